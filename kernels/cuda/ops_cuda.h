// The CUDA backend of the Ops seam (kernels/ops.h): the same ops on one
// GPU's memory, in fp32 storage, on one stream. Matmuls (cuBLASLt, with the
// bias as an epilogue) and attention's batched products (cuBLAS) compute in
// fp32 or, with bf16 compute, on bf16 tensor cores with fp32 accumulation.
// Reductions that scatter (embedding and LayerNorm weight gradients) use
// atomics: their order, and so their last bits, vary from run to run.
#ifndef PTRAIN_KERNELS_CUDA_OPS_CUDA_H_
#define PTRAIN_KERNELS_CUDA_OPS_CUDA_H_

#include <memory>
#include <string>

#include "kernels/ops.h"

namespace ptrain::kernels {

struct CudaOptions {
  int device = 0;
  // Matmul compute: false for fp32, true for bf16 tensor cores (inputs
  // rounded to bf16, fp32 accumulation and output).
  bool bf16_compute = false;
};

// Devices the CUDA runtime sees (0 without a driver or GPU, or when the
// backend is not built).
int CudaDeviceCount();

// The backend on options.device; null with *error set when there is no such
// device or the backend is not built (PT_CUDA=OFF or no nvcc).
std::unique_ptr<Ops> MakeCudaOps(const CudaOptions& options,
                                 std::string* error);

// Bytes of the device's memory in use by this process and in total.
struct CudaMemory {
  int64_t used = 0, total = 0;
};
CudaMemory CudaMemoryInfo();

}  // namespace ptrain::kernels

#endif  // PTRAIN_KERNELS_CUDA_OPS_CUDA_H_
