#include "planner/profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/incbin.h"
#include "nlohmann/json.hpp"

PT_INCBIN(ptrain_profile_a100, PTRAIN_PROFILE_DIR "/a100.json");
PT_INCBIN(ptrain_profile_h100, PTRAIN_PROFILE_DIR "/h100.json");
PT_INCBIN(ptrain_profile_h200, PTRAIN_PROFILE_DIR "/h200.json");
PT_INCBIN_DECLARE(ptrain_profile_a100);
PT_INCBIN_DECLARE(ptrain_profile_h100);
PT_INCBIN_DECLARE(ptrain_profile_h200);

namespace ptrain::planner {

namespace {

using Json = nlohmann::json;

constexpr char kFormat[] = "ptrain-profile/1";

struct Builtin {
  const char* name;
  std::string_view text;
};
std::vector<Builtin> Builtins() {
  return {{"a100", PT_INCBIN_VIEW(ptrain_profile_a100)},
          {"h100", PT_INCBIN_VIEW(ptrain_profile_h100)},
          {"h200", PT_INCBIN_VIEW(ptrain_profile_h200)}};
}

// Reads the fields of one JSON object, each error naming the field's path.
class Reader {
 public:
  Reader(const Json& j, std::string path, std::string_view origin)
      : j_(j), path_(std::move(path)), origin_(std::string(origin)) {}

  absl::Status Error(std::string_view field, std::string_view rule) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "profile ", origin_, ": ", Name(field), " ", std::string(rule)));
  }
  std::string Name(std::string_view field) const {
    return path_.empty() ? std::string(field)
                         : absl::StrCat(path_, ".", std::string(field));
  }
  bool Has(std::string_view field) const {
    return j_.contains(std::string(field));
  }
  const Json& At(std::string_view field) const {
    return j_.at(std::string(field));
  }

  absl::StatusOr<std::string> String(std::string_view field,
                                     bool required = true) const {
    if (!Has(field)) {
      if (!required) return std::string();
      return Error(field, "is missing");
    }
    if (!At(field).is_string()) return Error(field, "must be a string");
    return At(field).get<std::string>();
  }
  // A number > 0 (>= 0 with `zero_ok`).
  absl::StatusOr<double> Positive(std::string_view field,
                                  bool zero_ok = false) const {
    if (!Has(field)) return Error(field, "is missing");
    const Json& v = At(field);
    if (!v.is_number()) return Error(field, "must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (!zero_ok && x == 0)) {
      return Error(field, absl::StrCat(zero_ok ? "must be >= 0" : "must be > 0",
                                       " (is ", v.dump(), ")"));
    }
    return x;
  }
  absl::StatusOr<int64_t> Count(std::string_view field, bool required = true,
                                bool zero_ok = false) const {
    if (!Has(field) && !required) return 0;
    absl::StatusOr<double> x = Positive(field, zero_ok);
    if (!x.ok()) return x.status();
    if (*x != std::floor(*x) || *x > 9e15) {
      return Error(field, "must be a whole number");
    }
    return static_cast<int64_t>(*x);
  }

 private:
  const Json& j_;
  std::string path_;
  std::string origin_;
};

#define PT_ASSIGN(lhs, expr)                        \
  do {                                              \
    auto pt_value_ = (expr);                        \
    if (!pt_value_.ok()) return pt_value_.status(); \
    lhs = *std::move(pt_value_);                    \
  } while (0)

absl::Status Precision(const Reader& r, std::string* out) {
  PT_ASSIGN(*out, r.String("precision"));
  if (*out != "fp32" && *out != "bf16") {
    return r.Error("precision",
                   absl::StrCat("must be fp32 or bf16 (is \"", *out, "\")"));
  }
  return absl::OkStatus();
}

absl::Status ParseLinks(const Json& j, const std::string& origin,
                        HardwareProfile* p) {
  Reader top(j, "links", origin);
  if (!j.is_object())
    return Reader(j, "", origin).Error("links", "must be an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() != "intra_node" && it.key() != "inter_node") {
      return top.Error(it.key(),
                       "is not a link class (intra_node, inter_node)");
    }
  }
  for (LinkClass link : {LinkClass::kIntraNode, LinkClass::kInterNode}) {
    const std::string cls = LinkClassName(link);
    if (!j.contains(cls)) continue;
    if (!j.at(cls).is_object()) return top.Error(cls, "must be an object");
    std::array<LinkCost, kCollectiveCount> costs;
    Reader lr(j.at(cls), absl::StrCat("links.", cls), origin);
    for (int c = 0; c < kCollectiveCount; ++c) {
      const char* name = CollectiveName(static_cast<Collective>(c));
      if (!lr.Has(name)) return lr.Error(name, "is missing");
      if (!lr.At(name).is_object()) return lr.Error(name, "must be an object");
      Reader cr(lr.At(name), lr.Name(name), origin);
      PT_ASSIGN(costs[c].alpha_s, cr.Positive("alpha_s", /*zero_ok=*/true));
      PT_ASSIGN(costs[c].bus_bytes_per_s, cr.Positive("bus_bytes_per_s"));
    }
    p->links[static_cast<int>(link)] = costs;
  }
  return absl::OkStatus();
}

absl::StatusOr<HardwareProfile> Parse(const Json& j,
                                      const std::string& origin) {
  const Reader r(j, "", origin);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", origin, ": not a JSON object"));
  }
  HardwareProfile p;
  std::string format;
  PT_ASSIGN(format, r.String("format"));
  if (format != kFormat) {
    return r.Error("format", absl::StrCat("must be \"", kFormat, "\" (is \"",
                                          format, "\")"));
  }
  PT_ASSIGN(p.name, r.String("name"));
  PT_ASSIGN(p.source, r.String("source"));
  PT_ASSIGN(p.device, r.String("device"));
  if (p.device != "cpu" && p.device != "cuda") {
    return r.Error("device",
                   absl::StrCat("must be cpu or cuda (is \"", p.device, "\")"));
  }
  PT_ASSIGN(p.memory_bytes, r.Count("memory_bytes"));
  if (p.device == "cpu") {
    int64_t cores = 0;
    PT_ASSIGN(cores, r.Count("cores"));
    p.cores = static_cast<int>(std::min<int64_t>(cores, 1 << 20));
  }
  for (const char* list : {"matmul", "attention"}) {
    if (!r.Has(list)) return r.Error(list, "is missing");
    if (!r.At(list).is_array() || r.At(list).empty()) {
      return r.Error(list, "must be a non-empty list");
    }
  }
  bool forward = false;
  for (size_t i = 0; i < j["matmul"].size(); ++i) {
    const Reader e(j["matmul"][i], absl::StrCat("matmul[", i, "]"), origin);
    HardwareProfile::Matmul m;
    if (absl::Status s = Precision(e, &m.precision); !s.ok()) return s;
    std::string pass;
    PT_ASSIGN(pass, e.String("pass"));
    if (pass != "forward" && pass != "backward") {
      return e.Error("pass", absl::StrCat("must be forward or backward (is \"",
                                          pass, "\")"));
    }
    m.backward = pass == "backward";
    forward = forward || !m.backward;
    PT_ASSIGN(m.m, e.Count("m"));
    PT_ASSIGN(m.n, e.Count("n"));
    PT_ASSIGN(m.k, e.Count("k"));
    int64_t threads = 0;
    PT_ASSIGN(threads, e.Count("threads", /*required=*/p.device == "cpu"));
    m.threads = static_cast<int>(std::min<int64_t>(threads, 1 << 20));
    PT_ASSIGN(m.flops_per_s, e.Positive("flops_per_s"));
    p.matmul.push_back(m);
  }
  if (!forward) return r.Error("matmul", "has no forward entry");
  for (size_t i = 0; i < j["attention"].size(); ++i) {
    const Reader e(j["attention"][i], absl::StrCat("attention[", i, "]"),
                   origin);
    HardwareProfile::Attention a;
    if (absl::Status s = Precision(e, &a.precision); !s.ok()) return s;
    PT_ASSIGN(a.B, e.Count("B"));
    PT_ASSIGN(a.T, e.Count("T"));
    PT_ASSIGN(a.C, e.Count("C"));
    PT_ASSIGN(a.heads, e.Count("heads"));
    int64_t threads = 0;
    PT_ASSIGN(threads, e.Count("threads", /*required=*/p.device == "cpu"));
    a.threads = static_cast<int>(std::min<int64_t>(threads, 1 << 20));
    PT_ASSIGN(a.forward_s, e.Positive("forward_s"));
    PT_ASSIGN(a.backward_s, e.Positive("backward_s"));
    p.attention.push_back(a);
  }
  PT_ASSIGN(p.elementwise_bytes_per_s, r.Positive("elementwise_bytes_per_s"));
  PT_ASSIGN(p.optimizer_params_per_s, r.Positive("optimizer_params_per_s"));
  if (r.Has("peak_flops_per_s")) {
    const Json& peaks = r.At("peak_flops_per_s");
    if (!peaks.is_object()) {
      return r.Error("peak_flops_per_s", "must be an object of precisions");
    }
    const Reader pr(peaks, "peak_flops_per_s", origin);
    for (auto it = peaks.begin(); it != peaks.end(); ++it) {
      if (it.key() != "fp32" && it.key() != "bf16") {
        return pr.Error(it.key(), "is not a precision (fp32, bf16)");
      }
      double v = 0;
      PT_ASSIGN(v, pr.Positive(it.key()));
      p.peak_flops_per_s.emplace_back(it.key(), v);
    }
  }
  if (r.Has("links")) {
    if (absl::Status s = ParseLinks(r.At("links"), origin, &p); !s.ok()) {
      return s;
    }
  }
  return p;
}

#undef PT_ASSIGN

// log2 of a positive size.
double L2(double x) { return std::log2(std::max(x, 1e-30)); }

// Linear interpolation of f over the sorted distinct `xs` at x: below the
// first, f(first)·x/first (a share of a core does that share of the work);
// above the last, f(last).
template <typename F>
double OverThreads(const std::vector<int>& xs, double x, F f) {
  if (xs.empty()) return f(0);
  if (x <= xs.front()) return f(xs.front()) * std::min(1.0, x / xs.front());
  for (size_t i = 1; i < xs.size(); ++i) {
    if (x <= xs[i]) {
      const double a = xs[i - 1], b = xs[i];
      const double w = (x - a) / (b - a);
      return f(xs[i - 1]) * (1 - w) + f(xs[i]) * w;
    }
  }
  return f(xs.back());
}

template <typename T>
std::vector<int> ThreadLevels(const std::vector<T>& entries,
                              std::string_view precision) {
  std::vector<int> xs;
  for (const T& e : entries) {
    if (e.precision == precision) xs.push_back(e.threads);
  }
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  return xs;
}

// A profile's precision when it lacks the one asked: a CPU measured in
// fp32 runs a bf16 job's matmuls at about that rate; a GPU has bf16.
std::string Available(const std::vector<HardwareProfile::Matmul>& m,
                      std::string_view precision) {
  for (const auto& e : m) {
    if (e.precision == precision) return std::string(precision);
  }
  return m.front().precision;
}

}  // namespace

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kAllGather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kSendRecv:
      return "sendrecv";
    case Collective::kAllToAll:
      return "alltoall";
  }
  return "?";
}

double BusFactor(Collective c, int p) {
  if (p <= 1) return 0;
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * (p - 1) / p;
    case Collective::kSendRecv:
      return 1.0;
    default:
      return static_cast<double>(p - 1) / p;
  }
}

const char* LinkClassName(LinkClass c) {
  return c == LinkClass::kIntraNode ? "intra_node" : "inter_node";
}

double HardwareProfile::MatmulFlopsPerS(std::string_view precision_asked,
                                        bool backward, double m, double n,
                                        double k, double threads) const {
  const std::string precision = Available(matmul, precision_asked);
  // Fall back to the forward entries for a pass the grid lacks.
  bool have = false;
  for (const Matmul& e : matmul) {
    have = have || (e.precision == precision && e.backward == backward);
  }
  if (!have) backward = false;
  const auto at_threads = [&](int t) {
    // Inverse-distance weighting of log rate over the 4 nearest points.
    std::vector<std::pair<double, double>> near;  // (distance², log rate)
    for (const Matmul& e : matmul) {
      if (e.precision != precision || e.backward != backward ||
          e.threads != t) {
        continue;
      }
      const double dm = L2(m) - L2(e.m), dn = L2(n) - L2(e.n),
                   dk = L2(k) - L2(e.k);
      near.emplace_back(dm * dm + dn * dn + dk * dk, std::log(e.flops_per_s));
    }
    std::sort(near.begin(), near.end());
    if (near.empty()) return 0.0;
    if (near.front().first < 1e-12) return std::exp(near.front().second);
    double wsum = 0, sum = 0;
    for (size_t i = 0; i < std::min<size_t>(4, near.size()); ++i) {
      const double w = 1 / near[i].first;
      wsum += w;
      sum += w * near[i].second;
    }
    return std::exp(sum / wsum);
  };
  if (device != "cpu") return at_threads(0);
  return OverThreads(ThreadLevels(matmul, precision), threads, at_threads);
}

double HardwareProfile::AttentionSeconds(std::string_view precision_asked,
                                         bool backward, double B, double T,
                                         double C, double head,
                                         double threads) const {
  std::string precision(precision_asked);
  if (std::none_of(attention.begin(), attention.end(), [&](const Attention& a) {
        return a.precision == precision;
      })) {
    precision = attention.front().precision;
  }
  const auto at_threads = [&](int t) {
    const Attention* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (const Attention& a : attention) {
      if (a.precision != precision || (device == "cpu" && a.threads != t)) {
        continue;
      }
      // The nearest head size first (a backend may take another kernel
      // for another head size), then the nearest T.
      const double d =
          4 * std::abs(L2(static_cast<double>(a.C) / a.heads) - L2(head)) +
          std::abs(L2(a.T) - L2(T));
      if (d < best_d) best_d = d, best = &a;
    }
    if (best == nullptr) return 0.0;
    const double s = backward ? best->backward_s : best->forward_s;
    // Seconds → a rate over B·T²·C, so that a slower thread count (a
    // share of a core) divides it.
    return (static_cast<double>(best->B) * best->T * best->T * best->C) / s;
  };
  const double rate =
      device == "cpu"
          ? OverThreads(ThreadLevels(attention, precision), threads, at_threads)
          : at_threads(0);
  return rate > 0 ? B * T * T * C / rate : 0;
}

double HardwareProfile::CollectiveSeconds(LinkClass link, Collective c, int p,
                                          double bytes) const {
  if (p <= 1) return 0;
  const LinkCost& l = (*links[static_cast<int>(link)])[static_cast<int>(c)];
  return l.alpha_s + BusFactor(c, p) * bytes / l.bus_bytes_per_s;
}

double HardwareProfile::PeakFlopsPerS(std::string_view precision_asked) const {
  for (const auto& [name, v] : peak_flops_per_s) {
    if (name == precision_asked) return v;
  }
  const std::string precision = Available(matmul, precision_asked);
  const int threads = MaxThreads();
  double best = 0;
  for (const Matmul& e : matmul) {
    if (e.precision == precision && !e.backward && e.threads == threads) {
      best = std::max(best, e.flops_per_s);
    }
  }
  return best;
}

int HardwareProfile::MaxThreads() const {
  int t = 0;
  for (const Matmul& e : matmul) t = std::max(t, e.threads);
  return t;
}

absl::StatusOr<HardwareProfile> ParseProfile(std::string_view json,
                                             std::string_view origin_view) {
  const std::string origin(origin_view);
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", origin, ": not valid JSON"));
  }
  try {
    return Parse(j, origin);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("profile ", origin, ": ", e.what()));
  }
}

absl::StatusOr<HardwareProfile> LoadProfile(std::string_view name_or_path) {
  for (const Builtin& b : Builtins()) {
    if (name_or_path == b.name) return ParseProfile(b.text, b.name);
  }
  const std::string path(name_or_path);
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile ", path, ": neither a shipped profile (",
        absl::StrJoin(BuiltinProfileNames(), ", "), ") nor a readable file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseProfile(text.str(), path);
}

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (const Builtin& b : Builtins()) names.emplace_back(b.name);
  return names;
}

}  // namespace ptrain::planner
