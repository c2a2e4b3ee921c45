// The CUDA backend's softmax and cross-entropy over the vocabulary
// (kernels/cpu/crossentropy.cpp), whole or split by vocabulary columns.
#include <cmath>
#include <cstdint>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

// One block per row.
__global__ void CrossEntropyMaxKernel(float* maxes, const float* logits, int Vl,
                                      int vocab_begin, int V) {
  const int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  const int real = V - vocab_begin < Vl ? V - vocab_begin : Vl;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < real; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = BlockReduce(mx, MaxOp(), -INFINITY);
  if (threadIdx.x == 0) maxes[r] = mx;
}

__global__ void CrossEntropyExpKernel(float* sums, float* target_shifted,
                                      float* probs, const float* logits,
                                      const float* maxes,
                                      const int32_t* targets, int Vl,
                                      int vocab_begin, int V) {
  const int64_t r = blockIdx.x;
  const float* l = logits + r * Vl;
  float* p = probs + r * Vl;
  const float mx = maxes[r];
  const int real = V - vocab_begin < Vl ? V - vocab_begin : Vl;
  // The target's logit is read before probs (which may alias logits) is
  // written.
  if (threadIdx.x == 0) {
    const int t = targets[r] - vocab_begin;
    target_shifted[r] = t >= 0 && t < Vl ? l[t] - mx : 0.0f;
  }
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    const float e = j < real ? expf(l[j] - mx) : 0.0f;
    p[j] = e;
    sum += e;
  }
  sum = BlockReduce(sum, SumOp(), 0.0f);
  if (threadIdx.x == 0) sums[r] = sum;
}

__global__ void CrossEntropyFinishKernel(float* losses, float* probs,
                                         const float* sums,
                                         const float* target_shifted, int Vl) {
  const int64_t r = blockIdx.x;
  float* p = probs + r * Vl;
  const float inv = 1.0f / sums[r];
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) p[j] *= inv;
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sums[r], target_shifted[r]);
  }
}

// The three steps in one block per row and three passes over it (two
// reads, one write): each thread keeps a running maximum and the sum of
// exponentials relative to it, and the block combines them. kGradient:
// the write pass leaves (probability - onehot) * dloss instead, the fused
// classifier (Ops::crossentropy_forward_backward), in the CPU's order of
// operations (p * dloss, then dloss off the target's). L: the logits'
// type, float or bf16 (read as their values, the gradient rounded as it is
// written over them).
template <bool kGradient, typename L>
__global__ void CrossEntropyForwardKernel(float* losses, L* probs,
                                          const L* logits,
                                          const int32_t* targets, int Vl, int V,
                                          float dloss) {
  const int64_t r = blockIdx.x;
  const L* l = logits + r * Vl;
  L* p = probs + r * Vl;
  const int real = V < Vl ? V : Vl;
  // The target's logit is read before probs (which may alias logits) is
  // written; the block's reductions order the two.
  const int t = targets[r];
  const float target = threadIdx.x == 0 ? Load(l + t) : 0.0f;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < real; j += blockDim.x) {
    const float x = Load(l + j);
    if (x > m) {
      s = s * expf(m - x) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
  }
  const float mx = BlockReduce(m, MaxOp(), -INFINITY);
  const float sum =
      BlockReduce(m == -INFINITY ? 0.0f : s * expf(m - mx), SumOp(), 0.0f);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    const float q = j < real ? expf(Load(l + j) - mx) * inv : 0.0f;
    if (kGradient) {
      float d = q * dloss;
      if (j == t) d -= dloss;
      Store(p + j, d);
    } else {
      Store(p + j, q);
    }
  }
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sum, target - mx);
  }
}

// 16 bytes of a row: 8 bf16 or 4 floats, as floats and back (bf16 rounded
// to nearest even).
template <typename L>
struct Vec16 {
  static constexpr int kN = 16 / sizeof(L);
};
__device__ __forceinline__ void Unpack(uint4 v, float* x, const float*) {
  x[0] = __uint_as_float(v.x);
  x[1] = __uint_as_float(v.y);
  x[2] = __uint_as_float(v.z);
  x[3] = __uint_as_float(v.w);
}
__device__ __forceinline__ void Unpack(uint4 v, float* x,
                                       const __nv_bfloat16*) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = __uint_as_float(w[i] << 16);
    x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 Pack(const float* x, const float*) {
  return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]),
                    __float_as_uint(x[2]), __float_as_uint(x[3]));
}
__device__ __forceinline__ uint4 Pack(const float* x, const __nv_bfloat16*) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// CrossEntropyForwardKernel's work with one read of the row: a block of
// kRowThreads holds its row in registers (kVecs 16-byte vectors a thread,
// loaded whole), takes the maximum, then the sum of exponentials, then
// writes the probabilities or the gradient from the values it holds. For
// rows 16-byte aligned whose length fits kVecs * kRowThreads vectors (a
// GPT-2 vocabulary of bf16 logits is 7 vectors a thread).
constexpr int kRowThreads = 1024;
template <bool kGradient, typename L, int kVecs>
__global__ void __launch_bounds__(kRowThreads)
    CrossEntropyRowKernel(float* losses, L* probs, const L* logits,
                          const int32_t* targets, int Vl, int V, float dloss) {
  constexpr int W = Vec16<L>::kN;
  const int64_t r = blockIdx.x;
  const uint4* in = reinterpret_cast<const uint4*>(logits + r * Vl);
  uint4* out = reinterpret_cast<uint4*>(probs + r * Vl);
  const int nv = Vl / W;
  const int real = V < Vl ? V : Vl;
  const int t = targets[r];
  // Read before any thread writes: the block's reductions order the two.
  const float target = threadIdx.x == 0 ? Load(logits + r * Vl + t) : 0.0f;
  uint4 held[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int v = threadIdx.x + i * kRowThreads;
    if (v < nv) held[i] = in[v];
  }
  // fn(v, x) for each vector v this thread holds, x its W values.
  auto for_each_held = [&](auto fn) {
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int v = threadIdx.x + i * kRowThreads;
      if (v >= nv) break;
      float x[W];
      Unpack(held[i], x, logits);
      fn(v, x);
    }
  };
  float m = -INFINITY;
  for_each_held([&](int v, const float* x) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (v * W + e < real) m = fmaxf(m, x[e]);
    }
  });
  const float mx = BlockReduce(m, MaxOp(), -INFINITY);
  float s = 0.0f;
  for_each_held([&](int v, const float* x) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (v * W + e < real) s += expf(x[e] - mx);
    }
  });
  const float sum = BlockReduce(s, SumOp(), 0.0f);
  const float inv = 1.0f / sum;
  for_each_held([&](int v, float* x) {
#pragma unroll
    for (int e = 0; e < W; ++e) {
      const int j = v * W + e;
      const float q = j < real ? expf(x[e] - mx) * inv : 0.0f;
      if (kGradient) {
        float d = q * dloss;
        if (j == t) d -= dloss;
        x[e] = d;
      } else {
        x[e] = q;
      }
    }
    out[v] = Pack(x, logits);
  });
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sum, target - mx);
  }
}

// crossentropy_parallel_finish and _backward in one pass over each row of
// the exponentials, in place.
__global__ void CrossEntropyFinishBackwardKernel(
    float* losses, float* exps, const float* sums, const float* target_shifted,
    const int32_t* targets, float dloss, int Vl, int vocab_begin) {
  const int64_t r = blockIdx.x;
  float* e = exps + r * Vl;
  const float inv = 1.0f / sums[r];
  const int t = targets[r] - vocab_begin;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    float d = (e[j] * inv) * dloss;
    if (j == t) d -= dloss;
    e[j] = d;
  }
  if (threadIdx.x == 0) {
    losses[r] = math::CrossEntropyLoss(sums[r], target_shifted[r]);
  }
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, float dloss,
                                           int64_t rows, int Vl,
                                           int vocab_begin) {
  const int64_t n = rows * Vl;
  ForEachIndex(n, [&](int64_t i) {
    const int64_t r = i / Vl;
    const int j = static_cast<int>(i % Vl);
    const float onehot = targets[r] - vocab_begin == j ? 1.0f : 0.0f;
    dlogits[i] = (probs[i] - onehot) * dloss;  // may be probs itself
  });
}

}  // namespace

template <bool kGradient, typename L>
void CudaBackend::ClassifierRows(const char* name, float* losses, L* probs,
                                 const L* logits, const int32_t* targets,
                                 int rows, int Vl, int V, float dloss) {
  constexpr int W = Vec16<L>::kN;
  const int vecs = (Vl / W + kRowThreads - 1) / kRowThreads;
  const bool aligned = Vl % W == 0 &&
                       reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(probs) % 16 == 0;
  if (!aligned || vecs > 8) {
    Run(name, CrossEntropyForwardKernel<kGradient, L>, rows, losses, probs,
        logits, targets, Vl, V, dloss);
    return;
  }
  const OpScope scope(&times_, stream_, name);
  auto launch = [&](auto kernel) {
    kernel<<<rows, kRowThreads, 0, stream_>>>(losses, probs, logits, targets,
                                              Vl, V, dloss);
  };
  if (vecs <= 1) {
    launch(CrossEntropyRowKernel<kGradient, L, 1>);
  } else if (vecs <= 2) {
    launch(CrossEntropyRowKernel<kGradient, L, 2>);
  } else if (vecs <= 4) {
    launch(CrossEntropyRowKernel<kGradient, L, 4>);
  } else {
    launch(CrossEntropyRowKernel<kGradient, L, 8>);
  }
  Launched();
}

void CudaBackend::crossentropy_parallel_max(float* maxes, const float* logits,
                                            int B, int T, int Vl,
                                            int vocab_begin, int V) {
  Run("crossentropy_parallel_max", CrossEntropyMaxKernel, B * T, maxes, logits,
      Vl, vocab_begin, V);
}

void CudaBackend::crossentropy_parallel_exp(float* sums, float* target_shifted,
                                            float* probs, const float* logits,
                                            const float* maxes,
                                            const int32_t* targets, int B,
                                            int T, int Vl, int vocab_begin,
                                            int V) {
  Run("crossentropy_parallel_exp", CrossEntropyExpKernel, B * T, sums,
      target_shifted, probs, logits, maxes, targets, Vl, vocab_begin, V);
}

void CudaBackend::crossentropy_parallel_finish(float* losses, float* probs,
                                               const float* sums,
                                               const float* target_shifted,
                                               int B, int T, int Vl) {
  Run("crossentropy_parallel_finish", CrossEntropyFinishKernel, B * T, losses,
      probs, sums, target_shifted, Vl);
}

void CudaBackend::crossentropy_forward(float* losses, float* probs,
                                       const float* logits,
                                       const int32_t* targets, float* stats,
                                       int B, int T, int Vl, int V) {
  (void)stats;
  ClassifierRows<false>("crossentropy_forward", losses, probs, logits, targets,
                        B * T, Vl, V, 0.0f);
}

void CudaBackend::crossentropy_forward_backward(float* losses, Act logits,
                                                const int32_t* targets,
                                                float dloss, float* stats,
                                                int B, int T, int Vl, int V) {
  (void)stats;
  if (Bf16Storage(logits)) {
    auto* l = static_cast<__nv_bfloat16*>(logits.p);
    ClassifierRows<true>("crossentropy_forward_backward", losses, l, l, targets,
                         B * T, Vl, V, dloss);
    return;
  }
  ClassifierRows<true>("crossentropy_forward_backward", losses, logits.f32(),
                       logits.f32(), targets, B * T, Vl, V, dloss);
}

void CudaBackend::crossentropy_parallel_finish_backward(
    float* losses, float* exps, const float* sums, const float* target_shifted,
    const int32_t* targets, float dloss, int B, int T, int Vl,
    int vocab_begin) {
  Run("crossentropy_parallel_finish_backward", CrossEntropyFinishBackwardKernel,
      B * T, losses, exps, sums, target_shifted, targets, dloss, Vl,
      vocab_begin);
}

void CudaBackend::crossentropy_parallel_backward(float* dlogits,
                                                 const float* probs,
                                                 const int32_t* targets,
                                                 float dloss, int B, int T,
                                                 int Vl, int vocab_begin) {
  const int64_t rows = static_cast<int64_t>(B) * T;
  Run("crossentropy_parallel_backward", CrossEntropyBackwardKernel,
      Blocks(rows * Vl), dlogits, probs, targets, dloss, rows, Vl, vocab_begin);
}

}  // namespace ptrain::kernels::cuda_impl
