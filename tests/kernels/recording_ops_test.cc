// Tests of RecordingOps (tests/testing), the CPU's stand-in for a backend
// that captures graphs: eager ops are the wrapped backend's bit for bit, a
// capture runs nothing, a replay writes what the eager ops write, and what
// a capture cannot hold fails it by name.
#include "tests/testing/recording_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"

namespace ptrain::testing {
namespace {

using kernels::Act;
using kernels::ConstAct;
using kernels::DType;
using kernels::Ops;

// The CPU's bf16 kernels need AVX512_BF16 (cpu_kernels_test's kNoBf16).
constexpr char kNoBf16[] =
    "no AVX512_BF16 on this CPU: oneDNN has no bf16 matmul here";

// Odd sizes, as cpu_kernels_test's. Vl pads the vocabulary by one column.
constexpr int kB = 2;
constexpr int kT = 5;
constexpr int kC = 12;
constexpr int kNH = 3;
constexpr int kOC = 7;
constexpr int kV = 11;
constexpr int kVl = 12;
constexpr int64_t kBT = kB * kT;
// Ring attention's block: cp 2, Tl positions a rank (zigzag: even).
constexpr int kCp = 2;
constexpr int kTl = 4;
// Decoding n positions from pos into caches of capacity rows.
constexpr int kDecodeN = 2;
constexpr int kDecodePos = 3;
constexpr int kCapacity = 8;
// AdamW's buffers and the runs over them.
constexpr int64_t kN = 40;
const std::vector<Ops::Run> kRuns = {{0, 10, 1}, {12, 20, 0}, {34, 6, 1}};

// Everything an op reads or writes, at fixed addresses (a graph keeps
// them): random contents, which Save keeps and Restore writes back.
class Memory {
 public:
  struct Snapshot {
    std::vector<float> floats;
    std::vector<int32_t> tokens;
  };

  explicit Memory(uint64_t seed) : rng_(seed) {
    floats_.resize(kCapacityFloats);
    x = Take(kBT * kC);
    x2 = Take(kBT * kC);
    y = Take(kBT * kC);
    y2 = Take(kBT * kC);
    dx = Take(kBT * kC);
    hidden = Take(kBT * kC);
    saved = Take(kBT * kC);
    w = Take(kOC * kC);
    bias = Take(kOC);
    dw = Take(kOC * kC);
    dbias = Take(kOC);
    out = Take(kBT * kOC);
    dout = Take(kBT * kOC);
    ln_w = Take(kC);
    ln_b = Take(kC);
    dln_w = Take(kC);
    dln_b = Take(kC);
    mean = Take(kBT);
    rstd = Take(kBT, /*positive=*/true);
    qkv = Take(kBT * 3 * kC);
    dqkv = Take(kBT * 3 * kC);
    att = Take(kB * kNH * kT * kT);
    datt = Take(kB * kNH * kT * kT);
    att_out = Take(kBT * kC);
    block_qkv = Take(kB * kTl * 3 * kC);
    block_kv = Take(kB * kTl * 2 * kC);
    block_out = Take(kB * kTl * kC);
    block_dout = Take(kB * kTl * kC);
    block_lse = Take(kB * kNH * kTl);
    block_dqkv = Take(kB * kTl * 3 * kC);
    block_dkv = Take(kB * kTl * 2 * kC);
    kcache = Take(kCapacity * kC);
    vcache = Take(kCapacity * kC);
    decode_qkv = Take(kDecodeN * 3 * kC);
    decode_out = Take(kDecodeN * kC);
    wte = Take(kV * kC);
    dwte = Take(kV * kC);
    wpe = Take(kT * kC);
    dwpe = Take(kT * kC);
    logits = Take(kBT * kVl);
    probs = Take(kBT * kVl, /*positive=*/true);
    losses = Take(kBT);
    stats = Take(3 * kBT);
    maxes = Take(kBT);
    sums = Take(kBT, /*positive=*/true);
    target_shifted = Take(kBT);
    params = Take(kN);
    m = Take(kN);
    v = Take(kN, /*positive=*/true);
    grads = Take(kN);
    x16 = TakeBf16(kBT * kC);
    dx16 = TakeBf16(kBT * kC);
    h16 = TakeBf16(kBT * kC);
    w16 = TakeBf16(kOC * kC);
    logits16 = TakeBf16(kBT * kVl);
    params16 = TakeBf16(kN);
    tokens_.resize(2 * kBT);
    std::uniform_int_distribution<int32_t> token(0, kV - 1);
    for (int32_t& t : tokens_) t = token(rng_);
    targets = tokens_.data();
    staging = tokens_.data() + kBT;
  }
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;

  Snapshot Save() const { return {floats_, tokens_}; }
  // Back to `s`, in place: the addresses the ops were given stay.
  void Restore(const Snapshot& s) {
    std::copy(s.floats.begin(), s.floats.end(), floats_.begin());
    std::copy(s.tokens.begin(), s.tokens.end(), tokens_.begin());
  }
  // Where p lies in the floats (Snapshot::floats' index).
  int64_t Offset(const float* p) const { return p - floats_.data(); }
  // New random values in p (n).
  void Refill(float* p, int64_t n) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) p[i] = dist(rng_);
  }

  float *x, *x2, *y, *y2, *dx, *hidden, *saved, *w, *bias, *dw, *dbias, *out,
      *dout, *ln_w, *ln_b, *dln_w, *dln_b, *mean, *rstd, *qkv, *dqkv, *att,
      *datt, *att_out, *block_qkv, *block_kv, *block_out, *block_dout,
      *block_lse, *block_dqkv, *block_dkv, *kcache, *vcache, *decode_qkv,
      *decode_out, *wte, *dwte, *wpe, *dwpe, *logits, *probs, *losses, *stats,
      *maxes, *sums, *target_shifted, *params, *m, *v, *grads;
  void *x16, *dx16, *h16, *w16, *logits16, *params16;  // bf16
  int32_t* targets;  // (B,T) in [0,V): the tokens too
  int32_t* staging;  // (B,T)

 private:
  static constexpr int64_t kCapacityFloats = 1 << 16;

  float* Take(int64_t n, bool positive = false) {
    if (used_ + n > kCapacityFloats) {
      std::fprintf(stderr, "Memory: raise kCapacityFloats\n");
      std::abort();
    }
    float* p = floats_.data() + used_;
    used_ += n;
    std::uniform_real_distribution<float> dist(positive ? 0.1f : -1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) p[i] = dist(rng_);
    return p;
  }
  // n bf16 values (two to a float): random floats rounded.
  void* TakeBf16(int64_t n) {
    float* p = Take((n + 1) / 2);
    std::vector<float> values(n);
    Refill(values.data(), n);
    kernels::RoundToBf16Rows(reinterpret_cast<uint16_t*>(p), values.data(), 1,
                             n);
    return p;
  }

  std::mt19937_64 rng_;
  std::vector<float> floats_;  // kCapacityFloats, used_ of them taken
  int64_t used_ = 0;
  std::vector<int32_t> tokens_;
};

// Where `got` and `want` first differ, bit for bit ("" where nowhere).
std::string FirstDifference(const Memory::Snapshot& got,
                            const Memory::Snapshot& want) {
  for (size_t i = 0; i < want.floats.size(); ++i) {
    if (std::memcmp(&got.floats[i], &want.floats[i], 4) != 0) {
      return "float " + std::to_string(i) + ": " +
             std::to_string(got.floats[i]) + " against " +
             std::to_string(want.floats[i]);
    }
  }
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    if (got.tokens[i] != want.tokens[i]) {
      return "token " + std::to_string(i) + ": " +
             std::to_string(got.tokens[i]) + " against " +
             std::to_string(want.tokens[i]);
    }
  }
  return "";
}

// One op issued on a backend over Memory.
struct OpCase {
  std::string name;
  std::function<void(Ops&, Memory&)> issue;
};

// Every op that can be recorded, over fp32 tensors (CpuOps), the ops with a
// default body in ops.h included.
std::vector<OpCase> Fp32Ops() {
  const int64_t n = kBT * kC;
  return {
      {"Zero", [=](Ops& o, Memory& t) { o.Zero(t.y, n); }},
      {"Copy", [=](Ops& o, Memory& t) { o.Copy(t.y, t.x, n); }},
      {"Add", [=](Ops& o, Memory& t) { o.Add(t.y, t.x, n); }},
      {"CopyRows",
       [](Ops& o, Memory& t) { o.CopyRows(t.y, kC, t.x, 2 * kC, 4, 5, true); }},
      {"Convert",
       [](Ops& o, Memory& t) {
         o.Convert(Act(t.x16, DType::kBf16), t.x, kBT, kC);
       }},
      {"embedding_forward",
       [](Ops& o, Memory& t) {
         o.embedding_forward(t.y, t.targets, t.wte, kB, kT, kC, 0, kV);
       }},
      {"embedding_backward",
       [](Ops& o, Memory& t) {
         o.embedding_backward(t.dwte, t.dx, t.targets, kB, kT, kC, 0, kV);
       }},
      {"position_forward",
       [](Ops& o, Memory& t) { o.position_forward(t.y, t.wpe, kB, 3, kC, 2); }},
      {"position_backward",
       [](Ops& o, Memory& t) {
         o.position_backward(t.dwpe, t.dx, kB, 3, kC, 2);
       }},
      {"layernorm_forward",
       [](Ops& o, Memory& t) {
         o.layernorm_forward(t.y, t.mean, t.rstd, t.x, t.ln_w, t.ln_b, kB, kT,
                             kC);
       }},
      {"layernorm_backward",
       [](Ops& o, Memory& t) {
         o.layernorm_backward(t.dx, t.dln_w, t.dln_b, t.y, t.x, t.ln_w, t.mean,
                              t.rstd, kB, kT, kC);
       }},
      {"matmul_forward",
       [](Ops& o, Memory& t) {
         o.matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC);
       }},
      {"matmul_backward",
       [](Ops& o, Memory& t) {
         o.matmul_backward(t.dx, t.dw, t.dbias, t.dout, t.x, t.w, kB, kT, kC,
                           kOC);
       }},
      {"gelu_matmul_forward",
       [](Ops& o, Memory& t) {
         o.gelu_matmul_forward(t.out, t.hidden, nullptr, t.x, t.w, t.bias, kB,
                               kT, kC, kOC);
       }},
      {"gelu_matmul_backward",
       [](Ops& o, Memory& t) {
         o.gelu_matmul_backward(t.dx, t.dw, t.dbias, t.dout, t.hidden, nullptr,
                                t.x, t.w, kB, kT, kC, kOC);
       }},
      {"attention_forward",
       [](Ops& o, Memory& t) {
         o.attention_forward(t.att_out, t.att, t.qkv, kB, kT, kC, kNH, kNH);
       }},
      {"attention_backward",
       [](Ops& o, Memory& t) {
         o.attention_backward(t.dqkv, t.datt, t.dx, t.qkv, t.att_out, t.att, kB,
                              kT, kC, kNH, kNH);
       }},
      {"attention_block_forward",
       [](Ops& o, Memory& t) {
         o.attention_block_forward(t.block_out, t.block_lse, t.block_qkv,
                                   t.block_kv, 2 * kC, kB, kTl, kC, kNH, kNH,
                                   kCp,
                                   /*q_rank=*/1, /*k_rank=*/0, /*first=*/true);
       }},
      {"attention_block_backward",
       [](Ops& o, Memory& t) {
         o.attention_block_backward(
             t.block_dqkv, t.block_dkv, t.block_dout, t.block_qkv, t.block_out,
             t.block_lse, t.block_kv, 2 * kC, kB, kTl, kC, kNH, kNH, kCp,
             /*q_rank=*/1, /*k_rank=*/0);
       }},
      {"attention_decode",
       [](Ops& o, Memory& t) {
         o.attention_decode(t.decode_out, t.kcache, t.vcache, t.decode_qkv,
                            kDecodeN, kDecodePos, kC, kNH, kNH, kCapacity);
       }},
      {"gelu_forward", [=](Ops& o, Memory& t) { o.gelu_forward(t.y, t.x, n); }},
      {"gelu_backward",
       [=](Ops& o, Memory& t) { o.gelu_backward(t.dx, t.x, t.y, n); }},
      {"bias_forward",
       [](Ops& o, Memory& t) { o.bias_forward(t.out, t.bias, kBT, kOC); }},
      {"residual_forward",
       [=](Ops& o, Memory& t) { o.residual_forward(t.y, t.x, t.x2, n); }},
      {"residual_layernorm_forward",
       [](Ops& o, Memory& t) {
         o.residual_layernorm_forward(t.y, t.y2, t.mean, t.rstd, t.x, t.x2,
                                      t.ln_w, t.ln_b, kB, kT, kC);
       }},
      {"crossentropy_parallel_max",
       [](Ops& o, Memory& t) {
         o.crossentropy_parallel_max(t.maxes, t.logits, kB, kT, kVl, 0, kV);
       }},
      {"crossentropy_parallel_exp",
       [](Ops& o, Memory& t) {
         o.crossentropy_parallel_exp(t.sums, t.target_shifted, t.probs,
                                     t.logits, t.maxes, t.targets, kB, kT, kVl,
                                     0, kV);
       }},
      {"crossentropy_parallel_finish",
       [](Ops& o, Memory& t) {
         o.crossentropy_parallel_finish(t.losses, t.probs, t.sums,
                                        t.target_shifted, kB, kT, kVl);
       }},
      {"crossentropy_forward",
       [](Ops& o, Memory& t) {
         o.crossentropy_forward(t.losses, t.probs, t.logits, t.targets, t.stats,
                                kB, kT, kVl, kV);
       }},
      {"crossentropy_parallel_backward",
       [](Ops& o, Memory& t) {
         o.crossentropy_parallel_backward(t.logits, t.probs, t.targets, 0.25f,
                                          kB, kT, kVl, 0);
       }},
      {"crossentropy_forward_backward",
       [](Ops& o, Memory& t) {
         o.crossentropy_forward_backward(t.losses, t.logits, t.targets, 0.25f,
                                         t.stats, kB, kT, kVl, kV);
       }},
      {"crossentropy_parallel_finish_backward",
       [](Ops& o, Memory& t) {
         o.crossentropy_parallel_finish_backward(t.losses, t.probs, t.sums,
                                                 t.target_shifted, t.targets,
                                                 0.25f, kB, kT, kVl, 0);
       }},
      {"adamw_update",
       [](Ops& o, Memory& t) {
         o.adamw_update(t.params, t.m, t.v, t.grads, kN, 1e-2f, 0.9f, 0.95f,
                        1e-8f, 0.1f, 3, 0.5f);
       }},
      // The runs are this call's own: gone once the capture has returned.
      {"adamw_update_runs",
       [](Ops& o, Memory& t) {
         const std::vector<Ops::Run> runs = kRuns;
         o.adamw_update_runs(t.params, nullptr, t.m, t.v, t.grads, runs.data(),
                             static_cast<int>(runs.size()), 1e-2f, 0.9f, 0.95f,
                             1e-8f, 0.1f, 3, 0.5f);
       }},
  };
}

// The ops CpuBf16Ops does otherwise than CpuOps over bf16 tensors, its
// overrides of ops.h's defaults among them, that need no bf16 matmul (they
// run on every CPU).
std::vector<OpCase> Bf16StoredOps() {
  auto bf = [](void* p) { return Act(p, DType::kBf16); };
  return {
      {"layernorm_forward",
       [=](Ops& o, Memory& t) {
         o.layernorm_forward(bf(t.h16), t.mean, t.rstd, t.x, t.ln_w, t.ln_b, kB,
                             kT, kC);
       }},
      {"residual_layernorm_forward",
       [=](Ops& o, Memory& t) {
         o.residual_layernorm_forward(t.y, bf(t.h16), t.mean, t.rstd, t.x, t.x2,
                                      t.ln_w, t.ln_b, kB, kT, kC);
       }},
      {"crossentropy_forward_backward",
       [=](Ops& o, Memory& t) {
         o.crossentropy_forward_backward(t.losses, bf(t.logits16), t.targets,
                                         0.25f, t.stats, kB, kT, kVl, kV);
       }},
      {"adamw_update_runs",
       [](Ops& o, Memory& t) {
         o.adamw_update_runs(t.params, t.params16, t.m, t.v, t.grads,
                             kRuns.data(), static_cast<int>(kRuns.size()),
                             1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f);
       }},
  };
}

// Those that multiply in bf16 (kNoBf16), the MLP's gelu_matmul pair among
// them.
std::vector<OpCase> Bf16MatmulOps() {
  auto bf = [](void* p) { return Act(p, DType::kBf16); };
  auto cbf = [](void* p) { return ConstAct(p, DType::kBf16); };
  return {
      {"matmul_forward",
       [=](Ops& o, Memory& t) {
         o.matmul_forward(t.out, cbf(t.x16), cbf(t.w16), t.bias, kB, kT, kC,
                          kOC);
       }},
      {"gelu_matmul_forward",
       [=](Ops& o, Memory& t) {
         o.gelu_matmul_forward(t.out, t.hidden, t.saved, cbf(t.x16), cbf(t.w16),
                               t.bias, kB, kT, kC, kOC);
       }},
      {"gelu_matmul_backward",
       [=](Ops& o, Memory& t) {
         o.gelu_matmul_backward(bf(t.dx16), t.dw, t.dbias, t.dout, t.hidden,
                                t.saved, cbf(t.x16), cbf(t.w16), kB, kT, kC,
                                kOC);
       }},
  };
}

// Each op of `cases` issued on a RecordingOps over `inner` outside a
// capture writes what inner writes, bit for bit, and counts as one eager op.
void ExpectEagerIsInner(Ops& inner, const std::vector<OpCase>& cases) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    Memory t(7);
    const Memory::Snapshot before = t.Save();
    c.issue(inner, t);
    const Memory::Snapshot want = t.Save();
    ASSERT_NE(FirstDifference(want, before), "") << "the op writes nothing";
    t.Restore(before);
    RecordingOps rec(inner);
    c.issue(rec, t);
    EXPECT_EQ(FirstDifference(t.Save(), want), "");
    EXPECT_EQ(rec.eager_ops(), 1);
  }
}

// Each op of `cases` captured on a RecordingOps over `inner`: one op
// recorded, nothing written; its replay writes what inner's eager call
// writes, bit for bit.
void ExpectReplayIsEager(Ops& inner, const std::vector<OpCase>& cases) {
  for (const OpCase& c : cases) {
    SCOPED_TRACE(c.name);
    Memory t(11);
    const Memory::Snapshot before = t.Save();
    c.issue(inner, t);
    const Memory::Snapshot want = t.Save();
    ASSERT_NE(FirstDifference(want, before), "") << "the op writes nothing";
    t.Restore(before);
    RecordingOps rec(inner);
    std::string error;
    std::unique_ptr<kernels::OpsGraph> graph =
        rec.Capture([&] { c.issue(rec, t); }, &error);
    ASSERT_NE(graph, nullptr) << error;
    EXPECT_EQ(FirstDifference(t.Save(), before), "") << "written at capture";
    EXPECT_EQ(rec.ops_recorded(), 1);
    EXPECT_EQ(rec.eager_ops(), 0);
    ASSERT_TRUE(graph->Replay());
    EXPECT_EQ(FirstDifference(t.Save(), want), "");
    EXPECT_EQ(rec.replays(), 1);
  }
}

TEST(RecordingOpsTest, EagerOpsWriteWhatCpuOpsWritesBitForBit) {
  ExpectEagerIsInner(kernels::CpuOps(), Fp32Ops());
}

TEST(RecordingOpsTest, EagerBf16StoredOpsWriteWhatCpuBf16OpsWritesBitForBit) {
  ExpectEagerIsInner(kernels::CpuBf16Ops(), Bf16StoredOps());
}

TEST(RecordingOpsTest, EagerOpsWriteWhatCpuBf16OpsWritesBitForBit) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  ExpectEagerIsInner(kernels::CpuBf16Ops(), Fp32Ops());
  ExpectEagerIsInner(kernels::CpuBf16Ops(), Bf16MatmulOps());
}

// The ops with a default body in ops.h among them: each one op, inner's,
// not the ops its default body issues.
TEST(RecordingOpsTest, EachOpCapturedIsOneOpWhoseReplayWritesTheEagerResult) {
  ExpectReplayIsEager(kernels::CpuOps(), Fp32Ops());
}

// CpuBf16Ops' overrides of the defaults: inner's, as one op.
TEST(RecordingOpsTest, Bf16StoredOpsCapturedReplayTheEagerResultBitForBit) {
  ExpectReplayIsEager(kernels::CpuBf16Ops(), Bf16StoredOps());
}

TEST(RecordingOpsTest, Bf16OpsCapturedReplayTheEagerResultBitForBit) {
  if (!kernels::CpuHasBf16()) GTEST_SKIP() << kNoBf16;
  ExpectReplayIsEager(kernels::CpuBf16Ops(), Fp32Ops());
  ExpectReplayIsEager(kernels::CpuBf16Ops(), Bf16MatmulOps());
}

TEST(RecordingOpsTest, ReplayReadsTheInputsContentsAtReplay) {
  Memory t(3);
  RecordingOps rec(kernels::CpuOps());
  auto forward = [&](Ops& o) {
    o.layernorm_forward(t.y, t.mean, t.rstd, t.x, t.ln_w, t.ln_b, kB, kT, kC);
    o.matmul_forward(t.out, t.y, t.w, t.bias, kB, kT, kC, kOC);
  };
  std::string error;
  std::unique_ptr<kernels::OpsGraph> graph =
      rec.Capture([&] { forward(rec); }, &error);
  ASSERT_NE(graph, nullptr) << error;
  EXPECT_EQ(rec.ops_recorded(), 2);

  const Memory::Snapshot first_inputs = t.Save();
  forward(kernels::CpuOps());
  const Memory::Snapshot first = t.Save();
  t.Restore(first_inputs);
  ASSERT_TRUE(graph->Replay());
  EXPECT_EQ(FirstDifference(t.Save(), first), "");

  t.Refill(t.x, kBT * kC);
  const Memory::Snapshot second_inputs = t.Save();
  forward(kernels::CpuOps());
  const Memory::Snapshot second = t.Save();
  ASSERT_NE(std::memcmp(t.out, &first.floats[t.Offset(t.out)],
                        kBT * kOC * sizeof(float)),
            0)
      << "new inputs, the same output";
  t.Restore(second_inputs);
  ASSERT_TRUE(graph->Replay());
  EXPECT_EQ(FirstDifference(t.Save(), second), "");
  EXPECT_EQ(rec.replays(), 2);
  EXPECT_EQ(rec.captures(), 1);
}

// Every op a capture cannot hold (ops.h, Ops::Capture), issued between two
// ops that can be: named by `name` in the capture's error.
std::vector<OpCase> OpsThatCannotBeRecorded() {
  const int64_t n = kBT * kC;
  return {
      {"Alloc", [](Ops& o, Memory&) { EXPECT_EQ(o.Alloc(4), nullptr); }},
      {"Free", [](Ops& o, Memory&) { o.Free(nullptr); }},
      {"AllocTokens",
       [](Ops& o, Memory&) { EXPECT_EQ(o.AllocTokens(4), nullptr); }},
      {"FreeTokens", [](Ops& o, Memory&) { o.FreeTokens(nullptr); }},
      {"AllocHost",
       [](Ops& o, Memory&) { EXPECT_EQ(o.AllocHost(4), nullptr); }},
      {"FreeHost", [](Ops& o, Memory&) { o.FreeHost(nullptr); }},
      {"StageTokens",
       [](Ops& o, Memory& t) {
         const std::vector<int32_t> host(kBT, 3);
         o.StageTokens(t.staging, host.data(), kBT);
       }},
      {"ToHost", [=](Ops& o, Memory& t) { o.ToHost(t.y, t.x, n); }},
      {"FromHost", [=](Ops& o, Memory& t) { o.FromHost(t.y, t.x, n); }},
      {"ToHostAsync",
       [=](Ops& o, Memory& t) { EXPECT_EQ(o.ToHostAsync(t.y, t.x, n), 0); }},
      {"FromHostAsync",
       [=](Ops& o, Memory& t) { o.FromHostAsync(t.y, t.x, n); }},
      {"WaitCopy", [](Ops& o, Memory&) { o.WaitCopy(0); }},
      {"ComputeAfterCopies", [](Ops& o, Memory&) { o.ComputeAfterCopies(); }},
      {"Synchronize", [](Ops& o, Memory&) { o.Synchronize(); }},
      {"Sum", [=](Ops& o, Memory& t) { EXPECT_EQ(o.Sum(t.x, n), 0.0); }},
      {"SumSquares",
       [=](Ops& o, Memory& t) { EXPECT_EQ(o.SumSquares(t.x, n), 0.0); }},
      {"SumSquaresRuns",
       [](Ops& o, Memory& t) {
         double sums[2] = {-1.0, -1.0};
         o.SumSquaresRuns(t.x, kRuns.data(), static_cast<int>(kRuns.size()),
                          sums);
         EXPECT_EQ(sums[0], 0.0);
         EXPECT_EQ(sums[1], 0.0);
       }},
      {"Capture",
       [](Ops& o, Memory& t) {
         std::string error;
         EXPECT_EQ(o.Capture([&] { o.Zero(t.y, 4); }, &error), nullptr);
         EXPECT_EQ(error.rfind("Capture ", 0), 0u) << error;
       }},
  };
}

TEST(RecordingOpsTest,
     AnOpThatCannotBeRecordedFailsTheCaptureByNameAndRunsNothing) {
  for (const OpCase& c : OpsThatCannotBeRecorded()) {
    SCOPED_TRACE(c.name);
    Memory t(5);
    const Memory::Snapshot before = t.Save();
    RecordingOps rec(kernels::CpuOps());
    std::string error;
    std::unique_ptr<kernels::OpsGraph> graph = rec.Capture(
        [&] {
          rec.matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC);
          c.issue(rec, t);
          rec.gelu_forward(t.y, t.x, kBT * kC);
        },
        &error);
    EXPECT_EQ(graph, nullptr);
    EXPECT_EQ(error.rfind(c.name + " ", 0), 0u) << error;
    EXPECT_NE(error.find("during a capture"), std::string::npos) << error;
    EXPECT_EQ(FirstDifference(t.Save(), before), "") << "written at capture";
    EXPECT_EQ(rec.failed_captures(), 1);
    EXPECT_EQ(rec.captures(), 0);
    EXPECT_EQ(rec.ops_recorded(), 0);
    EXPECT_EQ(rec.eager_ops(), 0);
    EXPECT_FALSE(rec.capturing());
  }
}

TEST(RecordingOpsTest, TheFirstOpThatCannotBeRecordedIsTheOneNamed) {
  Memory t(5);
  RecordingOps rec(kernels::CpuOps());
  std::string error;
  EXPECT_EQ(rec.Capture(
                [&] {
                  rec.Sum(t.x, kBT);
                  EXPECT_EQ(rec.Alloc(4), nullptr);
                },
                &error),
            nullptr);
  EXPECT_EQ(error, "Sum reads a result on the host during a capture");
}

TEST(RecordingOpsTest, AfterAFailedCaptureOpsRunAndCaptureAgain) {
  Memory t(5);
  const Memory::Snapshot before = t.Save();
  kernels::CpuOps().matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC);
  const Memory::Snapshot want = t.Save();
  t.Restore(before);
  RecordingOps rec(kernels::CpuOps());
  std::string error;
  ASSERT_EQ(rec.Capture([&] { rec.Synchronize(); }, &error), nullptr);
  std::unique_ptr<kernels::OpsGraph> graph = rec.Capture(
      [&] { rec.matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC); },
      &error);
  ASSERT_NE(graph, nullptr) << error;
  EXPECT_EQ(FirstDifference(t.Save(), before), "");
  ASSERT_TRUE(graph->Replay());
  EXPECT_EQ(FirstDifference(t.Save(), want), "");
  t.Restore(before);
  rec.matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC);
  EXPECT_EQ(FirstDifference(t.Save(), want), "");
  EXPECT_EQ(rec.eager_ops(), 1);
  EXPECT_EQ(rec.captures(), 1);
  EXPECT_EQ(rec.failed_captures(), 1);
}

TEST(RecordingOpsTest, AReplayInsideACaptureFailsItAndRunsNothing) {
  Memory t(5);
  RecordingOps rec(kernels::CpuOps());
  std::string error;
  std::unique_ptr<kernels::OpsGraph> graph =
      rec.Capture([&] { rec.gelu_forward(t.y, t.x, kBT * kC); }, &error);
  ASSERT_NE(graph, nullptr) << error;
  const Memory::Snapshot before = t.Save();
  EXPECT_EQ(rec.Capture([&] { EXPECT_FALSE(graph->Replay()); }, &error),
            nullptr);
  EXPECT_EQ(error.rfind("Replay ", 0), 0u) << error;
  EXPECT_EQ(FirstDifference(t.Save(), before), "");
  EXPECT_EQ(rec.replays(), 0);
}

TEST(RecordingOpsTest, AGraphCapturedBeforeMoveScratchReplaysNothing) {
  Memory t(9);
  const Memory::Snapshot before = t.Save();
  RecordingOps rec(kernels::CpuOps());
  auto forward = [&] {
    rec.matmul_forward(t.out, t.x, t.w, t.bias, kB, kT, kC, kOC);
  };
  std::string error;
  std::unique_ptr<kernels::OpsGraph> stale = rec.Capture(forward, &error);
  ASSERT_NE(stale, nullptr) << error;
  rec.MoveScratch();
  EXPECT_FALSE(stale->Replay());
  EXPECT_EQ(FirstDifference(t.Save(), before), "");
  EXPECT_EQ(rec.replays(), 0);

  std::unique_ptr<kernels::OpsGraph> fresh = rec.Capture(forward, &error);
  ASSERT_NE(fresh, nullptr) << error;
  EXPECT_TRUE(fresh->Replay());
  EXPECT_NE(FirstDifference(t.Save(), before), "");
  EXPECT_FALSE(stale->Replay());
  EXPECT_EQ(rec.replays(), 1);
}

// The graph keeps the runs as they were at capture, as a GPU backend copies
// them to the device then.
TEST(RecordingOpsTest, AdamwRunsAreThoseOfTheCaptureNotOfTheReplay) {
  Memory t(13);
  const Memory::Snapshot before = t.Save();
  auto update = [&](Ops& o, const std::vector<Ops::Run>& runs) {
    o.adamw_update_runs(t.params, nullptr, t.m, t.v, t.grads, runs.data(),
                        static_cast<int>(runs.size()), 1e-2f, 0.9f, 0.95f,
                        1e-8f, 0.1f, 3, 0.5f);
  };
  update(kernels::CpuOps(), kRuns);
  const Memory::Snapshot want = t.Save();
  t.Restore(before);
  RecordingOps rec(kernels::CpuOps());
  std::vector<Ops::Run> runs = kRuns;
  std::string error;
  std::unique_ptr<kernels::OpsGraph> graph =
      rec.Capture([&] { update(rec, runs); }, &error);
  ASSERT_NE(graph, nullptr) << error;
  for (Ops::Run& r : runs) r = {0, kN, 0};
  ASSERT_TRUE(graph->Replay());
  EXPECT_EQ(FirstDifference(t.Save(), want), "");
}

// As a GPU backend's: code that reads the host array instead of what
// StageTokens returns is caught.
TEST(RecordingOpsTest, StageTokensCopiesIntoTheStagingBuffer) {
  Memory t(1);
  RecordingOps rec(kernels::CpuOps());
  std::vector<int32_t> host(kBT);
  for (int64_t i = 0; i < kBT; ++i) host[i] = static_cast<int32_t>(i % kV);
  const int32_t* staged = rec.StageTokens(t.staging, host.data(), kBT);
  EXPECT_EQ(staged, t.staging);
  EXPECT_EQ(std::vector<int32_t>(staged, staged + kBT), host);
  EXPECT_FALSE(rec.IsDeviceMemory(t.staging));
}

// CpuBf16Ops overrides the sizes and the activation type (no bf16 kernel
// runs here, so this holds on every CPU).
TEST(RecordingOpsTest, QueriesAnswerAsTheInnerBackend) {
  for (Ops* inner : {&kernels::CpuOps(), &kernels::CpuBf16Ops()}) {
    SCOPED_TRACE(inner->name());
    RecordingOps rec(*inner);
    EXPECT_EQ(rec.device(), inner->device());
    EXPECT_EQ(rec.name(), "recording " + inner->name());
    EXPECT_EQ(rec.activation_type(), inner->activation_type());
    EXPECT_EQ(rec.gelu_saved_floats(kBT, kC),
              inner->gelu_saved_floats(kBT, kC));
    for (int64_t T : {int64_t{kT}, kernels::kFlashAttentionT}) {
      EXPECT_EQ(rec.attention_saved_floats(kB, T, kC, kNH),
                inner->attention_saved_floats(kB, T, kC, kNH));
      EXPECT_EQ(rec.attention_scratch_floats(kB, T, kC, kNH),
                inner->attention_scratch_floats(kB, T, kC, kNH));
    }
    EXPECT_EQ(rec.CaptureUnsupported(), "");
    EXPECT_EQ(rec.eager_ops(), 0);
  }
  EXPECT_EQ(RecordingOps(kernels::CpuBf16Ops()).activation_type(),
            DType::kBf16);
  EXPECT_NE(RecordingOps(kernels::CpuBf16Ops()).gelu_saved_floats(kBT, kC), 0);
}

TEST(RecordingOpsTest, EagerMemoryOpsAreTheInnerBackends) {
  RecordingOps rec(kernels::CpuOps());
  float* p = rec.Alloc(5);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(rec.Sum(p, 5), 0.0);  // zeroed
  const std::vector<float> host = {1, 2, 3, 4, 5};
  rec.FromHost(p, host.data(), 5);
  EXPECT_EQ(rec.Sum(p, 5), 15.0);
  EXPECT_EQ(rec.SumSquares(p, 5), 55.0);
  double sums[2];
  const std::vector<Ops::Run> runs = {{0, 2, 0}, {3, 2, 1}};
  rec.SumSquaresRuns(p, runs.data(), 2, sums);
  EXPECT_EQ(sums[0], 5.0);
  EXPECT_EQ(sums[1], 41.0);
  float* pinned = rec.AllocHost(5);
  ASSERT_NE(pinned, nullptr);
  rec.WaitCopy(rec.ToHostAsync(pinned, p, 5));
  EXPECT_EQ(std::vector<float>(pinned, pinned + 5), host);
  rec.FreeHost(pinned);
  rec.Free(p);
  int32_t* tokens = rec.AllocTokens(3);
  ASSERT_NE(tokens, nullptr);
  rec.FreeTokens(tokens);
  EXPECT_EQ(rec.eager_ops(), 13);
}

}  // namespace
}  // namespace ptrain::testing
