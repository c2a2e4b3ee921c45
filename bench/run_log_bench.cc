// What an attempt's end costs ptcoord in reading its run log: a synthetic
// run.jsonl of --mb megabytes (step lines as ptworker writes them, an
// evaluation every 1000 steps) read whole, and read back to the newest step
// the store already has (the last one, and 1000 steps before it). ptcoord
// holds its lock while it reads. Then the store's side: as many loss points
// as the log has, in one attempt of one job, and how long asking for the
// attempt's newest training and evaluation steps takes. Prints figures;
// never fails on time.
//
//   build/bench/run_log_bench [--mb 270] [--reps 3]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "CLI/CLI.hpp"
#include "coordinator/reports.h"
#include "coordinator/store.h"

int main(int argc, char** argv) {
  CLI::App app{"run log read at an attempt's end"};
  int mb = 270, reps = 3;
  app.add_option("--mb", mb, "size of the run log")->check(CLI::Range(1, 4096));
  app.add_option("--reps", reps, "reads per figure (best is printed)")
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  namespace fs = std::filesystem;
  const fs::path path =
      fs::temp_directory_path() /
      ("run_log_bench_" + std::to_string(getpid()) + ".jsonl");
  int64_t steps = 0;
  {
    std::ofstream out(path);
    while (out.tellp() < int64_t{mb} << 20) {
      ++steps;
      out << R"({"type":"step","step":)" << steps
          << R"(,"loss":2.5123,"lr":0.000123,"ms":3.2,"tok_per_s":91234.5,)"
          << R"("mfu":0.1234})"
          << "\n";
      if (steps % 1000 == 0) {
        out << R"({"type":"eval","step":)" << steps << R"(,"val_loss":2.25})"
            << "\n";
      }
    }
  }
  const ptrain::ReportContext ctx{"job-0001", 1, 8, steps};
  std::printf(
      "run log of %.0f MB, %lld steps (read: its last 256 MiB at most)\n",
      fs::file_size(path) / 1e6, static_cast<long long>(steps));
  for (const int64_t known : {int64_t{-1}, steps - 1000, steps}) {
    double best = 1e30;
    size_t records = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const ptrain::RunLogSummary log =
          ptrain::ReadRunLog(path.string(), ctx, known);
      best = std::min(best, std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - t0)
                                .count());
      records = log.records.size();
    }
    std::printf("  store has up to step %-9lld %8zu records read in %8.3f s\n",
                static_cast<long long>(known), records, best);
  }
  fs::remove(path);

  // The same steps as loss points of attempt 2, after 1000 of attempt 1.
  const fs::path db_path =
      fs::temp_directory_path() /
      ("run_log_bench_" + std::to_string(getpid()) + ".db");
  {
    auto store = ptrain::Store::Open(db_path.string());
    if (!store.ok()) {
      std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
      return 1;
    }
    auto job = (*store)->InsertJob(ptrain::JobRecord{});
    if (!job.ok()) {
      std::fprintf(stderr, "store: %s\n", job.status().ToString().c_str());
      return 1;
    }
    ptrain::JobUpdate update;
    update.record = *job;
    auto flush = [&] {
      const absl::Status s = (*store)->Apply(update);
      update.loss_points.clear();
      return s;
    };
    auto add = [&](int attempt, int64_t step, double val_loss) {
      ptrain::v1::LossPoint& p = update.loss_points.emplace_back();
      p.set_attempt(attempt);
      p.set_step(step);
      p.set_loss(2.5);
      p.set_val_loss(val_loss);
      return update.loss_points.size() < 20000 ? absl::OkStatus() : flush();
    };
    absl::Status s;
    for (int64_t step = 1; step <= 1000 && s.ok(); ++step) s = add(1, step, 0);
    for (int64_t step = 1; step <= steps && s.ok(); ++step) {
      s = add(2, step, 0);
      if (s.ok() && step % 1000 == 0) s = add(2, step, 2.25);
    }
    if (s.ok()) s = flush();
    if (!s.ok()) {
      std::fprintf(stderr, "store: %s\n", s.ToString().c_str());
      return 1;
    }
    double best = 1e30;
    ptrain::Store::LastSteps last;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto got = (*store)->LastLossSteps(job->job.id(), 2);
      best = std::min(best, std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - t0)
                                .count());
      if (!got.ok()) {
        std::fprintf(stderr, "store: %s\n", got.status().ToString().c_str());
        return 1;
      }
      last = *got;
    }
    std::printf(
        "store of %lld loss points: attempt 2's newest step %lld and "
        "evaluation %lld in %8.4f s\n",
        static_cast<long long>(steps + steps / 1000 + 1000),
        static_cast<long long>(last.step), static_cast<long long>(last.eval),
        best);
  }
  for (const std::string suffix : {"", "-wal", "-shm"}) {
    fs::remove(db_path.string() + suffix);
  }
  return 0;
}
