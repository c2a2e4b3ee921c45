// Recorded passes (StageOptions::graphs) on the CPU, through RecordingOps
// (tests/testing/recording_ops.h), which records and replays ops as a GPU
// backend's CUDA graphs do: a replay re-issues the recorded ops with the
// pointers and values they had, and nothing of the host code around them.
// So what the stage must do for a replay to compute what op-by-op launches
// compute — stage tokens into fixed buffers, keep host reads (the loss) out
// of the recording, set the slot's host state itself, make the weights'
// bf16 copy before — is tested here, bit for bit, without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"
#include "tests/testing/recording_ops.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/model/rng.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain {
namespace {

const GptConfig kModel{/*n_layer=*/2,      /*n_head=*/2,
                       /*n_embd=*/16,
                       /*block_size=*/8,   /*vocab_size=*/29,
                       /*padded_vocab=*/32};
constexpr int kB = 2, kT = 8, kMicrobatches = 2, kSteps = 12;

// A model with its ZeRO-0 store and AdamW on `ops`, passes recorded or not.
struct Model {
  Model(kernels::Ops* ops, bool graphs, bool bf16)
      : layout(BuildPlan(kModel, {})),
        store(layout, 1, Zero(bf16), nullptr, ops),
        stage(kModel, layout, Options(&store, ops, graphs)),
        optimizer(&store, TrainOptions(), {}) {
    store.InitParams(7);
  }
  static ZeroOptions Zero(bool bf16) {
    ZeroOptions z;
    z.microbatches = kMicrobatches;
    z.bf16_weights = bf16;
    return z;
  }
  static StageOptions Options(UnitStore* store, kernels::Ops* ops,
                              bool graphs) {
    StageOptions o;
    o.max_B = kB;
    o.max_T = kT;
    o.store = store;
    o.ops = ops;
    o.graphs = graphs;
    return o;
  }
  static v1::TrainSpec TrainOptions() {
    v1::TrainSpec t = DefaultJobSpec().train();
    t.set_grad_clip(1.0);
    t.set_weight_decay(0.1);
    return t;
  }
  std::vector<ParamInfo> layout;
  ZeroStore store;
  GptStage stage;
  DistributedOptimizer optimizer;
};

// Tokens of (step, microbatch) and their targets.
void Fill(std::vector<int32_t>* in, std::vector<int32_t>* tg, int step,
          int mb) {
  for (size_t i = 0; i < in->size(); ++i) {
    (*in)[i] = CounterRandom64(step, 2 * mb, i) % kModel.vocab_size;
    (*tg)[i] = CounterRandom64(step, 2 * mb + 1, i) % kModel.vocab_size;
  }
}

// kSteps optimizer steps of kMicrobatches microbatches; every third step
// an evaluation forward (dloss 0: the probabilities kept, no backward) in
// the same slot first, and in step 8 the microbatches are shorter (a new
// shape). Tokens come from two host buffers in turn, so that a pass that
// read them where they were at its recording reads the wrong ones.
// `moved`: the backend's buffers move before step 5 (its graphs are
// stale). Returns the losses: each step's, then each evaluation's.
std::vector<float> Train(Model& r, testing::RecordingOps* moved) {
  std::vector<int32_t> in[2], tg[2];
  std::vector<float> losses;
  int turn = 0;
  for (int step = 0; step < kSteps; ++step) {
    if (moved != nullptr && step == 5) moved->MoveScratch();
    const int T = step == 8 ? kT / 2 : kT;
    for (auto* v : {&in[0], &in[1], &tg[0], &tg[1]}) v->resize(kB * T);
    if (step % 3 == 2) {
      Fill(&in[turn], &tg[turn], 1000 + step, 0);
      losses.push_back(
          r.stage.Forward(0, in[turn].data(), nullptr, tg[turn].data(), kB, T));
      turn ^= 1;
    }
    const float dloss = 1.0f / (kMicrobatches * kB * T);
    r.store.BeginStep();
    float loss = 0.0f;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      Fill(&in[turn], &tg[turn], step, mb);
      r.store.BeginMicrobatch(mb == kMicrobatches - 1);
      loss += r.stage.Forward(0, in[turn].data(), nullptr, tg[turn].data(), kB,
                              T, dloss);
      r.stage.Backward(0, in[turn].data(), tg[turn].data(), dloss, nullptr);
      turn ^= 1;
    }
    r.store.FinishGradients();
    r.optimizer.Step(1e-2f);
    losses.push_back(loss);
  }
  return losses;
}

void ExpectSameWeights(Model& a, Model& b) {
  const int64_t n = a.store.update_size();
  ASSERT_EQ(n, b.store.update_size());
  EXPECT_EQ(0, std::memcmp(a.store.update_params(), b.store.update_params(),
                           n * sizeof(float)));
}

TEST(RecordedPasses, ReplaysComputeWhatOpByOpLaunchesComputeBitForBit) {
  std::vector<bool> precisions = {false};
  if (kernels::CpuHasBf16()) precisions.push_back(true);
  for (const bool bf16 : precisions) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    kernels::Ops& inner = bf16 ? kernels::CpuBf16Ops() : kernels::CpuOps();
    Model eager(&inner, /*graphs=*/false, bf16);
    const std::vector<float> want = Train(eager, nullptr);

    testing::RecordingOps recording(inner);
    Model recorded(&recording, /*graphs=*/true, bf16);
    const std::vector<float> got = Train(recorded, &recording);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "loss " << i;
    }
    ExpectSameWeights(recorded, eager);

    // Forward and backward of training at T and T/2, and evaluation at T:
    // each recorded at its second run; the training passes once more after
    // the move (stale: one run op by op, then a new recording).
    const GptStage::GraphCounts c = recorded.stage.graph_counts();
    EXPECT_EQ(c.failed, 0);
    EXPECT_EQ(recording.failed_captures(), 0);
    EXPECT_EQ(c.captured, recording.captures());
    EXPECT_GE(c.captured, 5);
    // 2 microbatches × (forward + backward) × 12 steps, but the runs op by
    // op: the first of each shape, the one after the move, the short step.
    EXPECT_GE(c.replayed, 30);
    EXPECT_EQ(recording.replays(), c.replayed);
    EXPECT_GT(recording.ops_recorded(), 0);
  }
}

// Two pipeline stages on one rank: the first stage's forward and the
// last's backward are recorded from tokens and the gradient received, the
// others from the buffer the stage's input was received into (two, taken
// in turn, as the pipeline runtime does) and the slot (two microbatches in
// flight). Four microbatches a step for 4 steps give the losses and both
// stages' gradients of op-by-op launches bit for bit.
TEST(RecordedPasses, PipelineStagesReplayForEachSlotAndReceiveBuffer) {
  struct Result {
    std::vector<float> losses, grads0, grads1;
  };
  auto run = [](kernels::Ops* ops, bool graphs, Result* out,
                GptStage::GraphCounts counts[2]) {
    std::vector<std::unique_ptr<GptStage>> stages;
    for (int s = 0; s < 2; ++s) {
      PlanOptions plan;
      plan.pp = 2;
      plan.pp_rank = s;
      StageOptions o;
      o.max_B = kB;
      o.max_T = kT;
      o.slots = 2;
      o.stage = s;
      o.n_stages = 2;
      o.ops = ops;
      o.graphs = graphs;
      stages.push_back(
          std::make_unique<GptStage>(kModel, BuildPlan(kModel, plan), o));
      stages.back()->InitParams(5);
    }
    const int64_t n = int64_t{kB} * kT * kModel.n_embd;
    kernels::Buffer acts[2] = {kernels::Buffer(ops, n),
                               kernels::Buffer(ops, n)};
    kernels::Buffer grads[2] = {kernels::Buffer(ops, n),
                                kernels::Buffer(ops, n)};
    std::vector<int32_t> in(kB * kT), tg(kB * kT);
    const float dloss = 1.0f / (4 * kB * kT);
    for (int step = 0; step < 4; ++step) {
      for (auto& st : stages) st->ZeroGrad();
      float loss = 0.0f;
      for (int mb = 0; mb < 4; ++mb) {
        Fill(&in, &tg, step, mb);
        const int slot = mb % 2, buf = (mb / 2) % 2;
        stages[0]->Forward(slot, in.data(), nullptr, nullptr, kB, kT);
        ops->Copy(acts[buf].data(), stages[0]->output(slot), n);
        loss += stages[1]->Forward(slot, nullptr, acts[buf].data(), tg.data(),
                                   kB, kT, dloss);
        stages[1]->Backward(slot, nullptr, tg.data(), dloss, nullptr);
        ops->Copy(grads[buf].data(), stages[1]->dinput(), n);
        stages[0]->Backward(slot, in.data(), nullptr, dloss, grads[buf].data());
      }
      out->losses.push_back(loss);
    }
    for (int s = 0; s < 2; ++s) {
      std::vector<float>& g = s == 0 ? out->grads0 : out->grads1;
      g.assign(stages[s]->grads(),
               stages[s]->grads() + stages[s]->buffer_size());
      counts[s] = stages[s]->graph_counts();
    }
  };
  Result want, got;
  GptStage::GraphCounts none[2], counts[2];
  run(&kernels::CpuOps(), false, &want, none);
  testing::RecordingOps recording(kernels::CpuOps());
  run(&recording, true, &got, counts);
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_EQ(got.losses[i], want.losses[i]) << "step " << i;
  }
  EXPECT_EQ(got.grads0, want.grads0);
  EXPECT_EQ(got.grads1, want.grads1);
  for (int s = 0; s < 2; ++s) {
    // Forward and backward of 2 slots (× 2 receive buffers where the pass
    // reads one): each recorded at its second run.
    EXPECT_EQ(counts[s].failed, 0) << "stage " << s;
    EXPECT_EQ(counts[s].captured, 6) << "stage " << s;
    EXPECT_EQ(counts[s].replayed, 2 * 16 - 6) << "stage " << s;
  }
}

// Keys run once and never recorded (here a last stage's forward from 70
// receive addresses, as sampling's forwards of every length through an
// earlier stage) do not keep later keys from being recorded.
TEST(RecordedPasses, KeysRunOnceMakeRoomForLaterOnes) {
  testing::RecordingOps recording(kernels::CpuOps());
  PlanOptions plan;
  plan.pp = 2;
  plan.pp_rank = 1;
  StageOptions o;
  o.max_B = kB;
  o.max_T = kT;
  o.stage = 1;
  o.n_stages = 2;
  o.ops = &recording;
  o.graphs = true;
  GptStage last(kModel, BuildPlan(kModel, plan), o);
  last.InitParams(5);
  const int64_t n = int64_t{kB} * kT * kModel.n_embd;
  kernels::Buffer hidden(&recording, 71 * n);
  std::vector<int32_t> in(kB * kT), tg(kB * kT);
  Fill(&in, &tg, 0, 0);
  for (int i = 0; i < 70; ++i) {
    last.Forward(0, nullptr, hidden.data() + i * n, tg.data(), kB, kT);
  }
  EXPECT_EQ(last.graph_counts().captured, 0);
  const float* again = hidden.data() + 70 * n;
  const float first = last.Forward(0, nullptr, again, tg.data(), kB, kT);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(last.Forward(0, nullptr, again, tg.data(), kB, kT), first);
  }
  EXPECT_EQ(last.graph_counts().captured, 1);
  EXPECT_EQ(last.graph_counts().replayed, 3);
}

// Without graphs nothing is recorded: every op runs as issued.
TEST(RecordedPasses, OffRecordsNothing) {
  testing::RecordingOps recording(kernels::CpuOps());
  Model plain(&recording, /*graphs=*/false, /*bf16=*/false);
  Train(plain, nullptr);
  EXPECT_EQ(recording.captures(), 0);
  EXPECT_EQ(recording.replays(), 0);
  EXPECT_EQ(plain.stage.graph_counts().replayed, 0);
  EXPECT_GT(recording.eager_ops(), 0);
}

}  // namespace
}  // namespace ptrain
