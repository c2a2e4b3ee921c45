// The flight recorder's ring and its JSON-lines dump; see flight_recorder.h.
#include "worker/engine/comm/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/net.h"
#include "common/private_file.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

int64_t NowUnixMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

const char* StateName(int state) {
  switch (state) {
    case 0:
      return "queued";
    case 1:
      return "started";
    default:
      return "completed";
  }
}

}  // namespace

const char* FlightPhaseName(FlightPhase phase) {
  switch (phase) {
    case FlightPhase::kSetup:
      return "setup";
    case FlightPhase::kForward:
      return "forward";
    case FlightPhase::kBackward:
      return "backward";
    case FlightPhase::kOptimizer:
      return "optimizer";
    case FlightPhase::kEval:
      return "eval";
    case FlightPhase::kSample:
      return "sample";
    case FlightPhase::kCheckpoint:
      return "checkpoint";
  }
  return "setup";
}

FlightRecorder::FlightRecorder(int capacity) { SetCapacity(capacity); }

void FlightRecorder::SetCapacity(int capacity) {
  PT_CHECK(capacity >= 0, "a flight recorder's capacity is not negative");
  std::lock_guard<std::mutex> lock(mu_);
  ring_.assign(std::max(capacity, 1), Entry{});
  // Ids go on, so that the ring's slots of older ids read as overwritten.
  on_.store(capacity > 0);
}

void FlightRecorder::SetIdentity(Identity identity) {
  std::lock_guard<std::mutex> lock(mu_);
  identity_ = std::move(identity);
}

void FlightRecorder::SetGroup(const std::string& group,
                              std::vector<int> world_ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  group_members_[GroupIndex(group)] = std::move(world_ranks);
}

int FlightRecorder::GroupIndex(const std::string& group) {
  for (size_t i = 0; i < group_names_.size(); ++i) {
    if (group_names_[i] == group) return static_cast<int>(i);
  }
  group_names_.push_back(group);
  group_members_.emplace_back();
  group_seq_.push_back(0);
  return static_cast<int>(group_names_.size()) - 1;
}

int FlightRecorder::WorldRank(int group, int peer) const {
  const std::vector<int>& members = group_members_[group];
  return peer >= 0 && peer < static_cast<int>(members.size()) ? members[peer]
                                                              : peer;
}

FlightRecorder::Entry& FlightRecorder::Append() {
  const uint64_t id = next_id_++;
  Entry& e = ring_[(id - 1) % ring_.size()];
  e = Entry{};
  e.id = id;
  e.step = step_;
  e.microbatch = microbatch_;
  e.phase = phase_;
  return e;
}

void FlightRecorder::SetStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
}

void FlightRecorder::Enter(FlightPhase phase, int microbatch) {
  if (!on_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (phase == phase_ && microbatch == microbatch_) return;
  phase_ = phase;
  microbatch_ = microbatch;
  Entry& e = Append();
  e.mark = true;
  e.start_us = last_progress_us_ = NowUnixMicros();
}

uint64_t FlightRecorder::Issued(const std::string& group, CommOp op,
                                int64_t bytes, int peer, bool queued) {
  if (!on_.load(std::memory_order_relaxed)) return 0;
  const int64_t now = NowUnixMicros();
  std::lock_guard<std::mutex> lock(mu_);
  const int g = GroupIndex(group);
  Entry& e = Append();
  e.group = g;
  e.op = op;
  e.bytes = bytes;
  e.seq = ++group_seq_[g];
  if (op == CommOp::kSend || op == CommOp::kRecv) {
    e.peer = WorldRank(g, peer);
    e.peer_seq = ++p2p_[{g, e.peer, op == CommOp::kSend}];
  }
  e.enqueue_us = now;
  e.start_us = queued ? 0 : now;
  e.state = queued ? State::kQueued : State::kStarted;
  last_activity_us_ = now;
  return e.id;
}

void FlightRecorder::Started(uint64_t id) {
  if (id == 0) return;  // issued while off
  const int64_t now = NowUnixMicros();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = ring_[(id - 1) % ring_.size()];
  if (e.id != id || e.state != State::kQueued) return;
  e.state = State::kStarted;
  e.start_us = now;
}

void FlightRecorder::Completed(uint64_t id) {
  if (id == 0 || !on_.load(std::memory_order_relaxed)) return;
  const int64_t now = NowUnixMicros();
  std::lock_guard<std::mutex> lock(mu_);
  last_activity_us_ = last_progress_us_ = now;
  Entry& e = ring_[(id - 1) % ring_.size()];
  // Overwritten since (a call outlived the ring): only the time counts.
  if (e.id != id) return;
  e.state = State::kCompleted;
  e.end_us = now;
}

uint64_t FlightRecorder::recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_ - 1;
}

int64_t FlightRecorder::ProgressAgeMillis() const {
  const int64_t now = NowUnixMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (last_progress_us_ == 0) return -1;
  return std::max<int64_t>(0, (now - last_progress_us_) / 1000);
}

std::string FlightRecorder::Dump(const std::string& reason) const {
  const std::string host = HostName("");
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  for (size_t g = 0; g < group_names_.size(); ++g) {
    if (!group_members_[g].empty()) groups[group_names_[g]] = group_members_[g];
  }
  const nlohmann::ordered_json header = {
      {"type", "header"},
      {"version", 1},
      {"rank", identity_.rank},
      {"world_size", identity_.world_size},
      {"pid", static_cast<int64_t>(getpid())},
      {"host", host},
      {"coords", identity_.coords},
      {"groups", groups},
      {"reason", reason},
      {"dumped_unix_us", NowUnixMicros()},
      {"step", step_},
      {"microbatch", microbatch_},
      {"phase", FlightPhaseName(phase_)},
      {"last_activity_unix_us", last_activity_us_},
      {"capacity", on_.load() ? ring_.size() : 0},
      {"recorded", next_id_ - 1}};
  std::string out = header.dump();
  out += '\n';
  const uint64_t n = next_id_ - 1;
  const uint64_t first = n > ring_.size() ? n - ring_.size() + 1 : 1;
  for (uint64_t id = first; id <= n; ++id) {
    const Entry& e = ring_[(id - 1) % ring_.size()];
    if (e.id != id) continue;  // dropped by SetCapacity
    nlohmann::ordered_json line;
    if (e.mark) {
      line = {{"type", "mark"},
              {"id", e.id},
              {"step", e.step},
              {"microbatch", e.microbatch},
              {"phase", FlightPhaseName(e.phase)},
              {"unix_us", e.start_us}};
    } else {
      line = {{"type", "comm"},
              {"id", e.id},
              {"group", group_names_[e.group]},
              {"seq", e.seq},
              {"op", CommOpName(e.op)},
              {"bytes", e.bytes},
              {"peer", e.peer},
              {"peer_seq", e.peer_seq},
              {"step", e.step},
              {"microbatch", e.microbatch},
              {"phase", FlightPhaseName(e.phase)},
              {"enqueue_us", e.enqueue_us},
              {"start_us", e.start_us},
              {"state", StateName(static_cast<int>(e.state))}};
      if (e.state == State::kCompleted) line["end_us"] = e.end_us;
    }
    out += line.dump();
    out += '\n';
  }
  return out;
}

absl::Status FlightRecorder::DumpTo(const std::string& path,
                                    const std::string& reason) const {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(),
                                      ec);
  return ReplacePrivateFile(path, Dump(reason));
}

std::string FlightDumpPath(const std::string& log_json_path, int world_rank) {
  const std::filesystem::path dir =
      log_json_path.empty()
          ? std::filesystem::path("flight")
          : std::filesystem::path(log_json_path).parent_path() / "flight";
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.jsonl", world_rank);
  return (dir / name).string();
}

}  // namespace ptrain
