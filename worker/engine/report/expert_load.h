// ExpertLoad: a Mixture-of-Experts model's routing over one optimizer step,
// as every rank knows it after the step (train/expert_report.h). Plain
// data, for the run log and the metrics.
#ifndef PTRAIN_WORKER_ENGINE_REPORT_EXPERT_LOAD_H_
#define PTRAIN_WORKER_ENGINE_REPORT_EXPERT_LOAD_H_

#include <algorithm>
#include <numeric>
#include <vector>

namespace ptrain {

struct ExpertLoad {
  struct Layer {
    int layer = 0;               // the block's index in the model
    std::vector<double> tokens;  // kept per expert, over the global batch
    double dropped = 0;          // choices past an expert's capacity
    // The busiest expert's tokens over the mean (1: even; E: all on one).
    double imbalance() const {
      const double sum = std::accumulate(tokens.begin(), tokens.end(), 0.0);
      if (sum <= 0) return 1.0;
      const double most = *std::max_element(tokens.begin(), tokens.end());
      return most * static_cast<double>(tokens.size()) / sum;
    }
  };
  std::vector<Layer> layers;  // the MoE layers in order; empty: dense
  // The balance and z losses' value, as the step's loss is (a mean over
  // the microbatches), summed over the layers.
  double aux_loss = 0;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_REPORT_EXPERT_LOAD_H_
