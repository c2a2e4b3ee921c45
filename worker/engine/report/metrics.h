// Per-rank Prometheus metrics (DESIGN.md §7), served on /metrics by
// prometheus-cpp: loss, step, throughput, MFU, step and phase times,
// communication time and bytes per (group, op), memory, checkpoint time.
// Every rank serves its own, labelled with its coordinates, so a dashboard
// can show which rank is slow. Thread-safe (prometheus-cpp metrics are).
#ifndef PTRAIN_WORKER_ENGINE_REPORT_METRICS_H_
#define PTRAIN_WORKER_ENGINE_REPORT_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/engine/comm/comm.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/report/expert_load.h"

namespace ptrain {

struct RankLabels {
  std::string job, node;
  int rank = 0;
  // This rank's coordinate in each mesh dimension named at one or above
  // it (ParallelDims::NamedCoordinates): a label "<name>_rank" each, e.g.
  // dp_rank, tp_rank and pp_rank always, cp_rank in a job with cp > 1.
  std::vector<std::pair<std::string, int>> coordinates;
};

// Seconds of one step by phase.
struct PhaseSeconds {
  double data = 0, forward = 0, backward = 0, optimizer = 0;
  double bubble = 0;  // pipeline: waiting for a neighbouring stage
  // Of backward: a zero-bubble schedule's weight passes W (counted in
  // backward too).
  double weight = 0;
};

class RankMetrics {
 public:
  // Serves GET /metrics on `bind` ("0.0.0.0:0" takes a free port); any
  // other path is a 404, another method on /metrics a 405.
  static absl::StatusOr<std::unique_ptr<RankMetrics>> Start(
      const std::string& bind, const RankLabels& labels);
  ~RankMetrics();
  RankMetrics(const RankMetrics&) = delete;
  RankMetrics& operator=(const RankMetrics&) = delete;

  int port() const;
  // ptrain_step, ptrain_train_loss, ptrain_tokens_per_second,
  // ptrain_mfu_ratio, ptrain_step_seconds, ptrain_phase_seconds_total.
  void OnStep(int64_t step, double loss, double seconds, double tok_per_s,
              double mfu, const PhaseSeconds& phases);
  // The validation loss, and a blend's per source (label `source`).
  void OnEval(double val_loss,
              const std::vector<std::pair<std::string, double>>& sources = {});
  // ptrain_checkpoint_seconds; also moves
  // ptrain_last_checkpoint_timestamp_seconds to now once the job has a
  // checkpoint policy.
  void OnCheckpoint(double seconds);
  // A job that checkpoints every `every_steps` steps: exports
  // ptrain_checkpoint_every_steps and ptrain_last_checkpoint_timestamp_seconds
  // (now, the start of training, until the first save), from which an alert
  // tells a checkpoint overdue. Both are absent on ranks of jobs that do not
  // checkpoint.
  void OnCheckpointPolicy(int64_t every_steps);
  void SetMemory(const MemoryBytes& m);
  // ptrain_gpu_memory_bytes{kind=used|total}: the memory of the rank's GPU
  // in use (by every process on it) and its size; absent on cpu ranks.
  void SetGpuMemory(int64_t used, int64_t total);
  // ptrain_anomalies_total{kind}: a bad step (train.anomaly), "nan" or
  // "spike", whatever was done about it.
  void OnAnomaly(const std::string& kind);
  // A Mixture-of-Experts step: ptrain_moe_expert_tokens{layer,expert} (the
  // step's tokens kept per expert), ptrain_moe_imbalance_ratio{layer}
  // (busiest over mean), ptrain_moe_dropped_total{layer} and
  // ptrain_moe_aux_loss. Set by the run's first rank only.
  void OnExperts(const ExpertLoad& load);
  // Brings ptrain_comm_{seconds,bytes}_total up to `stats` (cumulative).
  void UpdateComm(const CommStats& stats);

 private:
  RankMetrics() = default;
  prometheus::Counter& Phase(const std::string& phase);
  // The Mixture-of-Experts families OnExperts sets.
  void RegisterExperts(prometheus::Registry& reg);

  RankLabels labels_;
  std::map<std::string, std::string> base_;  // the labels every series has
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge *step_, *loss_, *val_loss_, *tok_per_s_, *mfu_;
  // ptrain_val_loss's family, and its series of each blend source.
  prometheus::Family<prometheus::Gauge>* val_loss_family_ = nullptr;
  std::map<std::string, prometheus::Gauge*> val_loss_by_source_;
  prometheus::Histogram *step_seconds_, *checkpoint_seconds_;
  std::map<std::string, prometheus::Gauge*> memory_;
  prometheus::Family<prometheus::Gauge>* gpu_memory_family_ = nullptr;
  prometheus::Gauge *gpu_used_ = nullptr, *gpu_total_ = nullptr;
  prometheus::Family<prometheus::Gauge>* checkpoint_every_family_ = nullptr;
  prometheus::Family<prometheus::Gauge>* last_checkpoint_family_ = nullptr;
  prometheus::Gauge *checkpoint_every_ = nullptr, *last_checkpoint_ = nullptr;
  std::map<std::string, prometheus::Counter*> phases_;
  prometheus::Family<prometheus::Counter>*comm_seconds_, *comm_bytes_;
  // (group, op) -> counters, and the totals already added.
  std::map<std::pair<std::string, std::string>,
           std::pair<prometheus::Counter*, prometheus::Counter*>>
      comm_;
  std::map<std::pair<std::string, std::string>, CommStat> comm_seen_;
  prometheus::Counter* comm_exposed_ = nullptr;
  std::map<std::string, prometheus::Counter*> anomalies_;  // by kind
  prometheus::Family<prometheus::Gauge>*moe_tokens_ = nullptr,
  *moe_imbalance_ = nullptr, *moe_aux_ = nullptr;
  prometheus::Family<prometheus::Counter>* moe_dropped_ = nullptr;
  double exposed_seen_ = 0.0;  // CommStats::ExposedSeconds already added
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_REPORT_METRICS_H_
