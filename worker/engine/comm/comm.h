// Communicator: the collectives and point-to-point operations the parallel
// engines use, over one process group. Implemented over MPI (comm_mpi.cc) and,
// later, NCCL. Every call is timed and counted per (group, op) into a
// CommStats, which feeds ptrain_comm_seconds_total / ptrain_comm_bytes_total.
//
// Thread-safety: a Communicator is used by one thread at a time (the engine
// thread); CommStats may be read from any thread.
#ifndef PTRAIN_WORKER_ENGINE_COMM_COMM_H_
#define PTRAIN_WORKER_ENGINE_COMM_COMM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ptrain {

enum class CommOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kAllToAll
};
// "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv",
// "barrier", "all_to_all": the `op` label of the metrics.
const char* CommOpName(CommOp op);

struct CommStat {
  double seconds = 0.0;  // wall time from issue to observed completion
  int64_t bytes = 0;     // payload bytes this rank contributed (see Record)
  int64_t calls = 0;
};

// Per-rank counters keyed by (group, op). Thread-safe.
class CommStats {
 public:
  void Record(const std::string& group, CommOp op, double seconds,
              int64_t bytes);
  std::map<std::pair<std::string, std::string>, CommStat> Snapshot() const;
  CommStat Get(const std::string& group, CommOp op) const;
  // Exposed communication: seconds the computation waited for an
  // asynchronous operation it had hoped to hide behind it (the host
  // blocked on it, or on a GPU the compute stream stalled on it).
  void RecordExposed(double seconds);
  double ExposedSeconds() const;  // over every group, since Reset
  void Reset();

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, CommStat> stats_;
  double exposed_ = 0.0;
};

// A started non-blocking operation. Wait() blocks until it is complete (and
// records its time); destroying an unfinished handle waits for it.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void Wait() = 0;
  // Drives progress; true once complete (then Wait returns at once).
  virtual bool Test() = 0;
};

// Operations on float buffers sum (reductions are always sums). Counts are
// elements. All ranks of the group call collectives in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& group() const = 0;  // "dp", "tp", "pp", "world"

  // data (count) = sum over ranks of data.
  virtual void AllReduce(float* data, int64_t count) = 0;
  virtual void AllReduce(double* data, int64_t count) = 0;
  // data (count) = element-wise maximum over ranks (vocab-parallel softmax).
  virtual void AllReduceMax(float* data, int64_t count) = 0;
  // recv (count) = sum over ranks of send[rank*count, (rank+1)*count);
  // send has size()*count elements.
  virtual void ReduceScatter(const float* send, float* recv, int64_t count) = 0;
  // recv (size()*count) = concatenation over ranks of send (count).
  // send may alias recv + rank()*count (in place).
  virtual void AllGather(const float* send, float* recv, int64_t count) = 0;
  virtual void Broadcast(float* data, int64_t count, int root) = 0;
  virtual void Send(const float* data, int64_t count, int peer, int tag) = 0;
  virtual void Recv(float* data, int64_t count, int peer, int tag) = 0;
  virtual void Barrier() = 0;
  // Each rank sends send_counts[r] elements to rank r and receives
  // recv_counts[r] from it (size() counts each, agreeing pairwise), the
  // blocks packed in rank order in send and recv (which do not overlap).
  // This one: point-to-point to the peers and a copy of this rank's own
  // block, in host memory.
  virtual void AllToAllV(const float* send, const int64_t* send_counts,
                         float* recv, const int64_t* recv_counts);

  virtual std::unique_ptr<CommHandle> AllReduceAsync(float* data,
                                                     int64_t count) = 0;
  virtual std::unique_ptr<CommHandle> ReduceScatterAsync(const float* send,
                                                         float* recv,
                                                         int64_t count) = 0;
  virtual std::unique_ptr<CommHandle> AllGatherAsync(const float* send,
                                                     float* recv,
                                                     int64_t count) = 0;
  virtual std::unique_ptr<CommHandle> BroadcastAsync(float* data, int64_t count,
                                                     int root) = 0;
  virtual std::unique_ptr<CommHandle> SendAsync(const float* data,
                                                int64_t count, int peer,
                                                int tag) = 0;
  virtual std::unique_ptr<CommHandle> RecvAsync(float* data, int64_t count,
                                                int peer, int tag) = 0;

  virtual CommStats& stats() = 0;
};

// A group of this rank alone, in host memory, without MPI: reductions and
// gathers copy, point-to-point has no peer (PT_CHECK fails). The groups of
// a one-rank mesh without MPI (ParallelDims::Single).
std::unique_ptr<Communicator> MakeSelfCommunicator(
    const std::string& group, std::shared_ptr<CommStats> stats);

// The groups a rank's model and optimizer communicate over, in the memory
// of the backend they run on (ParallelDims::compute_groups).
struct ComputeGroups {
  Communicator* dp = nullptr;  // dp × cp ranks; null: 1 without MPI
  Communicator* tp = nullptr;  // null: tp = 1
  Communicator* pp = nullptr;  // null: pp = 1
  Communicator* cp = nullptr;  // null: cp = 1 (dp then spans dp × cp)
  // Stage 0 and the last stage (pp > 1): the tied wte's gradients are
  // summed over it. Null elsewhere.
  Communicator* embedding = nullptr;
  bool sequence_parallel = false;
  // ep > 1 (else null): the MoE layers' all-to-all group, and the ranks
  // holding the same experts (dp·cp/ep), over which their gradients are
  // summed and ZeRO shards them.
  Communicator* ep = nullptr;
  Communicator* expert_dp = nullptr;
};

// The one way ranks agree that something went wrong before they go on to
// their next collective: true on every rank of `group` when `failed` is
// true on any (collective; a null group is this rank alone).
bool AnyRankFailed(Communicator* group, bool failed);

// The same for a status: OK on every rank when every rank's `mine` is OK;
// otherwise a failed rank returns its own error and the others
// FailedPrecondition "`others`" (another rank's error is in its own log),
// each marked as agreed by `group` (MarkAgreed).
absl::Status AgreeOnStatus(Communicator* group, const absl::Status& mine,
                           absl::string_view others);

// `s` marked as a failure every rank of `group` reached alike, at the same
// point (after AnyRankFailed over it): when that group is the whole world,
// ptworker ends every rank cleanly with it instead of aborting the job.
// `echo`: `s` only says that another rank failed (AgreeOnStatus's
// `others`), so it is not the one to print.
absl::Status MarkAgreed(Communicator* group, absl::Status s, bool echo = false);
// The size of the group `s` was agreed by (MarkAgreed); 0 when unmarked.
int AgreedBy(const absl::Status& s);
// Whether `s` was marked as only the echo of another rank's failure.
bool IsAgreedEcho(const absl::Status& s);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_COMM_COMM_H_
