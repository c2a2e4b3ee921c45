// Checkpoints across layouts: a checkpoint written by any of {1 rank, dp2,
// zero1 dp2, zero3 dp2, tp2, dp2 tp2 zero1, tp4, dp2 tp2 zero3 with sequence
// parallelism, pp2, pp2 tp2 with SP, dp2 pp2, dp2 tp2 pp2 zero1 with SP,
// dp2 pp4, interleaved pp2 with 2 chunks per rank, the same with dp2 and
// zero2, uneven stages, context-parallel cp2 and dp2 cp2 zero1} loads into
// any of them (context parallelism is not part of the state's layout) and
// training goes on as the single-rank run does (losses within 1e-5); on the
// same layout it goes on bit for bit. A sharded layout reads only its share.
// Runs under `mpirun -n 8`. Also: the memory estimate equals the engine's
// buffers for every ZeRO stage, with and without tensor, sequence and context
// parallelism, and is the fullest rank of a pipeline.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/spec.h"
#include "kernels/cpu/kernels.h"
#include "tests/testing/weights_copy.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/parallel/memory_estimate.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

struct Layout {
  const char* name;
  int dp, zero, tp;
  bool sp;
  int pp = 1;
  int virtual_stages = 1;  // > 1: the interleaved schedule
  int microbatches = 1;
  int first_stage_layers = 0;  // 0: an even split
  int cp = 1;
  int ep = 1;         // the experts split over ep of the dp ranks
  int expert_tp = 0;  // parallel.expert_tp (0: tp)
  int world() const { return dp * tp * pp * cp; }
};
const Layout kLayouts[] = {{"single", 1, 0, 1, false},
                           {"dp2", 2, 0, 1, false},
                           {"zero1_dp2", 2, 1, 1, false},
                           {"zero3_dp2", 2, 3, 1, false},
                           {"tp2", 1, 0, 2, false},
                           {"dp2_tp2_zero1", 2, 1, 2, false},
                           {"tp4", 1, 0, 4, false},
                           {"dp2_tp2_zero3_sp", 2, 3, 2, true},
                           {"pp2", 1, 0, 1, false, 2},
                           {"pp2_tp2_sp", 1, 0, 2, true, 2},
                           {"dp2_pp2", 2, 0, 1, false, 2},
                           {"dp2_tp2_pp2_zero1_sp", 2, 1, 2, true, 2, 1, 2},
                           {"dp2_pp4", 2, 0, 1, false, 4, 1, 4},
                           {"pp2_v2", 1, 0, 1, false, 2, 2, 2},
                           {"dp2_pp2_v2_zero2", 2, 2, 1, false, 2, 2, 4},
                           {"dp2_pp2_stages_3_1", 2, 1, 1, false, 2, 1, 2, 3},
                           {"cp2", 1, 0, 1, false, 1, 1, 1, 0, 2},
                           {"dp2_cp2_zero1", 2, 1, 1, false, 1, 1, 1, 0, 2}};
constexpr int kSave = 8, kEnd = 16;

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string Root() {
  // One folder for the whole run, shared by the ranks (same machine).
  static std::string root = [] {
    int stamp = WorldRank() == 0 ? ::getpid() : 0;
    MPI_Bcast(&stamp, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return (fs::temp_directory_path() /
            ("ptrain_reshard_" + std::to_string(stamp)))
        .string();
  }();
  return root;
}

v1::JobSpec Spec(const Layout& l, const std::string& ckpt_dir,
                 const std::string& n_embd,
                 const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {
      "model.n_layer=4",
      "model.n_head=4",
      "model.n_embd=" + n_embd,
      "model.block_size=16",
      "train.global_batch=8",
      "train.steps=" + std::to_string(kEnd),
      "train.lr=3e-3",
      "train.warmup_steps=3",
      "train.eval_batches=1",
      "parallel.dp=" + std::to_string(l.dp),
      "parallel.zero=" + std::to_string(l.zero),
      "parallel.tp=" + std::to_string(l.tp),
      "parallel.pp=" + std::to_string(l.pp),
      "parallel.cp=" + std::to_string(l.cp),
      "parallel.ep=" + std::to_string(l.ep),
      "parallel.expert_tp=" + std::to_string(l.expert_tp),
      std::string("parallel.sequence_parallel=") + (l.sp ? "true" : "false"),
      "parallel.microbatches=" + std::to_string(l.microbatches),
      "parallel.virtual_stages=" + std::to_string(l.virtual_stages),
      "parallel.first_stage_layers=" + std::to_string(l.first_stage_layers),
      std::string("parallel.schedule=") +
          (l.virtual_stages > 1 ? "interleaved" : "1f1b"),
      "checkpoint.dir=" + ckpt_dir,
      "checkpoint.keep_last=10"};
  o.insert(o.end(), extra.begin(), extra.end());
  auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", o);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The ranks of the layout OnLayout is running (valid inside its `fn`).
MPI_Comm layout_comm = MPI_COMM_NULL;

// Runs `fn(trainer)` on the first l.world() ranks; the others wait.
template <typename Fn>
void OnLayout(const Layout& l, const std::string& ckpt_dir,
              const std::string& resume, Fn fn,
              const std::string& n_embd = "36",
              const std::vector<std::string>& extra = {}) {
  MPI_Comm comm;
  const bool member = WorldRank() < l.world();
  MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, WorldRank(),
                 &comm);
  if (member) {
    layout_comm = comm;
    const v1::JobSpec spec = Spec(l, ckpt_dir, n_embd, extra);
    auto dims = ParallelDims::Create(spec.parallel(), comm);
    EXPECT_TRUE(dims.ok()) << dims.status();
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.resume_from = resume;
    auto trainer = Trainer::Create(spec, opt, dims->get());
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (trainer.ok()) fn(**trainer);
    trainer->reset();
    dims->reset();
    MPI_Comm_free(&comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

std::vector<float> Steps(Trainer& t, int from, int to) {
  std::vector<float> out;
  for (int s = from; s < to; ++s) out.push_back(t.TrainStep(s).loss);
  return out;
}

class Reshard : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Straight runs of every layout, and a checkpoint from each at kSave.
    for (const Layout& l : kLayouts) {
      const std::string dir = Root() + "/" + l.name;
      OnLayout(l, dir, "",
               [&](Trainer& t) { straight_[l.name] = Steps(t, 0, kEnd); });
      // Ranks outside a layout learn its losses from rank 0.
      straight_[l.name].resize(kEnd);
      MPI_Bcast(straight_[l.name].data(), kEnd, MPI_FLOAT, 0, MPI_COMM_WORLD);
      OnLayout(l, dir, "", [&](Trainer& t) {
        Steps(t, 0, kSave);
        auto saved = t.checkpoints().SaveCheckpointAt(kSave);
        EXPECT_TRUE(saved.ok()) << saved.status();
      });
    }
  }
  static void TearDownTestSuite() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (WorldRank() == 0) fs::remove_all(Root());
  }
  static std::map<std::string, std::vector<float>> straight_;
};
std::map<std::string, std::vector<float>> Reshard::straight_;

TEST_F(Reshard, EveryLayoutLoadsEveryLayoutsCheckpoint) {
  const std::vector<float>& ref = straight_["single"];
  for (const Layout& from : kLayouts) {
    const std::string ckpt =
        Root() + "/" + from.name + "/step-0000000" + std::to_string(kSave);
    for (const Layout& to : kLayouts) {
      OnLayout(to, Root() + "/scratch", ckpt, [&](Trainer& t) {
        ASSERT_EQ(t.checkpoints().start_step(), kSave);
        const std::vector<float> got = Steps(t, kSave, kEnd);
        double diff = 0;
        bool exact = true;
        for (int i = 0; i < kEnd - kSave; ++i) {
          diff = std::max(diff, std::fabs(double(got[i]) - ref[kSave + i]) /
                                    ref[kSave + i]);
          exact = exact && got[i] == straight_[to.name][kSave + i];
        }
        if (WorldRank() == 0) {
          std::printf(
              "saved %-16s loaded %-16s losses vs single rank maxdiff %.2e%s\n",
              from.name, to.name, diff,
              from.name == to.name ? (exact ? ", bit-exact" : ", NOT exact")
                                   : "");
        }
        EXPECT_LE(diff, 1e-5) << from.name << " -> " << to.name;
        if (std::strcmp(from.name, to.name) == 0) {
          EXPECT_TRUE(exact)
              << "same layout must resume bit for bit: " << to.name;
        }
      });
    }
  }
}

// Each layout's checkpoint of the model `model` (overrides), saved at step
// kSave, loads into every layout and goes on as the single rank (the
// first layout) does.
void EveryCheckpointResumesOnEveryLayout(const std::string& tag,
                                         const std::vector<std::string>& model,
                                         const std::vector<Layout>& layouts) {
  std::vector<float> ref;
  const std::string root = Root() + "/" + tag;
  OnLayout(
      layouts[0], root + "/straight", "",
      [&](Trainer& t) { ref = Steps(t, 0, kEnd); }, "40", model);
  ref.resize(kEnd);
  MPI_Bcast(ref.data(), kEnd, MPI_FLOAT, 0, MPI_COMM_WORLD);
  for (const Layout& from : layouts) {
    const std::string dir = root + "/" + from.name;
    OnLayout(
        from, dir, "",
        [&](Trainer& t) {
          Steps(t, 0, kSave);
          auto saved = t.checkpoints().SaveCheckpointAt(kSave);
          EXPECT_TRUE(saved.ok()) << saved.status();
        },
        "40", model);
    for (const Layout& to : layouts) {
      OnLayout(
          to, root + "/scratch", dir + "/step-0000000" + std::to_string(kSave),
          [&](Trainer& t) {
            ASSERT_EQ(t.checkpoints().start_step(), kSave);
            const std::vector<float> got = Steps(t, kSave, kEnd);
            double diff = 0;
            for (int i = 0; i < kEnd - kSave; ++i) {
              diff = std::max(diff, std::fabs(double(got[i]) - ref[kSave + i]) /
                                        ref[kSave + i]);
            }
            if (WorldRank() == 0) {
              std::printf("saved %-22s loaded %-22s maxdiff %.2e\n", from.name,
                          to.name, diff);
            }
            EXPECT_LE(diff, 1e-5) << from.name << " -> " << to.name;
          },
          "40", model);
    }
  }
}

// A Llama's checkpoints between layouts that hold its key/value heads
// differently: whole on one rank, split over tp 2, replicated over tp 4 (2
// heads for 4 ranks), sharded by ZeRO-3 under tp 2 with SP, and in a
// pipeline.
TEST_F(Reshard, LlamaCheckpointsMoveBetweenSplitAndReplicatedKeyValueHeads) {
  EveryCheckpointResumesOnEveryLayout(
      "llama",
      {"model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=72",
       "model.tie_embeddings=false", "model.rope_theta=500000"},
      {{"llama_single", 1, 0, 1, false},
       {"llama_tp2", 1, 0, 2, false},
       {"llama_tp4", 1, 0, 4, false},
       {"llama_dp2_tp2_zero3_sp", 2, 3, 2, true},
       {"llama_pp2", 1, 0, 1, false, 2}});
}

// A Qwen3-MoE's checkpoints (heads apart from the width, query/key norms
// replicated over tp, experts in blocks 1 and 3): between one rank, tp 4
// (its key/value heads replicated), ZeRO-3 under tp 2 with SP, and experts
// whole on each tp rank split over ep 2.
TEST_F(Reshard, Qwen3MoeCheckpointsMoveBetweenLayouts) {
  EveryCheckpointResumesOnEveryLayout(
      "qwen3",
      {"model.arch=llama", "model.n_kv_head=2", "model.ffn_hidden=72",
       "model.head_dim=16", "model.qk_norm=true", "model.tie_embeddings=false",
       "model.moe.experts=4", "model.moe.every=2",
       "model.moe.expert_hidden=24"},
      {{"qwen3_single", 1, 0, 1, false},
       {"qwen3_tp4", 1, 0, 4, false},
       {"qwen3_dp2_tp2_zero3_sp", 2, 3, 2, true},
       {"qwen3_dp2_ep2_tp2_etp1_zero1_sp", 2, 1, 2, true, 1, 1, 1, 0, 1, 2,
        1}});
}

// A Mixture-of-Experts model's checkpoints (its experts split over tp and
// over ep ranks, sharded by ZeRO over the ranks holding the same ones, in
// pipeline stages), with a capacity that drops tokens, optimizer state
// included: from ep 4 to one rank, from one rank to ep 2 with tp 2, from
// pp 2 with ep 2 to one rank, between experts split over tp and experts
// whole on each tp rank (parallel.expert_tp=1, with and without ep), and
// every other way.
TEST_F(Reshard, MoeCheckpointsMoveBetweenLayouts) {
  EveryCheckpointResumesOnEveryLayout(
      "moe",
      {"model.moe.experts=4", "model.moe.expert_hidden=24",
       "model.moe.shared_experts=1", "model.moe.capacity_factor=1",
       "model.moe.z_loss_coef=0.001"},
      {{"moe_single", 1, 0, 1, false},
       {"moe_tp2", 1, 0, 2, false},
       {"moe_dp2_tp2_zero3_sp", 2, 3, 2, true},
       {"moe_dp2_pp2_zero1", 2, 1, 1, false, 2},
       {"moe_dp4_ep4_zero1", 4, 1, 1, false, 1, 1, 1, 0, 1, 4},
       {"moe_dp2_ep2_tp2_zero3_sp", 2, 3, 2, true, 1, 1, 1, 0, 1, 2},
       {"moe_dp2_pp2_ep2_zero1", 2, 1, 1, false, 2, 1, 1, 0, 1, 2},
       {"moe_tp2_etp1", 1, 0, 2, false, 1, 1, 1, 0, 1, 1, 1},
       {"moe_dp2_ep2_tp2_etp1_zero3_sp", 2, 3, 2, true, 1, 1, 1, 0, 1, 2, 1}});
}

// model.moe.every=2: dense MLPs in blocks 0 and 2 beside the experts of
// blocks 1 and 3, each a stage's under pp 2, moved between ep 4, ep 2 in
// pipeline stages and one rank.
TEST_F(Reshard, InterleavedMoeCheckpointsMoveBetweenLayouts) {
  EveryCheckpointResumesOnEveryLayout(
      "moe_every2",
      {"model.moe.experts=4", "model.moe.expert_hidden=24",
       "model.moe.every=2"},
      {{"every2_single", 1, 0, 1, false},
       {"every2_dp4_ep4_zero3", 4, 3, 1, false, 1, 1, 1, 0, 1, 4},
       {"every2_dp2_pp2_ep2_zero1", 2, 1, 1, false, 2, 1, 1, 0, 1, 2}});
}

TEST_F(Reshard, ShardedLayoutReadsOnlyItsShare) {
  // A model several checksum chunks large, saved by one rank.
  const std::string dir = Root() + "/wide";
  OnLayout(
      kLayouts[0], dir, "",
      [&](Trainer& t) {
        Steps(t, 0, 1);
        EXPECT_TRUE(t.checkpoints().SaveCheckpointAt(1).ok());
      },
      "256");
  const std::string ckpt = dir + "/step-00000001";
  int64_t files = 0;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().extension() == ".bin") files += fs::file_size(e.path());
  }
  OnLayout(
      kLayouts[3], Root() + "/scratch", ckpt,
      [&](Trainer& t) {
        const double share =
            double(t.checkpoints().resume_bytes_read()) / files;
        if (WorldRank() == 0) {
          std::printf(
              "zero3 dp2 rank 0 read %.1f%% of a single-rank checkpoint\n",
              100 * share);
        }
        // Half of the state, plus whole chunks at each stretch's ends.
        EXPECT_LT(share, 0.75);
        EXPECT_GT(share, 0.25);
      },
      "256");
}

// ZeRO-3 gathers each block unit's weights while the unit before it
// computes (one unit ahead, in the direction of the pass): of a step's
// block gathers (every block unit in forward and again in backward) all
// but the first of each pass were started ahead — and the run's losses are
// those of the layout without ZeRO (the layouts test holds that to the
// last bit over 50 steps).
TEST_F(Reshard, ZeroThreeGathersTheNextUnitAhead) {
  const Layout l{"zero3_ahead", 2, 3, 1, false};
  OnLayout(l, Root() + "/scratch", "", [&](Trainer& t) {
    const ZeroStore::GatherCounts before = t.store().gather_counts();
    Steps(t, 0, 2);
    const ZeroStore::GatherCounts c = t.store().gather_counts();
    const int64_t blocks_per_pass = 4 * 4;  // model.n_layer=4, 4 units each
    EXPECT_EQ(c.blocks - before.blocks, 2 * 2 * blocks_per_pass);
    EXPECT_EQ(c.ahead - before.ahead, 2 * 2 * (blocks_per_pass - 1));
  });
}

// Under bf16 the matmuls read the store's bf16 compute copy of the weights,
// which sharded ZeRO stages make from the gathered weights (1-2 after each
// step's gather, 3 from each unit's gather): wherever it may be read
// (initialised, trained, saved, resumed) it is the fp32 master weights
// rounded, and a resume continues the straight run bit for bit. With a
// pipeline (the tied embedding's gradient summed across stages) and tp+SP.
TEST_F(Reshard, Bf16WeightsCopyIsTheMasterRoundedForEveryShardedStage) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << "no bf16 instructions here";
  const std::vector<std::string> bf16 = {"train.precision=bf16"};
  for (const Layout& l : {Layout{"copy_zero1", 2, 1, 1, false},
                          Layout{"copy_zero2", 2, 2, 1, false},
                          Layout{"copy_zero3", 2, 3, 1, false},
                          Layout{"copy_zero1_pp2", 2, 1, 1, false, 2},
                          Layout{"copy_zero3_tp2_sp", 2, 3, 2, true}}) {
    SCOPED_TRACE(l.name);
    const std::string dir = Root() + "/" + l.name;
    std::vector<float> want(5), got(2);
    OnLayout(
        l, dir, "",
        [&](Trainer& t) {
          testing::ExpectWeightsCopyIsTheRoundedMaster(t.store(),
                                                       "initialised");
          want = Steps(t, 0, 5);
          testing::ExpectWeightsCopyIsTheRoundedMaster(t.store(), "trained");
        },
        "36", bf16);
    OnLayout(
        l, dir, "",
        [&](Trainer& t) {
          Steps(t, 0, 3);
          auto saved = t.checkpoints().SaveCheckpointAt(3);
          EXPECT_TRUE(saved.ok()) << saved.status();
          testing::ExpectWeightsCopyIsTheRoundedMaster(t.store(), "saved");
        },
        "36", bf16);
    OnLayout(
        l, dir, "latest",
        [&](Trainer& t) {
          testing::ExpectWeightsCopyIsTheRoundedMaster(t.store(), "resumed");
          got = Steps(t, 3, 5);
          for (int i = 0; i < 2; ++i) EXPECT_EQ(got[i], want[3 + i]) << 4 + i;
        },
        "36", bf16);
  }
}

TEST_F(Reshard, MemoryEstimateEqualsTheEngineBuffersOfEveryZeroStage) {
  // fp32, and bf16 (its weights' bf16 compute copy counted) where the CPU
  // computes in bf16.
  std::vector<std::string> precisions = {"fp32"};
  if (kernels::CpuHasBf16()) precisions.push_back("bf16");
  for (const std::string& precision : precisions) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (int micro : {1, 2}) {
        for (int tp : {1, 2}) {
          // Context parallelism on the microbatches-2 rows: cp 2 (dp 2 tp 2
          // cp 2 fills the 8 ranks).
          Layout l{"memory", 2, zero, tp, tp == 2 && micro == 2};
          l.cp = micro;
          // n_embd 35, one head, vocabulary 65: units of odd size, padded to
          // dp=2 (tp=2: n_embd 38, two heads of 19).
          const std::string n_embd = tp == 1 ? "35" : "38";
          const std::vector<std::string> extra = {
              "model.n_head=" + std::to_string(tp),
              "parallel.microbatches=" + std::to_string(micro),
              "train.precision=" + precision};
          OnLayout(
              l, Root() + "/scratch", "",
              [&](Trainer& t) {
                const MemoryBytes real = t.memory();
                const MemoryEstimate e = EstimateRankMemory(
                    Spec(l, Root() + "/scratch", n_embd, extra),
                    t.data().vocab_size);
                if (WorldRank() == 0) {
                  std::printf(
                      "%s zero%d microbatches %d tp%d%s cp%d: estimate %lld "
                      "bytes, engine %lld bytes\n",
                      precision.c_str(), zero, micro, tp, l.sp ? " sp" : "",
                      l.cp, static_cast<long long>(e.total()),
                      static_cast<long long>(real.params + real.grads +
                                             real.optimizer +
                                             real.activations));
                }
                EXPECT_EQ(e.params, real.params) << zero << "/" << micro;
                EXPECT_EQ(e.grads, real.grads) << zero << "/" << micro;
                EXPECT_EQ(e.optimizer, real.optimizer) << zero << "/" << micro;
                EXPECT_EQ(e.activations, real.activations)
                    << zero << "/" << micro;
              },
              n_embd, extra);
        }
      }
    }
  }
}

// Under a pipeline the ranks differ (embedding, head, microbatches in
// flight): the estimate is the rank that needs the most, with or without
// recomputation.
TEST_F(Reshard, MemoryEstimateIsTheFullestPipelineRank) {
  // The estimate of `l` against the fullest of its ranks' engine buffers.
  auto check = [&](const Layout& l, const std::vector<std::string>& extra,
                   const std::string& what) {
    OnLayout(
        l, Root() + "/scratch", "",
        [&](Trainer& t) {
          const MemoryBytes real = t.memory();
          long long mine =
              real.params + real.grads + real.optimizer + real.activations;
          long long most = 0;
          MPI_Allreduce(&mine, &most, 1, MPI_LONG_LONG, MPI_MAX, layout_comm);
          const MemoryEstimate e = EstimateRankMemory(
              Spec(l, Root() + "/scratch", "36", extra), t.data().vocab_size);
          if (WorldRank() == 0) {
            std::printf(
                "pp2 %s: estimate %lld bytes, fullest rank %lld bytes\n",
                what.c_str(), static_cast<long long>(e.total()), most);
          }
          EXPECT_EQ(e.total(), most) << what;
        },
        "36", extra);
  };
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"}) {
    for (int zero : {0, 2, 3}) {
      const int v = std::strcmp(schedule, "interleaved") == 0 ? 2 : 1;
      // ZeRO-3 rows recompute their blocks (one block's activations
      // shared by the microbatches in flight), ZeRO-2 rows attention's core.
      check({"memory", 2, zero, 1, false, 2, v, 4},
            {std::string("parallel.schedule=") + schedule,
             std::string("train.recompute=") + (zero == 3   ? "full"
                                                : zero == 2 ? "selective"
                                                            : "none")},
            std::string(schedule) + " zero" + std::to_string(zero));
    }
  }
  // Stages of 3 + 1 and 1 + 3 layers: the fuller stage is the first, then
  // the last (which also holds the head).
  for (int first : {3, 1}) {
    check({"memory", 2, 1, 1, false, 2, 1, 4, first}, {},
          "1f1b stages " + std::to_string(first) + " + " +
              std::to_string(4 - first));
  }
}

}  // namespace
}  // namespace ptrain
