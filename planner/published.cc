#include "planner/published.h"

#include <string>

#include "common/mesh.h"
#include "common/spec.h"

namespace ptrain::planner {

namespace {
constexpr int kVocab = 51200, kPositions = 2048, kGpusPerNode = 8;
}  // namespace

const std::vector<PublishedRun>& MegatronWeakScaling() {
  static const std::vector<PublishedRun> rows = {
      {1.7, 24, 2304, 24, 1, 1, 32, 512, 137},
      {3.6, 32, 3072, 30, 2, 1, 64, 512, 138},
      {7.5, 32, 4096, 36, 4, 1, 128, 512, 142},
      {18.4, 48, 6144, 40, 8, 1, 256, 1024, 135},
      {39.1, 64, 8192, 48, 8, 2, 512, 1536, 138},
      {76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140},
      {145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148},
      {310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155},
      {529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163},
      {1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163},
  };
  return rows;
}

double MegatronStepFlops(const PublishedRun& r) {
  const double B = r.batch, s = kPositions, l = r.layers, h = r.hidden,
               V = kVocab;
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

v1::JobSpec PublishedSpec(const PublishedRun& r) {
  v1::JobSpec spec = DefaultJobSpec();
  spec.set_name("megatron-" + std::to_string(r.layers) + "x" +
                std::to_string(r.hidden));
  v1::ModelSpec* m = spec.mutable_model();
  m->set_arch("gpt");
  m->set_n_layer(r.layers);
  m->set_n_head(r.heads);
  m->set_n_embd(r.hidden);
  m->set_block_size(kPositions);
  m->set_vocab_size(kVocab);
  spec.mutable_data()->set_path("data/input.txt");
  spec.mutable_train()->set_global_batch(r.batch);
  spec.mutable_resources()->set_device("cuda");
  return spec;
}

absl::StatusOr<PublishedComparison> CompareWithPublished(
    const PublishedRun& run, const HardwareProfile& profile) {
  const PlanInput input = PlanInputOf(PublishedSpec(run), profile);
  const Cluster cluster{run.gpus / kGpusPerNode, kGpusPerNode, 0};
  SearchOptions pinned;
  pinned.top = 1;
  pinned.accept = [&](const v1::JobSpec& s) {
    const ParallelLayout l = JobLayout(s);
    return l.degree("tp") == run.tp && l.degree("pp") == run.pp &&
           l.zero == 0 && s.train().recompute() == "full";
  };
  absl::StatusOr<PlanResult> a = PlanLayouts(input, cluster, profile, pinned);
  if (!a.ok()) return a.status();
  SearchOptions free;
  free.top = 1;
  absl::StatusOr<PlanResult> b = PlanLayouts(input, cluster, profile, free);
  if (!b.ok()) return b.status();
  PublishedComparison c;
  c.pinned = a->best.front();
  c.free = b->best.front();
  const double flops = MegatronStepFlops(run);
  c.pinned_tflops = flops / (c.pinned.prediction.step_s * run.gpus) / 1e12;
  c.free_tflops = flops / (c.free.prediction.step_s * run.gpus) / 1e12;
  return c;
}

}  // namespace ptrain::planner
