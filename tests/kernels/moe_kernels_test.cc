// Tests of the Mixture-of-Experts CPU kernels: the router's scores, top-k
// and weights against direct formulas, its backward and the auxiliary
// losses against finite differences in double, the dispatch plan's
// properties, and permute / unpermute around an elementwise "expert".
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "tests/testing/finite_difference.h"

namespace ptrain::kernels {
namespace {

using Vec = std::vector<double>;
using Ints = std::vector<int32_t>;

// Odd sizes, k neither 1 nor E.
constexpr int kN = 13;
constexpr int kE = 7;
constexpr int kK = 3;
constexpr int kC = 5;

// Central differences in double, as the other kernel tests take them: both
// truncation and rounding errors near 1e-10, any wrong term 1e-3 and up.
constexpr double kStep = 1e-6;
constexpr double kGradTol = 1e-6;
// Direct formulas in double against the kernels: rounding only.
constexpr double kExactTol = 1e-13;

struct Case {
  RouterScore kind;
  bool normalize;
  std::string Name() const {
    return std::string(kind == RouterScore::kSoftmax ? "softmax" : "sigmoid") +
           (normalize ? " normalised" : "");
  }
};
constexpr Case kCases[] = {{RouterScore::kSoftmax, false},
                           {RouterScore::kSoftmax, true},
                           {RouterScore::kSigmoid, false},
                           {RouterScore::kSigmoid, true}};

Vec Random(size_t n, std::mt19937_64* rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = dist(*rng);
  return v;
}

// tests/testing/finite_difference.h's, at this file's step and tolerance.
double MaxGradError(const std::string& name, Vec* x, const Vec& analytic,
                    const std::function<double()>& loss) {
  return testing::MaxGradError(name, x, analytic, loss, kStep, kGradTol);
}

double MaxDiff(const Vec& a, const Vec& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); i++) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

template <typename F>
struct Routed {
  Ints experts;
  std::vector<F> weights, scores;
};

template <typename F>
Routed<F> Route(const std::vector<F>& logits,
                const std::type_identity_t<std::vector<F>>* bias, int N, int E,
                int k, Case c) {
  Routed<F> r{Ints(N * k), std::vector<F>(N * k), std::vector<F>(N * E)};
  moe_router_forward(r.experts.data(), r.weights.data(), r.scores.data(),
                     logits.data(), bias ? bias->data() : nullptr, N, E, k,
                     c.kind, c.normalize);
  return r;
}

// The scores of one token straight from their definition.
Vec DirectScores(const double* x, int E, RouterScore kind) {
  Vec s(E);
  double sum = 0;
  for (int e = 0; e < E; e++) {
    s[e] = kind == RouterScore::kSoftmax ? std::exp(x[e])
                                         : 1 / (1 + std::exp(-x[e]));
    sum += s[e];
  }
  if (kind == RouterScore::kSoftmax) {
    for (double& v : s) v /= sum;
  }
  return s;
}

// The k highest of key (E), highest first, the lower index among equals:
// a stable sort of the indices.
Ints DirectTopK(const Vec& key, int k) {
  Ints idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return key[a] > key[b]; });
  idx.resize(k);
  return idx;
}

TEST(MoeRouterTest, ScoresAndWeightsAreTheFormula) {
  std::mt19937_64 rng(1);
  const Vec logits = Random(kN * kE, &rng, -3, 3);
  for (const Case& c : kCases) {
    const Routed<double> r = Route(logits, nullptr, kN, kE, kK, c);
    double maxdiff = 0;
    for (int t = 0; t < kN; t++) {
      const Vec s = DirectScores(&logits[t * kE], kE, c.kind);
      double chosen = 0;
      for (int j = 0; j < kK; j++) chosen += s[r.experts[t * kK + j]];
      for (int e = 0; e < kE; e++) {
        maxdiff = std::max(maxdiff, std::abs(r.scores[t * kE + e] - s[e]));
      }
      double sum = 0;
      for (int j = 0; j < kK; j++) {
        const double want =
            s[r.experts[t * kK + j]] / (c.normalize ? chosen : 1);
        maxdiff = std::max(maxdiff, std::abs(r.weights[t * kK + j] - want));
        sum += r.weights[t * kK + j];
      }
      if (c.normalize) {
        EXPECT_NEAR(sum, 1.0, kExactTol) << c.Name();
      }
    }
    EXPECT_LT(maxdiff, kExactTol) << c.Name();
  }
}

TEST(MoeRouterTest, ExpertsAreTheTopKHighestFirstTiesToTheLowerIndex) {
  // Three logits tie for the highest: the lower indices come first, and the
  // third of them is left out when k = 2.
  const Vec row = {0.5, 2.0, 1.0, 2.0, 2.0, -1.0};
  for (const Case& c : kCases) {
    EXPECT_EQ(Route(row, nullptr, 1, 6, 2, c).experts, (Ints{1, 3}))
        << c.Name();
    EXPECT_EQ(Route(row, nullptr, 1, 6, 4, c).experts, (Ints{1, 3, 4, 2}))
        << c.Name();
    EXPECT_EQ(Route(Vec(6, 0.0), nullptr, 1, 6, 3, c).experts, (Ints{0, 1, 2}))
        << c.Name();
  }
  // Logits on a coarse grid, so that ties are everywhere: every row is the
  // stable sort's first k.
  std::mt19937_64 rng(2);
  Vec logits = Random(kN * kE, &rng, -2, 2);
  for (double& x : logits) x = std::round(x * 2) / 2;
  for (const Case& c : kCases) {
    for (int k : {1, kK, kE}) {
      const Routed<double> r = Route(logits, nullptr, kN, kE, k, c);
      for (int t = 0; t < kN; t++) {
        const Vec key(r.scores.begin() + t * kE,
                      r.scores.begin() + (t + 1) * kE);
        EXPECT_EQ(
            Ints(r.experts.begin() + t * k, r.experts.begin() + (t + 1) * k),
            DirectTopK(key, k))
            << c.Name() << " k=" << k << " token " << t;
      }
    }
  }
}

TEST(MoeRouterTest, SelectionBiasChangesChoicesNotWeights) {
  std::mt19937_64 rng(3);
  const Vec logits = Random(kN * kE, &rng, -2, 2);
  Vec bias = Random(kE, &rng, -0.3, 0.3);
  // Expert 0 raised past every score: chosen first by every token.
  bias[0] = 2;
  for (const Case& c : kCases) {
    const Routed<double> plain = Route(logits, nullptr, kN, kE, kK, c);
    const Routed<double> biased = Route(logits, &bias, kN, kE, kK, c);
    EXPECT_EQ(biased.scores, plain.scores) << c.Name();
    EXPECT_NE(biased.experts, plain.experts) << c.Name();
    double maxdiff = 0;
    for (int t = 0; t < kN; t++) {
      const double* s = &biased.scores[t * kE];
      Vec key(kE);
      for (int e = 0; e < kE; e++) key[e] = s[e] + bias[e];
      const Ints chosen(biased.experts.begin() + t * kK,
                        biased.experts.begin() + (t + 1) * kK);
      EXPECT_EQ(chosen, DirectTopK(key, kK)) << c.Name() << " token " << t;
      EXPECT_EQ(chosen[0], 0) << c.Name() << " token " << t;
      double sum = 0;
      for (int j = 0; j < kK; j++) sum += s[chosen[j]];
      for (int j = 0; j < kK; j++) {
        const double want = s[chosen[j]] / (c.normalize ? sum : 1);
        maxdiff =
            std::max(maxdiff, std::abs(biased.weights[t * kK + j] - want));
      }
    }
    EXPECT_LT(maxdiff, kExactTol) << c.Name();
  }
}

TEST(MoeRouterTest, BackwardAccumulatesAndMatchesFiniteDifferences) {
  std::mt19937_64 rng(4);
  Vec logits = Random(kN * kE, &rng, -2, 2);
  const Vec bias = Random(kE, &rng, -0.5, 0.5);
  const Vec dweights = Random(kN * kK, &rng);
  const Vec noise = Random(kN * kE, &rng);
  for (const Case& c : kCases) {
    const Routed<double> r = Route(logits, &bias, kN, kE, kK, c);
    Vec dlogits = noise;
    moe_router_backward(dlogits.data(), dweights.data(), r.experts.data(),
                        r.scores.data(), kN, kE, kK, c.kind, c.normalize);
    for (size_t i = 0; i < dlogits.size(); i++) dlogits[i] -= noise[i];
    auto loss = [&] {
      const Routed<double> f = Route(logits, &bias, kN, kE, kK, c);
      double l = 0;
      for (size_t i = 0; i < f.weights.size(); i++) {
        l += f.weights[i] * dweights[i];
      }
      return l;
    };
    EXPECT_LT(MaxGradError("router " + c.Name(), &logits, dlogits, loss),
              kGradTol);
  }
}

TEST(MoeRouterTest, FloatMatchesDouble) {
  std::mt19937_64 rng(5);
  const Vec logits = Random(kN * kE, &rng, -3, 3);
  const Vec dweights = Random(kN * kK, &rng);
  const std::vector<float> logits_f(logits.begin(), logits.end());
  const std::vector<float> dweights_f(dweights.begin(), dweights.end());
  for (const Case& c : kCases) {
    const Routed<double> d = Route(logits, nullptr, kN, kE, kK, c);
    const Routed<float> f = Route(logits_f, nullptr, kN, kE, kK, c);
    EXPECT_EQ(f.experts, d.experts) << c.Name();
    EXPECT_LT(MaxDiff(Vec(f.weights.begin(), f.weights.end()), d.weights), 1e-6)
        << c.Name();
    Vec dl(kN * kE, 0.0);
    std::vector<float> dl_f(kN * kE, 0.0f);
    moe_router_backward(dl.data(), dweights.data(), d.experts.data(),
                        d.scores.data(), kN, kE, kK, c.kind, c.normalize);
    moe_router_backward(dl_f.data(), dweights_f.data(), f.experts.data(),
                        f.scores.data(), kN, kE, kK, c.kind, c.normalize);
    EXPECT_LT(MaxDiff(Vec(dl_f.begin(), dl_f.end()), dl), 1e-6) << c.Name();
  }
}

// aux from its definition, scores those of moe_router_forward.
double DirectAux(const Vec& scores, const Ints& experts, double coef, int N,
                 int E, int k, RouterScore kind) {
  Vec f(E, 0.0), P(E, 0.0);
  for (int32_t e : experts) f[e] += 1.0 / (N * k);
  for (int t = 0; t < N; t++) {
    double sum = 0;
    for (int e = 0; e < E; e++) sum += scores[t * E + e];
    const double norm = kind == RouterScore::kSigmoid ? sum : 1;
    for (int e = 0; e < E; e++) P[e] += scores[t * E + e] / norm / N;
  }
  double aux = 0;
  for (int e = 0; e < E; e++) aux += f[e] * P[e];
  return coef * E * aux;
}

TEST(MoeAuxLossTest, ValueIsTheFormulaAndGradientMatchesFiniteDifferences) {
  constexpr double kCoef = 0.3, kDloss = 0.7;
  std::mt19937_64 rng(6);
  Vec logits = Random(kN * kE, &rng, -2, 2);
  const Vec noise = Random(kN * kE, &rng);
  for (RouterScore kind : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const Case c{kind, kind == RouterScore::kSigmoid};
    const Routed<double> r = Route(logits, nullptr, kN, kE, kK, c);
    Vec dlogits = noise;
    const double aux =
        moe_aux_loss(dlogits.data(), r.scores.data(), r.experts.data(), kCoef,
                     kDloss, kN, kE, kK, kind);
    EXPECT_NEAR(aux, DirectAux(r.scores, r.experts, kCoef, kN, kE, kK, kind),
                kExactTol)
        << c.Name();
    EXPECT_EQ(moe_aux_loss<double>(nullptr, r.scores.data(), r.experts.data(),
                                   kCoef, kDloss, kN, kE, kK, kind),
              aux)
        << c.Name();
    for (size_t i = 0; i < dlogits.size(); i++) dlogits[i] -= noise[i];
    // f is a constant: the experts stay those of the unperturbed logits.
    auto loss = [&] {
      const Routed<double> f = Route(logits, nullptr, kN, kE, kK, c);
      return kDloss * DirectAux(f.scores, r.experts, kCoef, kN, kE, kK, kind);
    };
    EXPECT_LT(MaxGradError("aux " + c.Name(), &logits, dlogits, loss),
              kGradTol);
  }
}

// A sequence split into parts (context parallelism): each part given the
// whole sequence's counts and length returns its share, the shares
// summing to the whole's value, and each part's gradient rows are the
// whole's.
TEST(MoeAuxLossTest, PartsOfASequenceSumToItsLossWithItsGradient) {
  constexpr double kCoef = 0.3, kDloss = 0.7;
  constexpr int kParts[] = {5, 8};  // kN = 13 tokens in two parts
  std::mt19937_64 rng(8);
  const Vec logits = Random(kN * kE, &rng, -2, 2);
  for (RouterScore kind : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const Routed<double> r =
        Route(logits, nullptr, kN, kE, kK, Case{kind, false});
    Vec whole(kN * kE, 0.0);
    const double aux =
        moe_aux_loss(whole.data(), r.scores.data(), r.experts.data(), kCoef,
                     kDloss, kN, kE, kK, kind);
    Vec counts(kE, 0.0);
    for (int32_t e : r.experts) counts[e] += 1;
    double sum = 0;
    int t0 = 0;
    for (int n : kParts) {
      Vec part(n * kE, 0.0);
      sum += moe_aux_loss(part.data(), r.scores.data() + t0 * kE,
                          r.experts.data() + t0 * kK, kCoef, kDloss, n, kE, kK,
                          kind, counts.data(), kN);
      for (int i = 0; i < n * kE; i++) {
        EXPECT_NEAR(part[i], whole[t0 * kE + i], kExactTol) << i;
      }
      t0 += n;
    }
    EXPECT_NEAR(sum, aux, kExactTol);
  }
}

TEST(MoeAuxLossTest, IsTheCoefficientWhenRoutingIsUniform) {
  // Equal logits (P_e = 1/E) and every expert chosen equally often
  // (f_e = 1/E): aux = coef · E · E · (1/E²).
  constexpr int N = 7, E = 7, k = 3;
  Ints experts(N * k);
  for (int i = 0; i < N * k; i++) experts[i] = i % E;
  for (RouterScore kind : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
    const Routed<double> r =
        Route(Vec(N * E, 0.25), nullptr, N, E, k, Case{kind, false});
    EXPECT_NEAR(moe_aux_loss<double>(nullptr, r.scores.data(), experts.data(),
                                     0.01, 1.0, N, E, k, kind),
                0.01, kExactTol);
  }
}

TEST(MoeZLossTest, ValueIsTheFormulaAndGradientMatchesFiniteDifferences) {
  constexpr double kCoef = 0.2, kDloss = 0.6;
  std::mt19937_64 rng(7);
  Vec logits = Random(kN * kE, &rng, -3, 3);
  // A large row: the log-sum-exp must not overflow on its way.
  for (int e = 0; e < kE; e++) logits[e] += 800;
  // coef · (1/N) Σ lse² over rows [t0, N).
  auto direct = [&](int t0) {
    double sum = 0;
    for (int t = t0; t < kN; t++) {
      double m = logits[t * kE], se = 0;
      for (int e = 0; e < kE; e++) m = std::max(m, logits[t * kE + e]);
      for (int e = 0; e < kE; e++) se += std::exp(logits[t * kE + e] - m);
      sum += (m + std::log(se)) * (m + std::log(se));
    }
    return kCoef * sum / kN;
  };
  const Vec noise = Random(kN * kE, &rng);
  Vec dlogits = noise;
  const double z =
      moe_z_loss(dlogits.data(), logits.data(), kCoef, kDloss, kN, kE);
  EXPECT_NEAR(z, direct(0), kExactTol * z);
  EXPECT_EQ(moe_z_loss<double>(nullptr, logits.data(), kCoef, kDloss, kN, kE),
            z);
  for (size_t i = 0; i < dlogits.size(); i++) dlogits[i] -= noise[i];
  // The first row's lse² is 6.4e5: differences of it carry rounding of
  // 1e-16 · 6.4e5 / 1e-6, so the differences are of the other rows' terms,
  // and the first row is held to the formula below.
  Vec rest(logits.begin() + kE, logits.end());
  const Vec drest(dlogits.begin() + kE, dlogits.end());
  auto loss = [&] {
    std::copy(rest.begin(), rest.end(), logits.begin() + kE);
    return kDloss * direct(1);
  };
  EXPECT_LT(MaxGradError("z-loss", &rest, drest, loss), kGradTol);
  // The large row's gradient is the formula's, 2·coef·dloss·lse/N · p.
  double lse = 0;
  for (int e = 0; e < kE; e++) lse += std::exp(logits[e] - 800);
  lse = 800 + std::log(lse);
  for (int e = 0; e < kE; e++) {
    const double want =
        2 * kCoef * kDloss * lse / kN * std::exp(logits[e] - lse);
    EXPECT_NEAR(dlogits[e], want, 1e-12 * lse) << e;
  }
}

TEST(MoeLossTest, ValuesAreTheSameWhateverTheThreadCount) {
  constexpr int N = 64 * 300 + 5, E = 8, k = 2;
  std::mt19937_64 rng(11);
  const Vec logits = Random(int64_t{N} * E, &rng, -2, 2);
  const std::vector<float> lf(logits.begin(), logits.end());
  const Routed<float> r = Route(lf, nullptr, N, E, k, kCases[0]);
  auto values = [&](int threads) {
    omp_set_num_threads(threads);
    return std::vector<float>{
        moe_aux_loss<float>(nullptr, r.scores.data(), r.experts.data(), 0.01f,
                            1.0f, N, E, k, RouterScore::kSoftmax),
        moe_z_loss<float>(nullptr, lf.data(), 0.001f, 1.0f, N, E)};
  };
  const int saved = omp_get_max_threads();
  const std::vector<float> one = values(1);
  EXPECT_EQ(values(3), one);
  omp_set_num_threads(saved);
}

struct Plan {
  Ints slots, order, counts, offsets;
  int64_t dropped;
};

Plan MakePlan(const Ints& experts, int N, int k, int E, int capacity,
              int segment = 0) {
  Plan p{Ints(N * k, -7), Ints(N * k, -7), Ints(E, -7), Ints(E + 1, -7), 0};
  p.dropped = moe_dispatch_plan(p.slots.data(), p.order.data(), p.counts.data(),
                                p.offsets.data(), experts.data(), N, k, E,
                                capacity, segment);
  return p;
}

// Every property the plan promises, checked from its definition.
void ExpectPlanHolds(const Plan& p, const Ints& experts, int N, int k, int E,
                     int capacity, int segment = 0) {
  const int pairs = N * k;
  const int M = p.offsets[E];
  EXPECT_EQ(p.offsets[0], 0);
  for (int e = 0; e < E; e++) {
    EXPECT_EQ(p.offsets[e + 1] - p.offsets[e], p.counts[e]) << "expert " << e;
  }
  EXPECT_EQ(std::accumulate(p.counts.begin(), p.counts.end(), int64_t{0}),
            pairs - p.dropped);
  EXPECT_EQ(M, pairs - p.dropped);
  // The kept pairs' slots are [0, M), each once, and order inverts them.
  std::vector<int> seen(M, 0);
  for (int i = 0; i < pairs; i++) {
    const int32_t s = p.slots[i];
    if (s < 0) {
      EXPECT_EQ(s, -1);
      continue;
    }
    ASSERT_LT(s, M);
    seen[s]++;
    EXPECT_EQ(p.order[s], i);
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), M);
  for (int s = M; s < pairs; s++) EXPECT_EQ(p.order[s], -1);
  // Grouped by expert, pairs (so tokens) in order within each group.
  for (int e = 0; e < E; e++) {
    for (int s = p.offsets[e]; s < p.offsets[e + 1]; s++) {
      EXPECT_EQ(experts[p.order[s]], e) << "slot " << s;
      if (s > p.offsets[e]) {
        EXPECT_LT(p.order[s - 1], p.order[s]);
      }
    }
  }
  // Of each expert's pairs of a segment in token order, the first
  // `capacity` are kept.
  std::vector<int> taken(E, 0);
  int64_t dropped = 0;
  for (int i = 0; i < pairs; i++) {
    if (segment > 0 && i % (segment * k) == 0) {
      std::fill(taken.begin(), taken.end(), 0);
    }
    const bool keep = capacity == 0 || taken[experts[i]]++ < capacity;
    EXPECT_EQ(p.slots[i] >= 0, keep) << "pair " << i;
    dropped += !keep;
  }
  EXPECT_EQ(p.dropped, dropped);
}

Ints RoutedExperts(int N, int E, int k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Vec logits = Random(int64_t{N} * E, &rng, -2, 2);
  // Skewed: expert 1 popular, so a capacity bites.
  for (int t = 0; t < N; t++) logits[int64_t{t} * E + 1] += 1;
  return Route(logits, nullptr, N, E, k, kCases[0]).experts;
}

TEST(MoeDispatchTest, SmallPlanIsTheOneWorkedByHand) {
  // Tokens 0..3 choose {0,1} {1,2} {0,1} {1,0}; capacity 2 keeps expert 0's
  // tokens 0 and 2 and expert 1's tokens 0 and 1; token 3 loses both.
  const Ints experts = {0, 1, 1, 2, 0, 1, 1, 0};
  const Plan p = MakePlan(experts, 4, 2, 3, 2);
  EXPECT_EQ(p.counts, (Ints{2, 2, 1}));
  EXPECT_EQ(p.offsets, (Ints{0, 2, 4, 5}));
  EXPECT_EQ(p.order, (Ints{0, 4, 1, 2, 3, -1, -1, -1}));
  EXPECT_EQ(p.slots, (Ints{0, 2, 3, 4, 1, -1, -1, -1}));
  EXPECT_EQ(p.dropped, 3);
  const Plan all = MakePlan(experts, 4, 2, 3, 0);
  EXPECT_EQ(all.counts, (Ints{3, 4, 1}));
  EXPECT_EQ(all.order, (Ints{0, 4, 7, 1, 2, 5, 6, 3}));
  EXPECT_EQ(all.dropped, 0);
}

TEST(MoeDispatchTest, DroplessKeepsEveryPairGroupedInTokenOrder) {
  const Ints experts = RoutedExperts(kN, kE, kK, 8);
  const Plan p = MakePlan(experts, kN, kK, kE, 0);
  EXPECT_EQ(p.dropped, 0);
  ExpectPlanHolds(p, experts, kN, kK, kE, 0);
}

TEST(MoeDispatchTest, CapacityDropsEachExpertsLaterTokens) {
  const Ints experts = RoutedExperts(kN, kE, kK, 9);
  for (int capacity : {1, 3, 5, kN}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const Plan p = MakePlan(experts, kN, kK, kE, capacity);
    ExpectPlanHolds(p, experts, kN, kK, kE, capacity);
    if (capacity < 5) {
      EXPECT_GT(p.dropped, 0);
    }
    if (capacity == kN) {
      EXPECT_EQ(p.dropped, 0);
    }
  }
}

TEST(MoeDispatchTest, CapacityIsCountedInEachSegment) {
  // Each sequence of 8 tokens keeps up to `capacity` of each expert's:
  // more kept in all than one capacity over the whole batch.
  constexpr int N = 48;
  const Ints experts = RoutedExperts(N, kE, kK, 11);
  const Plan whole = MakePlan(experts, N, kK, kE, 2);
  const Plan seg = MakePlan(experts, N, kK, kE, 2, 8);
  ExpectPlanHolds(seg, experts, N, kK, kE, 2, 8);
  EXPECT_LT(seg.dropped, whole.dropped);
  EXPECT_GT(seg.dropped, 0);
}

// Context parallelism: a sequence of 4 chunks of 6 tokens, rank 0 holding
// chunks 0 and 3, rank 1 chunks 1 and 2. Each rank's plan over its two
// chunks, each counted after the pairs of the chunks before it (base),
// keeps exactly the pairs the whole sequence's plan keeps.
TEST(MoeDispatchTest, ChunksCountedAfterTheirSequencesEarlierOnesDropAlike) {
  constexpr int kChunk = 6, kChunks = 4, kCap = 3;
  const Ints experts = RoutedExperts(kChunk * kChunks, kE, kK, 12);
  const Plan whole = MakePlan(experts, kChunk * kChunks, kK, kE, kCap);
  ASSERT_GT(whole.dropped, 0);
  const int width = kChunk * kK;
  for (const std::array<int, 2> held : {std::array{0, 3}, {1, 2}}) {
    Ints local, base(2 * kE, 0);
    for (int j = 0; j < 2; j++) {
      const int g = held[j];
      local.insert(local.end(), experts.begin() + g * width,
                   experts.begin() + (g + 1) * width);
      for (int i = 0; i < g * width; i++) base[j * kE + experts[i]]++;
    }
    Plan p{Ints(2 * width), Ints(2 * width), Ints(kE), Ints(kE + 1), 0};
    p.dropped = moe_dispatch_plan(
        p.slots.data(), p.order.data(), p.counts.data(), p.offsets.data(),
        local.data(), 2 * kChunk, kK, kE, kCap, kChunk, base.data());
    int64_t dropped = 0;
    for (int j = 0; j < 2; j++) {
      for (int i = 0; i < width; i++) {
        const bool kept = whole.slots[held[j] * width + i] >= 0;
        EXPECT_EQ(p.slots[j * width + i] >= 0, kept)
            << "chunk " << held[j] << " pair " << i;
        dropped += kept ? 0 : 1;
      }
    }
    EXPECT_EQ(p.dropped, dropped);
  }
}

TEST(MoeDispatchTest, LongPlanHoldsAndIsTheSameWhateverTheThreadCount) {
  // Enough tokens for several blocks of the counting sort.
  constexpr int N = 5000, E = 16, k = 2;
  const Ints experts = RoutedExperts(N, E, k, 10);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const Plan one = MakePlan(experts, N, k, E, 70, 500);
  ExpectPlanHolds(one, experts, N, k, E, 70, 500);
  for (int threads : {2, 3, 4}) {
    omp_set_num_threads(threads);
    const Plan many = MakePlan(experts, N, k, E, 70, 500);
    EXPECT_EQ(many.slots, one.slots) << threads << " threads";
    EXPECT_EQ(many.order, one.order) << threads << " threads";
    EXPECT_EQ(many.counts, one.counts) << threads << " threads";
  }
  omp_set_num_threads(saved);
  EXPECT_GT(one.dropped, 0);
}

// A different elementwise function per expert, so that a row handed to the
// wrong expert shows.
double Expert(int e, double v) { return std::tanh(v) * (e + 1) + 0.1 * e; }
double ExpertGrad(int e, double v) {
  const double th = std::tanh(v);
  return (1 - th * th) * (e + 1);
}

// The experts applied to the packed rows (M,C), expert e to its range.
Vec ApplyExperts(const Vec& packed, const Plan& p, int E, int C) {
  Vec y(packed.size());
  for (int e = 0; e < E; e++) {
    for (int64_t i = int64_t{p.offsets[e]} * C;
         i < int64_t{p.offsets[e + 1]} * C; i++) {
      y[i] = Expert(e, packed[i]);
    }
  }
  return y;
}

TEST(MoePermuteTest, UnpermuteOfTheExpertsIsTheWeightedSumOverKeptChoices) {
  std::mt19937_64 rng(12);
  const Vec x = Random(kN * kC, &rng, -2, 2);
  const Vec logits = Random(kN * kE, &rng, -2, 2);
  const Routed<double> r = Route(logits, nullptr, kN, kE, kK, kCases[1]);
  for (int capacity : {0, 2}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const Plan p = MakePlan(r.experts, kN, kK, kE, capacity);
    const int M = p.offsets[kE];
    Vec packed(M * kC, 0.0);
    moe_permute_forward(packed.data(), x.data(), p.order.data(), M, kK, kC);
    const Vec y = ApplyExperts(packed, p, kE, kC);
    Vec out(kN * kC, 7.0);  // written, whatever was there
    moe_unpermute_forward(out.data(), y.data(), r.weights.data(),
                          p.slots.data(), kN, kK, kC);
    Vec want(kN * kC, 0.0);
    for (int t = 0; t < kN; t++) {
      for (int j = 0; j < kK; j++) {
        if (p.slots[t * kK + j] < 0) continue;
        for (int c = 0; c < kC; c++) {
          want[t * kC + c] += r.weights[t * kK + j] *
                              Expert(r.experts[t * kK + j], x[t * kC + c]);
        }
      }
    }
    EXPECT_LT(MaxDiff(out, want), kExactTol);
    if (capacity > 0) {
      EXPECT_GT(p.dropped, 0);
    }
  }
  // A token whose every choice is dropped gets zeros (token 3 below).
  const Ints experts = {0, 1, 1, 2, 0, 1, 1, 0};
  const Plan p = MakePlan(experts, 4, 2, 3, 2);
  const Vec y = Random(5 * kC, &rng);
  Vec out(4 * kC, 7.0);
  moe_unpermute_forward(out.data(), y.data(), Vec(8, 0.5).data(),
                        p.slots.data(), 4, 2, kC);
  for (int c = 0; c < kC; c++) EXPECT_EQ(out[3 * kC + c], 0.0);
}

TEST(MoePermuteTest, BackwardsMatchFiniteDifferences) {
  std::mt19937_64 rng(13);
  Vec x = Random(kN * kC, &rng, -2, 2);
  const Vec logits = Random(kN * kE, &rng, -2, 2);
  const Routed<double> r = Route(logits, nullptr, kN, kE, kK, kCases[3]);
  Vec weights = r.weights;
  const Vec dout = Random(kN * kC, &rng);
  for (int capacity : {0, 2}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const Plan p = MakePlan(r.experts, kN, kK, kE, capacity);
    const int M = p.offsets[kE];
    auto forward = [&](Vec* packed, Vec* y) {
      packed->assign(M * kC, 0.0);
      moe_permute_forward(packed->data(), x.data(), p.order.data(), M, kK, kC);
      *y = ApplyExperts(*packed, p, kE, kC);
    };
    auto loss = [&] {
      Vec packed, y, out(kN * kC);
      forward(&packed, &y);
      moe_unpermute_forward(out.data(), y.data(), weights.data(),
                            p.slots.data(), kN, kK, kC);
      double l = 0;
      for (size_t i = 0; i < out.size(); i++) l += out[i] * dout[i];
      return l;
    };
    Vec packed, y;
    forward(&packed, &y);
    // Garbage first: both of unpermute's gradients are written.
    Vec dy(M * kC, 7.0), dweights(kN * kK, 7.0);
    moe_unpermute_backward(dy.data(), dweights.data(), dout.data(), y.data(),
                           weights.data(), p.slots.data(), kN, kK, kC);
    for (size_t i = 0; i < dy.size(); i++) {
      int e = 0;
      while (p.offsets[e + 1] <= int64_t(i) / kC) e++;
      dy[i] *= ExpertGrad(e, packed[i]);
    }
    const Vec noise = Random(kN * kC, &rng);
    Vec dx = noise;
    moe_permute_backward(dx.data(), dy.data(), p.slots.data(), kN, kK, kC);
    for (size_t i = 0; i < dx.size(); i++) dx[i] -= noise[i];
    EXPECT_LT(MaxGradError("permute/unpermute dx", &x, dx, loss), kGradTol);
    EXPECT_LT(MaxGradError("unpermute dweights", &weights, dweights, loss),
              kGradTol);
  }
}

}  // namespace
}  // namespace ptrain::kernels
