// FlightRecorder: a rank's newest communication calls and phase marks in a
// fixed ring, dumped as JSON lines (docs/diagnose.md) when a job hangs, so
// that the dumps of all ranks say who is behind and where. Not a trace:
// entries beyond the ring's capacity are overwritten, oldest first.
//
// Thread-safety: every method may be called from any thread (the engine
// thread records, the signal thread dumps). One mutex, held for a few
// stores, never across a communication call.
#ifndef PTRAIN_WORKER_ENGINE_COMM_FLIGHT_RECORDER_H_
#define PTRAIN_WORKER_ENGINE_COMM_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "worker/engine/comm/comm.h"

namespace ptrain {

// What a rank is doing, for the entries it records.
enum class FlightPhase {
  kSetup,
  kForward,
  kBackward,
  kOptimizer,
  kEval,
  kSample,
  kCheckpoint
};
// "setup", "forward", "backward", "optimizer", "eval", "sample",
// "checkpoint".
const char* FlightPhaseName(FlightPhase phase);

class FlightRecorder {
 public:
  static constexpr int kDefaultCapacity = 2048;

  explicit FlightRecorder(int capacity = kDefaultCapacity);
  // A ring of `capacity` entries from now on (those recorded are dropped);
  // 0: records nothing, progress included (its calls return at once),
  // until set again.
  void SetCapacity(int capacity);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Who records: the header of every dump.
  struct Identity {
    int rank = 0;
    int world_size = 1;
    std::map<std::string, int> coords;  // each mesh dimension's, by name
  };
  void SetIdentity(Identity identity);
  // The world ranks of `group`'s members, in group order (a call's `peer`
  // is the group rank; dumps name world ranks).
  void SetGroup(const std::string& group, std::vector<int> world_ranks);

  // The step being trained (1-based) and the phase entered (a mark entry
  // when either changes); microbatch -1 outside a pass.
  void SetStep(int64_t step);
  void Enter(FlightPhase phase, int microbatch = -1);

  // A call issued on `group`: returns its id for Completed. `peer` is the
  // other side's group rank for send/recv, -1 otherwise. `queued`: issued
  // to a GPU stream that has not reached it (Started says when it has).
  uint64_t Issued(const std::string& group, CommOp op, int64_t bytes,
                  int peer = -1, bool queued = false);
  // The call has begun (a GPU stream reached it); Issued calls over MPI
  // begin at once and need not say so.
  void Started(uint64_t id);
  void Completed(uint64_t id);

  // The dump: a header line and the ring's entries, oldest first (the
  // format of docs/diagnose.md). `reason`: "start", "SIGUSR2", "SIGTERM".
  std::string Dump(const std::string& reason) const;
  // Replaces `path` by Dump(reason) atomically (common/private_file.h).
  absl::Status DumpTo(const std::string& path, const std::string& reason) const;

  // Entries ever recorded (marks included).
  uint64_t recorded() const;
  // Milliseconds since the rank last completed a call or entered a phase
  // (its progress: a rank waiting in a call or looping makes none); -1
  // before either.
  int64_t ProgressAgeMillis() const;

 private:
  enum class State { kQueued, kStarted, kCompleted };
  struct Entry {
    uint64_t id = 0;  // 0: an empty slot
    bool mark = false;
    int group = -1;  // index into group_names_
    CommOp op = CommOp::kBarrier;
    int64_t bytes = 0;
    int peer = -1;  // world rank
    int64_t seq = 0, peer_seq = 0;
    int64_t step = 0;
    int microbatch = -1;
    FlightPhase phase = FlightPhase::kSetup;
    int64_t enqueue_us = 0, start_us = 0, end_us = 0;
    State state = State::kStarted;
  };
  Entry& Append();  // the next slot, its id set; mu_ held
  int GroupIndex(const std::string& group);  // mu_ held
  int WorldRank(int group, int peer) const;  // mu_ held

  std::atomic<bool> on_{true};  // capacity > 0
  mutable std::mutex mu_;
  std::vector<Entry> ring_;                            // guarded by mu_
  uint64_t next_id_ = 1;                               // guarded by mu_
  Identity identity_;                                  // guarded by mu_
  std::vector<std::string> group_names_;               // guarded by mu_
  std::vector<std::vector<int>> group_members_;        // guarded by mu_
  std::vector<int64_t> group_seq_;                     // guarded by mu_
  std::map<std::tuple<int, int, bool>, int64_t> p2p_;  // guarded by mu_
  int64_t step_ = 0;                                   // guarded by mu_
  int microbatch_ = -1;                                // guarded by mu_
  FlightPhase phase_ = FlightPhase::kSetup;            // guarded by mu_
  int64_t last_activity_us_ = 0;                       // guarded by mu_
  int64_t last_progress_us_ = 0;                       // guarded by mu_
};

// Completes a recorded call when it goes out of scope (blocking calls).
class FlightCall {
 public:
  FlightCall(FlightRecorder* recorder, const std::string& group, CommOp op,
             int64_t bytes, int peer = -1)
      : recorder_(recorder),
        id_(recorder != nullptr ? recorder->Issued(group, op, bytes, peer)
                                : 0) {}
  ~FlightCall() {
    if (recorder_ != nullptr) recorder_->Completed(id_);
  }
  FlightCall(const FlightCall&) = delete;
  FlightCall& operator=(const FlightCall&) = delete;

 private:
  FlightRecorder* const recorder_;
  const uint64_t id_;
};

// Where a rank's dumps go: <dir of the run log>/flight/rank-NNNNN.jsonl,
// or flight/ in the working folder without a run log.
std::string FlightDumpPath(const std::string& log_json_path, int world_rank);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_COMM_FLIGHT_RECORDER_H_
