// The MPI Communicator: each op is one MPI call (blocking) or one MPI_I* call
// plus MPI_Test/MPI_Wait (async), timed and counted into CommStats.

#include "worker/engine/comm/comm_mpi.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/seconds.h"

namespace ptrain {
namespace {

// The abort hook of PT_CHECK while MPI is up: every rank goes down, so the
// launcher sees the failure instead of ranks waiting in a collective.
void AbortWorld() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
}

// MPI failures are not recoverable in a training job: PT_CHECK's failure,
// with this rank's number.
[[noreturn]] void MpiFail(const char* file, int line, const char* what,
                          const char* detail) {
  int rank = -1;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string ranked =
      "[rank " + std::to_string(rank) + "] " + (detail ? detail : "");
  CheckFailed(file, line, what, ranked.c_str());
}

void CheckMpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) {
    std::snprintf(msg, sizeof(msg), "MPI error code %d", rc);
  }
  MpiFail(file, line, call, msg);
}

#define PT_MPI_CHECK(call) CheckMpi((call), #call, __FILE__, __LINE__)
#define PT_COMM_CHECK(cond, detail)                                           \
  do {                                                                        \
    if (!(cond)) MpiFail(__FILE__, __LINE__, "check failed: " #cond, detail); \
  } while (0)

// MPI counts are int. Counts beyond INT_MAX abort rather than chunk: one
// bucket or shard of more than 2^31 elements (8 GiB of fp32) is a sizing bug in
// the caller, and chunking would break the one-request-per-handle contract of
// the async ops.
int MpiCount(int64_t count, CommOp op) {
  if (count >= 0 && count <= INT_MAX) return static_cast<int>(count);
  char detail[96];
  std::snprintf(detail, sizeof(detail), "%s of %lld elements", CommOpName(op),
                static_cast<long long>(count));
  MpiFail(__FILE__, __LINE__, "element count outside [0, INT_MAX]", detail);
}

using Clock = std::chrono::steady_clock;

// What one operation records when it completes.
struct Pending {
  std::shared_ptr<CommStats> stats;
  std::shared_ptr<FlightRecorder> recorder;  // may be null
  uint64_t flight_id;
  std::string group;
  CommOp op;
  int64_t bytes;
  Clock::time_point start;
  // For receives: the element count that must arrive (a shorter message is a
  // mismatched send, which MPI itself does not report); -1 otherwise.
  int expect_count;
};

void Complete(const Pending& p, const MPI_Status* status) {
  if (p.expect_count >= 0) {
    int got = 0;
    PT_MPI_CHECK(MPI_Get_count(status, MPI_FLOAT, &got));
    PT_COMM_CHECK(got == p.expect_count,
                  "received fewer elements than requested");
  }
  p.stats->Record(p.group, p.op, SecondsSince(p.start), p.bytes);
  if (p.recorder != nullptr) p.recorder->Completed(p.flight_id);
}

class MpiHandle : public CommHandle {
 public:
  MpiHandle(MPI_Request request, Pending pending)
      : request_(request), pending_(std::move(pending)) {}
  MpiHandle(const MpiHandle&) = delete;
  MpiHandle& operator=(const MpiHandle&) = delete;
  // The buffers belong to the caller; returning before MPI is done with them
  // would let the caller free or reuse memory MPI still reads or writes.
  ~MpiHandle() override { Wait(); }

  void Wait() override {
    if (done_) return;
    MPI_Status status;
    PT_MPI_CHECK(MPI_Wait(&request_, &status));
    Finish(status);
  }

  bool Test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    PT_MPI_CHECK(MPI_Test(&request_, &flag, &status));
    if (flag) Finish(status);
    return done_;
  }

 private:
  void Finish(const MPI_Status& status) {
    done_ = true;
    Complete(pending_, &status);
  }

  MPI_Request request_;
  const Pending pending_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  // Works on a duplicate of `comm`: our messages then cannot match anyone
  // else's on the same group, and MPI_ERRORS_RETURN on the duplicate lets us
  // check every return code without changing the caller's error handler.
  MpiCommunicator(MPI_Comm comm, std::string group,
                  std::shared_ptr<CommStats> stats,
                  std::shared_ptr<FlightRecorder> recorder)
      : group_(std::move(group)),
        stats_(stats ? std::move(stats) : std::make_shared<CommStats>()),
        recorder_(std::move(recorder)) {
    PT_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
    PT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    PT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    PT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override {
    // A communicator that outlives MPI_Finalize has nothing left to free.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& group() const override { return group_; }
  CommStats& stats() override { return *stats_; }

  void AllReduce(float* data, int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllReduce);
    Blocking(CommOp::kAllReduce, count * sizeof(float), [&] {
      PT_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm_));
    });
  }

  void AllReduce(double* data, int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllReduce);
    Blocking(CommOp::kAllReduce, count * sizeof(double), [&] {
      PT_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_DOUBLE, MPI_SUM, comm_));
    });
  }

  void AllReduceMax(float* data, int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllReduce);
    Blocking(CommOp::kAllReduce, count * sizeof(float), [&] {
      PT_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_MAX, comm_));
    });
  }

  void ReduceScatter(const float* send, float* recv, int64_t count) override {
    const int n = MpiCount(count, CommOp::kReduceScatter);
    Blocking(CommOp::kReduceScatter, WholeBuffer(count), [&] {
      PT_MPI_CHECK(
          MPI_Reduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm_));
    });
  }

  void AllGather(const float* send, float* recv, int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllGather);
    const void* src = GatherSource(send, recv, count);
    Blocking(CommOp::kAllGather, WholeBuffer(count), [&] {
      PT_MPI_CHECK(MPI_Allgather(src, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_));
    });
  }

  void Broadcast(float* data, int64_t count, int root) override {
    const int n = MpiCount(count, CommOp::kBroadcast);
    Blocking(CommOp::kBroadcast, count * sizeof(float),
             [&] { PT_MPI_CHECK(MPI_Bcast(data, n, MPI_FLOAT, root, comm_)); });
  }

  void Send(const float* data, int64_t count, int peer, int tag) override {
    const int n = MpiCount(count, CommOp::kSend);
    Blocking(
        CommOp::kSend, count * sizeof(float),
        [&] { PT_MPI_CHECK(MPI_Send(data, n, MPI_FLOAT, peer, tag, comm_)); },
        peer);
  }

  void Recv(float* data, int64_t count, int peer, int tag) override {
    const int n = MpiCount(count, CommOp::kRecv);
    const Pending pending =
        MakePending(CommOp::kRecv, count * sizeof(float), n, peer);
    MPI_Status status;
    PT_MPI_CHECK(MPI_Recv(data, n, MPI_FLOAT, peer, tag, comm_, &status));
    Complete(pending, &status);
  }

  void Barrier() override {
    Blocking(CommOp::kBarrier, 0, [&] { PT_MPI_CHECK(MPI_Barrier(comm_)); });
  }

  void AllToAllV(const float* send, const int64_t* send_counts, float* recv,
                 const int64_t* recv_counts) override {
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t s_at = 0, r_at = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = MpiCount(send_counts[r], CommOp::kAllToAll);
      rc[r] = MpiCount(recv_counts[r], CommOp::kAllToAll);
      sd[r] = MpiCount(s_at, CommOp::kAllToAll);
      rd[r] = MpiCount(r_at, CommOp::kAllToAll);
      s_at += send_counts[r];
      r_at += recv_counts[r];
    }
    // The bytes this rank sends, as a send's are counted.
    Blocking(CommOp::kAllToAll, s_at * static_cast<int64_t>(sizeof(float)),
             [&] {
               PT_MPI_CHECK(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT,
                                          recv, rc.data(), rd.data(), MPI_FLOAT,
                                          comm_));
             });
  }

  std::unique_ptr<CommHandle> AllReduceAsync(float* data,
                                             int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllReduce);
    return Async(CommOp::kAllReduce, count * sizeof(float), [&](auto* req) {
      PT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM,
                                  comm_, req));
    });
  }

  std::unique_ptr<CommHandle> ReduceScatterAsync(const float* send, float* recv,
                                                 int64_t count) override {
    const int n = MpiCount(count, CommOp::kReduceScatter);
    return Async(CommOp::kReduceScatter, WholeBuffer(count), [&](auto* req) {
      PT_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM,
                                             comm_, req));
    });
  }

  std::unique_ptr<CommHandle> AllGatherAsync(const float* send, float* recv,
                                             int64_t count) override {
    const int n = MpiCount(count, CommOp::kAllGather);
    const void* src = GatherSource(send, recv, count);
    return Async(CommOp::kAllGather, WholeBuffer(count), [&](auto* req) {
      PT_MPI_CHECK(
          MPI_Iallgather(src, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, req));
    });
  }

  std::unique_ptr<CommHandle> BroadcastAsync(float* data, int64_t count,
                                             int root) override {
    const int n = MpiCount(count, CommOp::kBroadcast);
    return Async(CommOp::kBroadcast, count * sizeof(float), [&](auto* req) {
      PT_MPI_CHECK(MPI_Ibcast(data, n, MPI_FLOAT, root, comm_, req));
    });
  }

  std::unique_ptr<CommHandle> SendAsync(const float* data, int64_t count,
                                        int peer, int tag) override {
    const int n = MpiCount(count, CommOp::kSend);
    return Async(
        CommOp::kSend, count * sizeof(float),
        [&](auto* req) {
          PT_MPI_CHECK(MPI_Isend(data, n, MPI_FLOAT, peer, tag, comm_, req));
        },
        -1, peer);
  }

  std::unique_ptr<CommHandle> RecvAsync(float* data, int64_t count, int peer,
                                        int tag) override {
    const int n = MpiCount(count, CommOp::kRecv);
    return Async(
        CommOp::kRecv, count * sizeof(float),
        [&](auto* req) {
          PT_MPI_CHECK(MPI_Irecv(data, n, MPI_FLOAT, peer, tag, comm_, req));
        },
        n, peer);
  }

 private:
  // reduce_scatter and all_gather count the whole size()*count buffer, as
  // nccl-tests' S does, so bytes/seconds is directly its algbw.
  int64_t WholeBuffer(int64_t count) const {
    return static_cast<int64_t>(size_) * count * sizeof(float);
  }

  // MPI forbids overlapping send and receive buffers; the in-place form is
  // how the aliasing the interface allows is spelled in MPI.
  const void* GatherSource(const float* send, float* recv,
                           int64_t count) const {
    return send == recv + static_cast<int64_t>(rank_) * count ? MPI_IN_PLACE
                                                              : send;
  }

  // A call issued now: its start, and its entry in the flight recorder
  // (`peer`: the other side of a send or receive).
  Pending MakePending(CommOp op, int64_t bytes, int expect_count = -1,
                      int peer = -1) const {
    const uint64_t id =
        recorder_ != nullptr ? recorder_->Issued(group_, op, bytes, peer) : 0;
    return Pending{stats_, recorder_, id,           group_,
                   op,     bytes,     Clock::now(), expect_count};
  }

  template <typename F>
  void Blocking(CommOp op, int64_t bytes, F&& call, int peer = -1) {
    const Pending pending = MakePending(op, bytes, -1, peer);
    call();
    Complete(pending, nullptr);
  }

  template <typename F>
  std::unique_ptr<CommHandle> Async(CommOp op, int64_t bytes, F&& issue,
                                    int expect_count = -1, int peer = -1) {
    Pending pending = MakePending(op, bytes, expect_count, peer);
    MPI_Request request = MPI_REQUEST_NULL;
    issue(&request);
    return std::make_unique<MpiHandle>(request, std::move(pending));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  const std::string group_;
  const std::shared_ptr<CommStats> stats_;
  const std::shared_ptr<FlightRecorder> recorder_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> MakeMpiCommunicator(
    MPI_Comm comm, std::string group, std::shared_ptr<CommStats> stats,
    std::shared_ptr<FlightRecorder> recorder) {
  SetCheckAbortHook(&AbortWorld);
  return std::make_unique<MpiCommunicator>(
      comm, std::move(group), std::move(stats), std::move(recorder));
}

}  // namespace ptrain
