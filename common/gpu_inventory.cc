// See gpu_inventory.h.
#include "common/gpu_inventory.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ptrain {

namespace {

// The "GPU UUID:" line of a GPU's `information` file ("" without one).
std::string UuidOf(const std::filesystem::path& gpu_dir) {
  std::ifstream in(gpu_dir / "information");
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view l = line;
    if (absl::StartsWith(l, "GPU UUID:")) {
      return std::string(absl::StripAsciiWhitespace(l.substr(9)));
    }
  }
  return "";
}

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace

GpuListing ListGpus(const std::string& dir) {
  GpuListing out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  out.driver = !ec;
  std::vector<std::filesystem::path> gpus;
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    gpus.push_back(it->path());
  }
  // By PCI bus id, the order CUDA_DEVICE_ORDER=PCI_BUS_ID gives.
  std::sort(gpus.begin(), gpus.end());
  for (const std::filesystem::path& g : gpus) {
    if (static_cast<int>(out.uuids.size()) == kMaxGpus) break;
    out.uuids.push_back(UuidOf(g));
  }
  return out;
}

int VisibleGpus(const GpuListing& listing,
                const std::optional<std::string>& visible) {
  const int listed = static_cast<int>(listing.uuids.size());
  if (!visible.has_value()) return listed;
  std::set<int> taken, indices;
  int mig = 0;
  for (absl::string_view entry : absl::StrSplit(*visible, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    int index = -1;
    if (absl::SimpleAtoi(entry, &index)) {
      if (index < 0 || index >= listed) break;
      if (!indices.insert(index).second) return 0;  // CUDA refuses the list
      if (!taken.insert(index).second) break;
    } else if (absl::StartsWith(entry, "GPU-") && entry.size() > 4) {
      std::vector<int> matches;
      for (int i = 0; i < listed; ++i) {
        if (absl::StartsWith(listing.uuids[i], entry)) matches.push_back(i);
      }
      if (matches.size() != 1 || !taken.insert(matches[0]).second) break;
    } else if (absl::StartsWith(entry, "MIG-") && listed > 0) {
      ++mig;
    } else {
      break;
    }
  }
  return std::min(kMaxGpus, static_cast<int>(taken.size()) + mig);
}

std::string NoGpuReason(const GpuListing& listing,
                        const std::optional<std::string>& visible) {
  if (VisibleGpus(listing, visible) > 0) return "";
  if (!listing.driver) {
    return "no NVIDIA driver on this host (no /proc/driver/nvidia/gpus)";
  }
  if (listing.uuids.empty()) {
    return "the NVIDIA driver shows no GPU on this host";
  }
  return absl::StrCat("CUDA_VISIBLE_DEVICES=", *visible,
                      " names none of this host's ", listing.uuids.size(),
                      " GPU(s)");
}

int GpuCount() { return VisibleGpus(ListGpus(), Env("CUDA_VISIBLE_DEVICES")); }

int HostGpuCount() {
  return std::min(static_cast<int>(ListGpus().uuids.size()), kMaxGpus);
}

std::string GpuUnavailableReason() {
  return NoGpuReason(ListGpus(), Env("CUDA_VISIBLE_DEVICES"));
}

bool RanksShareGpus() {
  const std::optional<std::string> v = Env("PTRAIN_CUDA_SHARE_GPUS");
  return v.has_value() && *v == "1";
}

}  // namespace ptrain
