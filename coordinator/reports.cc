// Checks on what ranks report; see reports.h. Every refusal names the field
// and the rule, and nothing here has a side effect.
#include "coordinator/reports.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bounded_file.h"
#include "common/checkpoint_commit.h"
#include "common/spec.h"
#include "nlohmann/json.hpp"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

// A printable, bounded rendering of untrusted text for error messages.
std::string Shown(absl::string_view s) {
  constexpr size_t kMax = 80;
  std::string out;
  for (char c : s.substr(0, kMax)) {
    out += absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (s.size() > kMax) out += "...";
  return absl::StrCat("'", out, "'");
}

absl::Status CheckJobAndAttempt(const std::string& job_id, int attempt,
                                const ReportContext& ctx) {
  if (job_id.size() > kMaxReportIdBytes || job_id != ctx.job_id) {
    return Invalid("job_id=", Shown(job_id), " is not this job (", ctx.job_id,
                   ")");
  }
  if (attempt != ctx.attempt) {
    return Invalid("attempt=", attempt, " is not the running attempt ",
                   ctx.attempt, " of ", ctx.job_id);
  }
  return absl::OkStatus();
}

absl::Status CheckStep(int64_t step, const ReportContext& ctx) {
  if (step < 0 || step > ctx.total_steps) {
    return Invalid("step=", step,
                   " must be in [0, train.steps=", ctx.total_steps, "]");
  }
  return absl::OkStatus();
}

absl::Status CheckRank(int rank, const ReportContext& ctx) {
  if (rank < 0 || rank >= ctx.world_size) {
    return Invalid("rank=", rank, " must be in [0, world size ", ctx.world_size,
                   ")");
  }
  return absl::OkStatus();
}

// A figure a rank measured: finite and not negative.
absl::Status CheckFigure(absl::string_view field, double v) {
  if (!std::isfinite(v))
    return Invalid(field, "=", v, " must be a finite number");
  if (v < 0) return Invalid(field, "=", v, " must not be negative");
  return absl::OkStatus();
}

// val_loss_by_source: at most data.blend's sources, each named as the
// spec's rule says, each loss a figure.
absl::Status CheckSourceLosses(
    const google::protobuf::Map<std::string, double>& losses) {
  if (losses.size() > static_cast<size_t>(kMaxBlendSources)) {
    return Invalid("val_loss_by_source has ", losses.size(),
                   " sources; at most ", kMaxBlendSources);
  }
  for (const auto& [name, loss] : losses) {
    const std::string field =
        absl::StrCat("val_loss_by_source[", Shown(name), "]");
    if (!IsBlendSourceName(name)) {
      return Invalid(field, ": a source name is 1 to ", kMaxBlendNameBytes,
                     " bytes without control characters");
    }
    if (absl::Status s = CheckFigure(field, loss); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  size_t label = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const char c = host[i];
    if (c == '.') {
      if (label == 0 || host[i - 1] == '-') return false;
      label = 0;
      continue;
    }
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-')
      return false;
    if (label == 0 && c == '-') return false;
    if (++label > 63) return false;
  }
  return label > 0 && host.back() != '-';
}

bool IsIpv4(absl::string_view host) {
  in_addr a;
  return inet_pton(AF_INET, std::string(host).c_str(), &a) == 1;
}

bool IsIpv6(absl::string_view host) {
  in6_addr a;
  return inet_pton(AF_INET6, std::string(host).c_str(), &a) == 1;
}

}  // namespace

absl::Status ValidateHostPort(absl::string_view field,
                              absl::string_view value) {
  const std::string rule = "must be HOST:PORT with a port in [1, 65535]";
  if (value.size() > 300)
    return Invalid(field, " is ", value.size(), " bytes; ", rule);
  const size_t colon = value.rfind(':');
  if (colon == absl::string_view::npos)
    return Invalid(field, "=", Shown(value), " ", rule);
  absl::string_view host = value.substr(0, colon);
  const absl::string_view port = value.substr(colon + 1);
  int port_number = 0;
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) {
        return absl::ascii_isdigit(static_cast<unsigned char>(c));
      });
  if (!digits || !absl::SimpleAtoi(port, &port_number) || port_number < 1 ||
      port_number > 65535) {
    return Invalid(field, "=", Shown(value), ": port ", Shown(port), " ", rule);
  }
  bool ok = false;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    ok = IsIpv6(host) && host != "::";
  } else {
    ok = (IsIpv4(host) && host != "0.0.0.0") ||
         (!IsIpv4(host) && IsDnsName(host) &&
          !std::all_of(host.begin(), host.end(), [](char c) {
            return absl::ascii_isdigit(static_cast<unsigned char>(c)) ||
                   c == '.';
          }));
  }
  if (!ok) {
    return Invalid(field, "=", Shown(value), ": host ", Shown(host),
                   " is not a DNS name, an IPv4 address or a bracketed IPv6 "
                   "address others can dial");
  }
  return absl::OkStatus();
}

absl::Status ValidateProgress(const v1::ReportProgressRequest& r,
                              const ReportContext& ctx) {
  absl::Status s = CheckJobAndAttempt(r.job_id(), r.attempt(), ctx);
  if (s.ok()) s = CheckRank(r.rank(), ctx);
  if (s.ok()) s = CheckStep(r.step(), ctx);
  if (s.ok()) s = CheckFigure("loss", r.loss());
  if (s.ok()) s = CheckFigure("val_loss", r.val_loss());
  if (s.ok()) s = CheckFigure("tok_per_s", r.tok_per_s());
  if (s.ok()) s = CheckFigure("mfu", r.mfu());
  if (s.ok()) s = CheckFigure("lr", r.lr());
  if (s.ok()) s = CheckSourceLosses(r.val_loss_by_source());
  // What the report says is well formed; now whether it fits what came
  // before it.
  if (s.ok() && r.step() < ctx.last_step) {
    s = Invalid("step=", r.step(), " is below step ", ctx.last_step,
                " that attempt ", ctx.attempt,
                " already reported: an attempt's steps only grow");
  }
  return s;
}

absl::Status ValidateCheckpoint(const v1::ReportCheckpointRequest& r,
                                const ReportContext& ctx) {
  absl::Status s = CheckJobAndAttempt(r.job_id(), r.attempt(), ctx);
  if (s.ok()) s = CheckStep(r.step(), ctx);
  if (!s.ok()) return s;
  if (r.dir().empty() || r.dir().size() > kMaxReportPathBytes ||
      r.dir().front() != '/' || r.dir().find('\0') != std::string::npos) {
    return Invalid("dir=", Shown(r.dir()),
                   " must be an absolute path of at most ", kMaxReportPathBytes,
                   " bytes");
  }
  const std::string want = StepFolderName(r.step());
  if (fs::path(r.dir()).filename().string() != want) {
    return Invalid("dir=", Shown(r.dir()), " must be the committed folder ",
                   want, " of step ", r.step());
  }
  if (r.rolled_back_from() != 0 &&
      (!r.resumed() || r.rolled_back_from() <= r.step() ||
       r.rolled_back_from() > ctx.total_steps)) {
    return Invalid("rolled_back_from=", r.rolled_back_from(),
                   " must be 0, or with resumed a step in (step=", r.step(),
                   ", train.steps=", ctx.total_steps, "]");
  }
  const bool printable =
      std::all_of(r.reason().begin(), r.reason().end(), [](char c) {
        return absl::ascii_isprint(static_cast<unsigned char>(c));
      });
  if (r.reason().size() > kMaxReasonBytes || !printable) {
    return Invalid("reason=", Shown(r.reason()),
                   " must be printable ASCII of at most ", kMaxReasonBytes,
                   " bytes");
  }
  return absl::OkStatus();
}

absl::Status ValidateAlive(const v1::ReportAliveRequest& r,
                           const ReportContext& ctx) {
  absl::Status s = CheckJobAndAttempt(r.job_id(), r.attempt(), ctx);
  if (s.ok()) s = CheckRank(r.rank(), ctx);
  if (!s.ok()) return s;
  const bool printable =
      std::all_of(r.activity().begin(), r.activity().end(), [](char c) {
        return absl::ascii_isprint(static_cast<unsigned char>(c));
      });
  if (r.activity().size() > kMaxActivityBytes || !printable) {
    return Invalid("activity=", Shown(r.activity()),
                   " must be printable ASCII of at most ", kMaxActivityBytes,
                   " bytes");
  }
  if (r.progress_age_ms() < -1) {
    return Invalid("progress_age_ms=", r.progress_age_ms(), " < -1");
  }
  return r.has_times() ? ValidateRankTimes(r.times(), ctx) : absl::OkStatus();
}

absl::Status ValidateRankTimes(const v1::RankTimes& t,
                               const ReportContext& ctx) {
  absl::Status s = CheckStep(t.step(), ctx);
  if (s.ok() && t.step() < 1) s = Invalid("times.step=", t.step(), " < 1");
  if (s.ok() && t.steps() < 1) s = Invalid("times.steps=", t.steps(), " < 1");
  if (s.ok()) s = CheckFigure("times.step_ms", t.step_ms());
  if (s.ok()) s = CheckFigure("times.exposed_ms", t.exposed_ms());
  if (!s.ok()) return s;
  if (t.comm_ms_size() > static_cast<int>(kMaxRankTimesGroups)) {
    return Invalid("times.comm_ms: ", t.comm_ms_size(), " groups; at most ",
                   kMaxRankTimesGroups);
  }
  for (const auto& [group, ms] : t.comm_ms()) {
    const bool name_ok =
        !group.empty() && group.size() <= kMaxRankTimesGroupBytes &&
        std::all_of(group.begin(), group.end(), [](char c) {
          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
        });
    if (!name_ok) {
      return Invalid("times.comm_ms: group ", Shown(group), " must be 1 to ",
                     kMaxRankTimesGroupBytes, " letters, digits or '_'");
    }
    if (s = CheckFigure(absl::StrCat("times.comm_ms[", group, "]"), ms);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEndpoint(const v1::ReportEndpointRequest& r,
                              const ReportContext& ctx) {
  absl::Status s = CheckJobAndAttempt(r.job_id(), r.attempt(), ctx);
  if (s.ok()) s = CheckRank(r.rank(), ctx);
  if (s.ok()) s = ValidateHostPort("address", r.address());
  if (!s.ok()) return s;
  if (r.labels_size() > static_cast<int>(kMaxEndpointLabels)) {
    return Invalid("labels: ", r.labels_size(), " entries; at most ",
                   kMaxEndpointLabels);
  }
  for (const auto& [k, v] : r.labels()) {
    if (k.size() > kMaxEndpointLabelBytes || v.size() > kMaxEndpointLabelBytes)
      return Invalid("labels[", Shown(k), "]: key and value must be at most ",
                     kMaxEndpointLabelBytes, " bytes");
  }
  return absl::OkStatus();
}

std::string StepFolderName(int64_t step) {
  return absl::StrFormat("step-%08d", step);
}

absl::StatusOr<std::string> ResolveCheckpointDir(
    absl::string_view field, const std::string& dir, int64_t step,
    const std::string& checkpoint_root, const std::string& job_uid) {
  if (checkpoint_root.empty()) {
    return Invalid(field, "=", Shown(dir),
                   ": the job has no checkpoint.dir, so it reports no "
                   "checkpoint");
  }
  std::error_code ec;
  const fs::path root = fs::canonical(checkpoint_root, ec);
  if (ec) {
    return Invalid(field, "=", Shown(dir), ": the job's checkpoint folder ",
                   checkpoint_root, " does not exist");
  }
  const fs::path real = fs::canonical(dir, ec);
  if (ec) return Invalid(field, "=", Shown(dir), " does not exist");
  if (real.parent_path() != root) {
    return Invalid(field, "=", Shown(dir), " resolves to ",
                   Shown(real.string()),
                   ", not a folder directly under the job's checkpoint "
                   "folder ",
                   root.string());
  }
  if (real.filename().string() != StepFolderName(step)) {
    return Invalid(field, "=", Shown(dir), " resolves to ",
                   Shown(real.string()), ", not the committed folder ",
                   StepFolderName(step), " of step ", step);
  }
  if (!fs::is_directory(real, ec)) {
    return Invalid(field, "=", Shown(dir), " is not a folder");
  }
  if (absl::Status s =
          CheckCommittedCheckpoint(field, real.string(), step, job_uid);
      !s.ok()) {
    return s;
  }
  return real.string();
}

std::optional<RunLogRecord> ParseRunLogLine(absl::string_view line,
                                            const ReportContext& ctx) {
  const nlohmann::json j =
      nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  auto type = j.find("type");
  auto step = j.find("step");
  if (type == j.end() || !type->is_string() || step == j.end() ||
      !step->is_number_integer()) {
    return std::nullopt;
  }
  // Numbers the rank may omit read as 0, as ProgressReporter sends them.
  auto number = [&](const char* key, double* out) {
    auto it = j.find(key);
    if (it == j.end()) return true;
    if (!it->is_number()) return false;
    *out = it->get<double>();
    return true;
  };
  RunLogRecord rec;
  rec.step = step->get<int64_t>();
  v1::ReportProgressRequest as_report;
  as_report.set_job_id(ctx.job_id);
  as_report.set_attempt(ctx.attempt);
  as_report.set_step(rec.step);
  const std::string t = type->get<std::string>();
  if (t == "step") {
    rec.kind = RunLogRecord::kStep;
    if (!number("loss", &rec.loss) || !number("lr", &rec.lr) ||
        !number("tok_per_s", &rec.tok_per_s) || !number("mfu", &rec.mfu)) {
      return std::nullopt;
    }
    as_report.set_loss(rec.loss);
    as_report.set_lr(rec.lr);
    as_report.set_tok_per_s(rec.tok_per_s);
    as_report.set_mfu(rec.mfu);
  } else if (t == "eval") {
    rec.kind = RunLogRecord::kEval;
    if (!number("val_loss", &rec.val_loss)) return std::nullopt;
    as_report.set_val_loss(rec.val_loss);
    as_report.set_is_eval(true);
    if (auto by = j.find("val_loss_by_source"); by != j.end()) {
      if (!by->is_object()) return std::nullopt;
      for (const auto& [name, loss] : by->items()) {
        if (!loss.is_number()) return std::nullopt;
        rec.val_loss_by_source[name] = loss.get<double>();
      }
      as_report.mutable_val_loss_by_source()->insert(
          rec.val_loss_by_source.begin(), rec.val_loss_by_source.end());
    }
  } else if (t == "end") {
    rec.kind = RunLogRecord::kEnd;
    if (rec.step != ctx.total_steps) return std::nullopt;
    return rec;
  } else if (t == "checkpoint") {
    rec.kind = RunLogRecord::kCheckpoint;
    auto dir = j.find("dir");
    if (dir == j.end() || !dir->is_string()) return std::nullopt;
    rec.dir = dir->get<std::string>();
    v1::ReportCheckpointRequest c;
    c.set_job_id(ctx.job_id);
    c.set_attempt(ctx.attempt);
    c.set_step(rec.step);
    c.set_dir(rec.dir);
    if (!ValidateCheckpoint(c, ctx).ok()) return std::nullopt;
    return rec;
  } else {
    return std::nullopt;
  }
  if (!ValidateProgress(as_report, ctx).ok()) return std::nullopt;
  return rec;
}

RunLogSummary ReadRunLog(const std::string& path, const ReportContext& ctx,
                         int64_t known_step, size_t max_bytes) {
  RunLogSummary out;
  // A rank's file: a link or anything but a regular file is no run log.
  absl::StatusOr<BoundedFile> in =
      BoundedFile::Open("", path, Symlinks::kRefuse);
  if (!in.ok()) return out;
  const int64_t size = in->size();
  // The lines that start in [window, size). From a window start past 0 the
  // byte before it is read too: a newline there starts a line at it.
  const int64_t window =
      size > static_cast<int64_t>(max_bytes) ? size - max_bytes : 0;
  const int64_t first = window > 0 ? window - 1 : 0;
  // Newest first: read back from the end in chunks; `buf` holds the bytes
  // [pos, ...) not yet parsed, the front one a line whose start is unread.
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<RunLogRecord> records, checkpoints;
  std::string buf;
  // The front line grew past kMaxRunLogLineBytes: dropped, and so is the
  // rest of it, up to the newline before it.
  bool overlong = false;
  int64_t pos = size;
  // False once a step at or before known_step is reached.
  auto take = [&](absl::string_view line) {
    std::optional<RunLogRecord> rec = ParseRunLogLine(line, ctx);
    if (!rec.has_value()) return true;
    switch (rec->kind) {
      case RunLogRecord::kStep:
        if (rec->step <= known_step) return false;
        if (!out.last_step.has_value()) out.last_step = *rec;
        records.push_back(*rec);
        break;
      case RunLogRecord::kEval:
        if (!out.last_eval.has_value()) out.last_eval = *rec;
        records.push_back(*rec);
        break;
      case RunLogRecord::kCheckpoint:
        checkpoints.push_back(*rec);
        break;
      case RunLogRecord::kEnd:
        out.ended = true;
        break;
    }
    return true;
  };
  bool more = true;
  while (more && pos > first) {
    const int64_t lo = std::max(first, pos - kChunk);
    absl::StatusOr<std::string> chunk =
        in->ReadAt(lo, static_cast<size_t>(pos - lo));
    // Shorter: the file shrank meanwhile (replaced); what was read stands.
    if (!chunk.ok() || static_cast<int64_t>(chunk->size()) != pos - lo) break;
    pos = lo;
    if (overlong) {
      const size_t nl = chunk->rfind('\n');
      if (nl == std::string::npos) continue;  // still inside that line
      chunk->resize(nl);                      // the line before it ends there
      overlong = false;
      buf = *std::move(chunk);
    } else {
      buf.insert(0, *chunk);
    }
    // Every line after a newline in buf is whole.
    for (size_t nl = buf.rfind('\n'); more && nl != std::string::npos;
         nl = buf.rfind('\n')) {
      more = take(absl::string_view(buf).substr(nl + 1));
      buf.resize(nl);
    }
    if (buf.size() > kMaxRunLogLineBytes) {
      buf.clear();
      overlong = true;
    }
  }
  // At the file's start what is left is its first line; at a window's, a
  // line that began before it.
  if (more && pos == 0 && window == 0 && !overlong) take(buf);
  std::reverse(records.begin(), records.end());
  std::reverse(checkpoints.begin(), checkpoints.end());
  out.records = std::move(records);
  out.checkpoints = std::move(checkpoints);
  return out;
}

}  // namespace ptrain
