// The rank side of RankService; see progress_reporter.h. One channel, one
// thread, a bounded queue; a coordinator that is down or restarting costs
// the training loop nothing, and one that is back is reached within
// kMaxReconnectBackoffMs.
#include "worker/progress_reporter.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/header_value.h"
#include "common/pem.h"
#include "common/spec.h"
#include "common/thread_entry.h"
#include "grpcpp/grpcpp.h"
#include "ptrain/v1/coordinator.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace ptrain {

class ProgressReporter::Rpc {
 public:
  Rpc(const std::string& address, const std::string& tls_ca_pem)
      : stub_(v1::RankService::NewStub(Channel(address, tls_ca_pem))) {}

  grpc::Status Send(const Item& item, const std::string& token) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    if (item.kind == Item::kCheckpoint) {
      v1::ReportCheckpointResponse resp;
      return stub_->ReportCheckpoint(&ctx, item.checkpoint, &resp);
    }
    if (item.kind == Item::kEndpoint) {
      v1::ReportEndpointResponse resp;
      return stub_->ReportEndpoint(&ctx, item.endpoint, &resp);
    }
    if (item.kind == Item::kAlive) {
      v1::ReportAliveResponse resp;
      return stub_->ReportAlive(&ctx, item.alive, &resp);
    }
    v1::ReportProgressResponse resp;
    return stub_->ReportProgress(&ctx, item.progress, &resp);
  }

 private:
  static std::shared_ptr<grpc::Channel> Channel(const std::string& address,
                                                const std::string& tls_ca_pem) {
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        grpc::InsecureChannelCredentials();
    if (!tls_ca_pem.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = tls_ca_pem;
      credentials = grpc::SslCredentials(ssl);
    }
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 500);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
    return grpc::CreateCustomChannel(address, credentials, args);
  }

  std::unique_ptr<v1::RankService::Stub> stub_;
};

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

double Number(const nlohmann::json& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressReporter>>
ProgressReporter::FromEnvironment() {
  const std::string address = Env("PTRAIN_COORDINATOR");
  if (address.empty()) return std::unique_ptr<ProgressReporter>();
  const std::string job_id = Env("PTRAIN_JOB_ID");
  const std::string token = Env("PTRAIN_JOB_TOKEN");
  const std::string attempt_text = Env("PTRAIN_ATTEMPT");
  if (job_id.empty() || token.empty()) {
    return absl::InvalidArgumentError(
        "PTRAIN_COORDINATOR is set but PTRAIN_JOB_ID or PTRAIN_JOB_TOKEN is "
        "not");
  }
  // Sent as a header on every report: gRPC aborts on a value it refuses.
  if (absl::Status s = CheckHeaderValue("PTRAIN_JOB_TOKEN", token); !s.ok()) {
    return s;
  }
  int attempt = 0;
  if (!absl::SimpleAtoi(attempt_text, &attempt) || attempt < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PTRAIN_ATTEMPT='", attempt_text, "' is not a positive integer"));
  }
  int rank = 0;
  if (!absl::SimpleAtoi(Env("OMPI_COMM_WORLD_RANK"), &rank)) rank = 0;
  double grace_s = 0;
  if (const std::string g = Env("PTRAIN_COORDINATOR_GRACE_S");
      !g.empty() &&
      (!absl::SimpleAtod(g, &grace_s) || !(grace_s >= 0) || grace_s > 1e7)) {
    return absl::InvalidArgumentError(
        absl::StrCat("PTRAIN_COORDINATOR_GRACE_S='", g,
                     "' is not a number of seconds in [0, 1e7]"));
  }
  std::string tls_ca_pem;
  if (const std::string ca = Env("PTRAIN_TLS_CA"); !ca.empty()) {
    absl::StatusOr<std::string> pem = ReadCertificateFile("PTRAIN_TLS_CA", ca);
    if (!pem.ok()) return pem.status();
    tls_ca_pem = std::move(*pem);
  }
  return std::unique_ptr<ProgressReporter>(new ProgressReporter(
      address, job_id, token, attempt, rank, std::move(tls_ca_pem),
      std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000))));
}

ProgressReporter::ProgressReporter(std::string address, std::string job_id,
                                   std::string token, int attempt, int rank,
                                   std::string tls_ca_pem,
                                   std::chrono::milliseconds coordinator_grace)
    : address_(address),
      job_id_(std::move(job_id)),
      token_(std::move(token)),
      attempt_(attempt),
      rank_(rank),
      rpc_(std::make_unique<Rpc>(address, tls_ca_pem)),
      coordinator_grace_(coordinator_grace),
      last_answer_(std::chrono::steady_clock::now()) {
  thread_ = std::thread(ThreadEntry("progress-report", [this] { Loop(); }));
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ > 0 || dropped_ > 0 || !queue_.empty()) {
    spdlog::warn("progress reporter: {} sent, {} failed, {} dropped, {} unsent",
                 sent_, failed_, dropped_, queue_.size());
  }
}

void ProgressReporter::OnRecord(const nlohmann::json& record) {
  auto type_it = record.find("type");
  if (type_it == record.end() || !type_it->is_string()) return;
  const std::string type = type_it->get<std::string>();
  Item item;
  const int64_t step = static_cast<int64_t>(Number(record, "step"));
  if (type == "step" || type == "eval") {
    v1::ReportProgressRequest& p = item.progress;
    p.set_job_id(job_id_);
    p.set_attempt(attempt_);
    p.set_rank(rank_);
    p.set_step(step);
    p.set_is_eval(type == "eval");
    p.set_loss(Number(record, "loss"));
    p.set_val_loss(Number(record, "val_loss"));
    if (auto by = record.find("val_loss_by_source");
        by != record.end() && by->is_object()) {
      for (const auto& [name, loss] : by->items()) {
        if (loss.is_number()) {
          (*p.mutable_val_loss_by_source())[name] = loss.get<double>();
        }
      }
    }
    p.set_tok_per_s(Number(record, "tok_per_s"));
    p.set_mfu(Number(record, "mfu"));
    p.set_lr(Number(record, "lr"));
  } else if (type == "checkpoint" || type == "resume" || type == "rollback") {
    item.kind = Item::kCheckpoint;
    v1::ReportCheckpointRequest& c = item.checkpoint;
    c.set_job_id(job_id_);
    c.set_attempt(attempt_);
    c.set_step(step);
    c.set_resumed(type != "checkpoint");
    if (type == "rollback") {
      // {"step": the bad one, "to_step": the checkpoint's, "reason"}
      c.set_rolled_back_from(step);
      c.set_step(static_cast<int64_t>(Number(record, "to_step")));
      auto why = record.find("reason");
      if (why != record.end() && why->is_string()) {
        // The RPC takes at most 256 bytes of it (reports.h).
        c.set_reason(why->get<std::string>().substr(0, 256));
      }
    }
    auto dir = record.find("dir");
    if (dir != record.end() && dir->is_string())
      c.set_dir(dir->get<std::string>());
  } else {
    return;
  }
  Enqueue(std::move(item));
}

void ProgressReporter::ReportEndpoint(const std::string& address) {
  Item item;
  item.kind = Item::kEndpoint;
  item.endpoint.set_job_id(job_id_);
  item.endpoint.set_attempt(attempt_);
  item.endpoint.set_rank(rank_);
  item.endpoint.set_address(address);
  Enqueue(std::move(item));
}

void ProgressReporter::SetActivity(const std::string& activity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (activity == activity_) return;
    activity_ = activity;
    next_alive_ = std::chrono::steady_clock::now();
  }
  cv_.notify_one();
}

void ProgressReporter::SetProgressProbe(std::function<int64_t()> progress_age) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_age_ = std::move(progress_age);
  }
  cv_.notify_one();
}

void ProgressReporter::SetAliveInterval(std::chrono::milliseconds every) {
  std::lock_guard<std::mutex> lock(mu_);
  alive_every_ = every;
}

std::chrono::milliseconds ProgressReporter::AliveInterval(
    int64_t hang_timeout_s) {
  return std::chrono::milliseconds(AliveIntervalMs(hang_timeout_s));
}

void ProgressReporter::SetRankTimesInterval(std::chrono::milliseconds every) {
  std::lock_guard<std::mutex> lock(mu_);
  times_every_ = every;
}

void ProgressReporter::OnRankStep(const RankStep& s) {
  const auto now = std::chrono::steady_clock::now();
  Item item;
  {
    std::lock_guard<std::mutex> lock(mu_);
    StepWindow& w = window_;
    if (!w.started) {
      // The first step only sets the baseline: the totals now hold the
      // setup's communication (the mesh, a checkpoint's loading) and the
      // first step's, which no step's wall time covers; counted from zero,
      // the first report would show more communication than step time.
      // So the first report covers the steps after it, every figure alike.
      w.started = true;
      w.since = now;
      w.comm_base = s.comm_seconds;
      return;
    }
    w.step = s.step;
    ++w.steps;
    w.seconds += s.seconds;
    w.exposed += s.comm_exposed;
    if (now - w.since < times_every_ || times_queued_) return;
    item.kind = Item::kAlive;  // the rest is filled when it is sent
    *item.alive.mutable_times() = MeansOf(w, s.comm_seconds);
    w = StepWindow();
    w.started = true;
    w.since = now;
    w.comm_base = s.comm_seconds;
    times_queued_ = true;
  }
  Enqueue(std::move(item));
}

v1::RankTimes ProgressReporter::MeansOf(
    const StepWindow& w, const std::map<std::string, double>& comm) {
  const double per_step_ms = 1e3 / std::max(w.steps, 1);
  v1::RankTimes t;
  t.set_step(w.step);
  t.set_steps(w.steps);
  t.set_step_ms(std::max(0.0, w.seconds * per_step_ms));
  t.set_exposed_ms(std::max(0.0, w.exposed * per_step_ms));
  std::vector<std::pair<double, std::string>> groups;
  for (const auto& [group, total] : comm) {
    // A name ptcoord would refuse would cost the whole report.
    if (!IsRankTimesGroupName(group)) continue;
    auto base = w.comm_base.find(group);
    double seconds = base == w.comm_base.end() ? total : total - base->second;
    // Totals only fall when the counters were reset: count from the reset.
    if (seconds < 0) seconds = total;
    groups.emplace_back(std::max(0.0, seconds), group);
  }
  // The groups with the most time tell where it went; ties by name.
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (groups.size() > kMaxRankTimesGroups) groups.resize(kMaxRankTimesGroups);
  for (const auto& [seconds, group] : groups) {
    (*t.mutable_comm_ms())[group] = seconds * per_step_ms;
  }
  return t;
}

v1::ReportAliveRequest ProgressReporter::AliveNow() const {
  v1::ReportAliveRequest alive;
  alive.set_job_id(job_id_);
  alive.set_attempt(attempt_);
  alive.set_rank(rank_);
  alive.set_activity(activity_.substr(0, 128));
  alive.set_progress_age_ms(
      progress_age_ ? std::max<int64_t>(-1, progress_age_()) : -1);
  return alive;
}

void ProgressReporter::Enqueue(Item item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kMaxQueued) {
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (it->kind == Item::kProgress) {
          queue_.erase(it);
          ++dropped_;
          break;
        }
      }
    }
    queue_.push_back(std::move(item));
  }
  cv_.notify_one();
}

void ProgressReporter::Loop() {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> give_up;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Woken by a report to send, a stop, or a change of activity.
    cv_.wait(lock,
             [this] { return stopping_ || !queue_.empty() || Heartbeating(); });
    if (Heartbeating() && !stopping_) {
      // Until a sign of life is due, only a report to send, a stop or the
      // end of the heartbeats cuts the wait short.
      cv_.wait_until(lock, next_alive_, [this] {
        return stopping_ || !queue_.empty() || !Heartbeating();
      });
      if (Heartbeating() && Clock::now() >= next_alive_) {
        // First in line: nothing else waits for it.
        Item alive;
        alive.kind = Item::kAlive;
        alive.alive = AliveNow();
        queue_.push_front(std::move(alive));
        next_alive_ = Clock::now() + alive_every_;
      }
    }
    if (stopping_) {
      if (!give_up) give_up = Clock::now() + std::chrono::seconds(3);
      if (queue_.empty() || Clock::now() >= *give_up) return;
    }
    if (queue_.empty()) continue;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    if (item.kind == Item::kAlive && item.alive.has_times()) {
      // Step times say what a heartbeat says, as of now, not as of when
      // they were queued. They do not stand in for the heartbeats: a
      // coordinator that refused them would otherwise hear no sign of life.
      v1::RankTimes times = std::move(*item.alive.mutable_times());
      item.alive = AliveNow();
      *item.alive.mutable_times() = std::move(times);
      times_queued_ = false;
    }
    lock.unlock();
    const grpc::Status s = rpc_->Send(item, token_);
    lock.lock();
    const bool transient =
        s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!transient) {
      last_answer_ = Clock::now();
    } else if (lost_ && coordinator_grace_.count() > 0 &&
               Clock::now() - last_answer_ >= coordinator_grace_) {
      std::function<void()> lost = std::move(lost_);
      lost_ = nullptr;  // once
      spdlog::error(
          "the coordinator at {} has not answered for {} s "
          "(PTRAIN_COORDINATOR_GRACE_S): stopping after this step and its "
          "checkpoint (exit 3), for a coordinator to resume",
          address_,
          std::chrono::duration_cast<std::chrono::seconds>(Clock::now() -
                                                           last_answer_)
              .count());
      lock.unlock();
      lost();
      lock.lock();
    }
    if (s.ok()) {
      ++sent_;
    } else if (transient && item.kind != Item::kProgress &&
               item.kind != Item::kAlive && !stopping_) {
      // A checkpoint or endpoint is said once; a newer progress report
      // replaces a lost one, these do not. Try again shortly, first in line.
      queue_.push_front(std::move(item));
      cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; });
    } else {
      // The first failure and then every 100th: a coordinator restart must
      // not flood the rank's log.
      if (failed_ % 100 == 0) {
        spdlog::warn("progress report to the coordinator failed ({}): {}",
                     static_cast<int>(s.error_code()), s.error_message());
      }
      ++failed_;
    }
  }
}

void ProgressReporter::OnCoordinatorLost(std::function<void()> lost,
                                         std::chrono::milliseconds grace) {
  std::lock_guard<std::mutex> lock(mu_);
  lost_ = std::move(lost);
  if (grace.count() > 0) coordinator_grace_ = grace;
}

int64_t ProgressReporter::sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_;
}
int64_t ProgressReporter::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}
int64_t ProgressReporter::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace ptrain
