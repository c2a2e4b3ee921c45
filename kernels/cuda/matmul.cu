// The CUDA backend's matmuls (kernels/cpu/matmul.cpp) through cuBLASLt,
// the bias as an epilogue; under bf16 compute on operands rounded to bf16.
#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

#include "kernels/common/math.h"
#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

// fp32 -> bf16, rounded to nearest even: a matmul's or the fused
// attention's input under bf16 compute; kGelu: GELU(x) rounded, the MLP
// projection's input computed as it is rounded (no fp32 GELU pass). The
// first kVec * nv elements kVec at a thread step (16-byte loads; `in`
// 16-byte and `out` 8-byte (fp32 in) or 16-byte (bf16 in) aligned when
// nv > 0), the rest one by one.
template <bool kGelu>
__device__ __forceinline__ float Prepare(float x) {
  return kGelu ? math::GeluFromExp(x, expf(math::GeluExponent(x))) : x;
}
// S: the input's type, float or bf16 (a stored fch).
template <typename S>
constexpr int64_t kVec = std::is_same_v<S, float> ? 4 : 8;
template <bool kGelu, typename S>
__global__ void ToBf16Kernel(__nv_bfloat16* out, const S* in, int64_t n,
                             int64_t nv) {
  ForEachIndex(nv, [&](int64_t i) {
    if constexpr (std::is_same_v<S, float>) {
      const float4 v = reinterpret_cast<const float4*>(in)[i];
      auto* o = reinterpret_cast<__nv_bfloat162*>(out) + 2 * i;
      o[0] = __floats2bfloat162_rn(Prepare<kGelu>(v.x), Prepare<kGelu>(v.y));
      o[1] = __floats2bfloat162_rn(Prepare<kGelu>(v.z), Prepare<kGelu>(v.w));
    } else {
      const uint4 raw = reinterpret_cast<const uint4*>(in)[i];
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
      uint4 res;
      auto* o = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 f = __bfloat1622float2(h[k]);
        o[k] = __floats2bfloat162_rn(Prepare<kGelu>(f.x), Prepare<kGelu>(f.y));
      }
      reinterpret_cast<uint4*>(out)[i] = res;
    }
  });
  const int64_t done = kVec<S> * nv;
  ForEachIndex(n - done, [&](int64_t i) {
    out[done + i] = __float2bfloat16_rn(Prepare<kGelu>(Load(in + done + i)));
  });
}

__global__ void FromBf16Kernel(float* out, const __nv_bfloat16* in, int64_t n) {
  ForEachIndex(n, [&](int64_t i) { out[i] = __bfloat162float(in[i]); });
}

// The largest power of two (up to 256 bytes) p is aligned to: 2 for a
// bf16 tensor at an odd element (a weight of the bf16 compute copy where a
// width is odd).
int Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (int align : {256, 128, 64, 32, 16, 8, 4}) {
    if (a % align == 0) return align;
  }
  return 2;
}

// The heuristic's algorithm for `desc` over the layouts, with operands of
// these alignments (bytes) and `workspace` bytes; none where no kernel takes
// a DGELU epilogue (`dgelu`: the caller does without it).
std::optional<cublasLtMatmulAlgo_t> BestAlgo(
    cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
    cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, uint32_t aa,
    uint32_t ab, uint32_t ad, size_t workspace, bool dgelu) {
  cublasLtMatmulPreference_t pref;
  PT_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = workspace;
  PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
  PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
  PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
  PT_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      lt, desc, la, lb, ld, ld, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (dgelu && (status != CUBLAS_STATUS_SUCCESS || found == 0)) {
    // No kernel takes the DGELU epilogue here: the caller does without.
    found = 0;
  } else {
    PT_CUDA_CHECK(status);
    PT_CHECK(found > 0, "cuBLASLt has no algorithm for a matmul");
  }
  if (found == 0) return std::nullopt;
  return result.algo;
}

}  // namespace

void CudaBackend::matmul_forward(Act out, ConstAct inp, ConstAct weight,
                                 const float* bias, int B, int T, int C,
                                 int OC) {
  const OpScope scope(&times_, stream_, "matmul_forward");
  const int64_t BT = static_cast<int64_t>(B) * T;
  // A bf16 output (qkv, fch) is written by cuBLASLt as it rounds.
  const Dst y{out.p, Bf16Storage(out) ? CUDA_R_16BF : CUDA_R_32F};
  // Column-major: out^T (OC,BT) = weight (C,OC)^T inp^T (C,BT).
  Matmul(true, false, OC, BT, C, Operand(weight, int64_t(C) * OC, 0), C,
         Operand(inp, BT * C, 1), C, 0.0f, y, OC, bias);
}

void CudaBackend::matmul_backward(float* dinp, float* dweight, float* dbias,
                                  ConstAct dout, ConstAct inp, ConstAct weight,
                                  int B, int T, int C, int OC) {
  const OpScope scope(&times_, stream_, "matmul_backward");
  const int64_t BT = static_cast<int64_t>(B) * T;
  // The input is an operand of the weight gradient only.
  MatmulBackward(dinp, dweight, dbias, dout,
                 dweight != nullptr ? Operand(inp, BT * C, 2) : Op{}, weight,
                 BT, C, OC);
}

void CudaBackend::gelu_matmul_forward(float* out, float* hidden, float* saved,
                                      ConstAct inp, ConstAct weight,
                                      const float* bias, int B, int T, int C,
                                      int OC) {
  if (!options_.bf16_compute) {
    Ops::gelu_matmul_forward(out, hidden, saved, inp, weight, bias, B, T, C,
                             OC);
    return;
  }
  // GELU as the input is rounded: `hidden` is left alone. The rounded
  // operand goes into `saved` (gelu_saved_floats) for the backward's weight
  // gradient, where the stage keeps it.
  const OpScope scope(&times_, stream_, "gelu_matmul_forward");
  const int64_t BT = static_cast<int64_t>(B) * T;
  Matmul(true, false, OC, BT, C, Operand(weight, int64_t(C) * OC, 0), C,
         GeluOperand(inp, BT * C, 1, saved), C, 0.0f, Dst{out, CUDA_R_32F}, OC,
         bias);
}

void CudaBackend::gelu_matmul_backward(Act dinp, float* dweight, float* dbias,
                                       const float* dout, float* hidden,
                                       const float* saved, ConstAct inp,
                                       ConstAct weight, int B, int T, int C,
                                       int OC) {
  if (!options_.bf16_compute) {
    Ops::gelu_matmul_backward(dinp, dweight, dbias, dout, hidden, saved, inp,
                              weight, B, T, C, OC);
    return;
  }
  const OpScope scope(&times_, stream_, "gelu_matmul_backward");
  const int64_t BT = static_cast<int64_t>(B) * T;
  const int64_t n = BT * C;
  const Op d = Operand(dout, BT * OC, 0);
  // The weight is an operand of the input gradient only.
  const Op w = dinp.p != nullptr ? Operand(weight, int64_t(C) * OC, 1) : Op{};
  // The gradient through GELU of a bf16-stored fch: cuBLASLt's DGELU
  // epilogue multiplies the product by GELU'(fch) (fch read as the
  // auxiliary input) and writes it rounded; where no algorithm takes it,
  // the product in fp32, then GELU's backward rounding as it writes.
  if (dinp.p == nullptr) {
    // The weight gradients only (Ops::matmul_backward).
  } else if (Bf16Storage(dinp)) {
    PT_CHECK(Bf16Storage(inp), "a bf16 GELU gradient of an fp32 input");
    if (!Matmul(false, false, C, BT, OC, w, C, d, OC, 0.0f,
                Dst{dinp.p, CUDA_R_16BF}, C, nullptr, inp.p)) {
      float* dgelu = Grow(&unpacked_[0], n);
      Matmul(false, false, C, BT, OC, w, C, d, OC, 0.0f, Dst{dgelu, CUDA_R_32F},
             C, nullptr);
      GeluBackwardInto(dinp, inp, dgelu, n);
    }
  } else {
    Matmul(false, false, C, BT, OC, w, C, d, OC, 0.0f, Dst{dinp.p, CUDA_R_32F},
           C, nullptr);
    GeluBackwardInto(dinp, inp, dinp.f32(), n);
  }
  if (dweight != nullptr) {
    // GELU(fch) rounded as the forward left it, else again.
    const Op g =
        saved != nullptr ? Op{saved, CUDA_R_16BF} : GeluOperand(inp, n, 2);
    WeightGradients(dweight, dbias, dout, d, g, BT, C, OC);
  }
}

void CudaBackend::MatmulBackward(float* dinp, float* dweight, float* dbias,
                                 ConstAct dout, Op in, ConstAct weight,
                                 int64_t BT, int C, int OC) {
  // dout is rounded once for both products (a bf16-stored one taken as it
  // is).
  const Op d = Operand(dout, BT * OC, 0);
  // dinp^T (C,BT) = weight^T... in column-major: (C,OC) (OC,BT).
  if (dinp != nullptr) {
    Matmul(false, false, C, BT, OC, Operand(weight, int64_t(C) * OC, 1), C, d,
           OC, 0.0f, Dst{dinp, CUDA_R_32F}, C, nullptr);
  }
  WeightGradients(dweight, dbias, dout, d, in, BT, C, OC);
}

void CudaBackend::WeightGradients(float* dweight, float* dbias, ConstAct dout,
                                  Op d, Op in, int64_t BT, int C, int OC) {
  if (dweight == nullptr) return;  // the input gradient only
  // dweight^T (C,OC) += inp^T (C,BT) dout (BT,OC).
  Matmul(false, true, C, OC, BT, in, C, d, OC, 1.0f, Dst{dweight, CUDA_R_32F},
         C, nullptr);
  if (dbias != nullptr) {
    ColumnSums(nullptr, dbias, dout, nullptr, nullptr, nullptr, BT, OC);
  }
}

const float* CudaBackend::AsF32(ConstAct x, int64_t n, int slot) {
  if (!Bf16Storage(x)) return x.f32();
  float* f = Grow(&unpacked_[slot], n);
  FromBf16Kernel<<<Blocks(n), kThreads, 0, stream_>>>(
      f, static_cast<const __nv_bfloat16*>(x.p), n);
  Launched();
  return f;
}

float* CudaBackend::F32Target(Act out, int64_t n, int slot) {
  return Bf16Storage(out) ? Grow(&unpacked_[slot], n) : out.f32();
}

void CudaBackend::Finish(Act out, const float* y, int64_t n) {
  if (!Bf16Storage(out)) return;
  Rounded<false>(y, n, /*slot=*/0, out.p);  // into out: no slot is used
}

CudaBackend::Op CudaBackend::Operand(ConstAct x, int64_t n, int slot) {
  // Stored in bf16: the operand as it is.
  if (Bf16Storage(x)) return {x.p, CUDA_R_16BF};
  if (!options_.bf16_compute) return {x.p, CUDA_R_32F};
  return Rounded<false>(x.f32(), n, slot);
}

CudaBackend::Op CudaBackend::GeluOperand(ConstAct x, int64_t n, int slot,
                                         void* into) {
  PT_CHECK(options_.bf16_compute, "GELU operands are bf16 compute's");
  if (Bf16Storage(x)) {
    return Rounded<true>(static_cast<const __nv_bfloat16*>(x.p), n, slot, into);
  }
  return Rounded<true>(x.f32(), n, slot, into);
}

template <bool kGelu, typename S>
CudaBackend::Op CudaBackend::Rounded(const S* x, int64_t n, int slot,
                                     void* into) {
  __nv_bfloat16* copy = into != nullptr ? static_cast<__nv_bfloat16*>(into)
                                        : Grow(&bf16_[slot], n);
  // Four floats or eight bf16 values at a time where aligned.
  const bool fp32 = std::is_same_v<S, float>;
  const int64_t nv =
      reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(copy) % (fp32 ? 8 : 16) == 0
          ? n / kVec<S>
          : 0;
  ToBf16Kernel<kGelu, S>
      <<<Blocks(nv > 0 ? nv : n), kThreads, 0, stream_>>>(copy, x, n, nv);
  Launched();
  return {copy, CUDA_R_16BF};
}

bool CudaBackend::Matmul(bool trans_a, bool trans_b, int64_t m, int64_t n,
                         int64_t k, Op A, int64_t lda, Op B, int64_t ldb,
                         float beta, Dst D, int64_t ldd, const float* bias,
                         const void* dgelu) {
  // bf16 operands compute in fp32; fp32 ones as configured.
  const cublasComputeType_t compute =
      A.type == CUDA_R_16BF ? CUBLAS_COMPUTE_32F : compute_;
  // A bias is of D's type (cuBLASLt's rule): a bf16 D takes it rounded.
  const void* bias_p = bias;
  if (bias != nullptr && D.type == CUDA_R_16BF) {
    __nv_bfloat16* b16 = Grow(&bias16_, m);
    ToBf16Kernel<false, float>
        <<<Blocks(m), kThreads, 0, stream_>>>(b16, bias, m, /*n4=*/0);
    Launched();
    bias_p = b16;
  }
  cublasLtMatmulDesc_t desc;
  PT_CUDA_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
      desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias != nullptr) {
    epilogue = CUBLASLT_EPILOGUE_BIAS;
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_p, sizeof(bias_p)));
  }
  if (dgelu != nullptr) {
    // GELU's input, laid out as D (of D's type).
    PT_CHECK(bias == nullptr, "a DGELU epilogue with a bias");
    epilogue = CUBLASLT_EPILOGUE_DGELU;
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dgelu,
        sizeof(dgelu)));
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldd, sizeof(ldd)));
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    PT_CUDA_CHECK(cublasLtMatmulDescSetAttribute(
        desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&la, A.type, trans_a ? k : m,
                                           trans_a ? m : k, lda));
  PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&lb, B.type, trans_b ? n : k,
                                           trans_b ? k : n, ldb));
  PT_CUDA_CHECK(cublasLtMatrixLayoutCreate(&ld, D.type, m, n, ldd));

  const int aux_align = dgelu != nullptr ? Alignment(dgelu) : 0;
  const AlgoKey key{trans_a,
                    trans_b,
                    m,
                    n,
                    k,
                    lda,
                    ldb,
                    ldd,
                    Alignment(A.p),
                    Alignment(B.p),
                    Alignment(D.p),
                    bias_p != nullptr ? Alignment(bias_p) : 0,
                    aux_align,
                    beta != 0.0f,
                    A.type,
                    D.type,
                    static_cast<int>(epilogue)};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    it = algos_
             .emplace(key, BestAlgo(lt_, desc, la, lb, ld, Alignment(A.p),
                                    Alignment(B.p), Alignment(D.p),
                                    kWorkspaceBytes, dgelu != nullptr))
             .first;
  }
  if (it->second.has_value()) {
    const float alpha = 1.0f;
    PT_CUDA_CHECK(cublasLtMatmul(lt_, desc, &alpha, A.p, la, B.p, lb, &beta,
                                 D.p, ld, D.p, ld, &*it->second, workspace_,
                                 kWorkspaceBytes, stream_));
  }
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
  return it->second.has_value();
}

}  // namespace ptrain::kernels::cuda_impl
