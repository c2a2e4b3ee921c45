#include "worker/engine/train/rank_device.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/gpu_inventory.h"
#include "common/spec.h"
#include "kernels/backends.h"

namespace ptrain {

namespace {

// The GPU of every rank, in rank order, when ptcoord chose them
// (PTRAIN_RANK_GPUS, "2,3,0,1": indices as the node's driver numbers its
// GPUs); empty otherwise, when a node's ranks take its GPUs in turn.
constexpr char kRankGpusEnv[] = "PTRAIN_RANK_GPUS";
absl::StatusOr<std::vector<int>> RankGpus(int world, int gpus) {
  const char* v = std::getenv(kRankGpusEnv);
  std::vector<int> out;
  if (v == nullptr || *v == '\0') return out;
  for (absl::string_view part : absl::StrSplit(v, ',')) {
    int g = -1;
    if (!absl::SimpleAtoi(part, &g) || g < 0 || g >= gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat(kRankGpusEnv, "=", v, ": '", part,
                       "' is not a GPU of this node (0..", gpus - 1, ")"));
    }
    out.push_back(g);
  }
  if (static_cast<int>(out.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat(kRankGpusEnv, "=", v, ": ", out.size(),
                     " GPUs for a world of ", world, " ranks"));
  }
  return out;
}

}  // namespace

absl::StatusOr<int> RankGpu(const v1::JobSpec& spec, const ParallelDims& dims) {
  if (spec.resources().device() != "cpu" &&
      spec.resources().device() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device=", spec.resources().device(),
                     ": must be cpu or cuda"));
  }
  if (SpecDevice(spec) != Device::kCuda) return -1;
  if (const std::string why = kernels::CudaUnavailableReason(); !why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.device=cuda: ", why));
  }
  const int gpus = kernels::CudaDeviceCount();
  auto rank_gpus = RankGpus(dims.world_size(), gpus);
  if (!rank_gpus.ok()) return rank_gpus.status();
  const int local = dims.local_size();
  if (local > gpus && !RanksShareGpus()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resources.device=cuda: ", local, " ranks on this node but ", gpus,
        " GPU(s): one rank per GPU (lower resources.ranks_per_node, or set "
        "PTRAIN_CUDA_SHARE_GPUS=1 to let ranks share GPUs)"));
  }
  // The GPU ptcoord chose for this rank, else the node's ranks take its
  // GPUs in turn.
  return !rank_gpus->empty() ? (*rank_gpus)[dims.world_rank()]
                             : dims.local_rank() % gpus;
}

absl::Status CheckPrecision(const v1::JobSpec& spec, int gpu) {
  if (SpecPrecision(spec) != Precision::kBf16) return absl::OkStatus();
  if (SpecDevice(spec) == Device::kCpu && !kernels::CpuHasBf16()) {
    return absl::InvalidArgumentError(
        "train.precision=bf16 with resources.device=cpu needs a CPU with "
        "AVX512_BF16 (this one has none, or ONEDNN_MAX_CPU_ISA forbids it): "
        "use fp32 or auto");
  }
  if (SpecDevice(spec) == Device::kCuda) {
    const std::string why =
        kernels::Bf16Unsupported(kernels::CudaComputeCapability(gpu));
    if (!why.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train.precision=", spec.train().precision(),
          spec.train().precision() == "auto" ? " (bf16 on cuda)" : "",
          " with resources.device=cuda: ", why, ": use fp32"));
    }
  }
  return absl::OkStatus();
}

int64_t RankGpuBytes(const TrainerOptions& options, const ParallelDims& dims,
                     int gpu) {
  if (gpu < 0) return 0;
  if (options.gpu_memory_bytes.has_value()) return *options.gpu_memory_bytes;
  return dims.local_size() > kernels::CudaDeviceCount()
             ? 0
             : kernels::CudaTotalMemory(gpu);
}

}  // namespace ptrain
