// GPT-2's encoder (common/gpt2_bpe.h) on one thread over a text file:
// MB/s (1e6 bytes) and tokens/s, the best of --repeats after a warm-up, with
// a word cache (fresh each repeat, as a new reader's would be), without, and
// the pre-tokenizer alone. bench/tokenizer_vs_tiktoken.sh puts it beside the
// tiktoken package on the same file and core. --ids-out instead writes the
// ids as a JSON array, once decoding them gave the text back
// (tests/common/gpt2/compare_reference.sh checks them against the reference
// encoders). Prints figures; never fails on time.
//
//   build/bench/tokenizer_throughput --corpus FILE [--repeats 5]
//       [--vocab DIR] [--ids-out FILE] [--tsv]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/gpt2_bpe.h"

namespace {

// The best time of `repeats` runs of `run` after one more, and what the
// last run returned (its number of tokens or words).
double Best(int repeats, const std::function<size_t()>& run, size_t* count) {
  *count = run();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    *count = run();
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 encoder throughput on one thread"};
  std::string corpus, vocab, ids_out;
  int repeats = 5;
  bool tsv = false;
  app.add_option("--corpus", corpus,
                 "text file (tests/common/gpt2/make_corpus.py writes one)")
      ->required();
  app.add_option("--repeats", repeats, "timed runs per figure (best printed)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--vocab", vocab,
                 "vocabulary directory (default: the one built in)");
  app.add_option("--ids-out", ids_out,
                 "only write the ids as a JSON array to this file");
  app.add_flag("--tsv", tsv, "figures as name<TAB>bytes<TAB>count<TAB>seconds");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(corpus, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", corpus.c_str());
    return 1;
  }
  std::ostringstream read;
  read << in.rdbuf();
  const std::string text = read.str();

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<ptrain::Gpt2Bpe> loaded;
  if (!vocab.empty()) {
    loaded = ptrain::Gpt2Bpe::Load(vocab);
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
      return 1;
    }
  }
  const ptrain::Gpt2Bpe& bpe =
      vocab.empty() ? ptrain::Gpt2Bpe::Builtin() : *loaded;
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();

  if (!ids_out.empty()) {
    const std::vector<int32_t> ids = bpe.Encode(text);
    const absl::StatusOr<std::string> back = bpe.Decode(ids);
    if (!back.ok() || *back != text) {
      std::fprintf(stderr, "decoding the ids does not give the text back\n");
      return 1;
    }
    std::ofstream out(ids_out, std::ios::binary);
    out << '[';
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out << ',';
      out << ids[i];
    }
    out << "]\n";
    if (!out.flush()) {
      std::fprintf(stderr, "cannot write %s\n", ids_out.c_str());
      return 1;
    }
    std::printf("%s: %zu ids of %zu bytes; decoded back to the text\n",
                ids_out.c_str(), ids.size(), text.size());
    return 0;
  }

  struct Figure {
    const char* name;
    std::function<size_t()> run;
  };
  const Figure figures[] = {
      {"ptrain encode, cache",
       [&] {
         ptrain::Gpt2Bpe::Cache cache;
         return bpe.Encode(text, &cache).size();
       }},
      {"ptrain encode, no cache", [&] { return bpe.Encode(text).size(); }},
      {"ptrain split (words)", [&] { return bpe.Split(text).size(); }},
  };
  if (!tsv) {
    std::printf("%s: %zu bytes; vocabulary %s in %.0f ms; best of %d\n",
                corpus.c_str(), text.size(),
                vocab.empty() ? "built in" : vocab.c_str(), load_s * 1e3,
                repeats);
  }
  for (const Figure& f : figures) {
    size_t count = 0;
    const double s = Best(repeats, f.run, &count);
    if (tsv) {
      std::printf("%s\t%zu\t%zu\t%.9f\n", f.name, text.size(), count, s);
    } else {
      std::printf("  %-26s %9zu in %8.4f s  %8.1f MB/s  %7.2f M/s\n", f.name,
                  count, s, text.size() / s / 1e6, count / s / 1e6);
    }
  }
  return 0;
}
