// The benchmarks' model configs on the Shakespeare example: S (4 layers,
// 4 heads, C=128, T=64) and M (6 layers, 6 heads, C=384, T=256), as
// `--set` overrides. One definition, so that every benchmark's "config M"
// is the same model. The Llama of a config (BenchLlama) has its width.
#ifndef PTRAIN_BENCH_CONFIGS_H_
#define PTRAIN_BENCH_CONFIGS_H_

#include <string>
#include <vector>

namespace ptrain {

// The model of config "M", else of config "S".
inline std::vector<std::string> BenchModel(const std::string& config) {
  const bool m = config == "M";
  return {std::string("model.n_layer=") + (m ? "6" : "4"),
          std::string("model.n_head=") + (m ? "6" : "4"),
          std::string("model.n_embd=") + (m ? "384" : "128"),
          std::string("model.block_size=") + (m ? "256" : "64")};
}

// The overrides that make a config of n_head heads and n_embd channels a
// Llama of the same width: grouped-query attention with key/value heads
// n_head / 4 where 4 divides n_head, else n_head / 3 where 3 does, else
// n_head (S: 1, M: 2), and the MLP's hidden width the
// multiple of 64 nearest 8C/3 (S: 320, M: 1024), which keeps its weights
// near GPT-2's 8C^2 (Llama's own rule, rounding up to a multiple of 256,
// would give S 512).
inline std::vector<std::string> BenchLlama(int n_head, int n_embd) {
  const int kv = n_head % 4 == 0   ? n_head / 4
                 : n_head % 3 == 0 ? n_head / 3
                                   : n_head;
  const int hidden = (8 * n_embd / 3 + 32) / 64 * 64;
  return {"model.arch=llama", "model.n_kv_head=" + std::to_string(kv),
          "model.ffn_hidden=" + std::to_string(hidden)};
}

}  // namespace ptrain

#endif  // PTRAIN_BENCH_CONFIGS_H_
