// Coordinator without RPC: submit validation, cancel, lookups, the
// supervision rules driven by a fake mpirun (a shell script) through Tick(),
// and the hardening rules: a private, locked state dir; tokens stored only
// as hashes and valid only while their attempt runs; rank reports checked
// field by field; run logs recovered; a store that cannot write changes
// nothing in memory.
#include "coordinator/coordinator.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "common/gpu_inventory.h"
#include "common/spec.h"
#include "coordinator/auth.h"
#include "coordinator/launcher.h"
#include "gtest/gtest.h"
#include "tests/testing/committed_checkpoint.h"
#include "tests/testing/coordinator_options.h"
#include "tests/testing/old_store.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSpec = R"(name: t
data: {path: data/x.txt}
train: {steps: 10}
restart: {max_restarts: 1, hang_timeout_s: 1}
)";

// Stands in for mpirun: its mode comes from the environment it inherits. It
// leaves its environment in fake.env beside run.jsonl (its --log-json), and
// in mode `log` writes a run log and a committed checkpoint first.
// (Written after a shebang and kShellCommitCheckpoint.)
constexpr const char* kFakeMpirun = R"(
echo "fake rank says goodbye" >&2
log=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--log-json" ]; then log="$2"; fi
  shift
done
env > "$(dirname "$log")/fake.env"
if [ "$FAKE_MODE" = log ] || [ "$FAKE_MODE" = logsleep ]; then
  ck="$FAKE_CKPT_ROOT/$PTRAIN_JOB_UID/step-00000005"
  commit_checkpoint "$ck" 5
  for s in 1 2 3 4 5 6 7; do
    echo "{\"type\":\"step\",\"step\":$s,\"loss\":$((10 - s)).5,\"lr\":0.001,\"ms\":1,\"tok_per_s\":100,\"mfu\":0.01}" >> "$log"
  done
  echo "{\"type\":\"eval\",\"step\":6,\"val_loss\":2.25}" >> "$log"
  echo "{\"type\":\"checkpoint\",\"step\":5,\"dir\":\"$ck\"}" >> "$log"
  echo "{\"type\":\"checkpoint\",\"step\":9,\"dir\":\"/etc\"}" >> "$log"
  echo "{\"type\":\"step\",\"step\":8,\"loss\":NaN}" >> "$log"
fi
if [ "$FAKE_MODE" = agent ]; then
  echo "ptrsh: cannot reach node1:27071: DNS resolution failed" >&2
  for i in $(seq 30); do echo "ORTE was unable to reliably start [$i]" >&2; done
fi
case "$FAKE_MODE" in
  ok|log) exit 0;;
  agent) exit 255;;
  fail) exit 5;;
  bad) exit 2;;
  stop) [ "$PTRAIN_ATTEMPT" = 1 ] && exit 3; exit 0;;
  waitfile) while [ ! -e "$FAKE_GO" ]; do sleep 0.05; done; exit 0;;
  *) exec sleep 100;;
esac
)";

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// VAR's value in a fake.env file ("" when absent).
std::string EnvValue(const fs::path& env_file, const std::string& var) {
  std::ifstream in(env_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(var + "=", 0) == 0) return line.substr(var.size() + 1);
  }
  return "";
}

mode_t Mode(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("coordinator_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "data" / "ckpt");
    // kSpec's data.path: a job's inputs must exist when it is submitted.
    std::ofstream(dir_ / "data" / "x.txt") << "some text to train on\n";
    const fs::path fake = dir_ / "fake_mpirun";
    std::ofstream(fake) << "#!/bin/sh\n"
                        << testing::kShellCommitCheckpoint << kFakeMpirun;
    fs::permissions(fake, fs::perms::owner_all);
    setenv("FAKE_MODE", "ok", 1);
    setenv("FAKE_CKPT_ROOT", (dir_ / "data" / "ckpt").c_str(), 1);
    setenv("FAKE_GO", (dir_ / "go").c_str(), 1);
    options_ = testing::LocalCoordinatorOptions(dir_);
    options_.mpirun = fake.string();
    options_.cancel_grace = absl::Milliseconds(500);
  }
  void TearDown() override {
    for (pid_t p : ProcessesWithEnv(
             {"FAKE_CKPT_ROOT=" + (dir_ / "data" / "ckpt").string()})) {
      kill(p, SIGKILL);
    }
    fs::remove_all(dir_);
  }

  std::unique_ptr<Coordinator> Make() {
    auto c = Coordinator::Create(options_);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A coordinator running one job whose fake rank sleeps (cancel grace
  // 5 s, no hang timeout in sight); its id in *id.
  // A coordinator running one job (*id) of one rank that never reports:
  // hung after a second (restart.hang_timeout_s=1), not restarted.
  std::unique_ptr<Coordinator> MakeWithHangingJob(std::string* id) {
    setenv("FAKE_MODE", "sleep", 1);
    auto c = Make();
    auto job = c->Submit(
        kSpec, {"restart.hang_timeout_s=1", "restart.max_restarts=0"});
    EXPECT_TRUE(job.ok()) << job.status();
    *id = job.ok() ? job->id() : "";
    TickUntil(*c, *id, v1::JOB_STATE_RUNNING);
    return c;
  }
  // A sign of life of rank 0 of job `id`'s first attempt.
  static v1::ReportAliveRequest AliveOfRank0(const std::string& id) {
    v1::ReportAliveRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_rank(0);
    return r;
  }
  std::unique_ptr<Coordinator> MakeWithSleepingJob(std::string* id) {
    setenv("FAKE_MODE", "sleep", 1);
    options_.cancel_grace = absl::Seconds(5);
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    EXPECT_TRUE(job.ok()) << job.status();
    *id = job.ok() ? job->id() : "";
    TickUntil(*c, *id, v1::JOB_STATE_RUNNING);
    return c;
  }
  // Ticks until the job reaches `state` or 20 s pass.
  v1::Job TickUntil(Coordinator& c, const std::string& id, v1::JobState state) {
    v1::Job job;
    for (int i = 0; i < 400; ++i) {
      c.Tick();
      job = c.Get(id, false)->job();
      if (job.state() == state) break;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return job;
  }
  fs::path AttemptDir(const std::string& id, int n) const {
    return dir_ / "state" / "jobs" / id / ("attempt-" + std::to_string(n));
  }
  // The attempt's token, as the fake found it in its environment.
  std::string TokenOf(const std::string& id, int n) {
    for (int i = 0; i < 200; ++i) {
      const std::string t =
          EnvValue(AttemptDir(id, n) / "fake.env", "PTRAIN_JOB_TOKEN");
      if (!t.empty()) return t;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return "";
  }

  fs::path dir_;
  CoordinatorOptions options_;
};

TEST_F(CoordinatorTest, BadInputIsRefusedAndStoresNothing) {
  auto c = Make();
  auto bad_yaml = c->Submit("name: t\nmodel: {n_layer: [\n", {});
  EXPECT_EQ(bad_yaml.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_yaml.status().message().find("line"), absl::string_view::npos)
      << bad_yaml.status();
  auto big = c->Submit(std::string(kMaxSpecBytes + 1, '#'), {});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  auto outside = c->Submit(kSpec, {"data.path=/etc/passwd"});
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.status().message().find("data.path"),
            absl::string_view::npos);
  auto too_wide = c->Submit(kSpec, {"parallel.dp=4"});
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kInvalidArgument);
  // A GPU job where ptcoord's own host has none (with a GPU there is
  // nothing to refuse).
  if (GpuCount() == 0) {
    auto gpu = c->Submit(kSpec, {"resources.device=cuda"});
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(gpu.status().message().find("resources.device=cuda"),
              absl::string_view::npos)
        << gpu.status();
  }
  EXPECT_TRUE(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->empty());
  EXPECT_EQ(c->List(v1::JOB_STATE_UNSPECIFIED, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An input that is not there is refused at submit, naming the field and
// the path looked at, instead of failing the job at launch: a missing
// data.path, a shard pattern that matches nothing, a folder for a file.
TEST_F(CoordinatorTest, MissingInputsAreRefusedAtSubmitNamingTheField) {
  auto c = Make();
  auto missing = c->Submit(kSpec, {"data.path=data/missing.txt"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.status().message(),
            "data.path: " + (dir_ / "data" / "missing.txt").string() +
                " does not exist")
      << missing.status();
  auto folder = c->Submit(kSpec, {"data.path=data/ckpt"});
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(folder.status().message().find("is not a file"),
            absl::string_view::npos)
      << folder.status();
  const std::vector<std::string> bins = {"data.path=''",
                                         "data.train_bin=data/train_*.bin",
                                         "data.val_bin=data/val.bin"};
  auto no_shard = c->Submit(kSpec, bins);
  EXPECT_EQ(no_shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_shard.status().message().find(
                "data.train_bin: no file matches " +
                (dir_ / "data" / "train_*.bin").string()),
            absl::string_view::npos)
      << no_shard.status();
  auto init = c->Submit(kSpec, {"model.init_from=llmc:data/gpt2.bin"});
  EXPECT_NE(init.status().message().find("model.init_from"),
            absl::string_view::npos)
      << init.status();
  EXPECT_TRUE(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->empty());
  // Once the shards are there, the same spec is accepted.
  std::ofstream(dir_ / "data" / "train_000.bin") << "x";
  std::ofstream(dir_ / "data" / "val.bin") << "x";
  auto shards = c->Submit(kSpec, bins);
  EXPECT_TRUE(shards.ok()) << shards.status();
}

// A model from a Hugging Face folder under the data roots: the spec stored
// has the fields its config.json gives (those the spec left out), so the
// ranks get them; a spec that disagrees with the config is refused at
// submit, naming the field.
TEST_F(CoordinatorTest, AHuggingFaceModelsFieldsAreTakenFromItsConfigAtSubmit) {
  auto c = Make();
  fs::create_directories(dir_ / "data" / "llama");
  std::ofstream(dir_ / "data" / "llama" / "config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
             "intermediate_size": 160, "num_hidden_layers": 3,
             "num_attention_heads": 8, "num_key_value_heads": 2,
             "max_position_embeddings": 64, "vocab_size": 300,
             "tie_word_embeddings": false})";
  auto job = c->Submit(kSpec, {"model.init_from=hf:data/llama"});
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::ModelSpec m = c->Get(job->id(), false)->job().spec().model();
  EXPECT_EQ(m.arch(), "llama");
  EXPECT_EQ(m.n_layer(), 3);
  EXPECT_EQ(m.n_kv_head(), 2);
  EXPECT_EQ(m.ffn_hidden(), 160);
  EXPECT_FALSE(m.tie_embeddings());
  EXPECT_EQ(m.init_from(), "hf:" + (dir_ / "data" / "llama").string());
  auto other =
      c->Submit(kSpec, {"model.init_from=hf:data/llama", "model.n_layer=4"});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.status().message().find(
                "model.n_layer=4 in the spec but 3 in the Hugging Face config"),
            absl::string_view::npos)
      << other.status();
  auto missing = c->Submit(kSpec, {"model.init_from=hf:data/none"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("config.json"),
            absl::string_view::npos)
      << missing.status();
}

// On its own host ptcoord keeps GPU jobs apart: each rank gets a GPU no
// running job holds (PTRAIN_RANK_GPUS, kept as a placement on this host),
// a GPU job waits while its GPUs are taken, and takes them once freed.
// --local-gpus stands for the host's GPUs (ptcoord checks it against the
// driver at start; this test has none).
TEST_F(CoordinatorTest, LocalGpuJobsTakeDistinctGpusAndWaitForThem) {
  if (RanksShareGpus()) GTEST_SKIP() << "PTRAIN_CUDA_SHARE_GPUS";
  options_.local_slots = 4;
  options_.local_gpus = 2;
  setenv("FAKE_MODE", "waitfile", 1);
  auto c = Make();
  auto too_wide = c->Submit(kSpec, {"resources.device=cuda", "parallel.dp=4"});
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_wide.status().message().find("--local-gpus"),
            absl::string_view::npos)
      << too_wide.status();
  // Silent (the fake reports no steps) for as long as the test takes.
  const std::vector<std::string> gpu = {"resources.device=cuda",
                                        "restart.hang_timeout_s=600"};
  auto a = c->Submit(kSpec, gpu);
  auto b = c->Submit(kSpec, gpu);
  auto waits = c->Submit(kSpec, gpu);
  ASSERT_TRUE(a.ok() && b.ok() && waits.ok());
  TickUntil(*c, a->id(), v1::JOB_STATE_RUNNING);
  TickUntil(*c, b->id(), v1::JOB_STATE_RUNNING);
  std::set<std::string> gpus;
  for (const auto& id : {a->id(), b->id()}) {
    const v1::Job job = c->Get(id, false)->job();
    ASSERT_EQ(job.placement_size(), 1) << id;
    ASSERT_EQ(job.placement(0).gpus_size(), 1) << id;
    // What its ranks were told, once the fake has started.
    std::string env;
    for (int i = 0; i < 200 && env.empty(); ++i) {
      env = EnvValue(AttemptDir(id, 1) / "fake.env", "PTRAIN_RANK_GPUS");
      if (env.empty()) absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_EQ(env, std::to_string(job.placement(0).gpus(0))) << id;
    gpus.insert(env);
  }
  EXPECT_EQ(gpus, (std::set<std::string>{"0", "1"}));
  // Both GPUs are held: the third waits, though slots are free.
  for (int i = 0; i < 5; ++i) c->Tick();
  EXPECT_EQ(c->Get(waits->id(), false)->job().state(), v1::JOB_STATE_QUEUED);
  std::ofstream(dir_ / "go") << "";
  const v1::Job done = TickUntil(*c, waits->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(done.placement_size(), 1);
  EXPECT_EQ(done.placement(0).gpus_size(), 1);
  EXPECT_EQ(c->Get(a->id(), false)->job().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, UnknownJobIsNotFoundAndRankAuthFails) {
  auto c = Make();
  EXPECT_EQ(c->Get("job-0042", false).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Cancel("job-0042").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->AuthenticateRank("job-0042", "Bearer x").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(c->AuthenticateUser("Bearer nope").status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(c->AuthenticateUser("Bearer user").ok());
}

TEST_F(CoordinatorTest, CancelQueuedJobTwiceIsIdempotent) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_QUEUED);
  auto first = c->Cancel(job->id());
  auto second = c->Cancel(job->id());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(first->finished_unix_ms(), second->finished_unix_ms());
}

// PauseJob / ResumeJob: a queued job is PAUSED at once and not scheduled;
// ResumeJob queues it again and it runs; what is not PAUSED cannot be
// resumed, what has ended cannot be paused; a PAUSED job cancels at once.
TEST_F(CoordinatorTest, PausedQueuedJobWaitsUntilResumed) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok()) << job.status();
  auto not_paused = c->Resume(job->id());
  EXPECT_EQ(not_paused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_paused.status().message().find(
                "is QUEUED: only a PAUSED job can be resumed"),
            std::string::npos)
      << not_paused.status();
  auto paused = c->Pause(job->id());
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->state(), v1::JOB_STATE_PAUSED);
  for (int i = 0; i < 10; ++i) c->Tick();
  EXPECT_EQ(c->Get(job->id(), false)->job().state(), v1::JOB_STATE_PAUSED);
  EXPECT_EQ(c->Get(job->id(), false)->job().attempts(), 0);
  EXPECT_TRUE(c->Pause(job->id()).ok());  // idempotent
  auto resumed = c->Resume(job->id());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->state(), v1::JOB_STATE_QUEUED);
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  auto ended = c->Pause(job->id());
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ended.status().message().find("is SUCCEEDED"), std::string::npos)
      << ended.status();

  auto other = c->Submit(kSpec, {});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(c->Pause(other->id()).ok());
  auto cancelled = c->Cancel(other->id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
}

// A running attempt that cannot be asked to save (no mpirun: this fake) is
// stopped anyway; the job is PAUSED once it has ended, and resumes as a new
// attempt.
TEST_F(CoordinatorTest, PausedRunningJobIsPausedOnceItsAttemptEnds) {
  std::string id;
  auto c = MakeWithSleepingJob(&id);
  auto asked = c->Pause(id);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_TRUE(asked->pause_requested());
  const v1::Job paused = TickUntil(*c, id, v1::JOB_STATE_PAUSED);
  ASSERT_EQ(paused.state(), v1::JOB_STATE_PAUSED);
  EXPECT_FALSE(paused.pause_requested());
  EXPECT_EQ(paused.attempts(), 1);
  ASSERT_TRUE(c->Resume(id).ok());
  const v1::Job again = TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  EXPECT_EQ(again.attempts(), 2);
  ASSERT_TRUE(c->Cancel(id).ok());
  TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
}

// Every attempt records why it ended, and only a failure of the job's own
// counts as a restart (what restart.max_restarts limits and the restart
// alert watches); a stop as asked (exit 3) and a pause are requeues, by
// reason.
TEST_F(CoordinatorTest, AttemptsSayWhyTheyEndedAndOnlyFailuresAreRestarts) {
  auto c = Make();
  // Submits with the fake in `mode` and ticks until the job is in `state`;
  // its attempts' ends.
  const auto ends =
      [&](const char* mode, const std::vector<std::string>& overrides,
          v1::JobState state,
          const std::function<void(const std::string&)>& drive = nullptr) {
        setenv("FAKE_MODE", mode, 1);
        auto job = c->Submit(kSpec, overrides);
        EXPECT_TRUE(job.ok()) << job.status();
        if (!job.ok()) return std::vector<v1::AttemptEnd>{};
        if (drive) drive(job->id());
        EXPECT_EQ(TickUntil(*c, job->id(), state).state(), state);
        std::vector<v1::AttemptEnd> out;
        const absl::StatusOr<v1::GetJobResponse> got = c->Get(job->id(), false);
        for (const v1::Attempt& a : got->attempts()) out.push_back(a.end());
        return out;
      };
  std::map<std::string, int64_t> requeued = {{"grown", 0},     {"lost", 0},
                                             {"node_lost", 0}, {"paused", 0},
                                             {"preempted", 0}, {"stopped", 0}};
  EXPECT_EQ(c->Requeues(), requeued);

  // Attempt 1 exits 3 (stopped as asked), attempt 2 0.
  EXPECT_EQ(ends("stop", {"restart.max_restarts=0"}, v1::JOB_STATE_SUCCEEDED),
            (std::vector<v1::AttemptEnd>{v1::ATTEMPT_END_STOPPED,
                                         v1::ATTEMPT_END_SUCCEEDED}));
  // Paused, resumed, cancelled.
  const auto pause_resume_cancel = [&](const std::string& id) {
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(c->Pause(id).ok());
    ASSERT_EQ(TickUntil(*c, id, v1::JOB_STATE_PAUSED).state(),
              v1::JOB_STATE_PAUSED);
    ASSERT_TRUE(c->Resume(id).ok());
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(c->Cancel(id).ok());
  };
  EXPECT_EQ(ends("sleep", {"restart.hang_timeout_s=600"},
                 v1::JOB_STATE_CANCELLED, pause_resume_cancel),
            (std::vector<v1::AttemptEnd>{v1::ATTEMPT_END_PAUSED,
                                         v1::ATTEMPT_END_CANCELLED}));
  EXPECT_EQ(c->Restarts(), 0);
  requeued["stopped"] = 1;
  requeued["paused"] = 1;
  EXPECT_EQ(c->Requeues(), requeued);

  // Fails twice: max_restarts is 1.
  EXPECT_EQ(ends("fail", {}, v1::JOB_STATE_FAILED),
            (std::vector<v1::AttemptEnd>{v1::ATTEMPT_END_FAILED,
                                         v1::ATTEMPT_END_FAILED}));
  EXPECT_EQ(c->Restarts(), 1);
  EXPECT_EQ(c->Requeues(), requeued);
}

// A job that ended before ptcoord restarted never changes again: a watcher
// that has seen nothing of it (version 0) still gets it at once, not after
// a change that never comes (`ptctl watch` hung on such jobs).
TEST_F(CoordinatorTest, AJobThatEndedBeforeARestartIsShownToANewWatcher) {
  std::string id;
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {});
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->id();
    ASSERT_EQ(TickUntil(*c, id, v1::JOB_STATE_SUCCEEDED).state(),
              v1::JOB_STATE_SUCCEEDED);
  }
  auto c = Make();
  auto snap = c->WaitForChange(id, 0, absl::Milliseconds(200));
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_GT(snap->version, 0u) << "a watcher would wait for a change";
  EXPECT_EQ(snap->job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(snap->message, "");
}

TEST_F(CoordinatorTest, ExitZeroSucceeds) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts(), 1);
  // Never evaluated: no validation loss, rather than one of 0.
  EXPECT_FALSE(done.progress().has_val_loss());
  EXPECT_TRUE(fs::exists(dir_ / "state/jobs" / job->id() / "spec.yaml"));
}

TEST_F(CoordinatorTest, FailureRestartsThenFailsWithLastStderrLines) {
  setenv("FAKE_MODE", "fail", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.attempts(), 2);  // max_restarts: 1
  EXPECT_NE(done.error().find("fake rank says goodbye"), std::string::npos)
      << done.error();
  EXPECT_NE(done.error().find("code 5"), std::string::npos) << done.error();
}

// mpirun could not start ranks on a node: OpenMPI's lines bury the launch
// agent's own, which the error quotes first.
TEST_F(CoordinatorTest, AFailedLaunchQuotesTheLaunchAgentsOwnLine) {
  setenv("FAKE_MODE", "agent", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.max_restarts=0"});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_NE(done.error().find("attempt 1 exited with code 255; the launch "
                              "agent said:\nptrsh: cannot reach "
                              "node1:27071: DNS resolution failed\nlast "
                              "stderr lines:\n"),
            std::string::npos)
      << done.error();
  EXPECT_NE(done.error().find("start [30]"), std::string::npos) << done.error();
  EXPECT_EQ(done.error().find("start [10]"), std::string::npos)
      << done.error();  // only the last 20 lines
}

// Exit 3 is ptworker's "stopped as asked (SIGUSR1) after a checkpoint": the
// job is requeued without using up a restart and is not marked failed.
TEST_F(CoordinatorTest, StoppedAttemptIsRequeuedWithoutARestart) {
  setenv("FAKE_MODE", "stop", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.max_restarts=0"});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_EQ(done.error(), "");
}

TEST_F(CoordinatorTest, ExitCodeTwoIsBadInputAndFailsWithoutRestart) {
  setenv("FAKE_MODE", "bad", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.max_restarts=3"});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.attempts(), 1) << done.error();
  EXPECT_NE(done.error().find("code 2"), std::string::npos) << done.error();
  EXPECT_NE(done.error().find("fake rank says goodbye"), std::string::npos)
      << done.error();
}

TEST_F(CoordinatorTest, SilentAttemptIsKilledAsHangAndRestarted) {
  setenv("FAKE_MODE", "sleep", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_NE(done.error().find("hang at step 0"), std::string::npos)
      << done.error();
}

// An attempt's folder is its ranks' to write (and with --launcher nodes
// every node's). FIFOs and links to /dev/zero where ptcoord reads dumps,
// logs and the run log hold nothing up: the hung attempt is analysed and
// ended while the API answers, and diagnose names what it skipped.
TEST_F(CoordinatorTest, HostileFilesInTheAttemptFolderHoldNothingUp) {
  std::string id;
  auto c = MakeWithHangingJob(&id);
  const fs::path a = AttemptDir(id, 1);
  // The attempt's process opens its logs after it is started (between fork
  // and exec): replaced before that, they would be opened (created) again.
  for (int i = 0; i < 200 && !fs::exists(a / "stderr.log"); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(a / "stderr.log"));
  fs::create_directories(a / "flight");
  const std::vector<fs::path> fifos = {a / "flight/rank-00001.jsonl",
                                       a / "stderr.log", a / "run.jsonl"};
  for (const fs::path& f : fifos) {
    fs::remove(f);
    ASSERT_EQ(::mkfifo(f.c_str(), 0600), 0) << f;
  }
  fs::create_symlink("/dev/zero", a / "flight/rank-00000.jsonl");
  fs::remove(a / "stdout.log");
  fs::create_symlink("/dev/zero", a / "stdout.log");

  auto ended = std::async(std::launch::async, [&] {
    return TickUntil(*c, id, v1::JOB_STATE_FAILED);
  });
  // Meanwhile the API answers, again and again.
  auto listed = std::async(std::launch::async, [&] {
    int answers = 0;
    for (int i = 0; i < 20; ++i) {
      answers += c->List(v1::JOB_STATE_UNSPECIFIED, 0).ok();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return answers;
  });
  // A read blocked on a FIFO fails the test, and writers that open and
  // close end it, so that the test ends.
  const auto unblock = [&](const auto& done, const char* what) {
    if (done.wait_for(std::chrono::minutes(1)) == std::future_status::ready) {
      return;
    }
    ADD_FAILURE() << what << " blocked on the attempt's files";
    while (done.wait_for(std::chrono::milliseconds(100)) !=
           std::future_status::ready) {
      for (const fs::path& f : fifos) {
        ::close(::open(f.c_str(), O_WRONLY | O_NONBLOCK));
      }
    }
  };
  unblock(listed, "the API");
  unblock(ended, "supervision");
  EXPECT_EQ(listed.get(), 20);
  const v1::Job done = ended.get();
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(done.error().find("hang at step 0"), std::string::npos)
      << done.error();
  auto events = c->Events(id);
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(std::any_of(events->begin(), events->end(), [](const auto& e) {
    return e.second.find("hang analysis of attempt 1") != std::string::npos;
  })) << "the hang was analysed";

  // The analysis kept for later, replaced by a link: not followed, said so,
  // and the dumps analysed again instead.
  fs::remove(a / "flight/analysis.txt");
  fs::create_symlink("/dev/zero", a / "flight/analysis.txt");
  auto diagnosed =
      std::async(std::launch::async, [&] { return c->Diagnose(id, 1); });
  unblock(diagnosed, "diagnose");
  auto d = diagnosed.get();
  ASSERT_TRUE(d.ok()) << d.status();
  for (const char* skipped :
       {"skipped: rank-00000.jsonl: is a symbolic link, not a regular file",
        "skipped: rank-00001.jsonl: is a FIFO, not a regular file",
        "skipped: stderr.log: is a FIFO, not a regular file",
        "skipped: analysis.txt: is a symbolic link, not a regular file"}) {
    EXPECT_NE(d->text().find(skipped), std::string::npos)
        << skipped << " not in:\n"
        << d->text();
  }
  EXPECT_EQ(d->text().rfind("attempt 1 ended (failed", 0), 0u) << d->text();
}

// exit_code lies in the ranks' folder too: a FIFO or a link there is an
// unknown exit, at once.
TEST_F(CoordinatorTest, ExitCodeFileThatIsAFifoOrALinkIsUnknown) {
  fs::create_directories(dir_ / "a");
  ASSERT_EQ(::mkfifo((dir_ / "a/exit_code").c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] {
    return ReadAttemptExit((dir_ / "a").string());
  });
  if (read.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    ADD_FAILURE() << "ReadAttemptExit blocked on a FIFO";
    ::close(::open((dir_ / "a/exit_code").c_str(), O_WRONLY | O_NONBLOCK));
  }
  EXPECT_EQ(read.get().kind, AttemptExit::kUnknown);
  fs::remove(dir_ / "a/exit_code");
  std::ofstream(dir_ / "code") << "0              \n";
  fs::create_symlink(dir_ / "code", dir_ / "a/exit_code");
  EXPECT_EQ(ReadAttemptExit((dir_ / "a").string()).kind, AttemptExit::kUnknown);
  fs::remove(dir_ / "a/exit_code");
  fs::copy_file(dir_ / "code", dir_ / "a/exit_code");
  const AttemptExit real = ReadAttemptExit((dir_ / "a").string());
  EXPECT_EQ(real.kind, AttemptExit::kCode);
  EXPECT_EQ(real.code, 0);
}

// The last lines of a failed attempt's stderr.log end its error: only the
// end of a long log is read, a line too long for an error is cut, and a log
// that is no regular file is said to be one.
TEST_F(CoordinatorTest, TailLinesReadsTheEndOnlyAndSaysWhatItSkipped) {
  const fs::path log = dir_ / "stderr.log";
  {
    std::ofstream out(log, std::ios::binary);
    out << std::string(3 * kMaxTailBytes, 'x') << "\n"
        << "one\n"
        << std::string(2 * kMaxTailLineBytes, 'y') << "\n"
        << "two\n";
  }
  EXPECT_EQ(TailLines(log.string(), 20),
            "one\n" + std::string(kMaxTailLineBytes, 'y') + "\u2026\ntwo\n");
  EXPECT_EQ(TailLines(log.string(), 1), "two\n");
  fs::remove(log);
  EXPECT_EQ(TailLines(log.string(), 20), "");
  ASSERT_EQ(::mkfifo(log.c_str(), 0600), 0);
  auto read = std::async(std::launch::async,
                         [&] { return TailLines(log.string(), 20); });
  if (read.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    ADD_FAILURE() << "TailLines blocked on a FIFO";
    ::close(::open(log.c_str(), O_WRONLY | O_NONBLOCK));
  }
  EXPECT_EQ(read.get(),
            "(" + log.string() + ": is a FIFO, not a regular file)\n");
}

// ptctl diagnose --attempt N of an attempt that ended without being asked
// for dumps: it ended, and how, not "running in setup".
TEST_F(CoordinatorTest, DiagnoseOfAnEndedAttemptSaysHowItEnded) {
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED).state(),
            v1::JOB_STATE_SUCCEEDED);
  const fs::path flight = AttemptDir(job->id(), 1) / "flight";
  fs::create_directories(flight);
  std::ofstream(flight / "rank-00000.jsonl")
      << R"({"type":"header","version":1,"rank":0,"world_size":1,"pid":4242,)"
         R"("host":"h","coords":{"dp":0},"groups":{"world":[0]},)"
         R"("reason":"start","dumped_unix_us":1700000000000000,"step":0,)"
         R"("microbatch":-1,"phase":"setup","last_activity_unix_us":0,)"
         R"("capacity":2048,"recorded":0})"
      << "\n";
  // Asked for the newest attempt with dumps: none answered a request.
  EXPECT_EQ(c->Diagnose(job->id(), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto d = c->Diagnose(job->id(), 1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->text().rfind("attempt 1 ended (succeeded): its ranks left no "
                            "dump",
                            0),
            0u)
      << d->text();
  EXPECT_EQ(d->text().find("running"), std::string::npos) << d->text();
  EXPECT_EQ(d->text().find("setup"), std::string::npos) << d->text();
  EXPECT_NE(d->json().find(R"("ended":"succeeded")"), std::string::npos)
      << d->json();
}

TEST_F(CoordinatorTest, CancelRunningJobEndsEveryProcess) {
  std::string id;
  auto c = MakeWithSleepingJob(&id);
  ASSERT_TRUE(c->Cancel(id).ok());
  ASSERT_TRUE(c->Cancel(id).ok());
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_CANCELLED);
}

// Only an ended job is deleted: then it is gone from every listing, with
// its folder in the state dir, and its id is never given again; its
// checkpoints stay unless purged. A running job is refused and unharmed.
TEST_F(CoordinatorTest, AnEndedJobIsDeletedRunningOnesAreRefused) {
  std::string running;
  auto c = MakeWithSleepingJob(&running);
  auto refused = c->Delete(running, /*purge=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "is RUNNING: only an ended job (SUCCEEDED, FAILED or "
                "CANCELLED) can be deleted; cancel it first"),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(c->Get(running, false)->job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c->Delete("job-9999", false).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(c->Cancel(running).ok());
  TickUntil(*c, running, v1::JOB_STATE_CANCELLED);

  setenv("FAKE_MODE", "ok", 1);
  auto kept = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  auto purged = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(kept.ok() && purged.ok());
  TickUntil(*c, kept->id(), v1::JOB_STATE_SUCCEEDED);
  TickUntil(*c, purged->id(), v1::JOB_STATE_SUCCEEDED);
  for (const auto* job : {&*kept, &*purged}) {
    fs::create_directories(job->spec().checkpoint().dir() + "/step-00000001");
  }
  const int64_t restarts = c->Restarts();
  auto d = c->Delete(kept->id(), /*purge=*/false);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->checkpoint_dir(), kept->spec().checkpoint().dir());
  EXPECT_FALSE(d->purged());
  EXPECT_TRUE(fs::exists(kept->spec().checkpoint().dir()));
  EXPECT_FALSE(fs::exists(dir_ / "state" / "jobs" / kept->id()));
  EXPECT_EQ(c->Get(kept->id(), false).status().code(),
            absl::StatusCode::kNotFound);
  d = c->Delete(purged->id(), /*purge=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->purged());
  EXPECT_FALSE(fs::exists(purged->spec().checkpoint().dir()));
  EXPECT_TRUE(fs::exists(dir_ / "data/ckpt"));  // only the job's folder
  EXPECT_EQ(c->Restarts(), restarts);           // counters do not go down
  std::vector<std::string> listed;
  const auto jobs = c->List(v1::JOB_STATE_UNSPECIFIED, 0);
  ASSERT_TRUE(jobs.ok());
  for (const v1::Job& j : *jobs) listed.push_back(j.id());
  EXPECT_EQ(listed, std::vector<std::string>{running});
  // The newest was deleted: the next job gets a new id all the same.
  auto next = c->Submit(kSpec, {});
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->id(), purged->id());
  EXPECT_NE(next->id(), kept->id());
  c.reset();
  // A restarted ptcoord does not know them either.
  auto again = Make();
  EXPECT_EQ(again->Get(kept->id(), false).status().code(),
            absl::StatusCode::kNotFound);
}

// The job list does not grow forever: ended jobs past the retention are
// forgotten (checkpoints kept), the others never.
TEST_F(CoordinatorTest, EndedJobsPastTheRetentionAreForgotten) {
  options_.ended_job_retention = absl::Hours(24);
  std::string running;
  auto c = MakeWithSleepingJob(&running);
  setenv("FAKE_MODE", "ok", 1);
  auto ended = c->Submit(kSpec, {});
  auto queued = c->Submit(kSpec, {"restart.max_restarts=0"});
  ASSERT_TRUE(ended.ok() && queued.ok());
  ASSERT_TRUE(c->Pause(queued->id()).ok());
  TickUntil(*c, ended->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(c->ForgetExpiredJobs(absl::Now()).empty());
  const std::vector<std::string> forgotten =
      c->ForgetExpiredJobs(absl::Now() + absl::Hours(25));
  EXPECT_EQ(forgotten, std::vector<std::string>{ended->id()});
  EXPECT_EQ(c->Get(ended->id(), false).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(c->Get(running, false).ok());
  EXPECT_TRUE(c->Get(queued->id(), false).ok());
}

TEST_F(CoordinatorTest, RestartReadoptsLiveAttempt) {
  setenv("FAKE_MODE", "sleep", 1);
  std::string id;
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  }  // the coordinator goes away; its attempt keeps running
  // The restart may come before the attempt's exec (often on a loaded
  // machine), when /proc still shows the coordinator's environment in it:
  // the state dir's lock, held by the forked child until its exec, makes
  // the new coordinator wait for it.
  auto c = Make();
  auto got = c->Get(id, false);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(got->job().attempts(), 1);
  ASSERT_TRUE(c->Cancel(id).ok());
  EXPECT_EQ(TickUntil(*c, id, v1::JOB_STATE_CANCELLED).state(),
            v1::JOB_STATE_CANCELLED);
}

// --- the state dir -------------------------------------------------------

TEST_F(CoordinatorTest, StateDirIsPrivateAndItsFilesAreOwnerOnly) {
  auto c = Make();
  ASSERT_NE(c, nullptr);
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Mode(dir_ / "state"), 0700u);
  for (const char* f :
       {"ptcoord.db", "ptcoord.db-wal", "ptcoord.db-shm", "lock"}) {
    EXPECT_EQ(Mode(dir_ / "state" / f), 0600u) << f;
  }
  EXPECT_EQ(Mode(dir_ / "state/jobs" / job->id()), 0700u);
  EXPECT_EQ(Mode(dir_ / "state/jobs" / job->id() / "spec.yaml"), 0600u);
  EXPECT_EQ(Mode(AttemptDir(job->id(), 1)), 0700u);
  EXPECT_EQ(Mode(AttemptDir(job->id(), 1) / "stderr.log"), 0600u);
}

TEST_F(CoordinatorTest, OlderOpenStateDirIsTightened) {
  fs::create_directories(dir_ / "state");
  chmod((dir_ / "state").c_str(), 0755);
  std::ofstream(dir_ / "state" / "address") << "127.0.0.1:1\n";
  chmod((dir_ / "state" / "address").c_str(), 0644);
  auto c = Make();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Mode(dir_ / "state"), 0700u);
  EXPECT_EQ(Mode(dir_ / "state" / "address"), 0600u);
}

TEST_F(CoordinatorTest, StateDirOthersCanWriteIsRefused) {
  fs::create_directories(dir_ / "state");
  chmod((dir_ / "state").c_str(), 0777);
  auto c = Coordinator::Create(options_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find(options_.state_dir),
            absl::string_view::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("writable by group or others"),
            absl::string_view::npos)
      << c.status();
  EXPECT_FALSE(fs::exists(dir_ / "state" / "ptcoord.db"));
}

TEST_F(CoordinatorTest, StateDirOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  fs::create_directories(dir_ / "state");
  chmod((dir_ / "state").c_str(), 0700);
  ASSERT_EQ(chown((dir_ / "state").c_str(), 65534, 65534), 0);
  auto c = Coordinator::Create(options_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(c.status().message().find("owned by uid 65534"),
            absl::string_view::npos)
      << c.status();
  EXPECT_FALSE(fs::exists(dir_ / "state" / "ptcoord.db"));
}

TEST_F(CoordinatorTest, SecondCoordinatorOnOneStateDirIsRefused) {
  auto first = Make();
  ASSERT_NE(first, nullptr);
  auto second = Coordinator::Create(options_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(options_.state_dir),
            absl::string_view::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("pid " + std::to_string(getpid())),
            absl::string_view::npos)
      << second.status();
  first.reset();  // released with its owner
  EXPECT_TRUE(Coordinator::Create(options_).ok());
}

// --- tokens, uids and the attempt's environment --------------------------

TEST_F(CoordinatorTest, RankTokenIsStoredOnlyAsItsHash) {
  setenv("FAKE_MODE", "sleep", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
  ASSERT_TRUE(job.ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_RUNNING);
  const std::string token = TokenOf(job->id(), 1);
  ASSERT_EQ(token.size(), 64u);
  EXPECT_TRUE(c->AuthenticateRank(job->id(), "Bearer " + token).ok());
  EXPECT_EQ(c->AuthenticateRank(job->id(), "Bearer " + GenerateToken()).code(),
            absl::StatusCode::kUnauthenticated);
  for (const char* f : {"ptcoord.db", "ptcoord.db-wal"}) {
    const std::string bytes = ReadFile(dir_ / "state" / f);
    EXPECT_EQ(bytes.find(token), std::string::npos) << f << " holds the token";
  }
  ASSERT_TRUE(c->Cancel(job->id()).ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, RankTokenDiesWithItsAttempt) {
  auto c = Make();
  auto job = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(job.ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  const std::string token = TokenOf(job->id(), 1);
  ASSERT_FALSE(token.empty());
  EXPECT_EQ(c->AuthenticateRank(job->id(), "Bearer " + token).code(),
            absl::StatusCode::kUnauthenticated);
  // Even past the token check, an ended attempt reports nothing.
  const fs::path forged =
      fs::path(job->spec().checkpoint().dir()) / "step-00123456";
  testing::WriteCommittedCheckpoint(forged, 123456);
  v1::ReportCheckpointRequest r;
  r.set_job_id(job->id());
  r.set_attempt(1);
  r.set_step(10);
  r.set_dir(forged.string());
  EXPECT_EQ(c->ReportCheckpoint(r).code(),
            absl::StatusCode::kFailedPrecondition);
  v1::ReportProgressRequest p;
  p.set_job_id(job->id());
  p.set_attempt(1);
  p.set_step(5);
  EXPECT_EQ(c->ReportProgress(p).code(), absl::StatusCode::kFailedPrecondition);
  auto got = c->Get(job->id(), true);
  EXPECT_EQ(got->loss_history_size(), 0);
  EXPECT_EQ(got->job().progress().step(), 0);
}

TEST_F(CoordinatorTest, AttemptGetsUidsDataRootsAndTlsCa) {
  options_.tls_ca_pem = "-----BEGIN CERTIFICATE-----\nfake\n";
  auto c = Make();
  auto job = c->Submit(kSpec, {});
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->uid().rfind("t-", 0), 0u) << job->uid();
  EXPECT_EQ(job->uid().size(), 2u + 26u) << job->uid();
  TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  const fs::path env = AttemptDir(job->id(), 1) / "fake.env";
  EXPECT_EQ(EnvValue(env, "PTRAIN_JOB_UID"), job->uid());
  EXPECT_EQ(EnvValue(env, "PTRAIN_ATTEMPT_UID").rfind(job->uid() + ".1.", 0),
            0u);
  EXPECT_EQ(EnvValue(env, "PTRAIN_DATA_ROOTS"), (dir_ / "data").string());
  const std::string ca = EnvValue(env, "PTRAIN_TLS_CA");
  ASSERT_FALSE(ca.empty());
  EXPECT_EQ(ReadFile(ca), options_.tls_ca_pem);
}

TEST_F(CoordinatorTest, CoordinatorsSharingACheckpointRootUseDistinctFolders) {
  auto a = Make();
  options_.state_dir = (dir_ / "state-b").string();
  auto b = Make();
  auto ja = a->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  auto jb = b->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(ja.ok() && jb.ok());
  EXPECT_EQ(ja->id(), jb->id());  // both job-0001
  EXPECT_NE(ja->uid(), jb->uid());
  EXPECT_EQ(ja->spec().checkpoint().dir(),
            (dir_ / "data/ckpt" / ja->uid()).string());
  EXPECT_EQ(jb->spec().checkpoint().dir(),
            (dir_ / "data/ckpt" / jb->uid()).string());
}

// A spec without checkpoint.dir checkpoints under the checkpoint root, in
// a folder of its own; its ranks may write there. One that names a folder
// keeps it.
TEST_F(CoordinatorTest, AJobWithoutACheckpointDirGetsOneUnderTheRoot) {
  options_.checkpoint_root = (dir_ / "ckpt-root").string();
  auto c = Make();
  auto plain = c->Submit(kSpec, {});
  auto named = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(plain.ok() && named.ok());
  EXPECT_EQ(plain->spec().checkpoint().dir(),
            (dir_ / "ckpt-root" / plain->uid()).string());
  EXPECT_EQ(named->spec().checkpoint().dir(),
            (dir_ / "data/ckpt" / named->uid()).string());
  TickUntil(*c, plain->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(
      EnvValue(AttemptDir(plain->id(), 1) / "fake.env", "PTRAIN_DATA_ROOTS"),
      (dir_ / "data").string() + ":" + (dir_ / "ckpt-root").string());
}

// An attempt an older ptcoord launched: its database has the plain token,
// its processes no PTRAIN_ATTEMPT_UID. Migrated, it is still found (by the
// token's hash), re-adopted and can be cancelled.
TEST_F(CoordinatorTest, AttemptOfAnOlderCoordinatorIsFoundByItsTokenHash) {
  const std::string token = GenerateToken();
  const fs::path attempt = AttemptDir("job-0001", 1);
  fs::create_directories(attempt);
  fs::create_directories(dir_ / "state");
  chmod((dir_ / "state").c_str(), 0700);
  {
    v1::Job job;
    job.set_id("job-0001");
    job.set_name("old");
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_attempts(1);
    job.set_world_size(1);
    auto spec = ParseJobSpec(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(spec.ok());
    *job.mutable_spec() = *spec;
    ASSERT_EQ(testing::WriteOldStore((dir_ / "state" / "ptcoord.db").string(),
                                     job, token, 0, /*wal=*/false),
              "");
  }
  // The old attempt: a wrapper shell naming its folder, a child that lives.
  const pid_t shell = fork();
  if (shell == 0) {
    const std::string env_token = "PTRAIN_JOB_TOKEN=" + token;
    const std::string env_mark =
        "FAKE_CKPT_ROOT=" + (dir_ / "data" / "ckpt").string();
    const char* envp[] = {env_token.c_str(), env_mark.c_str(), nullptr};
    execle("/bin/sh", "/bin/sh", "-c", "sleep 100; :", attempt.c_str(),
           static_cast<char*>(nullptr), envp);
    _exit(127);
  }
  absl::SleepFor(absl::Milliseconds(300));
  auto c = Make();
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 10; ++i) {
    c->Tick();
    absl::SleepFor(absl::Milliseconds(100));
  }
  v1::Job job = c->Get("job-0001", false)->job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.attempts(), 1);
  EXPECT_TRUE(c->AuthenticateRank("job-0001", "Bearer " + token).ok());
  ASSERT_TRUE(c->Cancel("job-0001").ok());
  job = TickUntil(*c, "job-0001", v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED);
  int status = 0;
  EXPECT_EQ(waitpid(shell, &status, WNOHANG), shell);  // signalled, gone
}

// --- rank reports --------------------------------------------------------

TEST_F(CoordinatorTest, InvalidRankReportsAreRefusedAndChangeNothing) {
  setenv("FAKE_MODE", "sleep", 1);
  auto c = Make();
  auto job = c->Submit(
      kSpec, {"restart.hang_timeout_s=600", "checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(job.ok());
  const std::string id = job->id();
  TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  const fs::path ckpt = job->spec().checkpoint().dir();
  testing::WriteCommittedCheckpoint(ckpt / "step-00000004", 4);
  fs::create_directories(ckpt / "step-00000006");  // no manifest
  testing::WriteCommittedCheckpoint(
      dir_ / "data" / "elsewhere" / "step-00000007", 7);
  fs::create_directory_symlink(dir_ / "data" / "elsewhere" / "step-00000007",
                               ckpt / "step-00000007");

  auto progress = [&](auto&& edit) {
    v1::ReportProgressRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_rank(0);
    r.set_step(3);
    r.set_loss(2.5);
    r.set_tok_per_s(100);
    edit(r);
    return c->ReportProgress(r);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* field;
    absl::Status status;
  };
  const std::vector<Case> cases = {
      {"loss", progress([&](auto& r) { r.set_loss(nan); })},
      {"loss", progress([&](auto& r) { r.set_loss(inf); })},
      {"val_loss",
       progress([&](auto& r) { r.set_is_eval(true), r.set_val_loss(-inf); })},
      {"step", progress([&](auto& r) { r.set_step(int64_t{1} << 62); })},
      {"step", progress([&](auto& r) { r.set_step(11); })},
      {"step", progress([&](auto& r) { r.set_step(-1); })},
      {"rank", progress([&](auto& r) { r.set_rank(-1); })},
      {"rank", progress([&](auto& r) { r.set_rank(1); })},  // world size 1
      {"tok_per_s", progress([&](auto& r) { r.set_tok_per_s(-5); })},
      {"mfu", progress([&](auto& r) { r.set_mfu(nan); })},
      {"attempt", progress([&](auto& r) { r.set_attempt(2); })},
      {"attempt", progress([&](auto& r) { r.set_attempt(0); })},
  };
  for (const Case& k : cases) {
    EXPECT_EQ(k.status.code(), absl::StatusCode::kInvalidArgument)
        << k.field << ": " << k.status;
    EXPECT_EQ(k.status.message().rfind(k.field, 0), 0u)
        << k.field << ": " << k.status;
  }
  auto checkpoint = [&](int64_t step, const std::string& dir) {
    v1::ReportCheckpointRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_step(step);
    r.set_dir(dir);
    return c->ReportCheckpoint(r);
  };
  for (const absl::Status& s : {
           checkpoint(123456, "/etc/forged/step-00123456"),  // step too
           checkpoint(4, "/etc/step-00000004"),
           checkpoint(5, (ckpt / "step-00000004").string()),  // wrong step
           checkpoint(6, (ckpt / "step-00000006").string()),  // uncommitted
           checkpoint(7, (ckpt / "step-00000007").string()),  // symlink out
           checkpoint(8, (ckpt / "step-00000008").string()),  // missing
           checkpoint(4, "relative/step-00000004"),
       }) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  auto endpoint = [&](const std::string& address) {
    v1::ReportEndpointRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_rank(0);
    r.set_address(address);
    return c->ReportEndpoint(r);
  };
  for (const char* a :
       {"", "host", "host:", "host:0", "host:65536", "host:-1", "host:80x",
        "0.0.0.0:80", "[::]:80", "a b:80", "::1:80", "-x:80", "999.1.1.1:80"}) {
    EXPECT_EQ(endpoint(a).code(), absl::StatusCode::kInvalidArgument) << a;
  }
  const uint64_t version =
      c->WaitForChange(id, 0, absl::ZeroDuration())->version;
  auto got = c->Get(id, true);
  EXPECT_EQ(got->loss_history_size(), 0);
  EXPECT_EQ(got->job().progress().step(), 0);
  EXPECT_TRUE(c->Endpoints().empty());
  auto listed = c->Checkpoints(id);
  ASSERT_TRUE(listed.ok());
  for (const v1::Checkpoint& k : *listed) EXPECT_EQ(k.step(), 4) << k.dir();

  // A resumed report (the checkpoint an attempt started from) is checked
  // alike and, taken, adds no checkpoint entry.
  auto resumed = [&](const std::string& dir) {
    v1::ReportCheckpointRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_step(4);
    r.set_dir(dir);
    r.set_resumed(true);
    return c->ReportCheckpoint(r);
  };
  EXPECT_EQ(resumed("/etc/step-00000004").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(resumed((ckpt / "step-00000004").string()).ok());
  auto after_resumed = c->Checkpoints(id);
  ASSERT_TRUE(after_resumed.ok());
  EXPECT_EQ(after_resumed->size(), listed->size());

  // What is right is taken.
  EXPECT_TRUE(progress([](auto&) {}).ok());
  EXPECT_TRUE(checkpoint(4, (ckpt / "step-00000004").string()).ok());
  EXPECT_TRUE(endpoint("[::1]:9100").ok());
  EXPECT_TRUE(endpoint("node-1.example:9100").ok());
  EXPECT_GT(c->WaitForChange(id, 0, absl::ZeroDuration())->version, version);
  got = c->Get(id, true);
  EXPECT_EQ(got->loss_history_size(), 1);
  EXPECT_EQ(got->job().progress().step(), 3);

  // A rollback (train.anomaly) from step 6 to the checkpoint at step 4:
  // checked, recorded as an event, and the steps after 4 come again.
  EXPECT_TRUE(progress([](auto& r) { r.set_step(6); }).ok());
  auto rollback = [&](int64_t from, bool resumed, const std::string& why) {
    v1::ReportCheckpointRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_step(4);
    r.set_dir((ckpt / "step-00000004").string());
    r.set_resumed(resumed);
    r.set_rolled_back_from(from);
    r.set_reason(why);
    return c->ReportCheckpoint(r);
  };
  EXPECT_EQ(progress([](auto& r) { r.set_step(5); }).code(),
            absl::StatusCode::kInvalidArgument);  // not before the rollback
  for (const absl::Status& s :
       {rollback(4, true, "nan"), rollback(6, false, "nan"),
        rollback(11, true, "nan"), rollback(6, true, "na\xc3\x97n"),
        rollback(6, true, std::string(300, 'x'))}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  ASSERT_TRUE(rollback(6, true, "loss nan at step 6").ok());
  EXPECT_NE(
      c->WaitForChange(id, 0, absl::ZeroDuration())
          ->message.find(
              "rolled back at step 6 (loss nan at step 6) to the checkpoint "
              "at step 4, skipping the 2 steps of data since"),
      std::string::npos);
  EXPECT_TRUE(progress([](auto& r) { r.set_step(5); }).ok());
  EXPECT_EQ(c->Get(id, false)->job().progress().step(), 5);
  ASSERT_TRUE(c->Cancel(id).ok());
  TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
}

// --- the run log ---------------------------------------------------------

// GetJob thins each loss series of a long job to loss_points_per_series
// (the store test checks the thinning itself) and says how many it has.
TEST_F(CoordinatorTest, LossHistoryIsThinnedToTheOption) {
  setenv("FAKE_MODE", "log", 1);
  options_.loss_points_per_series = 3;
  auto c = Make();
  auto job = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(job.ok());
  TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  auto got = c->Get(job->id(), true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->loss_points_stored(), 8);  // 7 steps and an eval
  std::vector<int64_t> steps;
  for (const v1::LossPoint& p : got->loss_history()) {
    if (p.val_loss() == 0) steps.push_back(p.step());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 5, 7}));
  EXPECT_EQ(got->loss_history_size(), 4);
}

TEST_F(CoordinatorTest, EndedAttemptIsCompletedFromItsRunLog) {
  setenv("FAKE_MODE", "log", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(job.ok());
  const v1::Job done = TickUntil(*c, job->id(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 7);
  EXPECT_EQ(done.progress().loss(), 3.5);
  EXPECT_TRUE(done.progress().has_val_loss());
  EXPECT_EQ(done.progress().val_loss(), 2.25);
  auto got = c->Get(job->id(), true);
  EXPECT_EQ(got->loss_history_size(), 8);  // 7 steps and an eval
  EXPECT_EQ(got->loss_points_stored(), 8);
  EXPECT_EQ(c->Get(job->id(), false)->loss_points_stored(), 0);
  auto cps = c->Checkpoints(job->id());
  ASSERT_TRUE(cps.ok());
  ASSERT_EQ(cps->size(), 1u);
  EXPECT_EQ((*cps)[0].step(), 5);
  EXPECT_EQ((*cps)[0].attempt(), 1);  // from the log, not just the folder
}

TEST_F(CoordinatorTest, ReadoptedAttemptCatchesUpFromItsRunLog) {
  setenv("FAKE_MODE", "logsleep", 1);
  std::string id;
  {
    auto c = Make();
    auto job = c->Submit(
        kSpec, {"restart.hang_timeout_s=600", "checkpoint.dir=data/ckpt"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    for (int i = 0; i < 200 && !fs::exists(AttemptDir(id, 1) / "run.jsonl");
         ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(300));
    // Steps 1-3 reached ptcoord as reports before it went down.
    for (int step = 1; step <= 3; ++step) {
      v1::ReportProgressRequest r;
      r.set_job_id(id);
      r.set_attempt(1);
      r.set_step(step);
      r.set_loss(10 - step + 0.5);
      ASSERT_TRUE(c->ReportProgress(r).ok());
    }
  }
  auto c = Make();
  const v1::Job job = c->Get(id, false)->job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.progress().step(), 7);
  EXPECT_EQ(job.progress().val_loss(), 2.25);
  // The log adds only what the reports had not: steps 4-7 and the eval.
  auto history = c->Get(id, true);
  ASSERT_TRUE(history.ok()) << history.status();
  std::vector<int64_t> steps;
  for (const v1::LossPoint& p : history->loss_history()) {
    steps.push_back(p.val_loss() != 0 ? -p.step() : p.step());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, -6}));
  ASSERT_TRUE(c->Cancel(id).ok());
  TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
}

// --- what ranks say, believed only when it holds -------------------------

// The probe's report of step 1 after step 366 of the same attempt was taken
// and shown. An attempt's steps only grow, also after a ptcoord restart
// that re-adopts it.
TEST_F(CoordinatorTest, ProgressMayNotGoBackWithinAnAttempt) {
  setenv("FAKE_MODE", "sleep", 1);
  std::string id;
  auto report = [&](Coordinator& c, int64_t step) {
    v1::ReportProgressRequest r;
    r.set_job_id(id);
    r.set_attempt(1);
    r.set_step(step);
    r.set_loss(1.5);
    return c.ReportProgress(r);
  };
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(report(*c, 8).ok());
    const absl::Status back = report(*c, 1);
    EXPECT_EQ(back.code(), absl::StatusCode::kInvalidArgument) << back;
    EXPECT_EQ(back.message().rfind("step=1", 0), 0u) << back;
    EXPECT_EQ(c->Get(id, false)->job().progress().step(), 8);
    EXPECT_EQ(c->Get(id, true)->loss_history_size(), 1);
  }
  auto c = Make();  // re-adopts the attempt, and knows where it was
  EXPECT_EQ(report(*c, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(report(*c, 8).ok());
  EXPECT_TRUE(report(*c, 9).ok());
  EXPECT_EQ(c->Get(id, false)->job().progress().step(), 9);
  ASSERT_TRUE(c->Cancel(id).ok());
  TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
}

// The probe had ptcoord record and list a folder whose manifest.json was
// "{}". Reported or found on disk, only what a committed save leaves is a
// checkpoint.
TEST_F(CoordinatorTest, OnlyACommittedCheckpointIsRecordedOrListed) {
  setenv("FAKE_MODE", "sleep", 1);
  auto c = Make();
  auto job = c->Submit(
      kSpec, {"restart.hang_timeout_s=600", "checkpoint.dir=data/ckpt"});
  ASSERT_TRUE(job.ok());
  const std::string id = job->id();
  TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  const fs::path folder =
      fs::path(job->spec().checkpoint().dir()) / "step-00000004";
  fs::create_directories(folder);
  std::ofstream(folder / "manifest.json") << "{}";
  v1::ReportCheckpointRequest r;
  r.set_job_id(id);
  r.set_attempt(1);
  r.set_step(4);
  r.set_dir(folder.string());
  const absl::Status fake = c->ReportCheckpoint(r);
  EXPECT_EQ(fake.code(), absl::StatusCode::kInvalidArgument) << fake;
  EXPECT_NE(fake.message().find("not a committed checkpoint"),
            std::string::npos)
      << fake;
  ASSERT_TRUE(c->Checkpoints(id).ok());
  EXPECT_TRUE(c->Checkpoints(id)->empty());
  // Of another job: refused too.
  testing::WriteCommittedCheckpoint(folder, 4, "another-job");
  EXPECT_EQ(c->ReportCheckpoint(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->Checkpoints(id)->empty());
  // What a commit of this job leaves: recorded and listed.
  testing::WriteCommittedCheckpoint(folder, 4, job->uid());
  EXPECT_TRUE(c->ReportCheckpoint(r).ok());
  ASSERT_EQ(c->Checkpoints(id)->size(), 1u);
  EXPECT_EQ((*c->Checkpoints(id))[0].attempt(), 1);
  ASSERT_TRUE(c->Cancel(id).ok());
  TickUntil(*c, id, v1::JOB_STATE_CANCELLED);
}

// A step longer than the hang timeout is no hang while the ranks' calls
// complete (their heartbeats say so); once no rank has made progress for
// the timeout, it is one.
TEST_F(CoordinatorTest, ProgressHeartbeatsKeepALongStepAliveButNotAStall) {
  std::string id;
  auto c = MakeWithHangingJob(&id);
  v1::ReportAliveRequest beat = AliveOfRank0(id);
  beat.set_progress_age_ms(50);
  for (int i = 0; i < 30; ++i) {  // three hang timeouts without a step
    ASSERT_TRUE(c->ReportAlive(beat).ok());
    c->Tick();
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(c->Get(id, false)->job().state(), v1::JOB_STATE_RUNNING);
  v1::ReportAliveRequest bad = beat;
  bad.set_progress_age_ms(-2);
  EXPECT_EQ(c->ReportAlive(bad).code(), absl::StatusCode::kInvalidArgument);
  // Heard from, but nothing completed for longer than the timeout.
  beat.set_progress_age_ms(1500);
  for (int i = 0;
       i < 30 && c->Get(id, false)->job().state() == v1::JOB_STATE_RUNNING;
       ++i) {
    ASSERT_TRUE(c->ReportAlive(beat).ok());
    c->Tick();
    absl::SleepFor(absl::Milliseconds(100));
  }
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_FAILED);
  EXPECT_NE(done.error().find("hang at step 0"), std::string::npos)
      << done.error();
}

// A rank loading a 3 GB file ended no step for longer than the hang
// timeout and was killed as hung. A rank that says it is busy is alive;
// silence is still a hang, and the error says what it was busy with.
TEST_F(CoordinatorTest, ABusyRankIsAliveButSilenceIsStillAHang) {
  std::string id;
  auto c = MakeWithHangingJob(&id);
  v1::ReportAliveRequest alive = AliveOfRank0(id);
  alive.set_activity("loading data");
  for (int i = 0; i < 30; ++i) {  // three hang timeouts
    ASSERT_TRUE(c->ReportAlive(alive).ok());
    c->Tick();
    absl::SleepFor(absl::Milliseconds(100));
  }
  v1::Job now = c->Get(id, false)->job();
  EXPECT_EQ(now.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(now.attempts(), 1);
  // Bad signs of life are refused and keep nothing alive.
  v1::ReportAliveRequest bad = alive;
  bad.set_rank(5);
  EXPECT_EQ(c->ReportAlive(bad).code(), absl::StatusCode::kInvalidArgument);
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_NE(done.error().find("hang at step 0 (last busy with loading data)"),
            std::string::npos)
      << done.error();
}

// An attempt whose exit code cannot be read (its exit_code file empty, as a
// full disk leaves it) is decided by what it left: a run log ending with
// the record of a finished run, or a committed checkpoint of the last
// step, says it finished and it is not run again; neither, and it runs
// again from its newest checkpoint without using up a restart.
TEST_F(CoordinatorTest,
       AnAttemptWithoutAReadableExitCodeIsDecidedByItsRecords) {
  setenv("FAKE_MODE", "waitfile", 1);
  struct Case {
    const char* what;
    std::function<void(const fs::path& attempt, const v1::Job& job)> leave;
    v1::JobState want;
  };
  const std::vector<Case> cases = {
      {"a run log that ends with the end record",
       [](const fs::path& attempt, const v1::Job&) {
         std::ofstream(attempt / "run.jsonl")
             << R"({"type":"step","step":10,"loss":1.5})"
             << "\n"
             << R"({"type":"end","step":10})"
             << "\n";
       },
       v1::JOB_STATE_SUCCEEDED},
      {"a committed checkpoint of the last step",
       [](const fs::path&, const v1::Job& job) {
         testing::WriteCommittedCheckpoint(
             fs::path(job.spec().checkpoint().dir()) / "step-00000010", 10,
             job.uid());
       },
       v1::JOB_STATE_SUCCEEDED},
      {"a run log that stops short, and a checkpoint before the last step",
       [](const fs::path& attempt, const v1::Job& job) {
         std::ofstream(attempt / "run.jsonl")
             << R"({"type":"step","step":9,"loss":1.5})"
             << "\n";
         testing::WriteCommittedCheckpoint(
             fs::path(job.spec().checkpoint().dir()) / "step-00000009", 9,
             job.uid());
       },
       v1::JOB_STATE_RESTARTING},
  };
  for (const Case& k : cases) {
    fs::remove(dir_ / "go");
    v1::Job job;
    {
      auto c = Make();
      auto submitted = c->Submit(
          kSpec, {"restart.hang_timeout_s=600", "checkpoint.dir=data/ckpt"});
      ASSERT_TRUE(submitted.ok());
      job = TickUntil(*c, submitted->id(), v1::JOB_STATE_RUNNING);
    }  // ptcoord goes away while the attempt runs
    const fs::path attempt = AttemptDir(job.id(), 1);
    k.leave(attempt, job);
    std::ofstream(dir_ / "go");
    for (int i = 0; i < 200 && !ReadExitCode(attempt.string()).has_value();
         ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    ASSERT_EQ(ReadExitCode(attempt.string()), 0) << k.what;
    fs::resize_file(attempt / "exit_code", 0);  // what a full disk leaves
    EXPECT_EQ(ReadAttemptExit(attempt.string()).kind, AttemptExit::kUnknown);
    auto c = Make();
    const v1::GetJobResponse got = *c->Get(job.id(), false);
    EXPECT_EQ(got.job().state(), k.want) << k.what << ": " << got.job().error();
    EXPECT_EQ(got.job().attempts(), 1) << k.what;
    ASSERT_EQ(got.attempts_size(), 1) << k.what;
    EXPECT_EQ(got.attempts(0).exit_code(),
              k.want == v1::JOB_STATE_SUCCEEDED ? 0 : -1)
        << k.what;
    if (k.want == v1::JOB_STATE_RESTARTING) {
      EXPECT_NE(got.job().error().find("exit code ptcoord can read"),
                std::string::npos)
          << got.job().error();
      ASSERT_TRUE(c->Cancel(job.id()).ok());
      TickUntil(*c, job.id(), v1::JOB_STATE_CANCELLED);
    }
  }
}

// A tmpfs of `bytes` at `dir` for this test alone: in a mount namespace of
// the test's own process (ctest runs each test in one), unmounted when it
// goes. Needs root; `error` says why when it could not be made.
class SmallDisk {
 public:
  SmallDisk(const fs::path& dir, size_t bytes) : dir_(dir) {
    fs::create_directories(dir);
    if (unshare(CLONE_NEWNS) != 0) {
      error_ = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
      return;
    }
    // Private where / is a mount point; in a chroot (CI) it is not, and the
    // mount below is undone by the destructor.
    mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0700";
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = std::string("mount tmpfs: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallDisk() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }
  // Writes a file until the disk has no room left.
  void Fill() {
    const int fd = open((dir_ / "filler").c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const std::string block(4096, 'f');
    while (fd >= 0 && write(fd, block.data(), block.size()) > 0) {
    }
    if (fd >= 0) close(fd);
  }
  void Free() { fs::remove(dir_ / "filler"); }

 private:
  const fs::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// The probe: the state dir filled up while a job ran; the attempt's exit
// code was lost (an empty file), ptcoord could not write the job's end and
// kept it RUNNING, and after a kill -9 and a restart with space freed it
// trained the finished job again from step 0. The exit code now overwrites
// bytes ptcoord wrote and synced at launch, which takes no new space.
TEST_F(CoordinatorTest, AFinishedJobIsNotRunAgainAfterAFullDiskAndACrash) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  SmallDisk disk(dir_ / "small", 2 << 20);
  ASSERT_TRUE(disk.error().empty()) << disk.error();
  options_.state_dir = (dir_ / "small" / "state").string();
  setenv("FAKE_MODE", "waitfile", 1);
  std::string id;
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    disk.Fill();
    std::ofstream(dir_ / "go");  // the job ends while the disk is full
    for (int i = 0; i < 40; ++i) {
      c->Tick();
      absl::SleepFor(absl::Milliseconds(50));
    }
    // Its end could not be written: RUNNING, as the disk has it.
    EXPECT_EQ(c->Get(id, false)->job().state(), v1::JOB_STATE_RUNNING);
  }  // ptcoord dies (the test's kill -9: nothing more is written)
  const fs::path attempt =
      fs::path(options_.state_dir) / "jobs" / id / "attempt-1";
  EXPECT_EQ(ReadExitCode(attempt.string()), 0);
  disk.Free();
  auto c = Make();
  for (int i = 0; i < 10; ++i) c->Tick();
  const v1::GetJobResponse got = *c->Get(id, false);
  EXPECT_EQ(got.job().state(), v1::JOB_STATE_SUCCEEDED) << got.job().error();
  EXPECT_EQ(got.job().attempts(), 1);
  EXPECT_FALSE(fs::exists(attempt.parent_path() / "attempt-2"));
}

// --- a store that cannot write -------------------------------------------

// Every file write of this process fails (EFBIG, as on a full disk) while
// it lives; processes started before keep their limits.
class FullDisk {
 public:
  FullDisk() {
    signal(SIGXFSZ, SIG_IGN);
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit none = saved_;
    none.rlim_cur = 0;
    setrlimit(RLIMIT_FSIZE, &none);
  }
  ~FullDisk() { setrlimit(RLIMIT_FSIZE, &saved_); }

 private:
  rlimit saved_;
};

TEST_F(CoordinatorTest, FailedStoreWriteChangesNothingAndIsRetried) {
  setenv("FAKE_MODE", "waitfile", 1);
  std::string id, queued;
  {
    auto c = Make();
    auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
    ASSERT_TRUE(job.ok());
    id = job->id();
    auto q = c->Submit(kSpec, {"parallel.dp=2"});  // waits for the slots
    ASSERT_TRUE(q.ok());
    queued = q->id();
    TickUntil(*c, id, v1::JOB_STATE_RUNNING);
    {
      FullDisk full;
      // Refused operations say so and leave memory as the disk has it.
      auto cancel = c->Cancel(queued);
      EXPECT_EQ(cancel.status().code(), absl::StatusCode::kUnavailable)
          << cancel.status();
      EXPECT_EQ(c->Get(queued, false)->job().state(), v1::JOB_STATE_QUEUED);
      EXPECT_FALSE(c->Get(queued, false)->job().cancel_requested());
      auto submit = c->Submit(kSpec, {});
      EXPECT_EQ(submit.status().code(), absl::StatusCode::kUnavailable);
      EXPECT_EQ(c->List(v1::JOB_STATE_UNSPECIFIED, 0)->size(), 2u);
      v1::ReportProgressRequest p;
      p.set_job_id(id);
      p.set_attempt(1);
      p.set_step(4);
      p.set_loss(1.5);
      EXPECT_EQ(c->ReportProgress(p).code(), absl::StatusCode::kUnavailable);
      EXPECT_EQ(c->Get(id, false)->job().progress().step(), 0);
      // The attempt ends while nothing can be written: still RUNNING, as on
      // disk, however often the supervisor looks.
      std::ofstream(dir_ / "go");
      for (int i = 0; i < 40; ++i) {
        c->Tick();
        absl::SleepFor(absl::Milliseconds(50));
      }
      EXPECT_EQ(c->Get(id, false)->job().state(), v1::JOB_STATE_RUNNING);
    }
    // Space again: the outcome is written on a later pass.
    EXPECT_EQ(TickUntil(*c, id, v1::JOB_STATE_SUCCEEDED).state(),
              v1::JOB_STATE_SUCCEEDED);
  }
  // After a restart it stays done: nothing runs twice.
  auto c = Make();
  ASSERT_NE(c, nullptr);
  for (int i = 0; i < 10; ++i) c->Tick();
  const v1::Job job = c->Get(id, false)->job();
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.attempts(), 1);
  ASSERT_TRUE(c->Cancel(queued).ok());
}

// Progress that came while the state disk was full is not shown (memory
// is what the disk has), but it is not lost either: the attempt's end,
// written once there is space, carries the newest figures received and
// says how many reports the loss history lacks. A succeeded job never
// shows the step it was at when the disk filled.
TEST_F(CoordinatorTest, FiguresReceivedOnAFullDiskReachTheJobsEnd) {
  setenv("FAKE_MODE", "waitfile", 1);
  auto c = Make();
  auto job = c->Submit(kSpec, {"restart.hang_timeout_s=600"});
  ASSERT_TRUE(job.ok());
  const std::string id = job->id();
  TickUntil(*c, id, v1::JOB_STATE_RUNNING);
  const auto report = [&](int64_t step, double loss) {
    v1::ReportProgressRequest p;
    p.set_job_id(id);
    p.set_attempt(1);
    p.set_step(step);
    p.set_loss(loss);
    return c->ReportProgress(p);
  };
  ASSERT_TRUE(report(2, 3.0).ok());
  {
    FullDisk full;
    EXPECT_EQ(report(4, 2.5).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(report(6, 2.0).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(c->Get(id, false)->job().progress().step(), 2);
  }
  std::ofstream(dir_ / "go");
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 6);
  EXPECT_EQ(done.progress().loss(), 2.0);
  EXPECT_EQ(done.progress().unsaved_reports(), 2);
  // Persisted so: a restarted ptcoord shows the same.
  c.reset();
  auto again = Make();
  const v1::Job stored = again->Get(id, false)->job();
  EXPECT_EQ(stored.progress().step(), 6);
  EXPECT_EQ(stored.progress().unsaved_reports(), 2);
}

// Slurm's commands stand in for a cluster: sbatch numbers its jobs from 1,
// scontrol reports job N in the state in $FAKE_SLURM/state.N (RUNNING until
// the test writes one), sinfo prints $FAKE_SLURM/sinfo.
constexpr const char* kFakeSbatch = R"(#!/bin/sh
n=$(($(cat "$FAKE_SLURM/next" 2>/dev/null || echo 0) + 1))
echo "$n" > "$FAKE_SLURM/next"
echo "$n"
)";
constexpr const char* kFakeScontrol = R"(#!/bin/sh
id="$4"
state=$(cat "$FAKE_SLURM/state.$id" 2>/dev/null || echo RUNNING)
code=0:0
[ "$state" = FAILED ] && code=141:0
echo "JobId=$id JobName=x JobState=$state Reason=None ExitCode=$code NodeList=n[1-2] NumNodes=2"
)";
constexpr const char* kFakeSinfo = R"(#!/bin/sh
cat "$FAKE_SLURM/sinfo"
)";

class SlurmCoordinatorTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    slurm_ = dir_ / "slurm";
    fs::create_directories(slurm_ / "bin");
    for (const auto& [name, text] :
         std::vector<std::pair<std::string, std::string>>{
             {"sbatch", kFakeSbatch},
             {"scontrol", kFakeScontrol},
             {"sinfo", kFakeSinfo},
             {"scancel", "#!/bin/sh\nexit 0\n"},
             {"squeue", "#!/bin/sh\nexit 0\n"}}) {
      std::ofstream(slurm_ / "bin" / name) << text;
      fs::permissions(slurm_ / "bin" / name, fs::perms::owner_all);
    }
    Sinfo("n1 alloc 2\nn2 alloc 2\n");
    setenv("FAKE_SLURM", slurm_.c_str(), 1);
    path_ = getenv("PATH");
    setenv("PATH", ((slurm_ / "bin").string() + ":" + path_).c_str(), 1);
    options_.slurm = true;
    options_.slurm_options.node_grace = absl::Seconds(2);
  }
  void TearDown() override {
    setenv("PATH", path_.c_str(), 1);
    CoordinatorTest::TearDown();
  }
  void Sinfo(const std::string& text) {
    std::ofstream(slurm_ / "sinfo") << text;
  }
  void SlurmState(int id, const std::string& state) {
    std::ofstream(slurm_ / ("state." + std::to_string(id))) << state << "\n";
  }
  // Ticks for `d`; the job's state at the end.
  v1::JobState TickFor(Coordinator& c, const std::string& id,
                       absl::Duration d) {
    const absl::Time end = absl::Now() + d;
    while (absl::Now() < end) {
      c.Tick();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return c.Get(id, false)->job().state();
  }

  // A coordinator running one job without restarts (as Slurm job 1).
  std::unique_ptr<Coordinator> StartRunning(std::string* id) {
    auto c = Make();
    if (c == nullptr) return nullptr;
    auto job = c->Submit(kSpec, {"restart.max_restarts=0"});
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return nullptr;
    *id = job->id();
    const v1::JobState state =
        TickUntil(*c, *id, v1::JOB_STATE_RUNNING).state();
    EXPECT_EQ(state, v1::JOB_STATE_RUNNING);
    return state == v1::JOB_STATE_RUNNING ? std::move(c) : nullptr;
  }

  fs::path slurm_;
  std::string path_;
};

// A dead node fails the Slurm job (FAILED, its peers' exit) before
// slurmctld marks the node down: within the grace, Slurm reporting a node
// of the job not responding makes it a lost node, requeued without using a
// restart (max_restarts is 0 here).
TEST_F(SlurmCoordinatorTest, FailureThenANodeNotRespondingIsALostNode) {
  std::string id;
  auto c = StartRunning(&id);
  ASSERT_NE(c, nullptr);
  SlurmState(1, "FAILED");
  // Every node still answers: the failure is not decided yet.
  EXPECT_EQ(TickFor(*c, id, absl::Milliseconds(800)), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c->Get(id, false)->job().attempts(), 1);
  Sinfo("n1 alloc 2\nn2 alloc* 2\n");
  for (int i = 0; i < 100 && c->Get(id, false)->job().attempts() < 2; ++i) {
    c->Tick();
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(c->Get(id, false)->job().attempts(), 2);
  SlurmState(2, "COMPLETED");
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  const auto got = c->Get(id, false);
  ASSERT_TRUE(got.ok());
  ASSERT_GE(got->attempts_size(), 1);
  EXPECT_NE(got->attempts(0).error().find(
                "lost a node: Slurm reports n2 down or not responding"),
            std::string::npos)
      << got->attempts(0).error();
}

// With every node of the job up through the grace, the failure is the
// job's own: it uses a restart (none left here: FAILED), after the grace.
TEST_F(SlurmCoordinatorTest, FailureWithItsNodesUpCountsAfterTheGrace) {
  std::string id;
  auto c = StartRunning(&id);
  ASSERT_NE(c, nullptr);
  const absl::Time failed = absl::Now();
  SlurmState(1, "FAILED");
  const v1::Job done = TickUntil(*c, id, v1::JOB_STATE_FAILED);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_GE(absl::Now() - failed, absl::Seconds(2));
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_NE(done.error().find("code 141"), std::string::npos) << done.error();
}

}  // namespace
}  // namespace ptrain
