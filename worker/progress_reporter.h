// ProgressReporter: forwards a rank's run-log records to ptcoord's
// RankService (ReportProgress, ReportCheckpoint, ReportEndpoint), its signs
// of life and step times (ReportAlive), over TLS when ptcoord hands the rank
// a CA. Not part of training: RPCs run on a background thread and their
// failures are logged, never fatal.
#ifndef PTRAIN_WORKER_PROGRESS_REPORTER_H_
#define PTRAIN_WORKER_PROGRESS_REPORTER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/coordinator.pb.h"
#include "worker/engine/report/rank_step.h"

namespace ptrain {

class ProgressReporter {
 public:
  // Reads PTRAIN_COORDINATOR (host:port), PTRAIN_JOB_ID, PTRAIN_JOB_TOKEN,
  // PTRAIN_ATTEMPT and PTRAIN_TLS_CA (a PEM file: talk TLS trusting it;
  // unset or empty: plain text), which ptcoord sets for every rank. nullptr
  // (not an error) when PTRAIN_COORDINATOR is unset: ptworker runs
  // standalone. InvalidArgument when it is set but another variable is
  // missing or bad, or the CA file is unreadable.
  static absl::StatusOr<std::unique_ptr<ProgressReporter>> FromEnvironment();

  // The channel reconnects at most this long after the coordinator is back
  // (gRPC's default backoff grows to 120 s, longer than a hang timeout).
  static constexpr int kMaxReconnectBackoffMs = 2000;

  // Sends what is still queued (for at most 3 s), then stops.
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Queues the RPC for one run-log record (docs/run-log.md): "step" and
  // "eval" become ReportProgress, "checkpoint" ({"step", "dir"}) becomes
  // ReportCheckpoint; other types are ignored. Never blocks on the network;
  // thread-safe. When more than kMaxQueued are waiting (coordinator down),
  // the oldest progress report is dropped; checkpoint reports are kept.
  // A checkpoint or endpoint report that fails because the coordinator is
  // unreachable or busy (UNAVAILABLE, DEADLINE_EXCEEDED) is sent again a
  // second later; a refused one (INVALID_ARGUMENT, ...) is not.
  void OnRecord(const nlohmann::json& record);

  // Queues ReportEndpoint: this rank serves Prometheus metrics at `address`
  // (host:port), for the coordinator's service discovery.
  void ReportEndpoint(const std::string& address);

  // While `activity` is not empty ("loading data"), ReportAlive goes out at
  // once and then every alive interval, so that a rank busy with something
  // that ends no step (loading, checkpointing, evaluating) is not taken for
  // a hung one; "" stops them. Thread-safe, never blocks on the network.
  void SetActivity(const std::string& activity);
  // With a probe, ReportAlive goes out at every alive interval whether
  // busy or not, carrying progress_age(): milliseconds since the rank last
  // made progress (-1: none yet), so that ptcoord tells a long step from a
  // hang. Called on the reporter's thread. Thread-safe.
  void SetProgressProbe(std::function<int64_t()> progress_age);
  // How often ReportAlive goes out (default 5 s): a fraction of the job's
  // restart.hang_timeout_s (AliveInterval).
  void SetAliveInterval(std::chrono::milliseconds every);
  // A quarter of `hang_timeout_s`, kept within [250 ms, 10 s].
  static std::chrono::milliseconds AliveInterval(int64_t hang_timeout_s);

  // Called on every rank at the end of each step it completes. Adds the
  // step to the figures since the previous RankTimes and, once the step-times
  // interval (kRankTimesEvery) has passed since that one, queues a
  // ReportAlive carrying them in `times`: means per step of the wall time,
  // the exposed communication and each group's communication (the
  // difference of the running totals, so evaluation and checkpoints between
  // the steps count too); at most kMaxRankTimesGroups groups, the ones with
  // the most time, names over kMaxRankTimesGroupBytes or of other than
  // letters, digits and '_' dropped. The first
  // call only starts the count (see the .cc). activity and progress_age_ms
  // are filled when it is sent, as a heartbeat's are; heartbeats go on as
  // before. At most one waits in the queue: while it does, steps add to
  // the next. Never blocks on the network; thread-safe.
  void OnRankStep(const RankStep& s);
  // The step-times interval (default kRankTimesEvery): tests set it.
  void SetRankTimesInterval(std::chrono::milliseconds every);
  static constexpr std::chrono::milliseconds kRankTimesEvery{1000};

  static constexpr size_t kMaxQueued = 4096;

  // Calls `lost` once, on the reporter's thread, when no report has been
  // answered by the coordinator (it is down, unreachable: every one failed
  // UNAVAILABLE or DEADLINE_EXCEEDED) for the grace period since the last
  // answered one or the reporter's start. The grace is
  // PTRAIN_COORDINATOR_GRACE_S (seconds; unset or 0: never), or `grace`
  // when that is positive. Thread-safe.
  void OnCoordinatorLost(std::function<void()> lost,
                         std::chrono::milliseconds grace = {});

  // PTRAIN_COORDINATOR: host:port of the coordinator.
  const std::string& coordinator_address() const { return address_; }

  // Counters for tests and the exit log line.
  int64_t sent() const;
  int64_t failed() const;
  int64_t dropped() const;

 private:
  struct Item {
    // kAlive, as kProgress, is not sent again when it fails: the next one
    // replaces it.
    enum Kind { kProgress, kCheckpoint, kEndpoint, kAlive } kind = kProgress;
    v1::ReportProgressRequest progress;
    v1::ReportCheckpointRequest checkpoint;
    v1::ReportEndpointRequest endpoint;
    v1::ReportAliveRequest alive;
  };
  void Enqueue(Item item);
  // Whether ReportAlive goes out at every interval now. mu_ held.
  bool Heartbeating() const { return !activity_.empty() || progress_age_; }
  // A ReportAlive of what the rank does now and its progress age (-1
  // without a probe). mu_ held.
  v1::ReportAliveRequest AliveNow() const;
  // The steps OnRankStep has counted since the previous RankTimes.
  struct StepWindow {
    bool started = false;  // the first call has set `since` and comm_base
    std::chrono::steady_clock::time_point since;
    int64_t step = 0;  // the newest
    int32_t steps = 0;
    double seconds = 0.0, exposed = 0.0;
    std::map<std::string, double> comm_base;  // the totals at its start
  };
  // The window's means given the communication totals at its end.
  static v1::RankTimes MeansOf(const StepWindow& w,
                               const std::map<std::string, double>& comm);
  class Rpc;  // the gRPC stub, kept out of this header

  ProgressReporter(std::string address, std::string job_id, std::string token,
                   int attempt, int rank, std::string tls_ca_pem,
                   std::chrono::milliseconds coordinator_grace);
  void Loop();

  const std::string address_;
  const std::string job_id_;
  const std::string token_;
  const int attempt_;
  const int rank_;
  std::unique_ptr<Rpc> rpc_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;                            // guarded by mu_
  bool stopping_ = false;                             // guarded by mu_
  std::string activity_;                              // guarded by mu_
  std::function<int64_t()> progress_age_;             // guarded by mu_
  std::chrono::milliseconds alive_every_{5000};       // guarded by mu_
  std::chrono::steady_clock::time_point next_alive_;  // guarded by mu_
  int64_t sent_ = 0, failed_ = 0, dropped_ = 0;       // guarded by mu_
  // Step times (OnRankStep); times_queued_: one waits in queue_.
  std::chrono::milliseconds times_every_{kRankTimesEvery};  // guarded by mu_
  StepWindow window_;                                       // guarded by mu_
  bool times_queued_ = false;                               // guarded by mu_
  // OnCoordinatorLost: the grace, when the coordinator last answered, and
  // what to call (once) when it has not for that long.
  std::chrono::milliseconds coordinator_grace_;        // guarded by mu_
  std::chrono::steady_clock::time_point last_answer_;  // guarded by mu_
  std::function<void()> lost_;                         // guarded by mu_
  std::thread thread_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_PROGRESS_REPORTER_H_
