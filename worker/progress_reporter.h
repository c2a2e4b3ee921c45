// ProgressReporter: forwards a rank's run-log records to ptcoord's
// RankService (ReportProgress, ReportCheckpoint, ReportEndpoint), over TLS
// when ptcoord hands the rank a CA. Not part of training: RPCs run on a
// background thread and their failures are logged, never fatal.
#ifndef PTRAIN_WORKER_PROGRESS_REPORTER_H_
#define PTRAIN_WORKER_PROGRESS_REPORTER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "ptrain/v1/coordinator.pb.h"

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

  static constexpr size_t kMaxQueued = 4096;

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
  class Rpc;  // the gRPC stub, kept out of this header

  ProgressReporter(std::string address, std::string job_id, std::string token,
                   int attempt, int rank, std::string tls_ca_pem);
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
  std::thread thread_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_PROGRESS_REPORTER_H_
