#include "common/memory_estimate.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ptrain {

namespace {

constexpr int64_t kMax = INT64_MAX;
constexpr int64_t kFloat = 4;

// Saturating int64 arithmetic on non-negative values: a size too large to
// represent stays "too large" through every later step.
int64_t Add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
int64_t Mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}
int64_t Sum(std::initializer_list<int64_t> xs) {
  int64_t s = 0;
  for (int64_t x : xs) s = Add(s, x);
  return s;
}
// Rounded up to a multiple of pad (GptUnits' padding).
int64_t Pad(int64_t n, int64_t pad) {
  if (n == kMax) return kMax;
  return Mul(Add(n, pad - 1) / pad, pad);
}

std::string Human(int64_t bytes) {
  if (bytes == kMax) return "more than 9.2 EB";
  const double b = static_cast<double>(bytes);
  if (b >= 1e12) return absl::StrFormat("%.1f TB", b / 1e12);
  if (b >= 1e9) return absl::StrFormat("%.1f GB", b / 1e9);
  return absl::StrFormat("%.1f MB", b / 1e6);
}

std::string Bytes(int64_t bytes) {
  return bytes == kMax ? std::string("more than 2^63")
                       : absl::StrCat(bytes, " bytes");
}

}  // namespace

int64_t MemoryEstimate::total() const {
  return Sum({params, grads, optimizer, activations});
}

MemoryEstimate EstimateRankMemory(const v1::JobSpec& spec, int64_t vocab_size) {
  const auto& m = spec.model();
  const auto& p = spec.parallel();
  const int64_t C = std::max<int64_t>(m.n_embd(), 1);
  const int64_t L = std::max<int64_t>(m.n_layer(), 1);
  const int64_t NH = std::max<int64_t>(m.n_head(), 1);
  const int64_t T = std::max<int64_t>(m.block_size(), 1);
  const int64_t V = std::max<int64_t>(vocab_size, 1);
  const int64_t dp = std::max<int64_t>(p.dp(), 1);
  const int64_t zero = p.zero();
  const int64_t mb = std::max<int64_t>(p.microbatches(), 1);
  const int64_t B =
      std::max<int64_t>(spec.train().global_batch() / (dp * mb), 1);

  // Units of GptParamLayout, each padded to a multiple of dp.
  const int64_t CC = Mul(C, C);
  const int64_t emb = Pad(Add(Mul(V, C), Mul(T, C)), dp);
  const int64_t attn = Pad(Sum({Mul(2, C), Mul(3, CC), Mul(3, C)}), dp);
  const int64_t proj = Pad(Add(CC, C), dp);
  const int64_t fc = Pad(Sum({Mul(2, C), Mul(4, CC), Mul(4, C)}), dp);
  const int64_t fc_proj = Pad(Add(Mul(4, CC), C), dp);
  const int64_t fin = Pad(Mul(2, C), dp);
  const int64_t total = Sum({emb, Mul(L, Sum({attn, proj, fc, fc_proj})), fin});
  const int64_t shard = total == kMax ? kMax : total / dp;
  const int64_t block_max = std::max({attn, proj, fc, fc_proj});

  // DataParallel's buffers by ZeRO stage.
  MemoryEstimate e;
  int64_t params = 0, grads = 0;
  if (zero <= 2) params = Add(params, total);
  if (zero >= 1) params = Add(params, shard);
  if (zero == 3) params = Sum({params, emb, fin, block_max});
  if (zero <= 1) grads = Add(grads, total);
  if (zero >= 1) grads = Add(grads, shard);
  if (zero >= 2) {
    const int64_t scratch = Sum({emb, fin, Mul(2, block_max)});
    grads = Add(grads, scratch);
    if (mb != 1) {
      grads = Add(grads, Sum({emb / dp, fin / dp, Mul(2, block_max / dp)}));
    }
  }
  e.params = Mul(params, kFloat);
  e.grads = Mul(grads, kFloat);
  e.optimizer = Mul(Mul(2, zero == 0 ? total : shard), kFloat);

  // Gpt's activation buffer for micro-batches of B sequences of T tokens.
  const int64_t BT = Mul(B, T);
  const int64_t BTC = Mul(BT, C);
  const int64_t att = Mul(Mul(B, NH), Mul(T, T));
  const int64_t acts = Sum({BTC, Mul(L, Mul(BT, Add(Mul(16, C), 4))),
                            Mul(L, att), Mul(BT, Add(C, 2)), Mul(BT, V), BT,
                            Mul(7, BTC), Mul(8, BTC), att, Mul(BT, V)});
  e.activations = Mul(acts, kFloat);
  return e;
}

int64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key, unit;
    int64_t kb = 0;
    if (fields >> key >> kb >> unit && key == "MemAvailable:" && kb > 0) {
      return Mul(kb, 1024);
    }
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? Mul(pages, page) : 0;
}

absl::Status CheckMemoryFits(const v1::JobSpec& spec, int64_t vocab_size,
                             int ranks_on_node, int64_t available_bytes) {
  if (available_bytes <= 0) return absl::OkStatus();
  const MemoryEstimate e = EstimateRankMemory(spec, vocab_size);
  const int64_t ranks = std::max(ranks_on_node, 1);
  const int64_t need = Mul(e.total(), ranks);
  if (need <= available_bytes) return absl::OkStatus();
  const auto& m = spec.model();
  const auto& p = spec.parallel();
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory: each rank needs ", Bytes(e.total()), " (", Human(e.total()),
      ": params ", Human(e.params), ", grads ", Human(e.grads), ", optimizer ",
      Human(e.optimizer), ", activations ", Human(e.activations),
      ") for model.n_layer=", m.n_layer(), ", model.n_head=", m.n_head(),
      ", model.n_embd=", m.n_embd(), ", model.block_size=", m.block_size(),
      ", vocabulary ", vocab_size, ", train.global_batch=",
      spec.train().global_batch(), " over parallel.dp=", p.dp(),
      " x parallel.microbatches=", p.microbatches(), ", parallel.zero=",
      p.zero(), "; ", ranks, ranks == 1 ? " rank" : " ranks",
      " on this machine need ", Bytes(need), " but it has ", available_bytes,
      " bytes (", Human(available_bytes), ") available"));
}

}  // namespace ptrain
