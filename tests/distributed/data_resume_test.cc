// Exact resume of a blend's data on any layout: every sequence a rank
// trains on carries its source and window in its first tokens, each rank
// records what it was fed at every step, and one run that stops and
// resumes through dp 4 → 2 (the shrink after a node loss) → 4 (grown
// back) → dp 2 · tp 2 → dp 2 · pp 2 → dp 2 · cp 2, with an anomaly
// rollback on the way, trains at every step on exactly the batch the
// uninterrupted single-rank run trained on at that step, the rollback's
// skip window aside: nothing skipped, nothing repeated, and each source's
// epochs are its windows once each. Runs under `mpirun -n 4`.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/spec.h"
#include "worker/engine/data/data.h"
#include "worker/engine/parallel/parallel_dims.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr int kT = 16, kBatch = 8, kVocab = 64;
// Windows of each source: web takes 0.75 of the sequences, code 0.25, so
// that over the run web goes through 3 epochs and code through 5.
constexpr int kWebWindows = 40, kCodeWindows = 10;
constexpr int kSteps = 24;
// The rollback: a NaN at step 11 goes back to the step-9 checkpoint and
// skips the two steps of data since.
constexpr int kNanStep = 11, kBackTo = 9, kSkip = kNanStep - kBackTo;

int WorldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A sequence: (source, window).
using Id = std::pair<int, int>;

// Source k's tokens: window w (tokens w·T .. w·T+T) begins with w in two
// base-64 digits and k; the rest is filler.
std::vector<uint16_t> SourceTokens(int k, int windows) {
  std::vector<uint16_t> ids(static_cast<size_t>(windows) * kT + 1);
  for (size_t p = 0; p < ids.size(); ++p) {
    const int w = static_cast<int>(p / kT), o = static_cast<int>(p % kT);
    ids[p] = o == 0   ? w % kVocab
             : o == 1 ? w / kVocab
             : o == 2 ? k
                      : (p * 7 + k) % kVocab;
  }
  return ids;
}

struct Layout {
  const char* name;
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int world() const { return dp * tp * pp * cp; }
};

class DataResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int stamp = WorldRank() == 0 ? ::getpid() : 0;
    MPI_Bcast(&stamp, 1, MPI_INT, 0, MPI_COMM_WORLD);
    root_ = fs::temp_directory_path() /
            ("ptrain_data_resume_" + std::to_string(stamp));
    if (WorldRank() == 0) {
      fs::create_directories(root_);
      const int windows[] = {kWebWindows, kCodeWindows};
      for (int k = 0; k < 2; ++k) {
        for (const char* split : {"train", "val"}) {
          ASSERT_TRUE(WriteTokenFile(Prefix(k) + "_" + split + ".bin",
                                     SourceTokens(k, windows[k]))
                          .ok());
        }
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  static void TearDownTestSuite() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (WorldRank() == 0) fs::remove_all(root_);
  }
  static std::string Prefix(int k) {
    return (root_ / (k == 0 ? "web" : "code")).string();
  }

  // What the ranks of a run were fed: per world rank of the phase, in the
  // order the steps ran, (step, dp rank, the dp rank's sequences).
  struct Fed {
    int64_t step;
    int dp_rank;
    std::vector<Id> ids;
  };
  using RankFeeds = std::vector<std::vector<Fed>>;

  // Runs the job on layout `l` (the first l.world() ranks) to `steps`,
  // resuming the newest checkpoint of `dir`; returns on world rank 0 what
  // each of its ranks that holds a sequence's first tokens (tp, pp and cp
  // rank aside: cp rank 0) was fed.
  // `nan_at_step`: the loss of that step reads as NaN (0: none).
  static RankFeeds Run(const Layout& l, const std::string& dir, int steps,
                       int64_t nan_at_step = 0) {
    RankFeeds feeds;
    MPI_Comm comm;
    const bool member = WorldRank() < l.world();
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, WorldRank(),
                   &comm);
    if (!member) {
      MPI_Barrier(MPI_COMM_WORLD);
      return feeds;
    }
    std::vector<std::string> set = {
        "model.n_layer=2",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=" + std::to_string(kT),
        "model.vocab_size=" + std::to_string(kVocab),
        "data.path=''",
        "data.blend=[{train_bin: " + Prefix(0) + "_train.bin, val_bin: " +
            Prefix(0) + "_val.bin, weight: 0.75}, {train_bin: " + Prefix(1) +
            "_train.bin, val_bin: " + Prefix(1) + "_val.bin, weight: 0.25}]",
        "train.steps=" + std::to_string(steps),
        "train.global_batch=" + std::to_string(kBatch),
        "train.eval_every=0",
        "train.sample_tokens=0",
        "train.anomaly.spike_factor=0",
        "train.anomaly.nan=rollback",
        "checkpoint.every=3",
        "checkpoint.dir=" + dir,
        "parallel.dp=" + std::to_string(l.dp),
        "parallel.tp=" + std::to_string(l.tp),
        "parallel.pp=" + std::to_string(l.pp),
        "parallel.cp=" + std::to_string(l.cp),
        "parallel.microbatches=" + std::to_string(l.pp > 1 ? 2 : 1)};
    auto spec = LoadJobSpecFile("examples/shakespeare-char.yaml", set);
    EXPECT_TRUE(spec.ok()) << spec.status();
    auto dims = ParallelDims::Create(spec->parallel(), comm);
    EXPECT_TRUE(dims.ok()) << dims.status();
    TrainerOptions opt;
    opt.peak_flops = 1e12;
    opt.quiet = true;
    opt.resume_from = "latest";
    if (nan_at_step > 0) opt.nan_at_step = nan_at_step;
    std::vector<Fed> mine;
    Trainer* trainer = nullptr;
    ParallelDims* d = dims->get();
    // What the rank was fed, read after each step from the feed (before
    // evaluation or a rollback refills it).
    opt.on_rank_step = [&](const RankStep& step) {
      if (d->cp_rank() != 0) return;
      const StepFeed& feed = trainer->feed();
      const int T_local = kT / l.cp, sequences = kBatch / l.dp;
      Fed fed{step.step, d->dp_rank(), {}};
      for (int i = 0; i < sequences; ++i) {
        const int32_t* in = feed.inputs() + int64_t{i} * T_local;
        fed.ids.push_back({in[2], in[0] + kVocab * in[1]});
      }
      mine.push_back(fed);
    };
    auto created = Trainer::Create(*spec, opt, d);
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) {
      trainer = created->get();
      const absl::Status ran = trainer->Run();
      EXPECT_TRUE(ran.ok()) << ran;
    }
    created = nullptr;
    // Gathered on rank 0 as flat integers.
    std::vector<int64_t> flat;
    for (const Fed& f : mine) {
      flat.insert(flat.end(), {f.step, f.dp_rank, int64_t(f.ids.size())});
      for (const Id& id : f.ids) flat.insert(flat.end(), {id.first, id.second});
    }
    int n = static_cast<int>(flat.size()), size = 0, rank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    std::vector<int> counts(size), offsets(size);
    MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm);
    int total = 0;
    for (int r = 0; r < size; ++r) offsets[r] = total, total += counts[r];
    std::vector<int64_t> all(rank == 0 ? total : 0);
    MPI_Gatherv(flat.data(), n, MPI_INT64_T, all.data(), counts.data(),
                offsets.data(), MPI_INT64_T, 0, comm);
    if (rank == 0) {
      feeds.resize(size);
      for (int r = 0; r < size; ++r) {
        for (int64_t i = offsets[r]; i < offsets[r] + counts[r];) {
          Fed f{all[i], static_cast<int>(all[i + 1]), {}};
          const int64_t m = all[i + 2];
          i += 3;
          for (int64_t j = 0; j < m; ++j, i += 2) {
            f.ids.push_back(
                {static_cast<int>(all[i]), static_cast<int>(all[i + 1])});
          }
          feeds[r].push_back(f);
        }
      }
    }
    dims->reset();
    MPI_Comm_free(&comm);
    MPI_Barrier(MPI_COMM_WORLD);
    return feeds;
  }

  // Each step's global batch as the run kept it: per rank the last time it
  // ran the step (a rollback runs steps again), the dp ranks' sequences in
  // order. The ranks of one dp rank must have been fed alike.
  static void Keep(const RankFeeds& feeds,
                   std::map<int64_t, std::vector<Id>>* kept) {
    std::map<std::pair<int64_t, int>, std::vector<Id>> by_dp;
    for (const std::vector<Fed>& rank : feeds) {
      std::map<std::pair<int64_t, int>, std::vector<Id>> last;
      for (const Fed& f : rank) last[{f.step, f.dp_rank}] = f.ids;
      for (const auto& [key, ids] : last) {
        auto [it, fresh] = by_dp.insert({key, ids});
        EXPECT_TRUE(fresh || it->second == ids)
            << "the ranks of dp rank " << key.second << " were fed "
            << "different sequences at step " << key.first;
      }
    }
    for (const auto& [key, ids] : by_dp) {
      std::vector<Id>& batch = (*kept)[key.first];
      batch.insert(batch.end(), ids.begin(), ids.end());
    }
  }

  static fs::path root_;
};
fs::path DataResume::root_;

TEST_F(DataResume, NoSequenceIsSkippedOrRepeatedAcrossLayoutsAndARollback) {
  // The uninterrupted single-rank run, long enough to cover the skip.
  const RankFeeds straight =
      Run({"single"}, (root_ / "straight").string(), kSteps + kSkip);
  const std::string dir = (root_ / "moving").string();
  const Layout phases[] = {{"dp4", 4},           {"dp2", 2},
                           {"dp4", 4},           {"dp2_tp2", 2, 2},
                           {"dp2_pp2", 2, 1, 2}, {"dp2_cp2", 2, 1, 1, 2}};
  const int ends[] = {6, 12, 15, 18, 21, kSteps};
  std::map<int64_t, std::vector<Id>> moving;
  std::vector<Fed> shrunk;  // dp 2's rank 0, rollback and all
  for (int i = 0; i < 6; ++i) {
    // The shrunk run meets the anomaly.
    const RankFeeds feeds = Run(phases[i], dir, ends[i], i == 1 ? kNanStep : 0);
    if (WorldRank() != 0) continue;
    ASSERT_EQ(feeds.size(), static_cast<size_t>(phases[i].world()));
    Keep(feeds, &moving);
    if (i == 1) shrunk = feeds[0];
  }
  if (WorldRank() != 0) return;

  std::map<int64_t, std::vector<Id>> ref;
  Keep(straight, &ref);
  ASSERT_EQ(ref.size(), static_cast<size_t>(kSteps + kSkip));
  // The straight run: each source's sequences are its windows once per
  // epoch, in an order that is not the files'.
  std::vector<std::vector<int>> order(2);
  for (const auto& [step, batch] : ref) {
    ASSERT_EQ(batch.size(), static_cast<size_t>(kBatch)) << step;
    for (const Id& id : batch) order[id.first].push_back(id.second);
  }
  const int windows[] = {kWebWindows, kCodeWindows};
  for (int k = 0; k < 2; ++k) {
    ASSERT_GE(order[k].size(), 2u * windows[k]) << "source " << k;
    for (size_t e = 0; (e + 1) * windows[k] <= order[k].size(); ++e) {
      std::vector<int> epoch(order[k].begin() + e * windows[k],
                             order[k].begin() + (e + 1) * windows[k]);
      std::vector<int> sorted = epoch, all(windows[k]);
      std::sort(sorted.begin(), sorted.end());
      for (int w = 0; w < windows[k]; ++w) all[w] = w;
      EXPECT_EQ(sorted, all) << "source " << k << " epoch " << e + 1;
      EXPECT_NE(epoch, all) << "source " << k << " epoch " << e + 1;
    }
  }
  // The moving run trained every step on the straight run's batch of that
  // step, after the rollback on the one kSkip steps further.
  ASSERT_EQ(moving.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, batch] : moving) {
    const int64_t want = step <= kBackTo ? step : step + kSkip;
    EXPECT_EQ(batch, ref[want])
        << "step " << step << " trained on other "
        << "sequences than the straight run's step " << want;
  }
  // The steps the rollback undid had read the skipped batches (the step
  // that met the NaN is never reported: it is undone before).
  std::map<int64_t, int> runs;
  for (const Fed& f : shrunk) {
    if (++runs[f.step] == 1 && f.step > kBackTo && f.step < kNanStep) {
      const std::vector<Id> first_half(ref[f.step].begin(),
                                       ref[f.step].begin() + kBatch / 2);
      EXPECT_EQ(f.ids, first_half) << "step " << f.step << " before the "
                                   << "rollback";
    }
  }
  for (int64_t s = kBackTo + 1; s <= kNanStep; ++s) {
    EXPECT_EQ(runs[s], s < kNanStep ? 2 : 1)
        << "step " << s << " after the rollback";
  }
}

}  // namespace
}  // namespace ptrain
