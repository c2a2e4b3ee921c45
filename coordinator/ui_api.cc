// See ui_api.h.
#include "coordinator/ui_api.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/bounded_file.h"
#include "common/gpu_inventory.h"
#include "common/job_state.h"
#include "common/process.h"
#include "common/proto_json.h"
#include "common/utf8.h"
#include "coordinator/queue_policy.h"

namespace ptrain {

using nlohmann::json;

ApiReply ApiError(int status, const std::string& message) {
  return {status, json{{"error", message}}};
}

namespace {

// From a Coordinator error: 404 for an unknown job, 400 for a refused
// argument, 503 otherwise (the store is busy or failing).
ApiReply FromStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      return ApiError(404, std::string(s.message()));
    case absl::StatusCode::kInvalidArgument:
      return ApiError(400, std::string(s.message()));
    default:
      return ApiError(503, std::string(s.message()));
  }
}

// Parameter `name` as an integer in [lo, hi], `fallback` when absent; an
// ApiReply (400 naming the parameter) when it is not one.
struct IntParam {
  int64_t value = 0;
  std::optional<ApiReply> error;
};
IntParam ReadInt(const ApiQuery& q, const std::string& name, int64_t lo,
                 int64_t hi, int64_t fallback) {
  auto it = q.find(name);
  if (it == q.end()) return {fallback, std::nullopt};
  int64_t v = 0;
  if (it->second.size() > kUiMaxParamBytes ||
      !absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return {0, ApiError(400, absl::StrCat("query parameter '", name,
                                          "' must be an integer in [", lo, ", ",
                                          hi, "]"))};
  }
  return {v, std::nullopt};
}

// Parameter `name` as one of `allowed`, `allowed[0]` when absent.
struct WordParam {
  std::string value;
  std::optional<ApiReply> error;
};
WordParam ReadWord(const ApiQuery& q, const std::string& name,
                   const std::vector<std::string>& allowed) {
  auto it = q.find(name);
  if (it == q.end()) return {allowed.front(), std::nullopt};
  if (std::find(allowed.begin(), allowed.end(), it->second) != allowed.end()) {
    return {it->second, std::nullopt};
  }
  std::string list;
  for (const std::string& a : allowed) {
    absl::StrAppend(&list, list.empty() ? "" : ", ", a);
  }
  return {"", ApiError(400, absl::StrCat("query parameter '", name,
                                         "' must be one of ", list))};
}

json Summary(const v1::Job& job) {
  const v1::Progress& p = job.progress();
  json j = {{"id", job.id()},
            {"name", job.name()},
            {"owner", job.owner()},
            {"state", LowerStateName(job.state())},
            {"attempts", job.attempts()},
            {"world_size", job.world_size()},
            {"created_ms", job.created_unix_ms()},
            {"started_ms", job.started_unix_ms()},
            {"finished_ms", job.finished_unix_ms()},
            {"error", job.error()},
            {"step", p.step()},
            {"steps", job.spec().train().steps()},
            {"loss", nullptr},
            {"val_loss", nullptr},
            {"tok_per_s", nullptr},
            {"mfu", nullptr},
            {"lr", nullptr},
            {"progress_ms", p.unix_ms()},
            {"eta_s", nullptr},
            {"cancel_requested", job.cancel_requested()},
            {"pause_requested", job.pause_requested()}};
  // A job that has trained no step yet has no figures ("—"), not zeros.
  if (p.unix_ms() > 0 && p.step() > 0) {
    j["loss"] = p.loss();
    j["tok_per_s"] = p.tok_per_s();
    j["mfu"] = p.mfu();
    j["lr"] = p.lr();
  }
  if (p.has_val_loss()) j["val_loss"] = p.val_loss();
  if (const std::optional<double> eta = EtaSeconds(job)) j["eta_s"] = *eta;
  // Why a waiting job waits, and its place in the queue.
  if (!job.waiting().empty()) {
    j["waiting"] = job.waiting();
    j["queue_position"] = job.queue_position();
  }
  j["priority"] = job.priority();
  return j;
}

// A file of an attempt's folder, which its ranks write, from `from` to its
// end but at most its last `n` bytes (ReadFileTail: a link, a FIFO or any
// other non-regular file is refused, and said why).
absl::StatusOr<FileTail> ReadRankFile(const std::string& path, int64_t from,
                                      int64_t n) {
  return ReadFileTail("", path, from, static_cast<size_t>(n),
                      Symlinks::kRefuse);
}

json PointJson(const v1::LossPoint& p) {
  const bool eval = p.val_loss() != 0;
  json j = {
      {"step", p.step()}, {"attempt", p.attempt()}, {"unix_ms", p.unix_ms()}};
  if (eval) {
    j["val_loss"] = p.val_loss();
    j["loss"] = j["tok_per_s"] = j["mfu"] = j["lr"] = nullptr;
    // A blend's: each source's loss by name.
    if (!p.val_loss_by_source().empty()) {
      j["val_loss_by_source"] = p.val_loss_by_source();
    }
  } else {
    j["val_loss"] = nullptr;
    j["loss"] = p.loss();
    j["tok_per_s"] = p.tok_per_s();
    j["mfu"] = p.mfu();
    j["lr"] = p.lr();
  }
  return j;
}

}  // namespace

std::string EventKind(const std::string& m) {
  const auto has = [&](absl::string_view s) { return absl::StrContains(m, s); };
  if (absl::StartsWith(m, "submitted")) return "submitted";
  if (has("rolled back")) return "rollback";
  if (has("preempt")) return "preempt";
  if (has("shrunk")) return "shrink";
  if (has("grow")) return "grow";
  if (has("lost") || has("requeued")) return "node_lost";
  if (has("hang")) return "hang";
  if (has("cancel")) return "cancel";
  if (has("pause") || absl::StartsWith(m, "resumed")) return "pause";
  if (absl::StartsWith(m, "checkpoint at step")) return "checkpoint";
  if (absl::StartsWith(m, "attempt") && has(" failed")) return "restart";
  if (absl::StartsWith(m, "attempt") && has(" started")) return "attempt";
  return "other";
}

namespace {

// A `sample` record's {"step", "text"}; null for anything else.
json SampleOf(const json& rec) {
  if (rec.contains("text") && rec["text"].is_string()) {
    return json{{"step", rec["step"]}, {"text", rec["text"]}};
  }
  return nullptr;
}

// An `experts` record's {"step", "layers"}, each layer's `layer`, `tokens`,
// `dropped` and `imbalance` checked; null for anything else.
json ExpertsRecordOf(const json& rec) {
  if (!rec.contains("layers") || !rec["layers"].is_array()) return nullptr;
  json layers = json::array();
  for (const json& l : rec["layers"]) {
    if (!l.is_object() || !l.contains("layer") ||
        !l["layer"].is_number_integer() || !l.contains("tokens") ||
        !l["tokens"].is_array() || !l.contains("dropped") ||
        !l["dropped"].is_number() || !l.contains("imbalance") ||
        !l["imbalance"].is_number()) {
      return nullptr;
    }
    for (const json& t : l["tokens"]) {
      if (!t.is_number()) return nullptr;
    }
    layers.push_back({{"layer", l["layer"]},
                      {"tokens", l["tokens"]},
                      {"dropped", l["dropped"]},
                      {"imbalance", l["imbalance"]}});
  }
  return json{{"step", rec["step"]}, {"layers", std::move(layers)}};
}

// The newest `sample` record (SampleOf) and the newest `experts` record
// (ExpertsRecordOf) among the lines of `text`, in one walk from its end
// (a record either makes null is passed over for an older one); null for
// each not found. A line cut at the start of a partial read is skipped by
// the parser failing on it.
struct NewestRecords {
  json sample = nullptr, experts = nullptr;
};
NewestRecords FindNewest(std::string_view text) {
  NewestRecords out;
  while (!text.empty() && (out.sample.is_null() || out.experts.is_null())) {
    size_t end = text.size();
    while (end > 0 && text[end - 1] == '\n') --end;
    const size_t start = text.rfind('\n', end == 0 ? 0 : end - 1);
    const size_t from = start == std::string_view::npos ? 0 : start + 1;
    const absl::string_view line(text.data() + from, end - from);
    const bool sample = out.sample.is_null() &&
                        absl::StrContains(line, "\"sample\""),
               experts = out.experts.is_null() &&
                         absl::StrContains(line, "\"experts\"");
    if (sample || experts) {
      json rec = json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (rec.is_object() && rec.contains("step") &&
          rec["step"].is_number_integer()) {
        const std::string type = rec.value("type", "");
        if (sample && type == "sample") out.sample = SampleOf(rec);
        if (experts && type == "experts") out.experts = ExpertsRecordOf(rec);
      }
    }
    if (start == std::string_view::npos) break;
    text = text.substr(0, start);
  }
  return out;
}

}  // namespace

json LatestSamples::Of(const std::string& path, int64_t max_bytes) {
  int64_t from = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = seen_.find(path);
    if (it != seen_.end()) from = it->second.scanned;
  }
  // Off the mutex: every job page asks, and one slow file must not hold
  // the others.
  absl::StatusOr<FileTail> got = ReadRankFile(path, from, max_bytes);
  const bool replaced = got.ok() && got->size < from;
  if (replaced) {
    // Shorter than what was read of it: another file now, read again.
    got = ReadRankFile(path, 0, max_bytes);
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = seen_.find(path);
  if (!got.ok()) {
    if (it != seen_.end()) seen_.erase(it);
    return nullptr;
  }
  bytes_read_ += static_cast<int64_t>(got->bytes.size());
  if (it != seen_.end() && it->second.scanned != from && !replaced) {
    // Another poll read it meanwhile, from where this one began: its
    // answer is as new as this one's.
    it->second.asked = ++clock_;
    return it->second.sample;
  }
  if (replaced && it != seen_.end()) {
    seen_.erase(it);
    it = seen_.end();
  }
  if (it == seen_.end()) {
    if (seen_.size() >= max_logs_) {
      seen_.erase(std::min_element(seen_.begin(), seen_.end(),
                                   [](const auto& a, const auto& b) {
                                     return a.second.asked < b.second.asked;
                                   }));
    }
    it = seen_.emplace(path, Seen{}).first;
  }
  // Whole lines only: a record still being written is read next time.
  const size_t whole = got->bytes.rfind('\n') + 1;  // 0 when none
  Seen& seen = it->second;
  const std::string_view lines = std::string_view(got->bytes).substr(0, whole);
  NewestRecords newer = FindNewest(lines);
  if (!newer.sample.is_null()) seen.sample = std::move(newer.sample);
  if (!newer.experts.is_null()) seen.experts = std::move(newer.experts);
  seen.scanned = got->start + static_cast<int64_t>(whole);
  seen.asked = ++clock_;
  return seen.sample;
}

json LatestSamples::ExpertsOf(const std::string& path) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = seen_.find(path);
  return it != seen_.end() ? it->second.experts : json(nullptr);
}

int64_t LatestSamples::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_read_;
}

ApiReply JobsApi(Coordinator& c, const ApiQuery& q) {
  std::vector<std::string> states = LowerStateNames();
  states.insert(states.begin(), "all");
  WordParam state = ReadWord(q, "state", states);
  if (state.error) return *state.error;
  IntParam limit = ReadInt(q, "limit", 1, kMaxListLimit, 0);
  if (limit.error) return *limit.error;
  const v1::JobState want =
      StateOfLowerName(state.value).value_or(v1::JOB_STATE_UNSPECIFIED);
  absl::StatusOr<std::vector<v1::Job>> jobs =
      c.List(want, static_cast<int>(limit.value));
  if (!jobs.ok()) return FromStatus(jobs.status());
  json list = json::array();
  for (const v1::Job& j : *jobs) list.push_back(Summary(j));
  return {200, json{{"now_ms", NowMs()}, {"jobs", std::move(list)}}};
}

ApiReply JobApi(Coordinator& c, LatestSamples& samples, const std::string& id,
                const ApiQuery&) {
  absl::StatusOr<v1::GetJobResponse> got = c.Get(id, false);
  if (!got.ok()) return FromStatus(got.status());
  const v1::Job& job = got->job();
  json j = Summary(job);
  j["spec"] = json::parse(ProtoJson(job.spec(), /*pretty=*/false), nullptr,
                          /*allow_exceptions=*/false);
  json placement = json::array();
  for (const v1::Placement& p : job.placement()) {
    placement.push_back(
        {{"node", p.node()},
         {"ranks", p.ranks()},
         {"gpus", std::vector<int>(p.gpus().begin(), p.gpus().end())},
         {"cpus", std::vector<int>(p.cpus().begin(), p.cpus().end())}});
  }
  j["placement"] = std::move(placement);
  json attempts = json::array();
  for (const v1::Attempt& a : got->attempts()) {
    const bool running =
        a.finished_unix_ms() == 0 && a.end() == v1::ATTEMPT_END_UNSPECIFIED;
    attempts.push_back({{"number", a.number()},
                        {"started_ms", a.started_unix_ms()},
                        {"finished_ms", a.finished_unix_ms()},
                        {"exit_code", a.exit_code()},
                        {"error", a.error()},
                        {"end", running ? "running" : EndName(a.end())}});
  }
  json checkpoints = json::array();
  if (auto list = c.Checkpoints(id); list.ok()) {
    for (const v1::Checkpoint& k : *list) {
      checkpoints.push_back({{"step", k.step()},
                             {"dir", k.dir()},
                             {"attempt", k.attempt()},
                             {"unix_ms", k.unix_ms()}});
    }
  }
  json events = json::array();
  if (auto list = c.Events(id); list.ok()) {
    for (const auto& [ms, message] : *list) {
      events.push_back({{"unix_ms", ms},
                        {"message", message},
                        {"kind", EventKind(message)}});
    }
  }
  // The newest sample and expert load: the latest attempt's, else an
  // earlier one's.
  json sample = nullptr, experts = nullptr;
  for (int n = job.attempts(); n >= 1 && n > job.attempts() - 3; --n) {
    absl::StatusOr<Coordinator::LogSource> src = c.Logs(id, n);
    if (!src.ok()) break;
    const std::string log =
        (std::filesystem::path(src->dir) / "run.jsonl").string();
    sample = samples.Of(log, int64_t{1} << 20);
    if (experts.is_null()) {
      experts = samples.ExpertsOf(log);
      if (!experts.is_null()) experts["attempt"] = n;
    }
    if (!sample.is_null()) {
      sample["attempt"] = n;
      break;
    }
  }
  return {200, json{{"now_ms", NowMs()},
                    {"job", std::move(j)},
                    {"attempts", std::move(attempts)},
                    {"checkpoints", std::move(checkpoints)},
                    {"events", std::move(events)},
                    {"sample", std::move(sample)},
                    {"experts", std::move(experts)}}};
}

ApiReply MetricsApi(Coordinator& c, const std::string& id, const ApiQuery& q) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  IntParam since = ReadInt(q, "since", 0, kMax, 0);
  if (since.error) return *since.error;
  IntParam rank_since = ReadInt(q, "rank_since", 0, kMax, 0);
  if (rank_since.error) return *rank_since.error;
  int64_t stored = 0, last = 0;
  absl::StatusOr<std::vector<v1::LossPoint>> points =
      c.LossSince(id, since.value, &stored, &last);
  if (!points.ok()) return FromStatus(points.status());
  json list = json::array();
  for (const v1::LossPoint& p : *points) list.push_back(PointJson(p));
  const RankTimesBoard::View view = c.rank_times().Since(id, rank_since.value);
  json ranks = json::array();
  for (const RankTimesBoard::Point& p : view.points) {
    json comm = json::object();
    for (const auto& [group, ms] : p.times.comm_ms()) comm[group] = ms;
    ranks.push_back({{"rank", p.rank},
                     {"unix_ms", p.unix_ms},
                     {"step", p.times.step()},
                     {"steps", p.times.steps()},
                     {"step_ms", p.times.step_ms()},
                     {"exposed_ms", p.times.exposed_ms()},
                     {"comm_ms", std::move(comm)}});
  }
  return {200, json{{"now_ms", NowMs()},
                    {"loss_points_stored", stored},
                    {"points", std::move(list)},
                    {"next_since", last},
                    {"ranks",
                     {{"world_size", view.world_size},
                      {"attempt", view.attempt},
                      {"points", std::move(ranks)}}},
                    {"next_rank_since", view.next}}};
}

ApiReply LogApi(Coordinator& c, const std::string& id, const ApiQuery& q) {
  IntParam attempt = ReadInt(q, "attempt", 0, 1 << 30, 0);
  if (attempt.error) return *attempt.error;
  WordParam stream = ReadWord(q, "stream", {"stderr", "stdout"});
  if (stream.error) return *stream.error;
  IntParam bytes = ReadInt(q, "bytes", 1, kUiMaxLogBytes, kUiDefaultLogBytes);
  if (bytes.error) return *bytes.error;
  absl::StatusOr<Coordinator::LogSource> src =
      c.Logs(id, static_cast<int>(attempt.value));
  if (!src.ok()) return FromStatus(src.status());
  const std::string name = stream.value + ".log";
  const std::string path = (std::filesystem::path(src->dir) / name).string();
  absl::StatusOr<FileTail> tail = ReadRankFile(path, 0, bytes.value);
  // A log that is missing is empty; one that is no regular file (the
  // ranks' folder may hold anything) is not shown, and said why.
  json omitted = nullptr;
  if (!tail.ok() && !absl::IsNotFound(tail.status())) {
    absl::string_view why = tail.status().message();
    absl::ConsumePrefix(&why, path);
    omitted =
        absl::StrCat(name, " of attempt ", src->attempt, why, ": not shown");
  }
  return {200, json{{"attempt", src->attempt},
                    {"stream", stream.value},
                    {"finished", src->finished},
                    {"size", tail.ok() ? tail->size : 0},
                    {"text", tail.ok() ? ToValidUtf8(tail->bytes) : ""},
                    {"omitted", std::move(omitted)}}};
}

ApiReply NodesApi(Coordinator& c, const ApiQuery&) {
  json nodes = json::array();
  for (const v1::Node& n : c.ListNodes()) {
    const v1::NodeSpec& s = n.spec();
    nodes.push_back({{"name", s.name()},
                     {"address", s.address()},
                     {"state", n.state() == v1::NODE_STATE_UP ? "up" : "down"},
                     {"draining", n.draining()},
                     {"slots", s.slots()},
                     {"slots_used", n.slots_used()},
                     {"cores", s.cores()},
                     {"gpus", s.gpus()},
                     {"memory_bytes", s.memory_bytes()},
                     {"last_heartbeat_ms", n.last_heartbeat_unix_ms()},
                     {"load1", n.load1()},
                     {"processes", n.processes()},
                     {"version", s.version()}});
  }
  return {200,
          json{{"now_ms", NowMs()},
               {"nodes", std::move(nodes)},
               {"local_slots", c.options().local_slots},
               {"local_slots_used", c.LocalSlotsUsed()},
               // This host, where jobs run when no node registered.
               {"local",
                {{"cores", c.options().cores},
                 {"gpus", c.options().local_gpus >= 0 ? c.options().local_gpus
                                                      : GpuCount()},
                 {"memory_bytes", HostMemoryBytes()},
                 {"load1", HostLoad1()}}}}};
}

}  // namespace ptrain
