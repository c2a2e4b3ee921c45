#include "worker/engine/model/flops.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_file.h"
#include "common/net.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"

namespace ptrain {

double MeasureSgemmPeakFlops(int n, int reps) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f);
  std::vector<float> b(static_cast<size_t>(n) * n, 0.25f);
  std::vector<float> c(static_cast<size_t>(n) * n, 0.0f);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::CpuSquareSgemm(n, a.data(), b.data(), c.data());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r > 0) best = std::min(best, s);  // the first call warms up
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}

double BestPeakFlops(double measured, const std::string& key,
                     const std::string& cache_path) {
  if (cache_path.empty()) return measured;
  // A few hosts, CPUs and thread counts: far below this.
  constexpr size_t kMaxCacheBytes = 1 << 20;
  nlohmann::json cache = nlohmann::json::object();
  if (auto text = ReadBoundedFile("peak cache", cache_path, kMaxCacheBytes);
      text.ok()) {
    auto parsed = nlohmann::json::parse(*text, nullptr,
                                        /*allow_exceptions=*/false);
    if (parsed.is_object()) cache = std::move(parsed);
  }
  const auto it = cache.find(key);
  if (it != cache.end() && it->is_number() && it->get<double>() >= measured) {
    return it->get<double>();
  }
  cache[key] = measured;
  // Ranks of a machine write at once: each renames a whole file of its own.
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(cache_path).parent_path(), ec);
  const std::string tmp = absl::StrCat(cache_path, ".", getpid(), ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << cache.dump(1) << "\n";
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return measured;
    }
  }
  fs::rename(tmp, cache_path, ec);
  if (ec) fs::remove(tmp, ec);
  return measured;
}

std::string PeakCacheKey(const std::string& what, int threads) {
  const std::string host = HostName("");
  std::string cpu = "unknown cpu";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0 &&
        line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return absl::StrCat(host, " | ", cpu, " | ", what, " | ", threads,
                      " threads");
}

std::string PeakCachePath() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') {
    return absl::StrCat(xdg, "/ptrain/matmul-peak.json");
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/') {
    return absl::StrCat(home, "/.cache/ptrain/matmul-peak.json");
  }
  return "";
}

std::string MfuAbovePeakWarning(double mfu, double peak_flops, bool measured) {
  if (!(mfu > 1.0)) return "";
  const std::string mfu_text = absl::StrFormat("MFU %.0f%%", 100.0 * mfu);
  if (measured) {
    return absl::StrCat(
        mfu_text, " is above 100%: the matmul peak measured at start (",
        absl::StrFormat("%.1f GFLOP/s", peak_flops / 1e9),
        " per rank) was low (a loaded machine?); pass --peak-gflops with "
        "this machine's peak");
  }
  return absl::StrCat(mfu_text, " is above 100%: --peak-gflops ",
                      absl::StrFormat("%g", peak_flops / 1e9),
                      " is below what this rank reaches; raise it");
}

double MeasureMatmulPeakFlops(kernels::Ops& ops, int n, int reps) {
  const int64_t nn = static_cast<int64_t>(n) * n;
  kernels::Buffer a(&ops, nn), b(&ops, nn), c(&ops, nn);
  std::vector<float> host(nn, 0.5f);
  ops.FromHost(a.data(), host.data(), nn);
  ops.FromHost(b.data(), host.data(), nn);
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    ops.Synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    ops.matmul_forward(c.data(), a.data(), b.data(), nullptr, 1, n, n, n);
    ops.Synchronize();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    if (r > 0) best = std::min(best, s);  // the first call warms up
  }
  return 2.0 * n * static_cast<double>(n) * n / best;
}

}  // namespace ptrain
