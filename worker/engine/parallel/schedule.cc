// See schedule.h.
#include "worker/engine/parallel/schedule.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace ptrain {
namespace {

PipeAction F(int mb, int chunk) { return {PipeAction::kForward, mb, chunk}; }
PipeAction B(int mb, int chunk) { return {PipeAction::kBackward, mb, chunk}; }
PipeAction W(int mb) { return {PipeAction::kWeight, mb, 0}; }

// The k-th forward (or backward) of an interleaved rank: microbatches go
// through the chunks in groups of pp — pp microbatches on chunk 0, the same
// pp on chunk 1, ..., then the next pp. Backward visits chunks in reverse.
PipeAction InterleavedPass(int k, int pp, int v, bool forward) {
  const int in_group = k % (pp * v);
  const int chunk = forward ? in_group / pp : v - 1 - in_group / pp;
  const int mb = k / (pp * v) * pp + k % pp;
  return forward ? F(mb, chunk) : B(mb, chunk);
}

}  // namespace

std::string ToString(const PipeAction& a, bool chunks) {
  const char* kind = a.kind == PipeAction::kForward    ? "F"
                     : a.kind == PipeAction::kBackward ? "B"
                                                       : "W";
  return absl::StrCat(kind, a.microbatch,
                      chunks ? absl::StrCat(".", a.chunk) : "");
}

std::vector<PipeAction> PipelineOrder(ScheduleKind kind, int pp, int rank,
                                      int m, int v) {
  PT_CHECK(pp >= 1 && rank >= 0 && rank < pp && m >= 1 && v >= 1,
           "pipeline order: bad pp, rank, microbatches or chunks");
  std::vector<PipeAction> order;
  switch (kind) {
    case ScheduleKind::kGpipe:
      PT_CHECK(v == 1, "gpipe runs one chunk per rank");
      for (int i = 0; i < m; ++i) order.push_back(F(i, 0));
      for (int i = 0; i < m; ++i) order.push_back(B(i, 0));
      break;
    case ScheduleKind::k1F1B: {
      PT_CHECK(v == 1, "1f1b runs one chunk per rank");
      // Rank r starts pp-r-1 forwards ahead, so that the last stage's
      // first backward arrives just as its warm-up ends.
      const int warmup = std::min(pp - rank - 1, m);
      for (int i = 0; i < warmup; ++i) order.push_back(F(i, 0));
      for (int i = 0; i < m - warmup; ++i) {
        order.push_back(F(warmup + i, 0));
        order.push_back(B(i, 0));
      }
      for (int i = m - warmup; i < m; ++i) order.push_back(B(i, 0));
      break;
    }
    case ScheduleKind::kZeroBubble:
      PT_CHECK(v == 1, "zb1p runs one chunk per rank");
      return ZeroBubbleOrder(pp, rank, m);
    case ScheduleKind::kInterleaved: {
      PT_CHECK(m % pp == 0, "interleaving needs microbatches a multiple of pp");
      const int total = m * v;
      // Warm-up: enough forwards that the first backward of the last
      // virtual stage can reach this rank, as Megatron counts them; every
      // forward first when m equals pp.
      const int warmup =
          m == pp ? total : std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
      for (int k = 0; k < warmup; ++k) {
        order.push_back(InterleavedPass(k, pp, v, true));
      }
      for (int k = 0; k < total - warmup; ++k) {
        order.push_back(InterleavedPass(warmup + k, pp, v, true));
        order.push_back(InterleavedPass(k, pp, v, false));
      }
      for (int k = total - warmup; k < total; ++k) {
        order.push_back(InterleavedPass(k, pp, v, false));
      }
      break;
    }
  }
  return order;
}

std::vector<PipeAction> ZeroBubbleOrder(int pp, int rank, int m) {
  PT_CHECK(pp >= 1 && rank >= 0 && rank < pp && m >= 1,
           "zero-bubble order: bad pp, rank or microbatches");
  std::vector<PipeAction> order;
  int weights = 0;  // W passes placed: W(0 .. weights-1)
  // After B(k), the W that lags `rank` microbatches behind it.
  auto after_backward = [&](int k) {
    if (k - rank >= 0) order.push_back(W(weights++));
  };
  const int warmup = std::min(pp - rank - 1, m);
  for (int i = 0; i < warmup; ++i) order.push_back(F(i, 0));
  for (int i = 0; i < m - warmup; ++i) {
    order.push_back(F(warmup + i, 0));
    order.push_back(B(i, 0));
    after_backward(i);
  }
  for (int i = m - warmup; i < m; ++i) {
    order.push_back(B(i, 0));
    after_backward(i);
  }
  while (weights < m) order.push_back(W(weights++));
  return order;
}

bool HasWeightPasses(const std::vector<PipeAction>& order) {
  return std::any_of(order.begin(), order.end(), [](const PipeAction& a) {
    return a.kind == PipeAction::kWeight;
  });
}

int MaxInFlight(const std::vector<PipeAction>& order) {
  // A microbatch is let go by its W where the order has W passes.
  const bool split = HasWeightPasses(order);
  const PipeAction::Kind last =
      split ? PipeAction::kWeight : PipeAction::kBackward;
  int now = 0, most = 0;
  for (const PipeAction& a : order) {
    if (a.kind == PipeAction::kForward) ++now;
    if (a.kind == last) --now;
    most = std::max(most, now);
  }
  return most;
}

std::vector<int> ChunkSlots(ScheduleKind kind, int pp, int rank, int m, int v) {
  if (pp == 1) return {1};
  if (kind == ScheduleKind::kGpipe) return {m};
  if (kind == ScheduleKind::k1F1B) return {std::min(pp - rank, m)};
  if (kind == ScheduleKind::kZeroBubble) {
    return {MaxInFlight(ZeroBubbleOrder(pp, rank, m))};
  }
  // After the warm-up, the count of each chunk repeats with a period of
  // pp·v passes (every period adds pp forwards and pp backwards to every
  // chunk), and the cool-down only lowers it: microbatches enough for the
  // warm-up and two periods give every chunk's maximum.
  int listed = m;
  if (m > pp) {
    const int warmup = (pp - rank - 1) * 2 + (v - 1) * pp;
    const int enough = ((warmup + v - 1) / v + 2 * pp + pp - 1) / pp * pp;
    listed = std::min(m, enough);
  }
  std::vector<int> now(v, 0), most(v, 0);
  for (const PipeAction& a :
       PipelineOrder(ScheduleKind::kInterleaved, pp, rank, listed, v)) {
    int& n = now[a.chunk];
    n += a.kind == PipeAction::kForward ? 1 : -1;
    most[a.chunk] = std::max(most[a.chunk], n);
  }
  return most;
}

double PipelineSimulation::bubble_fraction() const {
  if (idle.empty() || makespan <= 0) return 0;
  return std::accumulate(idle.begin(), idle.end(), 0.0) / idle.size() /
         makespan;
}

PipelineSimulation SimulatePipeline(ScheduleKind kind, int pp, int m, int v,
                                    double forward, double backward) {
  return SimulatePipeline(kind, pp, m, v, std::vector<double>(pp, forward),
                          std::vector<double>(pp, backward));
}

PipelineSimulation SimulatePipeline(ScheduleKind kind, int pp, int m, int v,
                                    const std::vector<double>& forward,
                                    const std::vector<double>& backward) {
  std::vector<std::vector<PipeAction>> orders;
  for (int r = 0; r < pp; ++r)
    orders.push_back(PipelineOrder(kind, pp, r, m, v));
  return SimulateOrders(orders, v, forward, backward,
                        std::vector<double>(pp, 0.0));
}

PipelineSimulation SimulateOrders(
    const std::vector<std::vector<PipeAction>>& orders, int v,
    const std::vector<double>& forward, const std::vector<double>& backward,
    const std::vector<double>& weight) {
  const int pp = static_cast<int>(orders.size());
  PT_CHECK(static_cast<int>(forward.size()) == pp &&
               static_cast<int>(backward.size()) == pp &&
               static_cast<int>(weight.size()) == pp,
           "one forward, backward and weight time per rank");
  const int stages = pp * v;
  int m = 0;
  for (const auto& o : orders) {
    for (const PipeAction& a : o) m = std::max(m, a.microbatch + 1);
  }
  // Finish time of (kind, microbatch, virtual stage) once scheduled; -1
  // before. A flat table: the planner simulates thousands of layouts.
  std::vector<double> done(size_t{3} * m * stages, -1.0);
  const auto at = [&](int kind, int mb, int s) -> double& {
    return done[(static_cast<size_t>(kind) * m + mb) * stages + s];
  };
  std::vector<size_t> next(pp, 0);
  std::vector<double> free_at(pp, 0.0), busy(pp, 0.0);
  size_t left = 0;
  for (const auto& o : orders) left += o.size();
  bool progress = true;
  while (left > 0 && progress) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      while (next[r] < orders[r].size()) {
        const PipeAction& a = orders[r][next[r]];
        const int s = a.chunk * pp + r;
        const bool fwd = a.kind == PipeAction::kForward;
        // Forward needs the previous virtual stage's forward; backward its
        // own forward and the next virtual stage's backward; W its own B.
        double needs[2];
        int n = 0;
        if (fwd && s > 0) needs[n++] = at(0, a.microbatch, s - 1);
        if (a.kind == PipeAction::kBackward) {
          needs[n++] = at(0, a.microbatch, s);
          if (s < stages - 1) needs[n++] = at(1, a.microbatch, s + 1);
        }
        if (a.kind == PipeAction::kWeight) needs[n++] = at(1, a.microbatch, s);
        double start = free_at[r];
        bool ready = true;
        for (int i = 0; i < n; ++i) {
          if (needs[i] < 0) {
            ready = false;
            break;
          }
          start = std::max(start, needs[i]);
        }
        if (!ready) break;
        // Each chunk holds 1/v of a rank's layers.
        const double t = (fwd                               ? forward[r]
                          : a.kind == PipeAction::kBackward ? backward[r]
                                                            : weight[r]) /
                         v;
        free_at[r] = start + t;
        busy[r] += t;
        at(static_cast<int>(a.kind), a.microbatch, s) = start + t;
        ++next[r];
        --left;
        progress = true;
      }
    }
  }
  PipelineSimulation sim;
  sim.deadlock = left > 0;
  sim.makespan = *std::max_element(free_at.begin(), free_at.end());
  for (int r = 0; r < pp; ++r) sim.idle.push_back(sim.makespan - busy[r]);
  return sim;
}

double AnalyticBubble(int pp, int m) {
  return static_cast<double>(pp - 1) / (m + pp - 1);
}

}  // namespace ptrain
