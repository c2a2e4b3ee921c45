// How ptcoord runs a job's attempts, behind one interface: mpirun on its own
// host (backend_local.cc), mpirun with ptrsh as its launch agent over the
// registered nodes (backend_nodes.cc), or one Slurm job each
// (backend_slurm.cc). The job state machine (coordinator.h) decides what
// becomes of a job; a backend places, starts, signals and watches attempts
// and says how one ended, and never changes a job. Not thread-safe: the
// Coordinator calls it under its lock.
#ifndef PTRAIN_COORDINATOR_ATTEMPT_BACKEND_H_
#define PTRAIN_COORDINATOR_ATTEMPT_BACKEND_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/auto_layout.h"
#include "coordinator/launcher.h"
#include "coordinator/scheduler.h"
#include "ptrain/v1/coordinator.pb.h"

namespace ptrain {

struct CoordinatorOptions;
class NodeRegistry;

// A backend's own state of one attempt (its process group, its Slurm job).
// Opaque to the state machine, which hands it back to the backend that
// made it and to no other.
class AttemptHandle {
 public:
  virtual ~AttemptHandle() = default;
};

// What Poll saw of an attempt.
struct AttemptStatus {
  enum State {
    kRunning,
    kQueued,  // waiting in the backend's own queue (Slurm's): not a hang
    kEnding,  // its leader (mpirun) ended; some of its processes linger
    kEnded,
  };
  State state = kRunning;
  // kEnded: the exit code, -1 when there is none: then `lost` (its
  // exit_code file still says pending: it died with its host, say) or
  // `exit_unknown` (the file is empty or unreadable: a full disk?). Either
  // way its run log and checkpoints may show that it finished.
  int exit_code = -1;
  bool lost = false;
  bool exit_unknown = false;
  // kEnded: why it ended, where the backend knows better than the exit code
  // ("... Slurm job 42 ended NODE_FAIL on n[1-2]"), and whether that is a
  // lost node (not the job's fault).
  std::string reason;
  bool node_lost = false;
  // kEnded: a failure a dying node may have caused before the backend hears
  // of the death: the state machine asks CheckNodes, for up to NodeGrace(),
  // before it blames the job.
  bool may_be_node_loss = false;
  // A change worth an event of the job ("Slurm job 42 RUNNING on n1").
  std::string event;
};

// Ranks' process states (/proc state letters) by (host, pid), as the
// machines they run on see them.
using ProcessStates = std::map<std::pair<std::string, int>, std::string>;

// What CheckNodes says about the nodes of an attempt that failed.
struct NodeVerdict {
  // Not empty: one of its nodes is lost, and this is why the attempt ended.
  std::string lost;
  // Every node of it was heard from since it ended: the failure is the
  // job's own.
  bool all_heard = false;
};

// Where a waiting job's next attempt starts.
struct AttemptPlace {
  // Its ranks' nodes in rank order (mpirun's hostfile); empty where the
  // backend does not name them (this host, Slurm).
  std::vector<NodeRanks> nodes;
  // What the job's `placement` shows: those nodes with a GPU job's GPUs,
  // or this host with the GPUs a GPU job takes here.
  std::vector<v1::Placement> placement;
  // The spec it runs when shrunk to fewer dp replicas
  // (restart.allow_shrink); nullopt: the job's own.
  std::optional<v1::JobSpec> shrunk;
};

// An attempt a previous ptcoord started, as a restarted one finds it.
struct AdoptRequest {
  std::string job_id;
  int attempt = 0;
  AttemptKey key;
  std::string attempt_dir;
};
struct Adopted {
  std::unique_ptr<AttemptHandle> handle;  // never null
  // Its processes (or Slurm job) still run: it is re-adopted. Otherwise
  // the handle's Poll says how it ended.
  bool alive = false;
};

class AttemptBackend {
 public:
  virtual ~AttemptBackend() = default;

  // Its --launcher name: local, nodes or slurm.
  virtual std::string Name() const = 0;

  // At submit: OK when a job of `spec` (`world` ranks) can ever run here;
  // InvalidArgument naming the rule when it cannot (more slots or GPUs
  // than this host has). Where nodes may join later, or Slurm queues, OK.
  virtual absl::Status Admit(const v1::JobSpec& spec, int world) const;
  // Where the waiting `job` starts now beside the jobs of `running`;
  // nullopt when it must wait (and, unless backfill lets them pass, so must
  // every job behind it).
  virtual std::optional<AttemptPlace> Place(const v1::Job& job,
                                            const RunningJobs& running) = 0;
  // What is free beside `running`, said as what a job that did not fit
  // needs: "more slots than the 2 of 4 free on this host (--local-slots)".
  virtual std::string FreeSlots(const RunningJobs& running) const;
  // How many slots are free beside `running`; -1 where the backend does
  // not know (Slurm).
  virtual int FreeSlotCount(const RunningJobs& running) const;
  // Whether the backend queues attempts itself (Slurm): Place never makes a
  // job wait, its attempts start at once and Poll says kQueued until the
  // backend runs them. Preemption then looks at those queued attempts, and
  // at TotalSlots.
  virtual bool QueuesItself() const;
  // How many ranks the backend's resources hold at once (Slurm: the up
  // nodes' CPUs of the partition); -1 when it cannot tell now.
  virtual int TotalSlots();
  // The cluster a `parallel: auto` job of `spec` is planned on
  // (auto_layout.h): the nodes that are up, busy or not, and the ranks
  // each holds (a GPU job: its GPUs; at most resources.ranks_per_node).
  // No node ({0, 0}) where the backend cannot tell.
  virtual ClusterShape Shape(const v1::JobSpec& spec);
  // Whether the running, shrunk `job` fits at its full size now beside
  // `others` (its own slots counted free): the state machine then stops it
  // to grow back. False where the backend cannot tell (Slurm places) or
  // never shrinks a job (this host).
  virtual bool FitsFullSize(const v1::Job& job, const RunningJobs& others);

  // Starts the attempt `request` describes (its job folder prepared, its
  // ranks' nodes in `request.placement`) running `spec`. An error: it did
  // not start.
  virtual absl::StatusOr<std::unique_ptr<AttemptHandle>> Start(
      LaunchRequest request, const v1::JobSpec& spec) = 0;
  // Fills what the attempt's record keeps of how it runs
  // (Attempt.slurm_job_id) and returns the event that says so; "" when
  // there is nothing to record.
  virtual std::string StartedEvent(const AttemptHandle& handle,
                                   v1::Attempt* attempt) const;
  // Finds an attempt a previous ptcoord started.
  virtual Adopted Adopt(const AdoptRequest& request) = 0;

  // How the attempt is doing. `ending`: ptcoord is ending it (Terminate
  // went out), so an end without an exit code is its doing, not a loss.
  virtual AttemptStatus Poll(AttemptHandle& handle, absl::Time now,
                             bool ending) = 0;
  // Whether a running attempt can be asked to save a checkpoint and stop
  // (pause, grow back). Under Slurm the signal would reach the batch
  // script too.
  virtual bool CanAskToStop() const;
  // Asks it: SIGUSR1 to mpirun, which forwards it to every rank; they save
  // a checkpoint of the step they are in and exit 3. False when it cannot
  // be asked (no mpirun left, or !CanAskToStop()).
  virtual bool AskToStop(AttemptHandle& handle);
  // Asks every rank of attempt `attempt_uid` of `job` for a flight recorder
  // dump (docs/diagnose.md): SIGUSR2 to mpirun, which forwards it
  // (scancel --signal=USR2 to Slurm's job steps; on nodes, each node's
  // daemon signals its ranks). Training goes on. Where the backend sees the
  // ranks' processes itself (the node daemons), their state letters by
  // (host, pid) go into *seen. False when it cannot be asked.
  virtual bool AskToDump(AttemptHandle& handle, const v1::Job& job,
                         const std::string& attempt_uid, ProcessStates* seen);
  // Asks it to end now: SIGTERM to its processes (scancel).
  virtual void Terminate(AttemptHandle& handle) = 0;
  // Ends it: SIGKILL (scancel --signal=KILL); sent again while it lingers.
  virtual void Kill(AttemptHandle& handle) = 0;

  // While the attempt of `job` runs: a node of its placement that the
  // backend knows is gone (a daemon whose heartbeats stopped), as the
  // reason to end it; "" when none.
  virtual std::string LostNode(const v1::Job& job, absl::Time now);
  // After a failure Poll marked may_be_node_loss, seen first at
  // `ended_at`: whether one of the attempt's nodes died.
  virtual NodeVerdict CheckNodes(AttemptHandle& handle, const v1::Job& job,
                                 absl::Time ended_at, absl::Time now);
  // How long a failure waits for CheckNodes before it is the job's own.
  virtual absl::Duration NodeGrace() const;
};

// The three backends. `options` (and `nodes`) are not owned and outlive
// the backend.
std::unique_ptr<AttemptBackend> NewLocalBackend(
    const CoordinatorOptions& options);
std::unique_ptr<AttemptBackend> NewNodesBackend(
    const CoordinatorOptions& options, NodeRegistry* nodes);
std::unique_ptr<AttemptBackend> NewSlurmBackend(
    const CoordinatorOptions& options);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_ATTEMPT_BACKEND_H_
