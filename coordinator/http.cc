#include "coordinator/http.h"

#include <CivetServer.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <functional>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "nlohmann/json.hpp"

namespace ptrain {

// Serves one page from a function producing its body.
class CoordinatorHttp::Handler : public CivetHandler {
 public:
  Handler(std::string page, std::string content_type,
          std::function<std::string()> body)
      : page_(std::move(page)),
        content_type_(std::move(content_type)),
        body_(std::move(body)) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    // civetweb routes "/metrics/anything" here too: declined, it gets
    // civetweb's 404 like any path that is not a page.
    const mg_request_info* ri = mg_get_request_info(conn);
    if (ri->local_uri == nullptr || page_ != ri->local_uri) return false;
    const std::string body = body_();
    mg_printf(conn,
              "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: "
              "%zu\r\nConnection: close\r\n\r\n",
              content_type_.c_str(), body.size());
    mg_write(conn, body.data(), body.size());
    return true;
  }

 private:
  const std::string page_;
  const std::string content_type_;
  const std::function<std::string()> body_;
};

std::string CoordinatorHttp::MetricsText(const Coordinator& c) {
  // Built per scrape from the coordinator's state: nothing to keep in sync.
  prometheus::Registry registry;
  auto& jobs = prometheus::BuildGauge()
                   .Name("ptrain_jobs")
                   .Help("Jobs known to this coordinator, by state.")
                   .Register(registry);
  for (const auto& [state, n] : c.JobCounts()) {
    jobs.Add({{"state", state}}).Set(n);
  }
  prometheus::BuildCounter()
      .Name("ptrain_job_restarts_total")
      .Help(
          "Restarts over all jobs: attempts that failed of the job's own doing "
          "and were requeued (what restart.max_restarts limits).")
      .Register(registry)
      .Add({})
      .Increment(static_cast<double>(c.Restarts()));
  // Apart from restarts, so that a restart alert does not fire on pauses
  // or preemptions; every reason is listed, so rates exist from the start.
  auto& requeues =
      prometheus::BuildCounter()
          .Name("ptrain_job_requeues_total")
          .Help(
              "Attempts that ended without a failure of the job's own and "
              "were requeued or paused, over all jobs, by reason: paused, "
              "stopped (SIGUSR1, exit 3), node_lost, grown (stopped to grow "
              "back), lost (no exit code), preempted (for a job of higher "
              "priority). Not restarts.")
          .Register(registry);
  for (const auto& [reason, n] : c.Requeues()) {
    requeues.Add({{"reason", reason}}).Increment(static_cast<double>(n));
  }
  // Per user (every user of the users file, zero included): what a team's
  // members hold now and have used since this ptcoord started.
  auto& user_jobs = prometheus::BuildGauge()
                        .Name("ptrain_user_running_jobs")
                        .Help("Running jobs per owner.")
                        .Register(registry);
  auto& user_slots = prometheus::BuildGauge()
                         .Name("ptrain_user_slots")
                         .Help("Slots the running jobs of each owner hold.")
                         .Register(registry);
  auto& user_slot_s =
      prometheus::BuildCounter()
          .Name("ptrain_user_slot_seconds_total")
          .Help("Slot-seconds each owner's jobs held since ptcoord started.")
          .Register(registry);
  auto& user_gpu_s =
      prometheus::BuildCounter()
          .Name("ptrain_user_gpu_seconds_total")
          .Help("GPU-seconds each owner's jobs held since ptcoord started.")
          .Register(registry);
  std::map<std::string, Coordinator::UserUsage> usage = c.UsageByUser();
  for (const User& u : c.UsersNow()->users()) usage[u.name];
  for (const auto& [user, u] : usage) {
    const std::map<std::string, std::string> labels = {
        {"user", user.empty() ? "-" : user}};
    user_jobs.Add(labels).Set(u.running_jobs);
    user_slots.Add(labels).Set(u.slots);
    user_slot_s.Add(labels).Increment(u.slot_seconds);
    user_gpu_s.Add(labels).Increment(u.gpu_seconds);
  }
  // Per unfinished job, so a rule can tell one job restarting often; the
  // spec's name is `name` (a scraped `job` label would be Prometheus's).
  auto& attempts = prometheus::BuildGauge()
                       .Name("ptrain_job_attempts")
                       .Help("Attempts started so far, per unfinished job.")
                       .Register(registry);
  auto& restarts =
      prometheus::BuildGauge()
          .Name("ptrain_job_restarts")
          .Help(
              "Restarts used so far (restart.max_restarts), per unfinished "
              "job.")
          .Register(registry);
  for (const Coordinator::UnfinishedJob& u : c.UnfinishedJobs()) {
    const std::map<std::string, std::string> labels = {{"job_id", u.job.id()},
                                                       {"name", u.job.name()}};
    attempts.Add(labels).Set(u.job.attempts());
    restarts.Add(labels).Set(u.restarts);
  }
  auto& nodes = prometheus::BuildGauge()
                    .Name("ptrain_nodes")
                    .Help(
                        "Nodes by state (up, down, draining); on one "
                        "machine, ptcoord's own host is the one node up.")
                    .Register(registry);
  auto& slots = prometheus::BuildGauge()
                    .Name("ptrain_node_slots")
                    .Help("Slots of each node: total and used by attempts.")
                    .Register(registry);
  std::map<std::string, int> by_state = {
      {"up", 0}, {"down", 0}, {"draining", 0}};
  if (!c.options().nodes.join_tokens.empty()) {
    for (const v1::Node& n : c.ListNodes()) {
      ++by_state[n.state() == v1::NODE_STATE_UP ? "up" : "down"];
      if (n.draining()) ++by_state["draining"];
      slots.Add({{"node", n.spec().name()}, {"kind", "total"}})
          .Set(n.spec().slots());
      slots.Add({{"node", n.spec().name()}, {"kind", "used"}})
          .Set(n.slots_used());
    }
  } else {
    // On one machine ptcoord's host is the node.
    by_state["up"] = 1;
    const std::string host = HostName();
    slots.Add({{"node", host}, {"kind", "total"}}).Set(c.options().local_slots);
    slots.Add({{"node", host}, {"kind", "used"}}).Set(c.LocalSlotsUsed());
  }
  for (const auto& [state, n] : by_state) nodes.Add({{"state", state}}).Set(n);
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

std::string CoordinatorHttp::ServiceDiscoveryJson(const Coordinator& c) {
  nlohmann::json targets = nlohmann::json::array();
  for (const Coordinator::RankEndpoint& e : c.Endpoints()) {
    targets.push_back({{"targets", {e.address}},
                       {"labels",
                        {{"ptrain_job_id", e.job_id},
                         {"ptrain_job", e.job_name},
                         {"ptrain_rank", std::to_string(e.rank)},
                         {"ptrain_node", e.node},
                         {"ptrain_attempt", std::to_string(e.attempt)}}}});
  }
  // Labels come from ranks and specs: never throw on bytes that are not
  // UTF-8.
  return targets.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::unique_ptr<CoordinatorHttp>> CoordinatorHttp::Start(
    const std::string& listen, Coordinator* c) {
  std::unique_ptr<CoordinatorHttp> h(new CoordinatorHttp());
  // civetweb wants host:port as "127.0.0.1:8080"; "0.0.0.0" binds all.
  try {
    h->server_ = std::make_unique<CivetServer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "4"});
  } catch (const CivetException& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": ", e.what()));
  }
  h->metrics_ = std::make_unique<Handler>(
      "/metrics", "text/plain; version=0.0.4", [c] { return MetricsText(*c); });
  h->sd_ = std::make_unique<Handler>("/sd", "application/json",
                                     [c] { return ServiceDiscoveryJson(*c); });
  h->server_->addHandler("/metrics", h->metrics_.get());
  h->server_->addHandler("/sd", h->sd_.get());
  const auto ports = h->server_->getListeningPorts();
  h->port_ = ports.empty() ? 0 : ports.front();
  return h;
}

CoordinatorHttp::~CoordinatorHttp() {
  if (server_ != nullptr) server_->close();
}

}  // namespace ptrain
