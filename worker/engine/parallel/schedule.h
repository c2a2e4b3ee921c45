// Pipeline schedules as data: the order in which one pipeline rank runs the
// forward and backward passes of an optimizer step's microbatches, for
// GPipe, 1F1B and interleaved 1F1B. A schedule is chosen once per job and
// is a pure function of (pp, rank, microbatches, chunks),
// so it is tested on its own: every pass once, an order the neighbours can
// follow without deadlock, the stash bound, and the bubble a simulation of
// it yields against the analytic one.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_SCHEDULE_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_SCHEDULE_H_

#include <string>
#include <vector>

#include "common/spec.h"

namespace ptrain {

// ScheduleKind, ScheduleKindOf and ScheduleName come with the spec
// (common/spec.h): parallel.schedule's values.

// kBackward is a whole backward pass; a zero-bubble order splits it into
// kBackward, the input gradients (on the critical path: the previous stage
// waits for them), and kWeight, the weight gradients of the same
// microbatch, which nothing waits for.
struct PipeAction {
  enum Kind { kForward, kBackward, kWeight } kind;
  int microbatch;  // 0 .. m-1
  int chunk;       // this rank's model chunk, 0 .. v-1 (0 unless interleaved)
  bool operator==(const PipeAction& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};
// "F3" / "B0" / "W2", with the chunk when there are several ("F3.1").
std::string ToString(const PipeAction& a, bool chunks = false);

// The passes rank `rank` of `pp` runs in one optimizer step of `m`
// microbatches over its `v` chunks (v = 1 but for kInterleaved);
// kZeroBubble's is ZeroBubbleOrder, with W passes. Chunk c
// of rank r is virtual stage c·pp + r of pp·v. Interleaving needs m a
// multiple of pp (the caller validated; PT_CHECK otherwise).
std::vector<PipeAction> PipelineOrder(ScheduleKind kind, int pp, int rank,
                                      int m, int v);

// ZB-H1 ("Zero Bubble Pipeline Parallelism", Qi et al.): 1F1B's forwards
// and input-gradient passes B in 1F1B's order, each weight-gradient pass W
// run after its B but rank r's W lagging r microbatches behind, so that a
// later stage answers with B first and the W it put off fills what would
// be idle time while it waits; the rest of the W close the step. Every
// rank holds at most min(pp, m) microbatches (1F1B's bound on its first
// rank): a microbatch's activations stay until its W.
std::vector<PipeAction> ZeroBubbleOrder(int pp, int rank, int m);

// True when `order` splits its backwards into B and W passes (a
// zero-bubble order).
bool HasWeightPasses(const std::vector<PipeAction>& order);

// The most microbatch-chunks whose forward has run and whose last
// backward pass has not (its W in an order that has W passes, else its
// B): the activation slots the rank needs.
int MaxInFlight(const std::vector<PipeAction>& order);

// The same for each of the rank's v chunks: the slots each chunk's stage
// needs (a chunk's microbatches in flight are consecutive, so microbatch
// mb can use slot mb % slots). Without a pipeline (pp = 1) microbatches run
// one after another: one slot. Equal to MaxInFlight of the order's passes
// of each chunk, computed without listing all 2·m·v of them.
std::vector<int> ChunkSlots(ScheduleKind kind, int pp, int rank, int m, int v);

// Every rank following its PipelineOrder, each pass of a chunk taking
// `forward` or `backward` time units, transfers free, each rank blocking
// on the neighbour it needs. Idle time is the bubble.
struct PipelineSimulation {
  bool deadlock = false;           // some rank waits forever
  double makespan = 0;             // the step
  std::vector<double> idle;        // per rank: makespan minus its busy time
  double bubble_fraction() const;  // mean idle / makespan
};
PipelineSimulation SimulatePipeline(ScheduleKind kind, int pp, int m, int v,
                                    double forward, double backward);
// The same with each rank's own pass times (its microbatch's forward and
// backward over all its chunks): stages that differ in work — the first
// embeds, the last computes the head and the loss — wait for the slowest,
// which the textbook bubble leaves out.
PipelineSimulation SimulatePipeline(ScheduleKind kind, int pp, int m, int v,
                                    const std::vector<double>& forward,
                                    const std::vector<double>& backward);

// The simulation over given orders (one per rank; v chunks each), each
// rank's F, B and W times as given (per microbatch over all its chunks): a
// B waits for its forward and the next virtual stage's B, a W for its own
// B. Orders without W passes take `backward` as the whole backward.
PipelineSimulation SimulateOrders(
    const std::vector<std::vector<PipeAction>>& orders, int v,
    const std::vector<double>& forward, const std::vector<double>& backward,
    const std::vector<double>& weight);

// The textbook bubble of GPipe and 1F1B: (pp-1) / (m+pp-1).
double AnalyticBubble(int pp, int m);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_SCHEDULE_H_
