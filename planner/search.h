// The layout search: every dp·tp·pp·cp(·ep) mesh of a cluster's ranks ×
// microbatches × schedule (1f1b, interleaved, zb1p) × ZeRO stage ×
// recomputation (sequence parallelism with tp), each a job spec the
// spec's own validator accepts and whose node-local groups (tp, cp) stay
// within a node, ranked by the cost model's predicted step, the fastest
// ten that fit in memory kept with, for each, what it lost to the best
// by; and the fastest layouts rejected, with why (out of memory by how
// much, a group that would cross nodes). Best-first: a layout's cheap
// lower bound (its passes without the bubble) orders the work, so only
// the layouts that could rank are simulated and sized.
#ifndef PTRAIN_PLANNER_SEARCH_H_
#define PTRAIN_PLANNER_SEARCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model.h"
#include "planner/profile.h"
#include "ptrain/v1/coordinator.pb.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain::planner {

struct SearchOptions {
  int top = 10;        // layouts that fit to rank
  int rejected = 5;    // faster layouts rejected to explain
  bool fixed = false;  // only the spec's own layout, costed the same way
  // Only the layouts it accepts (null: all): a search with some choices
  // pinned.
  std::function<bool(const v1::JobSpec&)> accept;
};

struct RankedLayout {
  v1::JobSpec spec;  // the base spec with the layout's parallel section
  Prediction prediction;
  // Ranked below the first: what it loses by ("bubble 31%", "dp 0.21 s
  // exposed"); rejected: why ("OOM by 3.2 GiB", "tp crosses nodes").
  std::string why;
};

struct PlanResult {
  std::vector<RankedLayout> best;      // fit, fastest first
  std::vector<RankedLayout> rejected;  // faster than the last of `best`
  int64_t layouts = 0;                 // valid layouts considered
  int64_t simulated = 0;               // costed in full (simulated pipeline)
  int64_t sized = 0;                   // memory estimated
  double seconds = 0;                  // the search's wall time
  int64_t parameters = 0;              // the model's (GptNumParams)
  // The notes that qualify the plan (an assumed vocabulary, the device
  // the profile sets).
  std::vector<std::string> notes;
};

// The base spec as the planner costs it on `profile`: its device set to
// the profile's (precision auto follows), and `vocab_size` resolved
// (model.vocab_size, else the GPT-2 tokenizer's 50257, noted).
struct PlanInput {
  v1::JobSpec spec;
  int vocab_size = 0;
  std::vector<std::string> notes;
};
PlanInput PlanInputOf(const v1::JobSpec& spec, const HardwareProfile& profile);

// Layouts of `input` on `cluster`. Errors (InvalidArgument, naming what is
// wrong): no layout fits ("needs at least 24 GPUs of 80 GiB: smallest fit
// is ..."), and with options.fixed a layout whose world is not the
// cluster's.
absl::StatusOr<PlanResult> PlanLayouts(const PlanInput& input,
                                       const Cluster& cluster,
                                       const HardwareProfile& profile,
                                       const SearchOptions& options);

// The search `parallel: auto` makes (ptcoord at submit; `ptctl plan` on
// such a spec): the fastest layout (top 1), keeping a train.recompute the
// spec names (one other than the default); every other choice is the
// planner's.
SearchOptions AutoLayoutOptions(const v1::JobSpec& spec);
// Writes a ranked layout (`planned`, a RankedLayout's spec) into `spec`:
// its parallel section, `auto` no more, and its train.recompute.
void AdoptLayout(const v1::JobSpec& planned, v1::JobSpec* spec);

// "dp=4 tp=2 pp=2 cp=1 zero=1 1f1b m=8 recompute=none sp": a layout in a
// line.
std::string LayoutWords(const v1::JobSpec& spec);

}  // namespace ptrain::planner

#endif  // PTRAIN_PLANNER_SEARCH_H_
