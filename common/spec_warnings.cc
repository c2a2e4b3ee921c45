// JobSpecWarnings: valid choices that are likely unintended, each a
// sentence naming the fields and what to write instead.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec.h"
#include "common/spec_internal.h"

namespace ptrain {
namespace {

using spec_internal::OtherStages;
using spec_internal::OtherStagesOf;

// A pipeline whose stages split the layers evenly while the LM head, on the
// last stage, costs a block or more: the split of the first and last
// stages' layers that makes the slowest stage fastest, when it is at least
// a tenth faster than the even one; "" otherwise. Only where the spec tells
// the vocabulary (model.vocab_size, or GPT-2's for token files).
std::string UnevenStagesAdvice(const v1::JobSpec& spec) {
  const v1::ParallelSpec& p = spec.parallel();
  const v1::ModelSpec& m = spec.model();
  const bool token_files =
      !spec.data().train_bin().empty() || spec.data().blend_size() > 0;
  const int vocab = m.vocab_size() > 0 ? m.vocab_size()
                    : token_files      ? kGpt2VocabSize
                                       : 0;
  const int64_t stages = int64_t{p.pp()} * p.virtual_stages();
  if (stages < 2 || vocab == 0 || p.first_stage_layers() != 0 ||
      p.last_stage_layers() != 0) {
    return "";
  }
  const int L = m.n_layer();
  // Forward multiply-adds a token: the head C·V, a block 12·C² + T·C
  // (its matmuls, then attention's scores and mixing at full length).
  const double C = m.n_embd(), T = m.block_size();
  const double head = C * vocab / (12 * C * C + T * C);  // in blocks
  const int even = static_cast<int>(L / stages);
  const double even_slowest = even + head;
  if (head < 1) return "";
  // The cost of the slowest stage with `first` and `last` layers (0: the
  // even share of what is left) at the ends, or -1 where that is no split.
  auto slowest = [&](int first, int last) -> double {
    const OtherStages others = OtherStagesOf(L, stages, first, last);
    if (!others.fit()) return -1;
    const double share = others.share();
    return std::max(
        {first > 0 ? first : share, share, (last > 0 ? last : share) + head});
  };
  // Of equal splits the one with the fewest layers first: the first stage
  // keeps the most microbatches in flight under 1F1B.
  int best_first = 0, best_last = 0;
  double best = even_slowest;
  for (int first = 0; first <= L; ++first) {
    for (int last = 0; last + first <= L; ++last) {
      const double c = slowest(first, last);
      if (c >= 0 && c < best - 1e-9)
        best = c, best_first = first, best_last = last;
    }
  }
  if (best > 0.9 * even_slowest) return "";
  std::string set;
  if (best_first > 0) {
    absl::StrAppend(&set, "parallel.first_stage_layers=", best_first);
  }
  if (best_last > 0) {
    absl::StrAppend(&set, set.empty() ? "" : " and ",
                    "parallel.last_stage_layers=", best_last);
  }
  return absl::StrFormat(
      "the LM head on the last pipeline stage costs about %.1f blocks "
      "(model.n_embd=%d × a vocabulary of %d), so with %d layers on every "
      "one of the parallel.pp × parallel.virtual_stages = %d stages the "
      "others wait for the last at every microbatch; %s would make the "
      "slowest stage %.1f blocks' worth instead of %.1f",
      head, m.n_embd(), vocab, even, stages, set, best, even_slowest);
}

}  // namespace

std::vector<std::string> JobSpecWarnings(const v1::JobSpec& spec) {
  std::vector<std::string> out;
  const v1::ParallelSpec& p = spec.parallel();
  if (std::string advice = UnevenStagesAdvice(spec); !advice.empty()) {
    out.push_back(std::move(advice));
  }
  if (p.pp() > 1 && p.microbatches() < p.pp()) {
    const double bubble =
        static_cast<double>(p.pp() - 1) / (p.microbatches() + p.pp() - 1);
    out.push_back(absl::StrCat(
        "parallel.microbatches=", p.microbatches(),
        " is fewer than parallel.pp=", p.pp(), ": the pipeline idles ",
        static_cast<int>(bubble * 100 + 0.5),
        "% of each step (the bubble, (pp-1)/(m+pp-1)); use at least ", p.pp(),
        " microbatches, better 4x that"));
  }
  const v1::CheckpointSpec& c = spec.checkpoint();
  if (c.async_save() && (c.dir().empty() || c.every() == 0)) {
    out.push_back(
        "checkpoint.async_save has no effect without checkpoint.dir and "
        "checkpoint.every > 0: only periodic checkpoints are written in the "
        "background (the last step's is always written before the run ends)");
  }
  return out;
}

}  // namespace ptrain
