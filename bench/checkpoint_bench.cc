// Checkpoint save and load speed against the disk's plain sequential write
// bandwidth for a file of the same size (write + fsync), and the time the
// training loop is blocked by a save. Prints figures; never passes or fails.
//
//   build/bench/checkpoint_bench [--config S|M] [--dir DIR] [--reps N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/configs.h"
#include "common/spec.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/trainer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds to write `bytes` to a new file in 8 MiB blocks and fsync it.
double PlainWrite(const std::string& path, int64_t bytes) {
  std::vector<char> block(8 << 20, 'x');
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (int64_t done = 0; done < bytes;) {
    const int64_t n = std::min<int64_t>(block.size(), bytes - done);
    if (::write(fd, block.data(), n) != n) std::perror("write");
    done += n;
  }
  ::fsync(fd);
  ::close(fd);
  const double s = Since(t0);
  fs::remove(path);
  return s;
}

int64_t FolderBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += fs::file_size(e);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "M", dir = "build/checkpoint_bench";
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--config")) config = argv[i + 1];
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  fs::remove_all(dir);
  std::vector<std::string> overrides = ptrain::BenchModel(config);
  for (const std::string& s :
       {std::string("train.global_batch=8"),
        std::string("checkpoint.keep_last=1"), "checkpoint.dir=" + dir}) {
    overrides.push_back(s);
  }
  auto spec =
      ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 2;
  }
  ptrain::TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  auto trainer = ptrain::Trainer::Create(*spec, opt);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    return 2;
  }
  auto& tr = **trainer;
  tr.TrainStep(0);

  double best_save = 1e30, best_plain = 1e30, best_load = 1e30;
  int64_t bytes = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    auto saved = tr.SaveCheckpointAt(r + 1);
    const double save = Since(t0);
    if (!saved.ok()) {
      std::fprintf(stderr, "%s\n", saved.status().ToString().c_str());
      return 1;
    }
    best_save = std::min(best_save, save);
    bytes = FolderBytes(*saved);
    best_plain = std::min(best_plain, PlainWrite(dir + "/plain.bin", bytes));
    // Load back every tensor (checksums verified).
    const auto t1 = Clock::now();
    auto reader = ptrain::CheckpointReader::Open(*saved);
    std::vector<float> buf;
    for (const auto& p : tr.store().layout()) {
      const ptrain::Box whole = ptrain::WholeBox(p.global_shape);
      for (const std::string& n :
           {p.name, ptrain::ExpAvgName(p.name), ptrain::ExpAvgSqName(p.name)}) {
        buf.resize(whole.numel());
        if (!(*reader)->Read(n, whole, buf.data()).ok()) return 1;
      }
    }
    best_load = std::min(best_load, Since(t1));
  }
  const double mb = bytes / 1e6;
  std::printf("config %s: checkpoint %.1f MB (weights + Adam moments)\n",
              config.c_str(), mb);
  std::printf("  plain sequential write + fsync: %.3f s, %.0f MB/s\n",
              best_plain, mb / best_plain);
  std::printf(
      "  checkpoint save: %.3f s, %.0f MB/s = %.2f x the plain write "
      "(training loop blocked %.3f s per save)\n",
      best_save, mb / best_save, best_plain / best_save, best_save);
  std::printf(
      "  checkpoint load (all tensors, checksums verified): %.3f s, "
      "%.0f MB/s\n",
      best_load, mb / best_load);
  fs::remove_all(dir);
  return 0;
}
