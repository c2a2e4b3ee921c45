// MakeCudaOps and friends: the CUDA backend is a module (libptrain_cuda.so)
// opened on first use with RTLD_LOCAL, so that a binary that never trains on
// a GPU neither needs the CUDA libraries to start nor has their symbols in
// its namespace (cuBLAS's would otherwise interpose on other libraries').
// The module is looked for at $PTRAIN_CUDA_LIBRARY, beside the executable,
// in ../kernels/ from it (the build tree), then on the library path.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "common/module_path.h"
#include "kernels/backends.h"

namespace ptrain::kernels {

namespace {

constexpr char kModule[] = "libptrain_cuda.so";

struct Module {
  void* handle = nullptr;
  std::string error;
  int (*device_count)() = nullptr;
  Ops* (*make_ops)(const CudaOptions*, std::string*) = nullptr;
  void (*memory)(int64_t*, int64_t*) = nullptr;
  int (*capability)(int) = nullptr;
  int64_t (*total_memory)(int) = nullptr;
  bool (*nccl_unique_id)(std::string*, std::string*) = nullptr;
  DeviceCollectives* (*nccl_make)(Ops*, const std::string*, int, int,
                                  std::string*) = nullptr;
};

const Module& Load() {
  static Module* const module = [] {
    auto* m = new Module();
    if (!PT_HAVE_CUDA) {
      m->error =
          "this ptrain is built without the CUDA backend (configure with "
          "-DPT_CUDA=ON where nvcc is installed)";
      return m;
    }
    std::string tried;
    for (const std::string& path :
         ModuleCandidates("PTRAIN_CUDA_LIBRARY", kModule, "kernels")) {
      m->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (m->handle != nullptr) break;
      tried += std::string("\n  ") + dlerror();
    }
    if (m->handle == nullptr) {
      m->error = "cannot load the CUDA backend (" + std::string(kModule) +
                 " or the CUDA libraries it needs):" + tried;
      return m;
    }
    m->device_count = reinterpret_cast<int (*)()>(
        dlsym(m->handle, "ptrain_cuda_device_count"));
    m->make_ops = reinterpret_cast<Ops* (*)(const CudaOptions*, std::string*)>(
        dlsym(m->handle, "ptrain_cuda_make_ops"));
    m->memory = reinterpret_cast<void (*)(int64_t*, int64_t*)>(
        dlsym(m->handle, "ptrain_cuda_memory"));
    m->capability = reinterpret_cast<int (*)(int)>(
        dlsym(m->handle, "ptrain_cuda_capability"));
    m->total_memory = reinterpret_cast<int64_t (*)(int)>(
        dlsym(m->handle, "ptrain_cuda_total_memory"));
    m->nccl_unique_id = reinterpret_cast<bool (*)(std::string*, std::string*)>(
        dlsym(m->handle, "ptrain_nccl_unique_id"));
    m->nccl_make =
        reinterpret_cast<DeviceCollectives* (*)(Ops*, const std::string*, int,
                                                int, std::string*)>(
            dlsym(m->handle, "ptrain_nccl_make"));
    if (m->device_count == nullptr || m->make_ops == nullptr ||
        m->memory == nullptr || m->capability == nullptr ||
        m->total_memory == nullptr || m->nccl_unique_id == nullptr ||
        m->nccl_make == nullptr) {
      m->error = std::string(kModule) + " lacks its entry points";
      m->handle = nullptr;
    }
    return m;
  }();
  return *module;
}

}  // namespace

int CudaDeviceCount() {
  const Module& m = Load();
  return m.handle != nullptr ? m.device_count() : 0;
}

std::string CudaUnavailableReason() {
  if (CudaDeviceCount() > 0) return "";
  std::string why;
  MakeCudaOps({}, &why);  // device 0 does not exist: it says why
  return why;
}

std::string CudaCaptureUnsupported() {
  const Module& m = Load();
  if (m.handle == nullptr) return m.error;
  const char* times = std::getenv("PTRAIN_CUDA_OP_TIMES");
  return times != nullptr && std::string(times) == "1" ? kOpTimesRecordNoGraphs
                                                       : "";
}

std::unique_ptr<Ops> MakeCudaOps(const CudaOptions& options,
                                 std::string* error) {
  const Module& m = Load();
  if (m.handle == nullptr) {
    *error = m.error;
    return nullptr;
  }
  return std::unique_ptr<Ops>(m.make_ops(&options, error));
}

bool NcclUniqueId(std::string* id, std::string* error) {
  const Module& m = Load();
  if (m.handle == nullptr) {
    *error = m.error;
    return false;
  }
  return m.nccl_unique_id(id, error);
}

std::unique_ptr<DeviceCollectives> MakeNcclCollectives(Ops* backend,
                                                       const std::string& id,
                                                       int nranks, int rank,
                                                       std::string* error) {
  const Module& m = Load();
  if (m.handle == nullptr) {
    *error = m.error;
    return nullptr;
  }
  return std::unique_ptr<DeviceCollectives>(
      m.nccl_make(backend, &id, nranks, rank, error));
}

int CudaComputeCapability(int device) {
  const Module& m = Load();
  return m.handle != nullptr ? m.capability(device) : 0;
}

std::string Bf16Unsupported(int capability) {
  if (capability >= kBf16Capability) return "";
  return "this GPU has no bf16 tensor cores (compute capability " +
         (capability > 0 ? std::to_string(capability / 10) + "." +
                               std::to_string(capability % 10)
                         : std::string("unknown")) +
         "; bf16 needs 8.0 or newer)";
}

int64_t CudaTotalMemory(int device) {
  const Module& m = Load();
  return m.handle != nullptr ? m.total_memory(device) : 0;
}

CudaMemory CudaMemoryInfo() {
  const Module& m = Load();
  CudaMemory mem;
  if (m.handle != nullptr) m.memory(&mem.used, &mem.total);
  return mem;
}

}  // namespace ptrain::kernels
