// ptworker under mpirun: a layout that does not fit the world, or any other
// bad input, ends every rank with a non-zero exit and one error line (no
// hang, no orphan); a good data-parallel run has rank 0 alone write the log.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/shell.h"

namespace {

namespace fs = std::filesystem;

using Result = ptrain::testing::ShellResult;

class PtworkerMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ptworker_mpi_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    log_ = (dir_ / "run.jsonl").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `env`: "NAME=value ..." more for every rank.
  Result Mpirun(int n, const std::string& args, const std::string& env = "") {
    const std::string err_file = (dir_ / "err.txt").string();
    // One OpenMP thread per rank, and ranks that yield while they wait:
    // more ranks than cores otherwise spin against each other.
    const std::string cmd =
        env + " OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 " + MPIEXEC +
        " --allow-run-as-root --oversubscribe --mca btl self,vader,tcp -n " +
        std::to_string(n) + " " + PTWORKER_PATH + " --config " + PT_SOURCE_DIR +
        "/examples/shakespeare-char.yaml --peak-gflops 100 " + "--log-json " +
        log_ + " --set checkpoint.dir=" + (dir_ / "ck").string() + " " + args;
    return ptrain::testing::RunShell(cmd, err_file);
  }

  void ExpectRefused(const Result& r, const std::string& needle) {
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    // One error line, from one rank.
    size_t count = 0;
    for (size_t at = r.err.find("ptworker: error"); at != std::string::npos;
         at = r.err.find("ptworker: error", at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 1u) << r.err;
    EXPECT_FALSE(fs::exists(log_)) << "a refused run wrote its log";
  }

  fs::path dir_;
  std::string log_;
};

TEST_F(PtworkerMpi, WorldSizeThatIsNotDpTpPpPrintsEveryFactor) {
  ExpectRefused(Mpirun(2, "--set parallel.dp=3 --set train.global_batch=33"),
                "world size 2 does not equal parallel.dp × parallel.tp × "
                "parallel.pp = 3 × 1 × 1 = 3");
}

TEST_F(PtworkerMpi, ZeroStageOutsideZeroToThreeIsRefused) {
  ExpectRefused(Mpirun(2, "--set parallel.dp=2 --set parallel.zero=4"),
                "parallel.zero");
}

TEST_F(PtworkerMpi, BatchThatDoesNotDivideIsRefused) {
  ExpectRefused(Mpirun(2, "--set parallel.dp=2 --set train.global_batch=7"),
                "train.global_batch=7 is not divisible by parallel.dp × "
                "parallel.microbatches");
}

TEST_F(PtworkerMpi, ZeroThreeRunHasRankZeroWriteTheLogAlone) {
  const Result r =
      Mpirun(2,
             "--set parallel.dp=2 --set parallel.zero=3 --set train.steps=4 "
             "--set train.eval_every=2 --set train.eval_batches=1 "
             "--set train.sample_tokens=10 --set model.n_layer=1");
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(log_);
  std::string line;
  int steps = 0, memory = 0;
  double exposed = 0.0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "step") {
      ++steps;
      // The wait for the gradient reductions is part of the step.
      const double ms = j.at("ms"), waited = j.at("comm_exposed_ms");
      EXPECT_GE(waited, 0.0);
      EXPECT_LE(waited, ms);
      exposed += waited;
    }
    if (j.at("type") == "memory") {
      ++memory;
      // ZeRO-3 over 2 ranks: each holds half of the Adam moments.
      EXPECT_LT(j.at("optimizer_bytes").get<int64_t>(),
                j.at("grads_bytes").get<int64_t>() * 2);
    }
  }
  // Two ranks appending to one file would double every line.
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(memory, 1);
  // The last units' reduce-scatters end after backward does: waited for.
  EXPECT_GT(exposed, 0.0);
}

// checkpoint.async_save over four ranks (dp=2 x pp=2, ZeRO-1): the ranks
// train on while their shards are written (the save of step 2 is logged
// after step 3), and every committed folder holds, shard for shard, the
// bytes a blocking run of the same job writes.
TEST_F(PtworkerMpi, AsyncSaveAcrossRanksWritesWhatABlockingSaveWrites) {
  const std::string args =
      "--set parallel.dp=2 --set parallel.pp=2 --set parallel.zero=1 "
      "--set parallel.microbatches=2 --set model.n_layer=2 "
      "--set model.n_embd=32 --set train.steps=6 --set train.eval_every=0 "
      "--set train.eval_batches=1 --set train.sample_tokens=0 "
      "--set checkpoint.every=2 --set checkpoint.keep_last=10 ";
  const fs::path async_dir = dir_ / "async", sync_dir = dir_ / "sync";
  const Result a = Mpirun(4,
                          args + "--set checkpoint.async_save=true " +
                              "--set checkpoint.dir=" + async_dir.string(),
                          "PTRAIN_TEST_CHECKPOINT_PAUSE_S=1");
  ASSERT_EQ(a.code, 0) << a.err;
  std::vector<std::pair<std::string, int64_t>> records;
  {
    std::ifstream in(log_);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      records.emplace_back(j.at("type").get<std::string>(),
                           j.value("step", int64_t{-1}));
      // The test hook reached the ranks: the thread paused 1 s.
      if (j.at("type") == "checkpoint" && j.at("step") != 6) {
        EXPECT_GE(j.value("write_seconds", 0.0), 1.0) << line;
      }
    }
  }
  const auto at = [&](const std::string& type, int64_t step) {
    return std::find(records.begin(), records.end(),
                     std::make_pair(type, step)) -
           records.begin();
  };
  EXPECT_LT(at("checkpoint", 2), static_cast<long>(records.size()));
  EXPECT_GT(at("checkpoint", 2), at("step", 3))
      << "the ranks waited for the save of step 2";
  const Result b =
      Mpirun(4, args + "--set checkpoint.dir=" + sync_dir.string());
  ASSERT_EQ(b.code, 0) << b.err;
  const auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  for (const char* step : {"step-00000002", "step-00000004", "step-00000006"}) {
    ASSERT_TRUE(fs::exists(async_dir / step / "manifest.json")) << step;
    for (int r = 0; r < 4; ++r) {
      char shard[32];
      std::snprintf(shard, sizeof(shard), "shard-%05d.bin", r);
      const std::string got = read(async_dir / step / shard);
      EXPECT_FALSE(got.empty()) << step << "/" << shard;
      EXPECT_TRUE(got == read(sync_dir / step / shard))
          << step << "/" << shard << " differs from the blocking save's";
    }
  }
}

// A failure every rank reaches alike (here the anomaly stop) ends the job
// cleanly: each rank finalizes and exits 2, one error line is printed, and
// no rank aborts the world (no MPI_ABORT banner). Alone, without mpirun,
// the same.
TEST_F(PtworkerMpi, AnAgreedFailureEndsEveryRankWithOneLineAndNoAbort) {
  const std::string args =
      "--set parallel.dp=2 --set model.n_layer=1 --set model.n_embd=32 "
      "--set train.steps=10 --set train.eval_every=0 "
      "--set train.sample_tokens=0 --set train.anomaly.nan=stop ";
  for (int ranks : {2, 1}) {
    const Result r =
        ranks == 1
            ? ptrain::testing::RunShell(
                  std::string("PTRAIN_TEST_NAN_AT_STEP=3 ") + PTWORKER_PATH +
                      " --config " + PT_SOURCE_DIR +
                      "/examples/shakespeare-char.yaml --log-json " + log_ +
                      " --set model.n_layer=1 --set model.n_embd=32 "
                      "--set train.steps=10 --set train.anomaly.nan=stop",
                  (dir_ / "err1.txt").string())
            : Mpirun(ranks, args, "PTRAIN_TEST_NAN_AT_STEP=3");
    EXPECT_EQ(r.code, 2) << r.err;
    size_t lines = 0;
    for (size_t at = r.err.find("ptworker: error"); at != std::string::npos;
         at = r.err.find("ptworker: error", at + 1)) {
      ++lines;
    }
    EXPECT_EQ(lines, 1u) << r.err;
    EXPECT_NE(r.err.find("stopping (train.anomaly.nan=stop)"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
    fs::remove(log_);
  }
}

// train.anomaly.nan=rollback over four ranks (tp=2 x pp=2, ZeRO-1): a NaN
// at step 6 rolls every rank back to the checkpoint of step 4 in place;
// from there the run trains, to the bit, as a run resumed from that
// checkpoint with its manifest saying the two steps of data are skipped.
TEST_F(PtworkerMpi, RollbackAcrossRanksIsAResumeThatSkipsTheWindow) {
  const std::string args =
      "--set parallel.tp=2 --set parallel.pp=2 --set parallel.zero=1 "
      "--set parallel.microbatches=2 --set model.n_layer=2 "
      "--set model.n_embd=32 --set train.steps=10 --set train.eval_every=0 "
      "--set train.eval_batches=1 --set train.sample_tokens=0 "
      "--set checkpoint.keep_last=10 ";
  const Result a = Mpirun(
      4,
      args + "--set checkpoint.every=4 " + "--set train.anomaly.nan=rollback",
      "PTRAIN_TEST_NAN_AT_STEP=6");
  ASSERT_EQ(a.code, 0) << a.err;
  const auto losses_after = [&](const std::string& type) {
    std::vector<std::pair<int64_t, double>> out;
    bool after = type.empty();
    std::ifstream in(log_);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("type") == type) after = true;
      if (after && j.at("type") == "step") {
        out.emplace_back(j.at("step").get<int64_t>(),
                         j.at("loss").get<double>());
      }
    }
    return out;
  };
  const auto rolled = losses_after("rollback");
  ASSERT_EQ(rolled.size(), 6u);  // steps 5..10 once more
  EXPECT_EQ(rolled.front().first, 5);
  // The checkpoint of step 4 with the window skipped, resumed.
  const fs::path from = dir_ / "ck" / "step-00000004";
  const fs::path copy = dir_ / "ck2" / "step-00000004";
  fs::create_directories(copy.parent_path());
  fs::copy(from, copy, fs::copy_options::recursive);
  nlohmann::json manifest;
  std::ifstream(copy / "manifest.json") >> manifest;
  EXPECT_EQ(manifest["sampler"]["skipped_steps"], 0);
  manifest["sampler"]["skipped_steps"] = 2;
  std::ofstream(copy / "manifest.json", std::ios::trunc) << manifest.dump(1);
  ASSERT_EQ(std::system(("cd " + copy.string() +
                         " && sha256sum manifest.json > manifest.sha256")
                            .c_str()),
            0);
  fs::remove(log_);
  const Result b =
      Mpirun(4, args + "--set checkpoint.dir=" + copy.parent_path().string() +
                    " --resume-from " + copy.string());
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(losses_after(""), rolled);
}

// Evaluation and sampling under tensor and sequence parallelism, and
// through a pipeline, give what one rank gives: the same validation losses
// and the same sampled text (the vocab-parallel logits are gathered for
// sampling only; the last stage's pick goes back to the others). Sampling
// runs through every stage's key/value cache, past the block size, where
// the context restarts from its last half. The run log's layout record
// names the layout and the schedule.
class PtworkerMpiLayouts : public PtworkerMpi {
 protected:
  std::vector<nlohmann::json> Records(const std::string& type,
                                      const std::string& field) {
    std::vector<nlohmann::json> out;
    std::ifstream in(log_);
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      if (j.at("type") == type) out.push_back(field.empty() ? j : j.at(field));
    }
    return out;
  }
  void ExpectSameAsOneRank(int n, const std::string& layout, int n_layer = 2) {
    const std::string args =
        "--set train.steps=6 --set train.eval_every=3 "
        "--set train.eval_batches=2 --set train.sample_every=3 "
        "--set train.sample_tokens=60 --set model.n_layer=" +
        std::to_string(n_layer) +
        " --set model.n_embd=64 --set model.block_size=32 "
        "--set parallel.microbatches=4 ";
    // Two runs: each saves its own checkpoints (one folder each).
    const Result one = Mpirun(
        1, args + "--set checkpoint.dir=" + (dir_ / "ck-one").string() + " ");
    ASSERT_EQ(one.code, 0) << one.err;
    const auto loss1 = Records("eval", "val_loss");
    const auto text1 = Records("sample", "text");
    fs::remove(log_);
    const Result many = Mpirun(n, args + layout + " --set checkpoint.dir=" +
                                      (dir_ / "ck-many").string());
    ASSERT_EQ(many.code, 0) << many.err;
    const auto loss2 = Records("eval", "val_loss");
    const auto text2 = Records("sample", "text");
    ASSERT_EQ(loss1.size(), 2u);
    ASSERT_EQ(loss2.size(), loss1.size());
    for (size_t i = 0; i < loss1.size(); ++i) {
      const double a = loss1[i].get<double>(), b = loss2[i].get<double>();
      EXPECT_LE(std::fabs(a - b) / a, 1e-5) << a << " vs " << b;
    }
    ASSERT_EQ(text1.size(), 2u);
    EXPECT_EQ(text2, text1);
  }
};

TEST_F(PtworkerMpiLayouts, TensorParallelRunEvaluatesAndSamplesAsOneRankDoes) {
  ExpectSameAsOneRank(
      2, "--set parallel.tp=2 --set parallel.sequence_parallel=true");
}

TEST_F(PtworkerMpiLayouts, PipelineRunEvaluatesAndSamplesAsOneRankDoes) {
  ExpectSameAsOneRank(4,
                      "--set parallel.pp=2 --set parallel.tp=2 "
                      "--set parallel.schedule=gpipe");
  const auto layout = Records("layout", "");
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].at("pp"), 2);
  EXPECT_EQ(layout[0].at("tp"), 2);
  EXPECT_EQ(layout[0].at("world"), 4);
  EXPECT_EQ(layout[0].at("schedule"), "gpipe");
  EXPECT_EQ(layout[0].at("virtual_stages"), 1);
  EXPECT_EQ(layout[0].at("stage_layers"), nlohmann::json({1, 1}));
}

// Through every rank twice: 4 layers as 4 virtual stages on 2 ranks.
TEST_F(PtworkerMpiLayouts, InterleavedPipelineEvaluatesAndSamplesAsOneRank) {
  ExpectSameAsOneRank(2,
                      "--set parallel.pp=2 --set parallel.schedule=interleaved "
                      "--set parallel.virtual_stages=2",
                      /*n_layer=*/4);
  const auto layout = Records("layout", "");
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].at("schedule"), "interleaved");
  EXPECT_EQ(layout[0].at("virtual_stages"), 2);
  EXPECT_EQ(layout[0].at("stage_layers"), nlohmann::json({1, 1, 1, 1}));
}

// Stages of 3 and 1 layers (parallel.first_stage_layers), in the log.
TEST_F(PtworkerMpiLayouts, UnevenPipelineEvaluatesAndSamplesAsOneRank) {
  ExpectSameAsOneRank(2,
                      "--set parallel.pp=2 --set parallel.first_stage_layers=3",
                      /*n_layer=*/4);
  const auto layout = Records("layout", "");
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].at("stage_layers"), nlohmann::json({3, 1}));
}

}  // namespace
