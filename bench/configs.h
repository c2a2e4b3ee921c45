// The benchmarks' model configs on the Shakespeare example: S (4 layers,
// 4 heads, C=128, T=64) and M (6 layers, 6 heads, C=384, T=256), as
// `--set` overrides. One definition, so that every benchmark's "config M"
// is the same model.
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

}  // namespace ptrain

#endif  // PTRAIN_BENCH_CONFIGS_H_
