// nccl-tests-style bandwidth table for the MPI Communicator against the same
// operations issued as raw MPI calls, side by side. Prints; never passes/fails.
//
//   mpirun --allow-run-as-root --oversubscribe -n 2 build/bench/comm_bench
//       [--min BYTES] [--max BYTES] [--factor F]   (BYTES may end in K, M, G)
//
// S (size) is the whole buffer: the all_reduce/broadcast buffer, the
// all_gather output, the reduce_scatter input, the message of send/recv.
// algbw = S/t (GB = 1e9); busbw = algbw x 2(n-1)/n for all_reduce, (n-1)/n for
// all_gather and reduce_scatter, 1 for broadcast and send/recv. t is the mean
// per call over one round on the slowest rank, the best of kRounds rounds.
// ratio = ours/mpi bandwidth (raw time / our time); 1.0 means no overhead.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "worker/engine/comm/comm.h"
#include "worker/engine/comm/comm_mpi.h"

namespace {

using ptrain::Communicator;

struct Op {
  const char* name;
  // Whether S is size()*count (the per-rank count is S/n).
  bool whole_is_n_slices;
  double bus_factor;
  // Runs the op once on per-rank `count` elements of send/recv.
  std::function<void(int64_t count)> ours;
  std::function<void(int64_t count)> raw;
};

void Check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  std::fprintf(stderr, "comm_bench: %s failed (%d)\n", what, rc);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

constexpr int kRounds = 3;

// Small messages are latency-bound and noisy, so they get many iterations;
// large ones are capped near 128 MB moved per variant and round to keep the run
// short.
int TimedIters(int64_t bytes) {
  return static_cast<int>(
      std::clamp<int64_t>((128 << 20) / std::max<int64_t>(bytes, 1), 3, 1000));
}

// Mean seconds per call over `iters` calls, on the slowest rank.
double TimeRound(const std::function<void(int64_t)>& run, int64_t count,
                 int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run(count);
  double t =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count() /
      iters;
  double slowest = 0;
  Check(MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
        "MPI_Allreduce(time)");
  return slowest;
}

// "64", "4K", "64M", "1G" (powers of 1024); -1 for anything else.
int64_t ParseBytes(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || (*end != '\0' && end[1] != '\0')) return -1;
  switch (*end) {
    case '\0':
      break;
    case 'K':
    case 'k':
      v *= 1 << 10;
      break;
    case 'M':
    case 'm':
      v *= 1 << 20;
      break;
    case 'G':
    case 'g':
      v *= 1 << 30;
      break;
    default:
      return -1;
  }
  return v >= 1 && v < 0x1p62 ? static_cast<int64_t>(v) : -1;
}

std::string HumanBytes(int64_t b) {
  char buf[32];
  if (b >= (1 << 20) && b % (1 << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%lldM", static_cast<long long>(b >> 20));
  } else if (b >= (1 << 10) && b % (1 << 10) == 0) {
    std::snprintf(buf, sizeof(buf), "%lldK", static_cast<long long>(b >> 10));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(b));
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::string min_text = "8", max_text = "64M";
  int64_t factor = 4;
  CLI::App app{
      "comm_bench: nccl-tests-style bandwidth of the MPI Communicator against "
      "raw MPI (run under mpirun)"};
  // Two buffers of the largest size per rank: at most 4 GiB each.
  const CLI::Validator bytes(
      [](std::string& v) {
        const int64_t b = ParseBytes(v.c_str());
        return b > 0 && b <= (int64_t{1} << 32)
                   ? std::string()
                   : "not a size from 1 to 4G: " + v;
      },
      "BYTES");
  app.add_option("--min", min_text,
                 "smallest size: bytes, or ending in K, M or G (default 8)")
      ->check(bytes);
  app.add_option("--max", max_text, "largest size (default 64M)")->check(bytes);
  app.add_option("--factor", factor, "size step (default 4)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
  CLI11_PARSE(app, argc, argv);
  const int64_t min_bytes = ParseBytes(min_text.c_str());
  const int64_t max_bytes = std::max(min_bytes, ParseBytes(max_text.c_str()));
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  // The last size is max_bytes even when the factor steps past it, so the
  // table always ends at the largest size asked for.
  std::vector<int64_t> sizes;
  for (int64_t s = min_bytes; s < max_bytes; s *= factor) sizes.push_back(s);
  sizes.push_back(max_bytes);

  auto stats = std::make_shared<ptrain::CommStats>();
  auto comm = ptrain::MakeMpiCommunicator(MPI_COMM_WORLD, "world", stats);
  // Zeros stay zeros under repeated sums: no overflow to inf, no denormals.
  const int64_t max_elems = max_bytes / sizeof(float) + n;
  std::vector<float> a(max_elems, 0.0f), b(max_elems, 0.0f);
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  MPI_Comm w = MPI_COMM_WORLD;

  const double nn = n;
  std::vector<Op> ops = {
      {"all_reduce", false, 2 * (nn - 1) / nn,
       [&](int64_t c) { comm->AllReduce(a.data(), c); },
       [&](int64_t c) {
         Check(MPI_Allreduce(MPI_IN_PLACE, a.data(), c, MPI_FLOAT, MPI_SUM, w),
               "MPI_Allreduce");
       }},
      {"reduce_scatter", true, (nn - 1) / nn,
       [&](int64_t c) { comm->ReduceScatter(a.data(), b.data(), c); },
       [&](int64_t c) {
         Check(MPI_Reduce_scatter_block(a.data(), b.data(), c, MPI_FLOAT,
                                        MPI_SUM, w),
               "MPI_Reduce_scatter_block");
       }},
      {"all_gather", true, (nn - 1) / nn,
       [&](int64_t c) { comm->AllGather(a.data(), b.data(), c); },
       [&](int64_t c) {
         Check(MPI_Allgather(a.data(), c, MPI_FLOAT, b.data(), c, MPI_FLOAT, w),
               "MPI_Allgather");
       }},
      {"broadcast", false, 1.0,
       [&](int64_t c) { comm->Broadcast(a.data(), c, 0); },
       [&](int64_t c) {
         Check(MPI_Bcast(a.data(), c, MPI_FLOAT, 0, w), "MPI_Bcast");
       }},
      // Ring: every rank sends to rank+1 and receives from rank-1 at once.
      {"send_recv", false, 1.0,
       [&](int64_t c) {
         auto r = comm->RecvAsync(b.data(), c, prev, 0);
         comm->Send(a.data(), c, next, 0);
         r->Wait();
       },
       [&](int64_t c) {
         MPI_Request r;
         Check(MPI_Irecv(b.data(), c, MPI_FLOAT, prev, 0, w, &r), "MPI_Irecv");
         Check(MPI_Send(a.data(), c, MPI_FLOAT, next, 0, w), "MPI_Send");
         Check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
       }},
  };

  if (rank == 0) {
    std::printf(
        "# comm_bench: %d ranks, float32, sum; GB = 1e9; time = the "
        "slowest rank's mean per call, best of %d rounds\n",
        n, kRounds);
  }
  for (const Op& op : ops) {
    if (rank == 0) {
      std::printf(
          "#\n# %s  (busbw = algbw x %.3f)\n"
          "# %10s %11s | %10s %8s %8s | %10s %8s %8s | %8s\n"
          "# %10s %11s | %10s %8s %8s | %10s %8s %8s | %8s\n",
          op.name, op.bus_factor, "size", "count", "ours", "", "", "raw MPI",
          "", "", "ratio", "(B)", "(elems)", "time(us)", "algbw", "busbw",
          "time(us)", "algbw", "busbw", "ours/mpi");
    }
    for (int64_t size : sizes) {
      int64_t count = std::max<int64_t>(1, size / sizeof(float));
      int64_t per_rank = count;
      if (op.whole_is_n_slices) {
        per_rank = std::max<int64_t>(1, count / n);
        count = per_rank * n;
      }
      const int64_t s = count * sizeof(float);
      const int iters = TimedIters(s);
      const int warmup = std::max(2, iters / 10);
      for (int i = 0; i < warmup; ++i) op.ours(per_rank);
      for (int i = 0; i < warmup; ++i) op.raw(per_rank);
      // Rounds alternate ours and raw so background load on a shared machine
      // hits both alike; the best round is the least disturbed one.
      double t_ours = 1e30, t_raw = 1e30;
      for (int round = 0; round < kRounds; ++round) {
        t_ours = std::min(t_ours, TimeRound(op.ours, per_rank, iters));
        t_raw = std::min(t_raw, TimeRound(op.raw, per_rank, iters));
      }
      const double alg_ours = s / t_ours / 1e9, alg_raw = s / t_raw / 1e9;
      if (rank == 0) {
        std::printf(
            "  %10s %11lld | %10.2f %8.3f %8.3f | %10.2f %8.3f %8.3f | "
            "%8.3f\n",
            HumanBytes(s).c_str(), static_cast<long long>(count), t_ours * 1e6,
            alg_ours, alg_ours * op.bus_factor, t_raw * 1e6, alg_raw,
            alg_raw * op.bus_factor, t_raw / t_ours);
        std::fflush(stdout);
      }
    }
  }
  comm.reset();
  MPI_Finalize();
  return 0;
}
