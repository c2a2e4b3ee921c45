// Fused causal attention on bf16 tensor cores, for the CUDA backend's bf16
// compute: the scores and probabilities never leave the chip (registers,
// and one shared tile of dS^T in the backward). The
// forward keeps one float per query row for the backward (the row's
// log-sum-exp, base 2), not the (T,T) probabilities; the backward
// recomputes the probabilities tile by tile.
//
// Layouts are the Ops seam's (kernels/ops.h attention_forward): inp and
// dinp (B,T,NH+2·KVH,hs) fp32 (NH query heads, then KVH key heads, then
// KVH value heads a row; query head h reads key/value head h / (NH/KVH),
// never a copy of it), out and dout (B,T,NH,hs) fp32. q, k, v and the
// probabilities enter the products as bf16; accumulation, the softmax
// statistics and every result are fp32.
#ifndef PTRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_
#define PTRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ptrain::kernels {

// Whether the fused kernels take heads of size hs (16, 32 or 64) on a GPU
// of compute capability `major`.x (8 or more: bf16 tensor cores).
bool FlashAttentionSupports(int hs, int major);

// out (B,T,NH,hs) = causal softmax(q k^T / sqrt(hs)) v, per query head
// (k, v its key/value head's), from qkv: inp rounded to bf16 (same layout,
// 16-byte aligned), into fp32 `out` or, rounded (nearest even), bf16
// `out_bf16` (the other null); lse (B,NH,T) receives each query row's
// log2-sum-exp of the scaled scores.
void FlashAttentionForward(float* out, __nv_bfloat16* out_bf16, float* lse,
                           const __nv_bfloat16* qkv, int B, int T, int NH,
                           int KVH, int hs, cudaStream_t stream);

// How the backward makes q's gradient. kAtomic: in the walk over the
// query tiles that makes dk and dv (one block per 64 keys of a key/value
// head, over its group's query heads one after the other), each block's
// share of every query row it sees is added atomically (one float4 an
// atomic on sm_90). kSecondPass: a second kernel, one block per 64 query
// rows, recomputes the scores and their gradient over the keys the mask
// leaves and writes dq once, without atomics: seven products of a key tile
// with a query tile instead of five, on fewer registers and without the
// shared dS^T.
enum class FlashDq { kAtomic, kSecondPass };
// The one the backend takes, unless PTRAIN_CUDA_FLASH_DQ says `atomic` or
// `pass` (FlashDqFromEnv; any other value is refused).
constexpr FlashDq kFlashDqDefault = FlashDq::kSecondPass;
FlashDq FlashDqFromEnv();

// dinp (laid out as qkv) = the gradients of q, k and v (written, not added
// to: nothing needs zeroing before; a key/value head's the sum over its
// group's query heads, in a fixed order), from dout (fp32), the forward's
// out (fp32 `out` or bf16 `out_bf16`, the other null) and lse, and qkv as
// in the forward. delta (B,NH,T) and dout_bf16 (dout's size, 16-byte
// aligned; dout rounded) are scratch.
void FlashAttentionBackward(float* dinp, float* delta, __nv_bfloat16* dout_bf16,
                            const float* dout, const float* out,
                            const __nv_bfloat16* out_bf16,
                            const __nv_bfloat16* qkv, const float* lse, int B,
                            int T, int NH, int KVH, int hs, FlashDq mode,
                            cudaStream_t stream);

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_CUDA_FLASH_ATTENTION_H_
