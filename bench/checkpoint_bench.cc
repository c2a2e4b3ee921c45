// Checkpoint save and load speed against the disk's plain sequential write
// bandwidth for a file of the same size (write + fsync), and the time the
// training loop is blocked by a save; then whole training runs that save
// every few steps, blocking against checkpoint.async_save (in the
// background), alternated: run time and seconds blocked per save, from the
// run log. Prints figures; never passes or fails.
//
//   build/bench/checkpoint_bench [--config S|M] [--dir DIR] [--reps N]
//                                [--steps N] [--every N] [--threads N]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/configs.h"
#include "bench/stats.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/train/trainer.h"

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

// The example spec with `overrides`; the error printed when it is bad.
std::optional<ptrain::v1::JobSpec> BenchSpec(
    const std::vector<std::string>& overrides) {
  auto spec =
      ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml", overrides);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return std::nullopt;
  }
  return *std::move(spec);
}

// One Run of `spec` (a save every checkpoint.every steps) with its run log
// at `log`: the wall seconds, and the seconds the loop was blocked per save
// and the thread's write seconds per save, averaged over the saves before
// the last step (the last one is always blocking).
struct RunTimes {
  double wall = 0, blocked = 0, written = 0;
  int saves = 0;
};
std::optional<RunTimes> TimedRun(const ptrain::v1::JobSpec& spec,
                                 const std::string& log) {
  fs::remove(log);
  ptrain::TrainerOptions opt;
  opt.peak_flops = 1e12;
  opt.quiet = true;
  opt.log_json_path = log;
  auto trainer = ptrain::Trainer::Create(spec, opt);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    return std::nullopt;
  }
  RunTimes t;
  const auto t0 = Clock::now();
  if (auto s = (*trainer)->Run(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return std::nullopt;
  }
  t.wall = Since(t0);
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") != "checkpoint" ||
        j.at("step").get<int64_t>() == spec.train().steps()) {
      continue;
    }
    ++t.saves;
    t.blocked += j.at("seconds").get<double>();
    t.written += j.value("write_seconds", 0.0);
  }
  if (t.saves > 0) {
    t.blocked /= t.saves;
    t.written /= t.saves;
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "M", dir = "build/checkpoint_bench";
  int reps = 3, steps = 24, every = 4, threads = 0;
  CLI::App app{
      "checkpoint_bench: checkpoint save/load MB/s against plain writes; the "
      "loop blocked per save, blocking vs checkpoint.async_save"};
  app.add_option("--config", config, "model: S or M")
      ->check(CLI::IsMember({"S", "M"}));
  app.add_option("--reps", reps, "saves and loads timed (best is printed)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--steps", steps, "steps of each training run")
      ->check(CLI::Range(1, 100000));
  app.add_option("--every", every, "checkpoint.every of those runs")
      ->check(CLI::Range(1, 100000));
  app.add_option("--threads", threads,
                 "resources.threads_per_rank of those runs (0: default)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--dir", dir, "scratch folder (removed first)");
  CLI11_PARSE(app, argc, argv);
  fs::remove_all(dir);
  std::vector<std::string> overrides = ptrain::BenchModel(config);
  for (const std::string& s :
       {std::string("train.global_batch=8"),
        std::string("checkpoint.keep_last=1"), "checkpoint.dir=" + dir}) {
    overrides.push_back(s);
  }
  const auto spec = BenchSpec(overrides);
  if (!spec.has_value()) return 2;
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
    auto saved = tr.checkpoints().SaveCheckpointAt(r + 1);
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

  spdlog::set_level(spdlog::level::warn);
  // Whole runs: a save every `every` steps, blocking and in the
  // background, alternated `reps` times; medians.
  std::vector<double> wall[2], blocked[2], written[2];
  int saves = 0;
  for (int r = 0; r < reps; ++r) {
    for (int async = 0; async < 2; ++async) {
      fs::remove_all(dir);
      std::vector<std::string> o = overrides;
      o.push_back("train.steps=" + std::to_string(steps));
      o.push_back("checkpoint.every=" + std::to_string(every));
      // 0: every core trains, and the writing thread takes from them.
      o.push_back("resources.threads_per_rank=" + std::to_string(threads));
      o.push_back(std::string("checkpoint.async_save=") +
                  (async ? "true" : "false"));
      for (const char* x : {"train.eval_every=0", "train.sample_tokens=0",
                            "train.eval_batches=1"}) {
        o.push_back(x);
      }
      const auto run_spec = BenchSpec(o);
      if (!run_spec.has_value()) return 2;
      fs::create_directories(dir);
      const auto t = TimedRun(*run_spec, dir + "/../checkpoint_bench.jsonl");
      if (!t.has_value()) return 1;
      wall[async].push_back(t->wall);
      blocked[async].push_back(t->blocked);
      written[async].push_back(t->written);
      saves = t->saves;
    }
  }
  std::printf(
      "training runs of %d steps, a save every %d (%d saves before the "
      "last step, which blocks in both), %s, medians of %d alternated:\n",
      steps, every, saves,
      threads > 0 ? (std::to_string(threads) + " training threads").c_str()
                  : "training on every core",
      reps);
  std::printf("  blocking:   run %.2f s, loop blocked %.3f s per save\n",
              ptrain::Median(wall[0]), ptrain::Median(blocked[0]));
  std::printf(
      "  background: run %.2f s, loop blocked %.3f s per save (the thread "
      "wrote for %.3f s)\n",
      ptrain::Median(wall[1]), ptrain::Median(blocked[1]),
      ptrain::Median(written[1]));
  std::printf(
      "  blocked per save: background / blocking = %.3f; run time: "
      "background / blocking = %.3f\n",
      ptrain::Median(blocked[1]) / ptrain::Median(blocked[0]),
      ptrain::Median(wall[1]) / ptrain::Median(wall[0]));
  fs::remove_all(dir);
  fs::remove(dir + "/../checkpoint_bench.jsonl");
  return 0;
}
