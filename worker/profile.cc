// `ptworker profile` (profile.h): its flags checked, the backend made as a
// training rank makes it, the measurements run (profile_measure.cc), the
// links fitted, and the profile written by rank 0.
#include "worker/profile.h"

#include <mpi.h>
#include <omp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/net.h"
#include "common/private_file.h"
#include "kernels/backends.h"
#include "nlohmann/json.hpp"
#include "worker/exit_status.h"

namespace ptrain {

namespace {

// The smallest seconds per bus byte a fit keeps (1e15 bytes/s): where the
// time does not grow with the size, the bandwidth is past measuring.
constexpr double kMinSecondsPerByte = 1e-15;

}  // namespace

LinkFit FitLink(Collective c, const std::vector<LinkPoint>& points) {
  // seconds ≈ a + b·x with x the bus bytes, weights 1/seconds².
  double sw = 0.0, sx = 0.0, sxx = 0.0, st = 0.0, sxt = 0.0;
  for (const LinkPoint& pt : points) {
    const double x = BusFactor(c, pt.ranks) * pt.bytes, t = pt.seconds;
    const double w = 1.0 / (t * t);
    sw += w;
    sx += w * x;
    sxx += w * x * x;
    st += w * t;
    sxt += w * x * t;
  }
  const double det = sw * sxx - sx * sx;
  // One distinct size leaves the slope undetermined.
  double b = det > 1e-9 * sw * sxx ? (sw * sxt - sx * st) / det : 0.0;
  b = std::max(b, kMinSecondsPerByte);
  double a = (st - b * sx) / sw;
  if (a < 0.0) {
    a = 0.0;
    b = std::max(sxx > 0.0 ? sxt / sxx : 0.0, kMinSecondsPerByte);
  }
  return {a, 1.0 / b};
}

namespace {

using Json = nlohmann::ordered_json;

// --device and --out; `out` checked only where it is written (rank 0).
absl::Status CheckFlags(const ProfileFlags& flags, bool out) {
  if (flags.device != "cpu" && flags.device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", flags.device, ": must be cpu or cuda"));
  }
  if (!out) return absl::OkStatus();
  if (flags.out.empty()) {
    return absl::InvalidArgumentError("--out is required: the profile's path");
  }
  const std::filesystem::path path(flags.out);
  const std::string dir =
      path.has_parent_path() ? path.parent_path().string() : ".";
  struct stat st;
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out=", flags.out, ": folder ", dir, " does not exist"));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "--out=", flags.out, ": folder ", dir, " is not writable"));
  }
  if (!path.has_filename() ||
      (stat(flags.out.c_str(), &st) == 0 && S_ISDIR(st.st_mode))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--out=", flags.out, ": is a folder, not a file"));
  }
  return absl::OkStatus();
}

// The backend a training rank on this device gets: the CPU's, or the
// CUDA backend on this rank's GPU (the node's ranks take its GPUs in turn),
// computing in bf16 where the GPU has bf16 tensor cores.
struct Backend {
  std::unique_ptr<kernels::Ops> owned;
  kernels::Ops* ops = &kernels::CpuOps();
  int gpu = -1;
};
absl::StatusOr<Backend> MakeBackend(const std::string& device,
                                    const NodeShare& node) {
  Backend b;
  if (device == "cpu") return b;
  if (const std::string why = kernels::CudaUnavailableReason(); !why.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--device=cuda: ", why));
  }
  b.gpu = node.local_rank % kernels::CudaDeviceCount();
  kernels::CudaOptions options;
  options.device = b.gpu;
  options.bf16_compute =
      kernels::Bf16Unsupported(kernels::CudaComputeCapability(b.gpu)).empty();
  std::string error;
  b.owned = kernels::MakeCudaOps(options, &error);
  if (b.owned == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--device=cuda: ", error));
  }
  b.ops = b.owned.get();
  return b;
}

// Waits for every rank without holding a core: the ranks that do not
// measure the kernels sleep through rank 0's measurement of them.
void QuietBarrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The GPU's model in the CUDA backend's name, "cuda:0 (MODEL, bf16
// compute)"; the whole name where it is not of that form.
std::string GpuModel(const std::string& backend) {
  const size_t open = backend.find(" (");
  const size_t comma = backend.rfind(", ");
  if (open == std::string::npos || comma == std::string::npos ||
      comma <= open + 2) {
    return backend;
  }
  return backend.substr(open + 2, comma - open - 2);
}

int64_t HostMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

// FitLink over the samples of each link and collective, by link then
// collective.
std::map<std::string, std::map<Collective, LinkFit>> FitLinks(
    const std::vector<LinkSample>& samples) {
  std::map<std::string, std::map<Collective, std::vector<LinkPoint>>> points;
  for (const LinkSample& s : samples) points[s.link][s.op].push_back(s.point);
  std::map<std::string, std::map<Collective, LinkFit>> fits;
  for (const auto& [link, ops] : points) {
    for (const auto& [op, pts] : ops) fits[link][op] = FitLink(op, pts);
  }
  return fits;
}

Json ProfileJson(
    const ProfileFlags& flags, const Backend& backend, const NodeShare& node,
    int threads, int world, const ComputeProfile& compute,
    const std::map<std::string, std::map<Collective, LinkFit>>& links) {
  const bool cpu = backend.gpu < 0;
  const std::string host = HostName();
  Json j;
  j["format"] = kProfileFormat;
  j["name"] = cpu ? host + "-cpu" : GpuModel(backend.ops->name());
  j["source"] = absl::StrCat("measured by ptworker profile on ", host, " at ",
                             UtcNow(), ", ", backend.ops->name(), ", ", threads,
                             " threads, ", world, " ranks");
  j["device"] = flags.device;
  j["memory_bytes"] =
      cpu ? HostMemoryBytes() : kernels::CudaTotalMemory(backend.gpu);
  if (cpu) j["cores"] = node.cores;
  Json& matmul = j["matmul"] = Json::array();
  for (const MatmulRate& r : compute.matmul) {
    Json e = {{"precision", r.precision},
              {"pass", r.pass},
              {"m", r.m},
              {"n", r.n},
              {"k", r.k}};
    if (cpu) e["threads"] = r.threads;
    e["flops_per_s"] = r.flops_per_s;
    matmul.push_back(std::move(e));
  }
  Json& attention = j["attention"] = Json::array();
  for (const AttentionTime& a : compute.attention) {
    Json e = {{"precision", a.precision},
              {"B", a.B},
              {"T", a.T},
              {"C", a.C},
              {"heads", a.heads}};
    if (cpu) e["threads"] = a.threads;
    e["forward_s"] = a.forward_s;
    e["backward_s"] = a.backward_s;
    attention.push_back(std::move(e));
  }
  j["elementwise_bytes_per_s"] = compute.elementwise_bytes_per_s;
  j["optimizer_params_per_s"] = compute.optimizer_params_per_s;
  if (world > 1) {
    Json& out = j["links"] = Json::object();
    for (const auto& [link, ops] : links) {
      for (const auto& [op, fit] : ops) {
        out[link][CollectiveName(op)] = {
            {"alpha_s", fit.alpha_s}, {"bus_bytes_per_s", fit.bus_bytes_per_s}};
      }
    }
  }
  return j;
}

std::string ThreadsWord(int t) {
  return t > 0 ? absl::StrCat(" at ", t, t == 1 ? " thread" : " threads") : "";
}

// One line per family, on stdout.
void PrintSummary(
    const ComputeProfile& c,
    const std::map<std::string, std::map<Collective, LinkFit>>& links) {
  std::map<int, std::pair<double, double>> best;  // threads: fwd, bwd
  for (const MatmulRate& r : c.matmul) {
    auto& [fwd, bwd] = best[r.threads];
    (r.pass == "forward" ? fwd : bwd) =
        std::max(r.pass == "forward" ? fwd : bwd, r.flops_per_s);
  }
  std::string line;
  for (const auto& [t, rates] : best) {
    absl::StrAppendFormat(&line, "%s%.1f / %.1f GFLOP/s%s",
                          line.empty() ? "" : "; ", rates.first / 1e9,
                          rates.second / 1e9, ThreadsWord(t));
  }
  std::printf("matmul (%s): best forward / backward %s (%zu entries)\n",
              c.matmul.empty() ? "" : c.matmul.front().precision.c_str(),
              line.c_str(), c.matmul.size());
  if (!c.attention.empty()) {
    const AttentionTime& a = c.attention.back();
    std::printf(
        "attention (%s): B=%d T=%d C=%d heads=%d: forward %.2f ms, backward "
        "%.2f ms%s (%zu entries)\n",
        a.precision.c_str(), a.B, a.T, a.C, a.heads, a.forward_s * 1e3,
        a.backward_s * 1e3, ThreadsWord(a.threads).c_str(), c.attention.size());
  }
  std::printf("elementwise: %.2f GB/s (dst += src, bytes read + written)\n",
              c.elementwise_bytes_per_s / 1e9);
  std::printf("optimizer: %.1f M params/s (AdamW)\n",
              c.optimizer_params_per_s / 1e6);
  for (const auto& [link, ops] : links) {
    std::string fits;
    for (const auto& [op, fit] : ops) {
      absl::StrAppendFormat(&fits, "%s%s %.1f us + %.2f GB/s",
                            fits.empty() ? "" : ", ", CollectiveName(op),
                            fit.alpha_s * 1e6, fit.bus_bytes_per_s / 1e9);
    }
    std::printf("links %s: %s (alpha + bus bandwidth)\n", link.c_str(),
                fits.c_str());
  }
}

}  // namespace

int RunProfile(const ProfileFlags& flags, const NodeShare& node) {
  const int rank = WorldRank();
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  SetupLogging("warn");
  absl::Status setup = CheckFlags(flags, rank == 0);
  absl::StatusOr<Backend> backend = absl::UnknownError("not made");
  if (setup.ok()) {
    backend = MakeBackend(flags.device, node);
    setup = backend.status();
  }
  if (const int rc = AgreeOnSetup(setup); rc != 0) return rc;
  kernels::Ops* ops = backend->ops;
  // One thread, then every core this rank may run on (the CPU); the GPU's
  // host threads as they are.
  std::vector<int> threads = {0};
  if (backend->gpu < 0) {
    threads = {1};
    if (node.rank_cores > 1) threads.push_back(node.rank_cores);
  }
  ComputeProfile compute;
  if (rank == 0) compute = MeasureCompute(ops, threads, flags.quick);
  QuietBarrier();
  std::vector<LinkSample> samples;
  if (world > 1) samples = MeasureLinks(ops, flags.quick);
  // Rank 0's outcome is every rank's exit code.
  int rc = 0;
  if (rank == 0) {
    const auto links = FitLinks(samples);
    PrintSummary(compute, links);
    const int used =
        threads.back() > 0 ? threads.back() : omp_get_max_threads();
    const Json j =
        ProfileJson(flags, *backend, node, used, world, compute, links);
    // What is written is what the planner reads: checked here first.
    const std::string text = j.dump(2) + "\n";
    absl::Status written = planner::ParseProfile(text, flags.out).status();
    if (written.ok()) written = ReplaceFile(flags.out, text, 0644);
    if (written.ok()) {
      std::printf("wrote %s\n", flags.out.c_str());
    } else {
      std::fprintf(stderr, "ptworker: error: --out=%s: %s\n", flags.out.c_str(),
                   std::string(written.message()).c_str());
      rc = IsInputError(written) ? kExitBadInput : kExitFailed;
    }
    std::fflush(stdout);
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
}

}  // namespace ptrain
