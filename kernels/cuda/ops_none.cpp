// The CUDA backend where it is not built (PT_CUDA=OFF, or no nvcc): every
// request says so.
#include "kernels/cuda/ops_cuda.h"

namespace ptrain::kernels {

int CudaDeviceCount() { return 0; }

std::unique_ptr<Ops> MakeCudaOps(const CudaOptions&, std::string* error) {
  *error =
      "this ptrain is built without the CUDA backend (configure with "
      "-DPT_CUDA=ON where nvcc is installed)";
  return nullptr;
}

CudaMemory CudaMemoryInfo() { return {}; }

}  // namespace ptrain::kernels
