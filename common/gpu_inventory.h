// The NVIDIA GPUs of this host that a CUDA program started from this
// process would see, counted without loading CUDA: the folders of
// /proc/driver/nvidia/gpus (one a GPU the driver shows), narrowed by
// CUDA_VISIBLE_DEVICES as the CUDA runtime narrows them. ptcoord counts its
// own host's GPUs and ptworkerd its node's (all of them) with it; ptworker,
// which loads CUDA anyway, asks the runtime (kernels::CudaDeviceCount).
#ifndef PTRAIN_COMMON_GPU_INVENTORY_H_
#define PTRAIN_COMMON_GPU_INVENTORY_H_

#include <optional>
#include <string>
#include <vector>

namespace ptrain {

// At most this many GPUs are counted (the range of ptworkerd's --gpus).
inline constexpr int kMaxGpus = 1024;

// What the driver shows: one entry a GPU, its UUID ("GPU-…") when its
// `information` file names one, else "".
struct GpuListing {
  bool driver = false;  // /proc/driver/nvidia/gpus exists
  std::vector<std::string> uuids;
};

// Reads `dir` (/proc/driver/nvidia/gpus, or a copy of it for a test).
GpuListing ListGpus(const std::string& dir = "/proc/driver/nvidia/gpus");

// How many of `listing`'s GPUs a CUDA program sees with CUDA_VISIBLE_DEVICES
// set to `visible` (nullopt: unset, every GPU): entries separated by commas,
// surrounding blanks ignored, each an index below the GPU count or a prefix
// of one GPU's UUID ("GPU-d4deb6b7"), or a MIG device ("MIG-…", taken on
// trust as one: the driver's folders do not list them); the first entry that
// is none of these, or names a GPU an entry before it named, ends the list,
// and an index given twice hides every GPU. Empty: none. At most kMaxGpus.
// What the CUDA driver (580) did with each such value on an H100.
int VisibleGpus(const GpuListing& listing,
                const std::optional<std::string>& visible);

// Why VisibleGpus is 0, for a message ("" when it is not).
std::string NoGpuReason(const GpuListing& listing,
                        const std::optional<std::string>& visible);

// This host's GPUs as seen with this process's CUDA_VISIBLE_DEVICES
// (ptcoord: the local launcher's ranks inherit its environment).
int GpuCount();
// Every GPU the driver shows, whatever this process's CUDA_VISIBLE_DEVICES
// (ptworkerd: the ranks it starts do not inherit its environment, and
// ptcoord numbers a node's GPUs as its driver does). At most kMaxGpus.
int HostGpuCount();
// NoGpuReason for this host and this process's CUDA_VISIBLE_DEVICES.
std::string GpuUnavailableReason();

// PTRAIN_CUDA_SHARE_GPUS=1: ranks may share a GPU (how tests run several
// ranks on one); otherwise each rank needs its own. Read by ptcoord, which
// places ranks on GPUs, and by ptworker, which refuses more ranks than GPUs
// on a node without it.
bool RanksShareGpus();

}  // namespace ptrain

#endif  // PTRAIN_COMMON_GPU_INVENTORY_H_
