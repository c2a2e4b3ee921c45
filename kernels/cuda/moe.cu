// The CUDA backend's Mixture-of-Experts ops (kernels/cpu/moe.cpp, the CPU
// twins, and kernels/cpu/kernels.h for their contracts): the router
// (scores, top-k, weights) and its backward, one thread a token; the
// balance and z losses, their sums per sequence on the device and their
// values on the host; the dispatch plan as counting passes, one block per
// expert, in token order without atomics (the plan is the CPU's, bit for
// bit); the permutations, one thread an element.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/math.h"
#include "kernels/common/moe_args.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

__global__ void RouterForwardKernel(int32_t* experts, float* weights,
                                    float* scores, const float* logits,
                                    const float* bias, int N, int E, int k,
                                    bool sigmoid, bool normalize) {
  ForEachIndex(N, [&](int64_t t) {
    const float* x = logits + t * E;
    float* s = scores + t * E;
    if (sigmoid) {
      for (int e = 0; e < E; e++) s[e] = 1.0f / (1.0f + expf(-x[e]));
    } else {
      float m = x[0];
      for (int e = 1; e < E; e++) m = fmaxf(m, x[e]);
      float sum = 0;
      for (int e = 0; e < E; e++) {
        s[e] = expf(x[e] - m);
        sum += s[e];
      }
      const float inv = 1.0f / sum;
      for (int e = 0; e < E; e++) s[e] *= inv;
    }
    int32_t* ex = experts + t * k;
    math::RouterTopK(ex, s, bias, E, k);
    const float inv = normalize ? 1.0f / math::RouterChosenSum(s, ex, k) : 1.0f;
    for (int j = 0; j < k; j++) weights[t * k + j] = s[ex[j]] * inv;
  });
}

__global__ void RouterBackwardKernel(float* dlogits, const float* dweights,
                                     const int32_t* experts,
                                     const float* scores, int N, int E, int k,
                                     math::RouterScore kind, bool normalize) {
  ForEachIndex(N, [&](int64_t t) {
    math::RouterBackwardRow(dlogits + t * E, dweights + t * k, experts + t * k,
                            scores + t * E, E, k, kind, normalize);
  });
}

// Per token: 1 (softmax) or 1 / Σ_e scores (sigmoid, normalised).
__global__ void ScoreNormKernel(float* inv, const float* scores, int N, int E,
                                bool sigmoid) {
  ForEachIndex(N, [&](int64_t t) {
    if (!sigmoid) {
      inv[t] = 1.0f;
      return;
    }
    float sum = 0;
    for (int e = 0; e < E; e++) sum += scores[t * E + e];
    inv[t] = 1.0f / (sum + static_cast<float>(math::kRouterNormEps));
  });
}

// One block a segment, its threads over the experts: the pairs naming each
// (unless given) and the sum of its normalised scores, in token order.
__global__ void AuxSumsKernel(float* counts, float* probs, bool count,
                              const float* scores, const float* inv,
                              const int32_t* experts, int segment, int E,
                              int k) {
  const int64_t seg = blockIdx.x, t0 = seg * segment;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    double n = 0, p = 0;
    for (int64_t t = t0; t < t0 + segment; t++) {
      p += double(scores[t * E + e]) * inv[t];
      if (!count) continue;
      for (int j = 0; j < k; j++) n += experts[t * k + j] == e ? 1 : 0;
    }
    if (count) counts[seg * E + e] = static_cast<float>(n);
    probs[seg * E + e] = static_cast<float>(p);
  }
}

// dlogits += the balance loss's gradient: a_e = dloss·coef·E·f_e / L per
// token of its segment, through the scores.
__global__ void AuxGradKernel(float* dlogits, const float* scores,
                              const float* inv, const float* counts, float coef,
                              float dloss, int N, int segment, int E, int k,
                              int length, bool sigmoid) {
  ForEachIndex(N, [&](int64_t t) {
    const float* c = counts + (t / segment) * E;
    const float* s = scores + t * E;
    const double L = length;
    const float scale = static_cast<float>(dloss * coef * E / (L * k) / L);
    float dot = 0;
    for (int e = 0; e < E; e++) dot += scale * c[e] * s[e] * inv[t];
    float* dx = dlogits + t * E;
    for (int e = 0; e < E; e++) {
      const float a = scale * c[e];
      dx[e] += sigmoid ? (a - dot) * inv[t] * s[e] * (1.0f - s[e])
                       : s[e] * (a - dot);
    }
  });
}

// lse2[t] = logsumexp(logits[t])²; dlogits += dloss·coef·(2/N)·lse·softmax.
__global__ void ZLossKernel(float* lse2, float* dlogits, const float* logits,
                            float coef, float dloss, int N, int E) {
  ForEachIndex(N, [&](int64_t t) {
    const float* x = logits + t * E;
    float m = x[0];
    for (int e = 1; e < E; e++) m = fmaxf(m, x[e]);
    float se = 0;
    for (int e = 0; e < E; e++) se += expf(x[e] - m);
    const float lse = m + logf(se);
    lse2[t] = lse * lse;
    if (dlogits == nullptr) return;
    const float g = dloss * coef * 2.0f * lse / static_cast<float>(N);
    for (int e = 0; e < E; e++) dlogits[t * E + e] += g * expf(x[e] - lse);
  });
}

// kept[i] for each pair: one thread a segment, counting its pairs per expert
// after `base`'s (seen: segments × E of scratch).
__global__ void KeptKernel(int32_t* kept, int32_t* seen, const int32_t* base,
                           const int32_t* experts, int segments, int segment,
                           int k, int E, int capacity) {
  ForEachIndex(segments, [&](int64_t s) {
    int32_t* n = seen + s * E;
    for (int e = 0; e < E; e++) n[e] = base != nullptr ? base[s * E + e] : 0;
    const int64_t end = (s + 1) * segment * int64_t{k};
    for (int64_t i = s * segment * int64_t{k}; i < end; i++) {
      kept[i] = capacity == 0 || n[experts[i]]++ < capacity ? 1 : 0;
    }
  });
}

// counts[e] = the kept pairs naming e: one block an expert.
__global__ void ExpertCountKernel(int32_t* counts, const int32_t* kept,
                                  const int32_t* experts, int64_t pairs) {
  const int e = blockIdx.x;
  int n = 0;
  for (int64_t i = threadIdx.x; i < pairs; i += blockDim.x) {
    n += kept[i] != 0 && experts[i] == e ? 1 : 0;
  }
  n = BlockReduce(n, SumOp{}, 0);
  if (threadIdx.x == 0) counts[e] = n;
}

__global__ void OffsetsKernel(int32_t* offsets, const int32_t* counts, int E) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  offsets[0] = 0;
  for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
}

// The flags' exclusive prefix sum over the block, and their total.
__device__ int BlockExclusiveScan(int flag, int* total) {
  __shared__ int warps[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_warps = blockDim.x / 32;
  int x = flag;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warps[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int w = lane < n_warps ? warps[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    warps[lane] = w;
  }
  __syncthreads();
  const int before = warp > 0 ? warps[warp - 1] : 0;
  *total = warps[n_warps - 1];
  __syncthreads();  // warps is read before the next call writes it
  return before + x - flag;
}

// One block an expert: its kept pairs' slots from offsets[e], in pair
// order, a tile of blockDim pairs at a time; order inverts them.
__global__ void SlotsKernel(int32_t* slots, int32_t* order,
                            const int32_t* offsets, const int32_t* kept,
                            const int32_t* experts, int64_t pairs) {
  const int e = blockIdx.x;
  int running = offsets[e];
  for (int64_t tile = 0; tile < pairs; tile += blockDim.x) {
    const int64_t i = tile + threadIdx.x;
    const int flag = i < pairs && kept[i] != 0 && experts[i] == e ? 1 : 0;
    int total = 0;
    const int rank = BlockExclusiveScan(flag, &total);
    if (flag) {
      slots[i] = running + rank;
      order[running + rank] = static_cast<int32_t>(i);
    }
    running += total;
  }
}

// The dropped pairs' slots, and the order's entries past the kept ones.
__global__ void DroppedKernel(int32_t* slots, int32_t* order,
                              const int32_t* kept, const int32_t* offsets,
                              int E, int64_t pairs) {
  ForEachIndex(pairs, [&](int64_t i) {
    if (kept[i] == 0) slots[i] = -1;
    if (i >= offsets[E]) order[i] = -1;
  });
}

__global__ void PermuteForwardKernel(float* out, const float* inp,
                                     const int32_t* order, int64_t n, int k,
                                     int C) {
  ForEachIndex(n, [&](int64_t i) {
    const int64_t s = i / C, c = i % C;
    out[i] = inp[int64_t{order[s] / k} * C + c];
  });
}

__global__ void PermuteBackwardKernel(float* dinp, const float* dout,
                                      const int32_t* slots, int64_t n, int k,
                                      int C) {
  ForEachIndex(n, [&](int64_t i) {
    const int64_t t = i / C, c = i % C;
    float d = 0;
    for (int j = 0; j < k; j++) {
      const int32_t s = slots[t * k + j];
      if (s >= 0) d += dout[int64_t{s} * C + c];
    }
    dinp[i] += d;
  });
}

__global__ void UnpermuteForwardKernel(float* out, const float* inp,
                                       const float* weights,
                                       const int32_t* slots, int64_t n, int k,
                                       int C) {
  ForEachIndex(n, [&](int64_t i) {
    const int64_t t = i / C, c = i % C;
    float o = 0;
    for (int j = 0; j < k; j++) {
      const int32_t s = slots[t * k + j];
      if (s >= 0) o += weights[t * k + j] * inp[int64_t{s} * C + c];
    }
    out[i] = o;
  });
}

// dinp row s = weight · dout row t for each kept pair (t, j) at slot s.
__global__ void UnpermuteBackwardRowsKernel(float* dinp, const float* dout,
                                            const float* weights,
                                            const int32_t* slots, int64_t n,
                                            int k, int C) {
  ForEachIndex(n, [&](int64_t i) {
    const int64_t pair = i / C, c = i % C;
    const int32_t s = slots[pair];
    if (s < 0) return;
    dinp[int64_t{s} * C + c] = weights[pair] * dout[(pair / k) * C + c];
  });
}

// dweights[pair] = dout row t · inp row s: one warp a pair.
__global__ void UnpermuteBackwardWeightsKernel(float* dweights,
                                               const float* dout,
                                               const float* inp,
                                               const int32_t* slots,
                                               int64_t pairs, int k, int C) {
  const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t pair = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
       pair < pairs; pair += warps) {
    const int32_t s = slots[pair];
    float dot = 0;
    if (s >= 0) {
      const float* d = dout + (pair / k) * C;
      const float* y = inp + int64_t{s} * C;
      for (int c = lane; c < C; c += 32) dot += d[c] * y[c];
    }
    dot = WarpSum(dot);
    if (lane == 0) dweights[pair] = s >= 0 ? dot : 0.0f;
  }
}

}  // namespace

void CudaBackend::moe_router_forward(int32_t* experts, float* weights,
                                     float* scores, const float* logits,
                                     const float* bias, int N, int E, int k,
                                     math::RouterScore kind, bool normalize) {
  CheckRouterChoices(k, E);
  Run("moe_router_forward", RouterForwardKernel, Blocks(N), experts, weights,
      scores, logits, bias, N, E, k, kind == math::RouterScore::kSigmoid,
      normalize);
}

void CudaBackend::moe_router_backward(float* dlogits, const float* dweights,
                                      const int32_t* experts,
                                      const float* scores, int N, int E, int k,
                                      math::RouterScore kind, bool normalize) {
  Run("moe_router_backward", RouterBackwardKernel, Blocks(N), dlogits, dweights,
      experts, scores, N, E, k, kind, normalize);
}

double CudaBackend::moe_aux_loss(float* dlogits, const float* scores,
                                 const int32_t* experts, float coef,
                                 float dloss, int N, int segment, int E, int k,
                                 math::RouterScore kind, const float* counts,
                                 int length) {
  if (N <= 0) return 0.0;
  PT_CHECK(segment > 0 && N % segment == 0, "aux-loss segments tile N");
  const int segments = N / segment;
  const bool sigmoid = kind == math::RouterScore::kSigmoid;
  if (counts == nullptr) length = segment;
  // Scratch: each token's score norm, then the counts and score sums.
  float* inv = Grow(&moe_floats_, int64_t{N} + 2 * int64_t{segments} * E);
  float* dev_counts = inv + N;
  float* probs = dev_counts + int64_t{segments} * E;
  Run("moe_aux_loss", ScoreNormKernel, Blocks(N), inv, scores, N, E, sigmoid);
  if (counts != nullptr) {
    FromHost(dev_counts, counts, int64_t{segments} * E);
  }
  OpScope scope(&times_, stream_, "moe_aux_loss");
  AuxSumsKernel<<<segments, kThreads, 0, stream_>>>(
      dev_counts, probs, counts == nullptr, scores, inv, experts, segment, E,
      k);
  Launched();
  if (dlogits != nullptr) {
    AuxGradKernel<<<Blocks(N), kThreads, 0, stream_>>>(
        dlogits, scores, inv, dev_counts, coef, dloss, N, segment, E, k, length,
        sigmoid);
    Launched();
  }
  std::vector<float> host(2 * int64_t{segments} * E);
  ToHost(host.data(), dev_counts, static_cast<int64_t>(host.size()));
  const double L = length;
  double sum = 0;
  for (int s = 0; s < segments; s++) {
    double aux = 0;
    for (int e = 0; e < E; e++) {
      aux += host[s * E + e] / (L * k) *
             (host[int64_t{segments} * E + s * E + e] / L);
    }
    sum += coef * E * aux;
  }
  return sum;
}

double CudaBackend::moe_z_loss(float* dlogits, const float* logits, float coef,
                               float dloss, int N, int E) {
  if (N <= 0) return 0.0;
  float* lse2 = Grow(&moe_floats_, N);
  Run("moe_z_loss", ZLossKernel, Blocks(N), lse2, dlogits, logits, coef, dloss,
      N, E);
  return coef * Sum(lse2, N) / N;
}

int64_t CudaBackend::moe_dispatch_plan(int32_t* slots, int32_t* order,
                                       int32_t* counts, int32_t* offsets,
                                       int32_t* host_offsets,
                                       const int32_t* experts, int N, int k,
                                       int E, int capacity, int segment,
                                       const int32_t* base) {
  const int64_t pairs = int64_t{N} * k;
  segment = DispatchSegment(N, k, capacity, segment);
  const int segments = N / segment;
  // Scratch: kept (pairs), seen and the base (segments × E each).
  int32_t* kept = Grow(&moe_ints_, pairs + 2 * int64_t{segments} * E);
  int32_t* seen = kept + pairs;
  int32_t* dev_base = seen + int64_t{segments} * E;
  if (base != nullptr) {
    FromHost(reinterpret_cast<float*>(dev_base),
             reinterpret_cast<const float*>(base), int64_t{segments} * E);
  }
  OpScope scope(&times_, stream_, "moe_dispatch_plan");
  KeptKernel<<<Blocks(segments), kThreads, 0, stream_>>>(
      kept, seen, base != nullptr ? dev_base : nullptr, experts, segments,
      segment, k, E, capacity);
  ExpertCountKernel<<<E, kThreads, 0, stream_>>>(counts, kept, experts, pairs);
  OffsetsKernel<<<1, 32, 0, stream_>>>(offsets, counts, E);
  SlotsKernel<<<E, kThreads, 0, stream_>>>(slots, order, offsets, kept, experts,
                                           pairs);
  DroppedKernel<<<Blocks(pairs), kThreads, 0, stream_>>>(slots, order, kept,
                                                         offsets, E, pairs);
  Launched();
  ToHost(reinterpret_cast<float*>(host_offsets),
         reinterpret_cast<const float*>(offsets), E + 1);
  return pairs - host_offsets[E];
}

void CudaBackend::moe_permute_forward(float* out, const float* inp,
                                      const int32_t* order, int M, int k,
                                      int C) {
  const int64_t n = int64_t{M} * C;
  Run("moe_permute_forward", PermuteForwardKernel, Blocks(n), out, inp, order,
      n, k, C);
}

void CudaBackend::moe_permute_backward(float* dinp, const float* dout,
                                       const int32_t* slots, int N, int k,
                                       int C) {
  const int64_t n = int64_t{N} * C;
  Run("moe_permute_backward", PermuteBackwardKernel, Blocks(n), dinp, dout,
      slots, n, k, C);
}

void CudaBackend::moe_unpermute_forward(float* out, const float* inp,
                                        const float* weights,
                                        const int32_t* slots, int N, int k,
                                        int C) {
  const int64_t n = int64_t{N} * C;
  Run("moe_unpermute_forward", UnpermuteForwardKernel, Blocks(n), out, inp,
      weights, slots, n, k, C);
}

void CudaBackend::moe_unpermute_backward(float* dinp, float* dweights,
                                         const float* dout, const float* inp,
                                         const float* weights,
                                         const int32_t* slots, int N, int k,
                                         int C) {
  const int64_t pairs = int64_t{N} * k, n = pairs * C;
  Run("moe_unpermute_backward", UnpermuteBackwardRowsKernel, Blocks(n), dinp,
      dout, weights, slots, n, k, C);
  Run("moe_unpermute_backward", UnpermuteBackwardWeightsKernel,
      Blocks(pairs * 32), dweights, dout, inp, slots, pairs, k, C);
}

}  // namespace ptrain::kernels::cuda_impl
