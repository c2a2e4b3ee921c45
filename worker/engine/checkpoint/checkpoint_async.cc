// BackgroundSave (checkpoint.h): a checkpoint written by a thread while
// training goes on, through the same steps as SaveCheckpoint
// (checkpoint_writer.cc): prepare and copy the state here, write the shard on
// the thread (no MPI call there), commit in Finish.
#include <chrono>
#include <cstring>
#include <thread>

#include "common/check.h"
#include "common/thread_entry.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"

namespace ptrain {

BackgroundSave::~BackgroundSave() {
  if (writer_.joinable()) writer_.join();
}

absl::StatusOr<bool> BackgroundSave::Start(const std::string& root,
                                           const CheckpointMeta& meta,
                                           std::vector<ShardRun> runs,
                                           Communicator* world,
                                           const SaveOptions& options) {
  PT_CHECK(!pending(), "a background checkpoint is already pending");
  const SaveFolders f = FoldersOf(root, meta.step);
  auto committed = PrepareSave(f, meta, world, options.fs);
  if (!committed.ok()) return committed.status();
  if (*committed) return true;
  meta_ = meta;
  options_ = options;
  // The copy the thread writes from: the caller's state changes with the
  // next step.
  int64_t total = 0;
  for (const ShardRun& r : runs) total += r.box.numel();
  snapshot_.resize(total);
  float* at = snapshot_.data();
  for (ShardRun& r : runs) {
    const int64_t n = r.box.numel();
    std::memcpy(at, r.data, n * sizeof(float));
    r.data = at;
    at += n;
  }
  runs_ = std::move(runs);
  root_ = root;
  wrote_ = absl::OkStatus();
  written_.store(false);
  const int rank = world != nullptr ? world->rank() : 0;
  writer_ = std::thread(ThreadEntry("checkpoint-save", [this, f, rank] {
    const auto t0 = std::chrono::steady_clock::now();
    wrote_ = WriteShard(f, rank, runs_, options_);
    write_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    written_.store(true, std::memory_order_release);
  }));
  return false;
}

bool BackgroundSave::AllWritten(Communicator* world) {
  PT_CHECK(pending(), "no background checkpoint is pending");
  const bool mine = written_.load(std::memory_order_acquire);
  return Agree(world, mine ? 0.0 : 1.0) == 0.0;
}

absl::StatusOr<std::string> BackgroundSave::Finish(Communicator* world) {
  PT_CHECK(pending(), "no background checkpoint is pending");
  writer_.join();
  const SaveFolders f = FoldersOf(root_, meta_.step);
  const absl::Status s = CommitSave(f, meta_, wrote_, world, options_);
  runs_.clear();
  if (!s.ok()) return s;
  return f.final_dir;
}

}  // namespace ptrain
