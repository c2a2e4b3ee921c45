#include "worker/engine/report/metrics.h"

#include <CivetServer.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstring>
#include <exception>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ptrain {

namespace p8s = prometheus;

namespace {

// prometheus-cpp answers GET /metrics and leaves every other request to
// civetweb, whose own error page needs more stack than a rank's civetweb
// threads have: Debian builds civetweb with 100 KiB thread stacks, and
// OpenBLAS's 60 KiB of static TLS lives in each of them. `curl RANK:PORT/`
// then ended the rank with SIGSEGV (prometheus-cpp issue #739). So every
// request but GET /metrics is answered here, before civetweb routes it: 404
// for another path, 405 for another method; malformed requests never reach
// this and are refused by civetweb with a 400, which fits in the stack.
int AnswerAllButMetrics(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri == nullptr || ri->request_method == nullptr) return 0;
  const bool metrics =
      ri->local_uri != nullptr && std::strcmp(ri->local_uri, "/metrics") == 0;
  if (metrics && std::strcmp(ri->request_method, "GET") == 0) return 0;
  const int status = metrics ? 405 : 404;
  const std::string body = metrics ? "only GET /metrics\n"
                                   : "not found: this rank serves /metrics\n";
  std::string reply = absl::StrCat(
      "HTTP/1.1 ", status,
      metrics ? " Method Not Allowed\r\nAllow: GET" : " Not Found",
      "\r\nContent-Type: text/plain\r\nContent-Length: ", body.size(),
      "\r\nConnection: close\r\n\r\n");
  if (std::strcmp(ri->request_method, "HEAD") != 0) reply += body;
  mg_write(conn, reply.data(), reply.size());
  return status;
}

std::map<std::string, std::string> With(std::map<std::string, std::string> a,
                                        const std::string& k,
                                        const std::string& v) {
  a[k] = v;
  return a;
}

// One counter of family `name` per value of `label`, each with the rank's
// `base` labels.
std::map<std::string, prometheus::Counter*> CountersBy(
    prometheus::Registry& reg, const char* name, const char* help,
    const std::map<std::string, std::string>& base, const char* label,
    std::initializer_list<const char*> values) {
  auto& family = prometheus::BuildCounter().Name(name).Help(help).Register(reg);
  std::map<std::string, prometheus::Counter*> out;
  for (const char* v : values) out[v] = &family.Add(With(base, label, v));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RankMetrics>> RankMetrics::Start(
    const std::string& bind, const RankLabels& labels) {
  std::unique_ptr<RankMetrics> m(new RankMetrics());
  m->labels_ = labels;
  m->base_ = {{"job", labels.job},
              {"rank", std::to_string(labels.rank)},
              {"node", labels.node}};
  for (const auto& [name, coord] : labels.coordinates) {
    m->base_[name + "_rank"] = std::to_string(coord);
  }
  try {
    CivetCallbacks callbacks;
    callbacks.begin_request = AnswerAllButMetrics;
    m->exposer_ =
        std::make_unique<p8s::Exposer>(bind, /*num_threads=*/2, &callbacks);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-bind ", bind, ": cannot listen: ", e.what()));
  }
  m->registry_ = std::make_shared<p8s::Registry>();
  auto& reg = *m->registry_;
  auto gauge = [&](const char* name, const char* help) {
    return &p8s::BuildGauge().Name(name).Help(help).Register(reg).Add(m->base_);
  };
  m->step_ = gauge("ptrain_step", "Optimizer steps completed.");
  m->loss_ = gauge("ptrain_train_loss", "Mean loss of the last global batch.");
  m->val_loss_family_ = &p8s::BuildGauge()
                             .Name("ptrain_val_loss")
                             .Help(
                                 "Last validation loss (a blend's "
                                 "sources: each, label source).")
                             .Register(reg);
  m->val_loss_ = &m->val_loss_family_->Add(m->base_);
  m->tok_per_s_ =
      gauge("ptrain_tokens_per_second", "Global tokens per second, last step.");
  m->mfu_ = gauge("ptrain_mfu_ratio",
                  "Model FLOPs utilisation of the last step (0..1).");
  m->step_seconds_ = &p8s::BuildHistogram()
                          .Name("ptrain_step_seconds")
                          .Help("Wall time of a training step.")
                          .Register(reg)
                          .Add(m->base_, p8s::Histogram::BucketBoundaries{
                                             0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1, 2.5, 5, 10, 30});
  m->checkpoint_seconds_ =
      &p8s::BuildHistogram()
           .Name("ptrain_checkpoint_seconds")
           .Help("Time the training loop was blocked by a checkpoint save.")
           .Register(reg)
           .Add(m->base_, p8s::Histogram::BucketBoundaries{
                              0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300});
  auto& memory = p8s::BuildGauge()
                     .Name("ptrain_memory_bytes")
                     .Help("Bytes this rank holds, by kind.")
                     .Register(reg);
  for (const char* kind : {"params", "grads", "optimizer", "activations"}) {
    m->memory_[kind] = &memory.Add(With(m->base_, "kind", kind));
  }
  m->gpu_memory_family_ =
      &p8s::BuildGauge()
           .Name("ptrain_gpu_memory_bytes")
           .Help(
               "Memory of this rank's GPU: in use (by every process on "
               "it) and in total.")
           .Register(reg);
  m->checkpoint_every_family_ =
      &p8s::BuildGauge()
           .Name("ptrain_checkpoint_every_steps")
           .Help("The job's checkpoint.every (steps between checkpoints).")
           .Register(reg);
  m->last_checkpoint_family_ =
      &p8s::BuildGauge()
           .Name("ptrain_last_checkpoint_timestamp_seconds")
           .Help(
               "Unix time of this rank's last checkpoint save (the start of "
               "training before the first).")
           .Register(reg);
  auto counters = [&](const char* name, const char* help) {
    return &p8s::BuildCounter().Name(name).Help(help).Register(reg);
  };
  m->phases_ = CountersBy(
      reg, "ptrain_phase_seconds_total",
      "Seconds spent by phase of the training loop.", m->base_, "phase",
      {"forward", "backward", "optimizer", "data", "checkpoint", "bubble"});
  m->comm_seconds_ = counters("ptrain_comm_seconds_total",
                              "Seconds in communication by group and op.");
  m->comm_bytes_ = counters("ptrain_comm_bytes_total",
                            "Bytes communicated by group and op.");
  m->comm_exposed_ =
      &counters("ptrain_comm_exposed_seconds_total",
                "Seconds this rank waited for communication it meant to hide "
                "behind computation (the gradient reductions still running "
                "when backward ended).")
           ->Add(m->base_);
  m->anomalies_ = CountersBy(
      reg, "ptrain_anomalies_total",
      "Steps found bad (train.anomaly) by kind: nan (a NaN or Inf loss or "
      "gradient norm) or spike (a loss above spike_factor times the median).",
      m->base_, "kind", {"nan", "spike"});
  m->RegisterExperts(reg);
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

void RankMetrics::RegisterExperts(prometheus::Registry& reg) {
  struct Gauges {
    prometheus::Family<prometheus::Gauge>** family;
    const char *name, *help;
  };
  for (const Gauges& g : {
           Gauges{&moe_tokens_, "ptrain_moe_expert_tokens",
                  "Tokens each expert of an MoE layer took in the last step, "
                  "over the global batch."},
           Gauges{&moe_imbalance_, "ptrain_moe_imbalance_ratio",
                  "An MoE layer's busiest expert's tokens over the mean in "
                  "the last step (1: even)."},
           Gauges{&moe_aux_, "ptrain_moe_aux_loss",
                  "The MoE balance and z losses' value in the last step "
                  "(added to the training loss)."},
       }) {
    *g.family = &p8s::BuildGauge().Name(g.name).Help(g.help).Register(reg);
  }
  moe_dropped_ = &p8s::BuildCounter()
                      .Name("ptrain_moe_dropped_total")
                      .Help(
                          "Token choices an MoE layer dropped past an "
                          "expert's capacity.")
                      .Register(reg);
}

void RankMetrics::OnExperts(const ExpertLoad& load) {
  for (const ExpertLoad::Layer& l : load.layers) {
    const std::string layer = std::to_string(l.layer);
    const auto at = With(base_, "layer", layer);
    for (size_t e = 0; e < l.tokens.size(); ++e) {
      moe_tokens_->Add(With(at, "expert", std::to_string(e))).Set(l.tokens[e]);
    }
    moe_imbalance_->Add(at).Set(l.imbalance());
    moe_dropped_->Add(at).Increment(l.dropped);
  }
  moe_aux_->Add(base_).Set(load.aux_loss);
}

void RankMetrics::OnAnomaly(const std::string& kind) {
  const auto it = anomalies_.find(kind);
  if (it != anomalies_.end()) it->second->Increment();
}

RankMetrics::~RankMetrics() = default;

int RankMetrics::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

p8s::Counter& RankMetrics::Phase(const std::string& phase) {
  return *phases_.at(phase);
}

void RankMetrics::OnStep(int64_t step, double loss, double seconds,
                         double tok_per_s, double mfu,
                         const PhaseSeconds& phases) {
  step_->Set(static_cast<double>(step));
  loss_->Set(loss);
  tok_per_s_->Set(tok_per_s);
  mfu_->Set(mfu);
  step_seconds_->Observe(seconds);
  Phase("data").Increment(phases.data);
  Phase("forward").Increment(phases.forward);
  Phase("backward").Increment(phases.backward);
  Phase("optimizer").Increment(phases.optimizer);
  Phase("bubble").Increment(phases.bubble);
}

void RankMetrics::OnEval(
    double val_loss,
    const std::vector<std::pair<std::string, double>>& sources) {
  val_loss_->Set(val_loss);
  for (const auto& [name, loss] : sources) {
    auto it = val_loss_by_source_.find(name);
    if (it == val_loss_by_source_.end()) {
      it = val_loss_by_source_
               .emplace(name,
                        &val_loss_family_->Add(With(base_, "source", name)))
               .first;
    }
    it->second->Set(loss);
  }
}

void RankMetrics::OnCheckpoint(double seconds) {
  checkpoint_seconds_->Observe(seconds);
  Phase("checkpoint").Increment(seconds);
  if (last_checkpoint_ != nullptr) last_checkpoint_->SetToCurrentTime();
}

void RankMetrics::OnCheckpointPolicy(int64_t every_steps) {
  if (checkpoint_every_ == nullptr) {
    checkpoint_every_ = &checkpoint_every_family_->Add(base_);
    last_checkpoint_ = &last_checkpoint_family_->Add(base_);
  }
  checkpoint_every_->Set(static_cast<double>(every_steps));
  last_checkpoint_->SetToCurrentTime();
}

void RankMetrics::SetMemory(const MemoryBytes& m) {
  memory_.at("params")->Set(static_cast<double>(m.params));
  memory_.at("grads")->Set(static_cast<double>(m.grads));
  memory_.at("optimizer")->Set(static_cast<double>(m.optimizer));
  memory_.at("activations")->Set(static_cast<double>(m.activations));
}

void RankMetrics::SetGpuMemory(int64_t used, int64_t total) {
  if (gpu_used_ == nullptr) {  // the series appear with the first value
    gpu_used_ = &gpu_memory_family_->Add(With(base_, "kind", "used"));
    gpu_total_ = &gpu_memory_family_->Add(With(base_, "kind", "total"));
  }
  gpu_used_->Set(static_cast<double>(used));
  gpu_total_->Set(static_cast<double>(total));
}

void RankMetrics::UpdateComm(const CommStats& stats) {
  for (const auto& [key, stat] : stats.Snapshot()) {
    auto it = comm_.find(key);
    if (it == comm_.end()) {
      auto labels = With(With(base_, "group", key.first), "op", key.second);
      it = comm_
               .emplace(key, std::make_pair(&comm_seconds_->Add(labels),
                                            &comm_bytes_->Add(labels)))
               .first;
    }
    CommStat& seen = comm_seen_[key];
    // Counters only grow: a reset of the source shows up as no change.
    if (stat.seconds > seen.seconds) {
      it->second.first->Increment(stat.seconds - seen.seconds);
    }
    if (stat.bytes > seen.bytes) {
      it->second.second->Increment(
          static_cast<double>(stat.bytes - seen.bytes));
    }
    seen = stat;
  }
  const double exposed = stats.ExposedSeconds();
  if (exposed > exposed_seen_) {
    comm_exposed_->Increment(exposed - exposed_seen_);
  }
  exposed_seen_ = exposed;
}

}  // namespace ptrain
