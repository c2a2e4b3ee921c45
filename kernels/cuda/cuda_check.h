// PT_CUDA_CHECK(call): a CUDA runtime call (or, where the file adds Ok and
// Why overloads for its status type, a cuBLAS or NCCL call) that must
// succeed; PT_CHECK's failure otherwise: file, line, the call and the
// library's reason. For the CUDA module's sources.
#ifndef PTRAIN_KERNELS_CUDA_CUDA_CHECK_H_
#define PTRAIN_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "common/check.h"

namespace ptrain::kernels {

inline bool Ok(cudaError_t e) { return e == cudaSuccess; }
inline const char* Why(cudaError_t e) { return cudaGetErrorString(e); }

}  // namespace ptrain::kernels

#define PT_CUDA_CHECK(call)                                             \
  do {                                                                  \
    const auto pt_status = (call);                                      \
    if (!Ok(pt_status)) {                                               \
      ::ptrain::CheckFailed(__FILE__, __LINE__, #call, Why(pt_status)); \
    }                                                                   \
  } while (0)

#endif  // PTRAIN_KERNELS_CUDA_CUDA_CHECK_H_
