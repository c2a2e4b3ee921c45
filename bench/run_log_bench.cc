// What an attempt's end costs ptcoord in reading its run log: a synthetic
// run.jsonl of --mb megabytes (step lines as ptworker writes them, an
// evaluation every 1000 steps) read whole, and read back to the newest step
// the store already has (the last one, and 1000 steps before it). ptcoord
// holds its lock while it reads. Prints figures; never fails on time.
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
  return 0;
}
