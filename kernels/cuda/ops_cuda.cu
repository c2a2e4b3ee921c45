// The CUDA backend (kernels/backends.h): the backend's lifetime, memory and
// copies, and the module's entry points. Each op family's kernels and the
// methods that launch them are in their own source (ops_cuda_impl.h lists
// them); per-element formulas from kernels/common/math.h.
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

#include "kernels/cuda/ops_cuda_impl.h"

namespace ptrain::kernels::cuda_impl {

namespace {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

}  // namespace

CudaBackend::CudaBackend(const CudaOptions& o) : options_(o) {
  PT_CUDA_CHECK(cudaSetDevice(o.device));
  PT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  PT_CUDA_CHECK(cublasLtCreate(&lt_));
  PT_CUDA_CHECK(cublasCreate(&blas_));
  PT_CUDA_CHECK(cublasSetStream(blas_, stream_));
  PT_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  PT_CUDA_CHECK(cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes));
  PT_CUDA_CHECK(cudaMalloc(&sum_, (2 + 2 * kSumBlocks) * sizeof(double)));
  PT_CUDA_CHECK(cudaDeviceGetAttribute(
      &major_, cudaDevAttrComputeCapabilityMajor, o.device));
  int optin = 0;
  PT_CUDA_CHECK(cudaDeviceGetAttribute(
      &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, o.device));
  max_shared_ = std::max(max_shared_, static_cast<size_t>(optin));
  compute_ = o.bf16_compute ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device);
  cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    for (auto& [k, event] : copy_done_) cudaEventDestroy(event);
    cudaStreamDestroy(copy_stream_);
  }
  if (comm_stream_ != nullptr) {
    cudaStreamSynchronize(comm_stream_);
    cudaStreamDestroy(comm_stream_);
  }
  if (times_.enabled()) times_.Print();
  cudaFree(scratch_.p);
  cudaFree(moe_floats_.p);
  cudaFree(moe_ints_.p);
  for (GrowOnly<__nv_bfloat16>& b : bf16_) cudaFree(b.p);
  for (GrowOnly<float>& b : unpacked_) cudaFree(b.p);
  cudaFree(adam_runs_.dev.p);
  cudaFree(norm_runs_.dev.p);
  cudaFree(embed_rows_.p);
  cudaFree(embed_positions_.p);
  cudaFree(embed_sort_temp_.p);
  cudaFree(sum_);
  cudaFree(workspace_);
  cublasDestroy(blas_);
  cublasLtDestroy(lt_);
  cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, options_.device);
  return std::string("cuda:") + std::to_string(options_.device) + " (" +
         prop.name + (options_.bf16_compute ? ", bf16 compute)" : ", fp32)");
}

float* CudaBackend::Alloc(int64_t n) {
  if (Refused("Alloc")) return nullptr;
  float* p = nullptr;
  PT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  PT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  return p;
}

void CudaBackend::Free(float* p) {
  if (Refused("Free")) return;
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PT_CUDA_CHECK(cudaFree(p));
}

int32_t* CudaBackend::AllocTokens(int64_t n) {
  if (Refused("AllocTokens")) return nullptr;
  int32_t* p = nullptr;
  PT_CUDA_CHECK(cudaMalloc(&p, n * sizeof(int32_t)));
  return p;
}

void CudaBackend::FreeTokens(int32_t* p) {
  if (Refused("FreeTokens")) return;
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  PT_CUDA_CHECK(cudaFree(p));
}

const int32_t* CudaBackend::StageTokens(int32_t* staging, const int32_t* host,
                                        int64_t n) {
  if (Refused("StageTokens")) return staging;
  // Synchronous: the caller may reuse its host buffer at once.
  PT_CUDA_CHECK(cudaMemcpyAsync(staging, host, n * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return staging;
}

void CudaBackend::ToHost(float* host, const float* src, int64_t n) {
  if (Refused("ToHost")) return;
  PT_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float),
                                cudaMemcpyDeviceToHost, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::FromHost(float* dst, const float* host, int64_t n) {
  if (Refused("FromHost")) return;
  PT_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float),
                                cudaMemcpyHostToDevice, stream_));
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

float* CudaBackend::AllocHost(int64_t n) {
  if (Refused("AllocHost")) return nullptr;
  void* p = nullptr;
  if (cudaHostAlloc(&p, n * sizeof(float), cudaHostAllocDefault) !=
      cudaSuccess) {
    cudaGetLastError();  // the caller reports it
    return nullptr;
  }
  std::memset(p, 0, n * sizeof(float));
  return static_cast<float*>(p);
}

void CudaBackend::FreeHost(float* p) {
  if (Refused("FreeHost")) return;
  PT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (copy_stream_ != nullptr) {
    PT_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  }
  PT_CUDA_CHECK(cudaFreeHost(p));
}

cudaStream_t CudaBackend::CommStream() {
  if (comm_stream_ == nullptr) {
    int least = 0, greatest = 0;
    PT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    PT_CUDA_CHECK(cudaStreamCreateWithPriority(
        &comm_stream_, cudaStreamNonBlocking, greatest));
  }
  return comm_stream_;
}

cudaStream_t CudaBackend::CopyStreamAfterCompute() {
  if (copy_stream_ == nullptr) {
    PT_CUDA_CHECK(
        cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  }
  cudaEvent_t issued;
  PT_CUDA_CHECK(cudaEventCreateWithFlags(&issued, cudaEventDisableTiming));
  PT_CUDA_CHECK(cudaEventRecord(issued, stream_));
  PT_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, issued, 0));
  PT_CUDA_CHECK(cudaEventDestroy(issued));  // released once it has fired
  return copy_stream_;
}

int64_t CudaBackend::ToHostAsync(float* host, const float* src, int64_t n) {
  if (Refused("ToHostAsync")) return 0;
  cudaStream_t s = CopyStreamAfterCompute();
  PT_CUDA_CHECK(
      cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  cudaEvent_t done;
  PT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  PT_CUDA_CHECK(cudaEventRecord(done, s));
  copy_done_[++copies_] = done;
  return copies_;
}

void CudaBackend::FromHostAsync(float* dst, const float* host, int64_t n) {
  if (Refused("FromHostAsync")) return;
  cudaStream_t s = CopyStreamAfterCompute();
  PT_CUDA_CHECK(
      cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, s));
  ++copies_;
}

void CudaBackend::WaitCopy(int64_t k) {
  if (Refused("WaitCopy")) return;
  // Copies finish in the order issued: the newest event at or before k
  // stands for all of them.
  auto end = copy_done_.upper_bound(k);
  if (end == copy_done_.begin()) return;
  PT_CUDA_CHECK(cudaEventSynchronize(std::prev(end)->second));
  for (auto it = copy_done_.begin(); it != end; ++it) {
    PT_CUDA_CHECK(cudaEventDestroy(it->second));
  }
  copy_done_.erase(copy_done_.begin(), end);
}

void CudaBackend::ComputeAfterCopies() {
  if (Refused("ComputeAfterCopies")) return;
  if (copy_stream_ == nullptr) return;
  cudaEvent_t copied;
  PT_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  PT_CUDA_CHECK(cudaEventRecord(copied, copy_stream_));
  PT_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied, 0));
  PT_CUDA_CHECK(cudaEventDestroy(copied));
}

bool CudaBackend::IsDeviceMemory(const void* p) const {
  cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer: host memory
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}

void CudaBackend::Zero(float* p, int64_t n) {
  const OpScope scope(&times_, stream_, "Zero");
  PT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
}

void CudaBackend::Copy(float* dst, const float* src, int64_t n) {
  const OpScope scope(&times_, stream_, "Copy");
  if (dst == src) return;
  PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace ptrain::kernels::cuda_impl

namespace ptrain::kernels {

// The module's entry points (ops_cuda_loader.cpp finds them with dlsym).
extern "C" int ptrain_cuda_device_count() { return cuda_impl::DeviceCount(); }

extern "C" Ops* ptrain_cuda_make_ops(const CudaOptions* options,
                                     std::string* error) {
  const int n = cuda_impl::DeviceCount();
  if (options->device < 0 || options->device >= n) {
    *error = n == 0 ? "no CUDA device is present (no GPU, or no driver)"
                    : "CUDA device " + std::to_string(options->device) +
                          " does not exist (" + std::to_string(n) + " present)";
    return nullptr;
  }
  return new cuda_impl::CudaBackend(*options);
}

extern "C" int ptrain_cuda_capability(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 10 * major + minor;
}

extern "C" int64_t ptrain_cuda_total_memory(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<int64_t>(prop.totalGlobalMem);
}

extern "C" void ptrain_cuda_memory(int64_t* used, int64_t* total) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *used = *total = 0;
    return;
  }
  *used = static_cast<int64_t>(total_bytes - free_bytes);
  *total = static_cast<int64_t>(total_bytes);
}

}  // namespace ptrain::kernels
