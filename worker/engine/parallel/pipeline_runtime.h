// PipelineRuntime: the one executor of a rank's passes. Training runs the
// passes of an optimizer step in a PipelineOrder (schedule.h) — without a
// pipeline the trivial order F0 B0 F1 B1 … — and evaluation and sampling
// run a forward-only order through the rank's chunks. Activations travel
// forward and gradients backward between neighbouring pipeline ranks as
// they are ready: each pass's receive is posted one receiving pass ahead,
// and sends never block (a copy is sent), so any order the schedule
// simulation finds deadlock-free runs without deadlock. An order with W
// passes (a zero-bubble schedule) runs each backward as GptStage's two
// passes; its chunks must be built with split_backward.
#ifndef PTRAIN_WORKER_ENGINE_PARALLEL_PIPELINE_RUNTIME_H_
#define PTRAIN_WORKER_ENGINE_PARALLEL_PIPELINE_RUNTIME_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/flight_recorder.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/parallel/schedule.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/report/metrics.h"

namespace ptrain {

class PipelineRuntime {
 public:
  struct Options {
    Communicator* pp = nullptr;  // the pipeline group; null: pp = 1
    int pp_rank = 0;
    // This rank's model chunks in order: chunk c is virtual stage
    // c·pp + pp_rank (not owned; they outlive the runtime).
    std::vector<GptStage*> chunks;
    // Where the gradients of a step are reduced (not owned); its backend
    // holds the runtime's buffers.
    ZeroStore* store = nullptr;
    int microbatches = 1;  // per optimizer step
    // Positions a rank holds of a sequence passed between stages: T / tp
    // under sequence parallelism, else T (seq_split 1).
    int seq_split = 1;
    // The largest microbatch passed between stages (its buffers' size).
    int max_B = 1, max_T = 1;
    // Told the pass of each training microbatch (not owned); may be null.
    FlightRecorder* recorder = nullptr;
  };
  explicit PipelineRuntime(Options options);

  // The trivial order of one stage: F0 B0 F1 B1 … over m microbatches.
  static std::vector<PipeAction> SequentialOrder(int m);
  // One microbatch forward through `chunks` chunks, in order.
  static std::vector<PipeAction> ForwardOrder(int chunks);

  // The passes of one optimizer step in `order` over the microbatches of
  // (B, T) tokens in `inputs` and `targets` (microbatch mb at mb·B·T),
  // then the step's gradient reductions. Returns the sum of the losses of
  // the microbatches this rank's last stage computed (0 on other ranks);
  // adds the time of each phase to *phases.
  double TrainStep(const std::vector<PipeAction>& order, const int32_t* inputs,
                   const int32_t* targets, int B, int T, float dloss,
                   PhaseSeconds* phases);
  // One forward of (B, T) through every stage (evaluation, sampling): the
  // loss on the rank of the last stage when `targets` is given, else 0.
  // decode_pos >= 0: the T tokens at positions [decode_pos, +T) of one
  // sequence (B = 1) through every stage's GptStage::Decode instead.
  float Forward(const int32_t* tokens, const int32_t* targets, int B, int T,
                int decode_pos = -1);

 private:
  // What one run of an order computes.
  struct Run {
    const int32_t* inputs;
    const int32_t* targets;
    int B, T;
    int64_t floats;  // of one message between stages
    int decode_pos;  // >= 0: Decode instead of Forward
    float dloss;     // backward's loss scale
    bool train;      // a training step's passes (the recorder marks them)
  };
  // The one executor: runs `order`, returning the last stage's loss sum.
  double Execute(const std::vector<PipeAction>& order, const Run& run,
                 PhaseSeconds* phases);
  // Tells the flight recorder which pass of a training step runs.
  void MarkPass(const PipeAction& a);
  int chunks() const { return static_cast<int>(chunks_.size()); }
  int VirtualStage(int c) const { return c * pp_size_ + pp_rank_; }
  int last_virtual_stage() const { return pp_size_ * chunks() - 1; }
  // The message tag of microbatch mb's activation (forward) or gradient
  // into chunk `into` of the receiving rank: unique per link and step.
  int Tag(int mb, int into, bool forward) const {
    return 2 * (mb * chunks() + into) + (forward ? 0 : 1);
  }
  // Sends a copy of `data` to pipeline rank `peer` without waiting: the
  // source buffer may be reused at once, and no rank ever blocks on a send
  // (only on the receive its order needs next).
  void SendCopy(const float* data, int64_t n, int peer, int tag);
  void WaitSends();

  Communicator* const pp_;
  const int pp_rank_, pp_size_;
  const std::vector<GptStage*> chunks_;
  ZeroStore* const store_;
  const int microbatches_, seq_split_;
  FlightRecorder* const recorder_;
  const int64_t n_embd_;
  // ForwardOrder of this rank's chunks, made once (sampling runs it for
  // every token), and the backwards each chunk has run in this step.
  const std::vector<PipeAction> forward_order_;
  std::vector<int> backwards_;
  // Two buffers of received activations or gradients (one in use, one
  // being received into), in the backend's memory.
  kernels::Buffer received_[2];
  // Copies of sent activations or gradients with their sends (a copy is
  // reused once its send completed).
  struct Outgoing {
    kernels::Buffer data;
    std::unique_ptr<CommHandle> send;  // null: free
  };
  std::vector<Outgoing> outgoing_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_PARALLEL_PIPELINE_RUNTIME_H_
