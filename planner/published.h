// Published training throughputs the planner is checked against: the
// weak-scaling study of Megatron-LM (Narayanan et al., "Efficient
// Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// SC 2021, Table 1): GPT models of 1.7B to 1T parameters on up to 3072
// A100 80GB GPUs (DGX A100 nodes of 8, NVLink within a node, 8×200 Gb/s
// InfiniBand each), with the tensor and pipeline degrees and the achieved
// teraFLOP/s per GPU of each. docs/planner.md shows paper against
// prediction (bench/plan_published.cc prints it).
#ifndef PTRAIN_PLANNER_PUBLISHED_H_
#define PTRAIN_PLANNER_PUBLISHED_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/profile.h"
#include "planner/search.h"

namespace ptrain::planner {

struct PublishedRun {
  double billions = 0;  // parameters, as the paper counts them
  int heads = 0, hidden = 0, layers = 0;
  int tp = 0, pp = 0, gpus = 0, batch = 0;
  double tflops_per_gpu = 0;  // achieved
};

// Its rows, smallest model first. Every model has a vocabulary of 51200
// and 2048 positions; mixed precision, activation recomputation, no ZeRO.
const std::vector<PublishedRun>& MegatronWeakScaling();

// The paper's FLOPs of one step (with recomputation's extra forward):
// 96·B·s·l·h²·(1 + s/6h + V/16lh).
double MegatronStepFlops(const PublishedRun& run);

// The run as a job spec: a GPT of its shape on cuda.
v1::JobSpec PublishedSpec(const PublishedRun& run);

// The planner on the run's cluster (gpus/8 nodes of 8): the best layout
// with the paper's tp and pp, ZeRO off and full recomputation (the rest —
// microbatches, schedule — as the planner picks), and the best layout it
// picks freely; each with its teraFLOP/s per GPU in the paper's count.
struct PublishedComparison {
  RankedLayout pinned, free;
  double pinned_tflops = 0, free_tflops = 0;
};
absl::StatusOr<PublishedComparison> CompareWithPublished(
    const PublishedRun& run, const HardwareProfile& profile);

}  // namespace ptrain::planner

#endif  // PTRAIN_PLANNER_PUBLISHED_H_
