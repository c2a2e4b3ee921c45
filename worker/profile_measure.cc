// The measurements of `ptworker profile` (profile.h): the kernels of one
// backend, timed on this process, and the collectives over groups of
// consecutive ranks, timed on every rank at once. No fitting, no output.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/mesh.h"
#include "kernels/ops.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/profile.h"

namespace ptrain {
namespace {

using kernels::Act;
using kernels::Buffer;
using kernels::ConstAct;
using kernels::DType;
using kernels::Ops;

// How long a measurement goes on: timed calls until `min_s` have passed or
// `max_reps` were made, after a warm-up call; a warm-up of `long_call_s` or
// more is the measurement itself (its one-time costs are then negligible,
// and the full grid's largest matmuls take seconds on one core).
struct Budget {
  double min_s;
  int max_reps;
  double long_call_s;
};
constexpr Budget kQuickBudget{0.03, 3, 0.25};
constexpr Budget kFullBudget{0.2, 5, 1.0};

// Calls shorter than this are timed in batches, so that a GPU's launch and
// wait are not what is measured.
constexpr double kMinBatchS = 1e-3;

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// Seconds per call of `fn` on `ops`: the best timing (Budget).
double BestSeconds(Ops* ops, const Budget& b, const std::function<void()>& fn) {
  auto time = [&](int calls) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) fn();
    ops->Synchronize();
    return Since(t0) / calls;
  };
  const double warm = time(1);
  if (warm >= b.long_call_s) return warm;
  const int calls = warm > 0.0
                        ? static_cast<int>(std::clamp(
                              std::ceil(kMinBatchS / warm), 1.0, 10000.0))
                        : 10000;
  double best = std::numeric_limits<double>::infinity(), total = 0.0;
  for (int r = 0; r < b.max_reps && (r == 0 || total < b.min_s); ++r) {
    const double t = time(calls);
    best = std::min(best, t);
    total += t * calls;
  }
  return best;
}

// `n` floats of `ops`' memory in [-1, 1), from a fixed sequence: kernels
// run on values like a model's (a GPU's tensor cores are faster on zeros).
Buffer RandomFloats(Ops* ops, int64_t n) {
  std::vector<float> host(n);
  uint32_t x = 2463534242u;
  for (float& v : host) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f;
  }
  Buffer b(ops, n);
  ops->FromHost(b.data(), host.data(), n);
  return b;
}

// RandomFloats stored as `type` (bf16: two to a float).
Buffer RandomTensor(Ops* ops, int64_t n, DType type) {
  Buffer f32 = RandomFloats(ops, n);
  if (type == DType::kF32) return f32;
  Buffer half(ops, (n + 1) / 2);
  ops->Convert(Act(half.data(), DType::kBf16), ConstAct(f32.data()), 1, n);
  return half;
}

// Room for `n` elements of `type`.
Buffer Room(Ops* ops, int64_t n, DType type) {
  return Buffer(ops, type == DType::kF32 ? n : (n + 1) / 2);
}

const char* PrecisionName(DType type) {
  return type == DType::kBf16 ? "bf16" : "fp32";
}

// The grids. Attention: B·T rows a shape, in heads of each head size (a
// GPU takes its fused kernel for heads of up to 64 channels and cuBLAS
// for larger ones: both measured).
struct Grid {
  std::vector<int> m, nk, T, head_sizes;
  int attention_rows = 0, heads = 0;
  int64_t elementwise_floats = 0, optimizer_params = 0;
};
Grid GridOf(bool gpu, bool quick) {
  Grid g;
  g.m = quick ? std::vector<int>{256, 1024} : std::vector<int>{256, 1024, 4096};
  g.nk = quick ? std::vector<int>{256, 768}
               : std::vector<int>{256, 768, 2048, 3072};
  if (gpu && !quick) {
    // A large model's matmuls, past where a GPU's rate levels off.
    g.m.push_back(16384);
    g.nk.push_back(8192);
  }
  g.head_sizes = gpu ? std::vector<int>{64, 128} : std::vector<int>{64};
  g.T = quick ? std::vector<int>{64, 256}
              : std::vector<int>{64, 128, 256, 512, 1024};
  g.attention_rows = (gpu ? 16384 : 4096) / (quick ? 4 : 1);
  g.heads = gpu ? 12 : 4;
  // 64 MiB a buffer: far past any cache.
  g.elementwise_floats = int64_t{16} << 20;
  g.optimizer_params = quick ? int64_t{4} << 20 : int64_t{16} << 20;
  return g;
}

// OpenMP threads for the scope of one count (0: leave them, a GPU).
void UseThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

void MeasureMatmuls(Ops* ops, const Grid& g, const std::vector<int>& threads,
                    const Budget& b, ComputeProfile* out) {
  const DType type = ops->activation_type();
  const int64_t m_max = *std::max_element(g.m.begin(), g.m.end());
  const int64_t nk_max = *std::max_element(g.nk.begin(), g.nk.end());
  // Inputs as a layer stores them (the stored type), outputs and gradients
  // fp32; each shape uses the front of the buffers.
  Buffer inp = RandomTensor(ops, m_max * nk_max, type);
  Buffer weight = RandomTensor(ops, nk_max * nk_max, type);
  Buffer bias = RandomFloats(ops, nk_max);
  Buffer dout = RandomFloats(ops, m_max * nk_max);
  Buffer y(ops, m_max * nk_max), dinp(ops, m_max * nk_max);
  Buffer dweight(ops, nk_max * nk_max), dbias(ops, nk_max);
  const ConstAct x(inp.data(), type), w(weight.data(), type);
  for (int t : threads) {
    UseThreads(t);
    for (int m : g.m) {
      for (int n : g.nk) {
        for (int k : g.nk) {
          // B = 1, T = m: rows are rows whatever their batch.
          const double fwd = BestSeconds(ops, b, [&] {
            ops->matmul_forward(y.data(), x, w, bias.data(), 1, m, k, n);
          });
          const double bwd = BestSeconds(ops, b, [&] {
            ops->matmul_backward(dinp.data(), dweight.data(), dbias.data(),
                                 dout.data(), x, w, 1, m, k, n);
          });
          const double flops = 2.0 * m * n * k;
          out->matmul.push_back(
              {PrecisionName(type), "forward", m, n, k, t, flops / fwd});
          out->matmul.push_back(
              {PrecisionName(type), "backward", m, n, k, t, 2 * flops / bwd});
        }
      }
    }
  }
}

void MeasureAttentionOf(Ops* ops, const Grid& g, int C, int NH,
                        const std::vector<int>& threads, const Budget& b,
                        ComputeProfile* out);

void MeasureAttention(Ops* ops, const Grid& g, const std::vector<int>& threads,
                      const Budget& b, ComputeProfile* out) {
  const int NH = g.heads;
  for (int head : g.head_sizes) {
    MeasureAttentionOf(ops, g, head * NH, NH, threads, b, out);
  }
}

void MeasureAttentionOf(Ops* ops, const Grid& g, int C, int NH,
                        const std::vector<int>& threads, const Budget& b,
                        ComputeProfile* out) {
  const DType type = ops->activation_type();
  for (int T : g.T) {
    const int B = std::max(1, g.attention_rows / T);
    const int64_t rows = int64_t{B} * T;
    Buffer qkv = RandomTensor(ops, rows * 3 * C, type);
    Buffer y = Room(ops, rows * C, type);
    Buffer att(ops, ops->attention_saved_floats(B, T, C, NH));
    Buffer datt(ops, ops->attention_scratch_floats(B, T, C, NH));
    Buffer dy = RandomFloats(ops, rows * C);
    Buffer dqkv(ops, rows * 3 * C);
    const Act yt(y.data(), type);
    const ConstAct qkvt(qkv.data(), type);
    for (int t : threads) {
      UseThreads(t);
      const double fwd = BestSeconds(ops, b, [&] {
        ops->attention_forward(yt, att.data(), qkvt, B, T, C, NH, NH);
      });
      // The backward reads what the last forward kept.
      const double bwd = BestSeconds(ops, b, [&] {
        ops->attention_backward(dqkv.data(), datt.data(), dy.data(), qkvt, yt,
                                att.data(), B, T, C, NH, NH);
      });
      out->attention.push_back({PrecisionName(type), B, T, C, NH, t, fwd, bwd});
    }
  }
}

}  // namespace

ComputeProfile MeasureCompute(Ops* ops, const std::vector<int>& threads,
                              bool quick) {
  const int saved_threads = omp_get_max_threads();
  const Grid g = GridOf(ops->device() == kernels::Device::kCuda, quick);
  const Budget& b = quick ? kQuickBudget : kFullBudget;
  ComputeProfile p;
  MeasureMatmuls(ops, g, threads, b, &p);
  MeasureAttention(ops, g, threads, b, &p);
  UseThreads(threads.back());
  {
    // dst += src: two floats read and one written an element.
    const int64_t n = g.elementwise_floats;
    Buffer dst = RandomFloats(ops, n), src = RandomFloats(ops, n);
    const double s =
        BestSeconds(ops, b, [&] { ops->Add(dst.data(), src.data(), n); });
    p.elementwise_bytes_per_s = 3.0 * sizeof(float) * n / s;
  }
  {
    const int64_t n = g.optimizer_params;
    Buffer params = RandomFloats(ops, n), grads = RandomFloats(ops, n);
    Buffer m(ops, n), v(ops, n);
    int64_t step = 0;
    const double s = BestSeconds(ops, b, [&] {
      ops->adamw_update(params.data(), m.data(), v.data(), grads.data(), n,
                        1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step, 1.0f);
    });
    p.optimizer_params_per_s = n / s;
  }
  omp_set_num_threads(saved_threads);
  return p;
}

namespace {

// The host of each rank of MPI_COMM_WORLD, in rank order.
std::vector<std::string> Hosts() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0, world = 1;
  MPI_Get_processor_name(name, &len);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::vector<char> all(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> hosts;
  for (int r = 0; r < world; ++r) {
    const char* h =
        all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
  return hosts;
}

std::string LinkOf(const std::vector<std::string>& hosts,
                   const std::vector<int>& ranks) {
  for (int r : ranks) {
    if (hosts[r] != hosts[ranks.front()]) return "inter_node";
  }
  return "intra_node";
}

// 4 KiB to 64 MiB (quick: 4 MiB), four times apart.
std::vector<int64_t> MessageBytes(bool quick) {
  std::vector<int64_t> sizes;
  const int64_t last = quick ? int64_t{4} << 20 : int64_t{64} << 20;
  for (int64_t s = 4096; s <= last; s *= 4) sizes.push_back(s);
  return sizes;
}

// The floats of each rank's part of a message of `bytes` over p ranks.
int64_t PartFloats(int64_t bytes, int p) {
  return std::max<int64_t>(1, bytes / int64_t{sizeof(float)} / p);
}

// Over this rank's group of `dims` (its tp group: p consecutive ranks),
// each collective's best seconds at each size, in kCollectives' order then
// the sizes', the slowest member's time of each repetition. Every group of
// the mesh runs at once, a barrier of all before each call.
std::vector<double> TimeGroup(ParallelDims* dims, Ops* ops,
                              const std::vector<int64_t>& sizes, bool quick) {
  Communicator* g = dims->tp_comm();  // the device twin after AttachDevice
  Communicator& host = dims->group("tp");
  Communicator& all = dims->world_group();
  const int p = g->size(), me = g->rank(), peer = p / 2;
  const int64_t max_floats = PartFloats(sizes.back(), p) * p;
  Buffer send = RandomFloats(ops, max_floats), recv(ops, max_floats);
  std::vector<double> best;
  for (Collective c : kCollectives) {
    for (int64_t bytes : sizes) {
      const int64_t part = PartFloats(bytes, p), whole = part * p;
      const std::vector<int64_t> counts(p, part);
      auto call = [&] {
        switch (c) {
          case Collective::kAllReduce:
            g->AllReduce(send.data(), whole);
            break;
          case Collective::kAllGather:
            g->AllGather(send.data(), recv.data(), part);
            break;
          case Collective::kReduceScatter:
            g->ReduceScatter(send.data(), recv.data(), part);
            break;
          case Collective::kAllToAll:
            g->AllToAllV(send.data(), counts.data(), recv.data(),
                         counts.data());
            break;
          case Collective::kSendRecv:
            // A ping-pong: half its time is one message's.
            if (me == 0) {
              g->Send(send.data(), whole, peer, 0);
              g->Recv(recv.data(), whole, peer, 0);
            } else if (me == peer) {
              g->Recv(recv.data(), whole, 0, 0);
              g->Send(send.data(), whole, 0, 0);
            }
            break;
        }
        ops->Synchronize();
      };
      const int reps =
          bytes <= (int64_t{1} << 20) ? (quick ? 5 : 20) : (quick ? 2 : 5);
      std::vector<float> seconds(reps + 1);  // [0]: the warm-up
      for (float& s : seconds) {
        all.Barrier();
        const auto t0 = std::chrono::steady_clock::now();
        call();
        s = static_cast<float>(Since(t0));
      }
      host.AllReduceMax(seconds.data(), static_cast<int64_t>(seconds.size()));
      const double t = *std::min_element(seconds.begin() + 1, seconds.end());
      best.push_back(c == Collective::kSendRecv ? t / 2 : t);
    }
  }
  return best;
}

// The mesh of `used` ranks as groups of p consecutive ones: tp = p (tp
// varies fastest), dp = used / p.
ParallelLayout GroupsOf(int p, int used) {
  ParallelLayout l;
  l.degrees.assign(MeshDimensions().size(), 1);
  l.degrees[MeshDimensionIndex("tp")] = p;
  l.degrees[MeshDimensionIndex("dp")] = used / p;
  return l;
}

}  // namespace

std::vector<LinkSample> MeasureLinks(Ops* ops, bool quick) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<std::string> hosts = Hosts();
  const std::vector<int64_t> sizes = MessageBytes(quick);
  const int per_group =
      static_cast<int>(std::size(kCollectives) * sizes.size());
  std::vector<LinkSample> samples;
  for (int p = 2; p <= world; p *= 2) {
    const int used = world / p * p;
    // The ranks that take part (the mesh then groups them; it does not
    // leave ranks out).
    MPI_Comm sub = MPI_COMM_WORLD;
    if (used < world) {
      MPI_Comm_split(MPI_COMM_WORLD, rank < used ? 0 : MPI_UNDEFINED, rank,
                     &sub);
    }
    std::vector<double> mine(per_group, 0.0);
    if (rank < used) {
      auto dims = ParallelDims::Create(GroupsOf(p, used), sub);
      // The layout is the sub-world's size by construction.
      PT_CHECK(dims.ok(), std::string(dims.status().message()).c_str());
      if (ops->device() == kernels::Device::kCuda) (*dims)->AttachDevice(ops);
      mine = TimeGroup(dims->get(), ops, sizes, quick);
      (*dims)->DetachDevice();
      dims->reset();
      if (sub != MPI_COMM_WORLD) MPI_Comm_free(&sub);
    }
    std::vector<double> all(rank == 0 ? static_cast<size_t>(world) * per_group
                                      : 0);
    MPI_Gather(mine.data(), per_group, MPI_DOUBLE, all.data(), per_group,
               MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank != 0) continue;
    for (int first = 0; first < used; first += p) {
      std::vector<int> group(p);
      for (int i = 0; i < p; ++i) group[i] = first + i;
      const double* times = all.data() + static_cast<size_t>(first) * per_group;
      for (Collective c : kCollectives) {
        const std::string link = c == Collective::kSendRecv
                                     ? LinkOf(hosts, {first, first + p / 2})
                                     : LinkOf(hosts, group);
        for (int64_t bytes : sizes) {
          const double whole =
              static_cast<double>(PartFloats(bytes, p) * p * sizeof(float));
          samples.push_back({link, c, {whole, p, *times++}});
        }
      }
    }
  }
  return samples;
}

}  // namespace ptrain
