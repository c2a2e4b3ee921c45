// Engine pieces on one rank: layout-invariant initialisation, the parameter
// table, the data sampler, token files, the schedule, clipping, gradient
// accumulation over microbatches, and generation through the key/value
// cache.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/spec.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "kernels/cpu/kernels.h"
#include "worker/engine/data/data.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/rng.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/report/runlog.h"
#include "worker/engine/train/anomaly.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

const GptConfig kTiny{/*n_layer=*/2,       /*n_head=*/2,
                      /*n_embd=*/12,
                      /*block_size=*/8,    /*vocab_size=*/13,
                      /*padded_vocab=*/128};

// A single-rank model with its own buffers, for up to (B, T) microbatches.
std::unique_ptr<GptStage> Stage(const GptConfig& c, int B, int T) {
  StageOptions o;
  o.max_B = B;
  o.max_T = T;
  return std::make_unique<GptStage>(c, BuildPlan(c, {}), o);
}

// The pp stages of one model, each with its own buffers, initialised from
// `seed`, gradients zeroed; the rest of their options `base`'s.
std::vector<std::unique_ptr<GptStage>> Stages(const GptConfig& c, int B, int T,
                                              int pp, uint64_t seed,
                                              const StageOptions& base = {}) {
  std::vector<std::unique_ptr<GptStage>> stages;
  for (int s = 0; s < pp; ++s) {
    StageOptions o = base;
    o.max_B = B;
    o.max_T = T;
    o.stage = s;
    o.n_stages = pp;
    PlanOptions plan;
    plan.pp = pp;
    plan.pp_rank = s;
    stages.push_back(std::make_unique<GptStage>(c, BuildPlan(c, plan), o));
    stages.back()->InitParams(seed);
    stages.back()->ZeroGrad();
  }
  return stages;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ptrain_engine_test_" + name))
      .string();
}

TEST(Rng, PhiloxMatchesPublishedKnownAnswer) {
  // Random123's kat_vectors for philox4x32_10, all-ones counter and key.
  auto r = Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                      {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(r[0], 0x408f276du);
  EXPECT_EQ(r[1], 0x41c83b0eu);
  EXPECT_EQ(r[2], 0xa20bc7c6u);
  EXPECT_EQ(r[3], 0x6d5451fdu);
}

TEST(Rng, CounterNormalHasUnitMomentsAndDependsOnAllInputs) {
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = CounterNormal(7, 3, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
  EXPECT_NE(CounterNormal(7, 3, 5), CounterNormal(8, 3, 5));
  EXPECT_NE(CounterNormal(7, 3, 5), CounterNormal(7, 4, 5));
  EXPECT_NE(CounterNormal(7, 3, 5), CounterNormal(7, 3, 6));
}

TEST(GptLayout, ParameterCountMatchesGpt2Formula) {
  const int64_t C = kTiny.n_embd, L = kTiny.n_layer, V = kTiny.vocab_size;
  const int64_t T = kTiny.block_size;
  const int64_t expect = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  EXPECT_EQ(GptNumParams(kTiny), expect);
  // Contiguous, in order, with decay exactly on the matrices.
  int64_t offset = 0;
  for (const auto& p : BuildPlan(kTiny, {})) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.numel;
    EXPECT_EQ(p.decay, p.shape.size() == 2) << p.name;
  }
}

TEST(GptInit, EveryElementIsAPureFunctionOfSeedNameAndIndex) {
  auto a = Stage(kTiny, 1, 4), b = Stage(kTiny, 2, 8);
  a->InitParams(42);
  b->InitParams(42);
  ASSERT_EQ(a->buffer_size(), b->buffer_size());
  for (int64_t i = 0; i < a->buffer_size(); ++i) {
    ASSERT_EQ(a->params()[i], b->params()[i]) << i;
  }
  // A shard computes its elements alone, without the rest of the model.
  for (const auto& p : a->layout()) {
    for (int64_t i = p.numel / 2; i < p.numel; ++i) {
      const std::optional<int64_t> g = GlobalIndex(p, i);
      const float want = g.has_value() ? InitialValue(p, 42, *g) : 0.0f;
      ASSERT_EQ(want, a->params()[p.offset + i]) << p.name;
    }
  }
  auto c = Stage(kTiny, 1, 4);
  c->InitParams(43);
  int same = 0;
  for (int64_t i = 0; i < a->buffer_size(); ++i) {
    same += a->params()[i] == c->params()[i];
  }
  // Only LayerNorm ones, zero biases and wte's padding rows coincide
  // across seeds.
  const int64_t C = kTiny.n_embd, L = kTiny.n_layer;
  EXPECT_EQ(same,
            L * 13 * C + 2 * C + (kTiny.padded_vocab - kTiny.vocab_size) * C);
}

TEST(GptInit, InitialValueDoesNotDependOnTheParameterOffset) {
  // A tensor keeps its numbers when other tensors change size (another
  // vocabulary moves every offset after wte).
  GptConfig other = kTiny;
  other.vocab_size = 29;
  other.padded_vocab = 256;
  const auto a = BuildPlan(kTiny, {}), b = BuildPlan(other, {});
  ASSERT_NE(a[2].offset, b[2].offset);
  for (int64_t i = 0; i < a[4].numel; ++i) {
    ASSERT_EQ(InitialValue(a[4], 9, i), InitialValue(b[4], 9, i));
  }
}

TEST(GptInit, WeightsHaveTheGpt2StandardDeviations) {
  GptConfig big{4, 4, 64, 16, 50, 128};
  auto m = Stage(big, 1, 1);
  m->InitParams(1);
  for (const auto& p : m->layout()) {
    if (p.init != ParamInfo::Init::kNormal) continue;
    double sq = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      if (!GlobalIndex(p, i).has_value()) continue;  // padding rows
      sq += double(m->params()[p.offset + i]) * m->params()[p.offset + i];
      ++n;
    }
    EXPECT_NEAR(std::sqrt(sq / n), p.init_std, 0.1 * p.init_std) << p.name;
  }
}

TEST(BatchSampler, GlobalBatchIsAPureFunctionOfSeedAndStep) {
  std::vector<uint16_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 50;
  TokenShards tokens;
  tokens.push_back(TokenStream(ids));
  const int T = 8, GB = 6;
  BatchSampler s(&tokens, T, GB, 5, "train");
  std::vector<int32_t> whole_in(GB * T), whole_tg(GB * T);
  s.Fill(3, 0, GB, whole_in.data(), whole_tg.data());
  // Any split of the batch over ranks and microbatches sees the same rows.
  for (int first : {0, 2, 4}) {
    std::vector<int32_t> in(2 * T), tg(2 * T);
    BatchSampler again(&tokens, T, GB, 5, "train");
    again.Fill(3, first, 2, in.data(), tg.data());
    for (int i = 0; i < 2 * T; ++i) {
      ASSERT_EQ(in[i], whole_in[first * T + i]);
      ASSERT_EQ(tg[i], whole_tg[first * T + i]);
    }
  }
  for (int i = 0; i < GB; ++i) {
    for (int t = 0; t + 1 < T; ++t) {
      EXPECT_EQ(whole_tg[i * T + t], whole_in[i * T + t + 1]);
    }
  }
  std::vector<int32_t> other_in(GB * T), other_tg(GB * T);
  s.Fill(4, 0, GB, other_in.data(), other_tg.data());
  EXPECT_NE(other_in, whole_in);
}

// Where each shard of `data` lies in `ids` (the whole text's), train and
// validation in stream order: they must alternate, tile `ids` and each
// match its place. The validation runs' starts; empty when they do not.
std::vector<int64_t> ValStarts(const TokenData& data,
                               const std::vector<int32_t>& ids) {
  std::vector<int64_t> starts;
  size_t t = 0, v = 0;
  int64_t at = 0;
  const auto fits = [&](const TokenStream& s) {
    return at + static_cast<int64_t>(s.size()) <=
               static_cast<int64_t>(ids.size()) &&
           std::equal(s.begin(), s.end(), ids.begin() + at);
  };
  bool last_val = false;
  while (at < static_cast<int64_t>(ids.size())) {
    const bool val =
        v < data.val.size() && fits(data.val[v]) && (at == 0 || !last_val);
    const bool train = !val && t < data.train.size() && fits(data.train[t]) &&
                       (at == 0 || last_val);
    if (!val && !train) {
      ADD_FAILURE() << "no shard matches the text at token " << at;
      return {};
    }
    if (val) starts.push_back(at);
    const TokenStream& s = val ? data.val[v++] : data.train[t++];
    EXPECT_GT(s.size(), 0u);
    at += static_cast<int64_t>(s.size());
    last_val = val;
  }
  EXPECT_EQ(t, data.train.size());
  EXPECT_EQ(v, data.val.size());
  return starts;
}

TEST(TokenData, CharTokenizerRoundTripsAndHoldsOutAPieceOfTheText) {
  const std::string path = TempPath("text.txt");
  std::string text;
  for (int i = 0; i < 100; ++i)
    text += "hello world " + std::to_string(i) + "\n";
  std::ofstream(path) << text;
  v1::DataSpec spec;
  spec.set_path(path);
  spec.set_tokenizer("char");
  spec.set_val_fraction(0.25);
  auto data = LoadTokenData(spec, 0, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->vocab_size, 19);  // "\n 0123456789dehlorw"
  const std::vector<int32_t> ids = data->tokenizer.Encode(text);
  EXPECT_EQ(data->tokenizer.Decode(ids), text);
  // A quarter of the tokens, rounded down, in one piece (fewer than 1.5
  // pieces' length), not at the text's end.
  EXPECT_EQ(TokenCount(data->val), static_cast<int64_t>(ids.size() / 4));
  ASSERT_EQ(data->val.size(), 1u);
  const std::vector<int64_t> starts = ValStarts(*data, ids);
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_LT(starts[0] + data->val[0].size(), ids.size());
  EXPECT_EQ(LoadTokenData(spec, 10, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::filesystem::remove(path);
}

// data.path's validation split samples the whole text: a text of eight
// regions, each in letters of its own, has validation tokens of every
// region, about val_fraction of the tokens, in runs between which the
// train runs lie, the same on every load and whatever train.seed.
TEST(TokenData, ValidationOfATextComesFromEveryRegion) {
  const std::string path = TempPath("regions.txt");
  std::string text;
  // Each region is longer than two of the 19 pieces' stretches.
  const int kRegions = 8, kRegionChars = 6000;
  uint32_t x = 1;
  for (int r = 0; r < kRegions; ++r) {
    for (int i = 0; i < kRegionChars; ++i) {
      // Letters 3r .. 3r+2 (a to x), in an order that does not repeat.
      x = x * 1103515245u + 12345u;
      text += static_cast<char>('a' + 3 * r + (x >> 16) % 3);
    }
  }
  std::ofstream(path) << text;
  v1::DataSpec spec;
  spec.set_path(path);
  spec.set_tokenizer("char");
  spec.set_val_fraction(0.1);
  const int T = 16;
  auto data = LoadTokenData(spec, 0, T);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::vector<int32_t> ids = data->tokenizer.Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  const int64_t n = static_cast<int64_t>(ids.size());
  EXPECT_EQ(TokenCount(data->val), n / 10);
  EXPECT_EQ(TokenCount(data->train) + TokenCount(data->val), n);
  const std::vector<int64_t> starts = ValStarts(*data, ids);
  ASSERT_FALSE(starts.empty());
  std::set<int> regions;
  size_t v = 0;
  for (int64_t at : starts) {
    const TokenStream& s = data->val[v++];
    EXPECT_GE(s.size(), static_cast<size_t>(T + 1));
    for (int64_t k = at; k < at + static_cast<int64_t>(s.size()); ++k) {
      regions.insert(static_cast<int>(k / kRegionChars));
    }
  }
  EXPECT_EQ(regions.size(), static_cast<size_t>(kRegions));
  // Each train run holds a sequence and its target.
  for (const TokenStream& s : data->train) {
    EXPECT_GE(s.size(), static_cast<size_t>(T + 1));
  }
  // Loaded again: the same split, the same digest.
  auto again = LoadTokenData(spec, 0, T);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->digest, data->digest);
  ASSERT_EQ(again->val.size(), data->val.size());
  for (size_t k = 0; k < data->val.size(); ++k) {
    EXPECT_TRUE(std::equal(again->val[k].begin(), again->val[k].end(),
                           data->val[k].begin(), data->val[k].end()));
  }
  EXPECT_EQ(ValStarts(*again, ids), starts);
  std::filesystem::remove(path);
}

// data.tokenizer=gpt2 on a text file: GPT-2's ids, its vocabulary the
// model's, a fifth held out; a model.vocab_size below the tokenizer's is
// refused naming both.
TEST(TokenData, Gpt2TokenizesATextAtStart) {
  const std::string path = TempPath("gpt2_text.txt");
  std::string text;
  for (int i = 0; i < 50; ++i) {
    text += "Hello world, it's 2026, line " + std::to_string(i) + ".\n";
  }
  std::ofstream(path) << text;
  v1::DataSpec spec;
  spec.set_path(path);
  spec.set_tokenizer("gpt2");
  spec.set_val_fraction(0.2);
  auto data = LoadTokenData(spec, 0, 8);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->vocab_size, 50257);
  EXPECT_FALSE(data->has_tokenizer);
  ASSERT_NE(data->text_tokenizer(), nullptr);
  const std::vector<int32_t> ids = data->text_tokenizer()->Encode(text);
  EXPECT_EQ(data->text_tokenizer()->Decode(ids), text);
  EXPECT_EQ(ValStarts(*data, ids).size(), data->val.size());
  EXPECT_EQ(TokenCount(data->val), static_cast<int64_t>(ids.size() / 5));
  EXPECT_EQ(ids[0], 15496);  // "Hello"
  auto small = LoadTokenData(spec, 1000, 8);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find(
                "model.vocab_size=1000 is smaller than the vocabulary of "
                "data.tokenizer (50257"),
            std::string::npos)
      << small.status();
  std::filesystem::remove(path);
}

// A text too large to tokenize at every start is refused with the command
// that prepares it once.
TEST(TokenData, ALargeTextIsSentToPrepare) {
  const std::string path = TempPath("gpt2_large.txt");
  {
    std::ofstream out(path);
    out << "x";
  }
  std::filesystem::resize_file(path, kMaxTokenizedTextBytes + 1);
  v1::DataSpec spec;
  spec.set_path(path);
  spec.set_tokenizer("gpt2");
  spec.set_val_fraction(0.1);
  auto data = LoadTokenData(spec, 0, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(data.status().message().find("ptworker prepare --tokenizer gpt2"),
            std::string::npos)
      << data.status();
  std::filesystem::remove(path);
}

// Token files decode through the tokenizer file beside them (auto), or the
// one data.tokenizer names; without either there is none. A damaged
// tokenizer file is an error naming it. DataTokenizerName names each.
TEST(TokenData, TokenFilesFindTheirTokenizer) {
  const std::string dir = TempPath("prepared");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto gpt2 = OpenTokenizer("gpt2", "test");
  ASSERT_TRUE(gpt2.ok());
  const std::vector<int32_t> ids = (*gpt2)->Encode(
      "The quick brown fox jumps over the lazy dog, again and again.");
  const std::vector<uint16_t> tokens(ids.begin(), ids.end());
  ASSERT_TRUE(WriteTokenFile(dir + "/c_train_000000.bin", tokens).ok());
  ASSERT_TRUE(WriteTokenFile(dir + "/c_val_000000.bin", tokens).ok());
  v1::DataSpec spec;
  spec.set_train_bin(dir + "/c_train_*.bin");
  spec.set_val_bin(dir + "/c_val_*.bin");
  spec.set_tokenizer("auto");
  auto none = LoadTokenData(spec, 0, 4);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->text_tokenizer(), nullptr);
  EXPECT_EQ(none->vocab_size, 50257);
  const auto resolved = [&] {
    auto n = DataTokenizerName(spec);
    EXPECT_TRUE(n.ok()) << n.status();
    return n.ok() ? *n : "(error)";
  };
  EXPECT_EQ(resolved(), "");

  // GPT-2's pieces: GPT-2's tokenizer, which encodes prompts too.
  ASSERT_TRUE(WriteLlmcTokenizer(**gpt2, dir + "/c_tokenizer.bin").ok());
  for (const char* name : {"auto", "char", ""}) {
    spec.set_tokenizer(name);
    auto data = LoadTokenData(spec, 0, 4);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_NE(data->text_tokenizer(), nullptr) << name;
    EXPECT_TRUE(data->text_tokenizer()->can_encode());
    EXPECT_EQ(data->text_tokenizer()->Decode(ids), (*gpt2)->Decode(ids));
    EXPECT_EQ(resolved(), "gpt2") << name;
  }
  // Other pieces: a tokenizer that decodes only.
  struct WithEnd : CharTokenizer {
    using CharTokenizer::CharTokenizer;
    int32_t end_of_text() const override { return 0; }
  } small("abcdefghij");
  ASSERT_TRUE(WriteLlmcTokenizer(small, dir + "/c_tokenizer.bin").ok());
  spec.set_tokenizer("auto");
  auto decodes = LoadTokenData(spec, 50257, 4);
  ASSERT_TRUE(decodes.ok()) << decodes.status();
  ASSERT_NE(decodes->text_tokenizer(), nullptr);
  EXPECT_FALSE(decodes->text_tokenizer()->can_encode());
  EXPECT_EQ(decodes->text_tokenizer()->Decode({7, 4, 11}), "he");
  EXPECT_EQ(resolved(), "llmc:" + dir + "/c_tokenizer.bin");
  // A SentencePiece model beside the shards comes first.
  const std::vector<std::string> lines(200, "the cat sat on the mat again");
  size_t next = 0;
  ASSERT_TRUE(TrainSentencePiece(
                  [&](std::string* line) {
                    if (next == lines.size()) return false;
                    *line = lines[next++];
                    return true;
                  },
                  300, "bpe", dir + "/c_spm.model")
                  .ok());
  auto spm = LoadTokenData(spec, 50257, 4);
  ASSERT_TRUE(spm.ok()) << spm.status();
  ASSERT_NE(spm->text_tokenizer(), nullptr);
  EXPECT_TRUE(spm->text_tokenizer()->can_encode());
  EXPECT_EQ(spm->text_tokenizer()->size(), 300);
  EXPECT_EQ(resolved(), "spm:" + dir + "/c_spm.model");
  std::filesystem::remove(dir + "/c_spm.model");
  spec.set_tokenizer("gpt2");
  auto named = LoadTokenData(spec, 0, 4);
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_NE(named->text_tokenizer(), nullptr);
  EXPECT_TRUE(named->text_tokenizer()->can_encode());
  EXPECT_EQ(resolved(), "gpt2");

  std::ofstream(dir + "/c_tokenizer.bin") << "not a tokenizer file";
  spec.set_tokenizer("auto");
  auto damaged = LoadTokenData(spec, 0, 4);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("data.train_bin"),
            std::string::npos)
      << damaged.status();
  EXPECT_NE(damaged.status().message().find("c_tokenizer.bin"),
            std::string::npos)
      << damaged.status();
  EXPECT_FALSE(DataTokenizerName(spec).ok());
  std::filesystem::remove_all(dir);
}

// data.train_bin as a pattern: its shards in sorted order; every sequence
// lies inside one shard, and every shard is drawn from. A pattern that
// matches nothing, or with wildcards in its folder, is refused naming the
// field; a file named like a pattern is that file.
TEST(TokenData, TokenFileShardsByPattern) {
  const std::string dir = TempPath("shards");
  std::filesystem::create_directories(dir);
  // Shard k holds tokens 100·k + (0..49): a sequence's tokens say which
  // shard it came from.
  for (int k = 2; k >= 0; --k) {
    std::vector<uint16_t> toks(50);
    for (int i = 0; i < 50; ++i) toks[i] = 100 * k + i;
    ASSERT_TRUE(
        WriteTokenFile(dir + "/train_00" + std::to_string(k) + ".bin", toks)
            .ok());
  }
  ASSERT_TRUE(
      WriteTokenFile(dir + "/val.bin", std::vector<uint16_t>(40, 7)).ok());
  v1::DataSpec spec;
  spec.set_train_bin(dir + "/train_*.bin");
  spec.set_val_bin(dir + "/val.bin");
  const int T = 8;
  auto data = LoadTokenData(spec, 0, T);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->train.size(), 3u);
  EXPECT_EQ(TokenCount(data->train), 150);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(data->train[k].data()[0], 100 * k);

  const int GB = 64;
  BatchSampler sampler(&data->train, T, GB, 1, "train");
  std::vector<int32_t> in(GB * T), tg(GB * T);
  std::set<int> seen;
  for (int b = 0; b < 8; ++b) {
    sampler.Fill(b, 0, GB, in.data(), tg.data());
    for (int i = 0; i < GB; ++i) {
      const int shard = in[i * T] / 100;
      seen.insert(shard);
      for (int t = 0; t < T; ++t) {
        // Consecutive tokens of one shard, the target one further.
        ASSERT_EQ(in[i * T + t], in[i * T] + t);
        ASSERT_EQ(tg[i * T + t], in[i * T] + t + 1);
        ASSERT_LT(tg[i * T + t] - 100 * shard, 50);
      }
    }
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2}));

  spec.set_train_bin(dir + "/nothing_*.bin");
  auto none = LoadTokenData(spec, 0, T);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(),
            "data.train_bin: no file matches '" + dir + "/nothing_*.bin'");
  spec.set_train_bin(dir + "/*/train.bin");
  auto folder = LoadTokenData(spec, 0, T);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("only the file name may be a "
                                           "pattern"),
            std::string::npos)
      << folder.status();
  // A literal file whose name has a wildcard character.
  std::vector<uint16_t> star(30, 3);
  ASSERT_TRUE(WriteTokenFile(dir + "/train_*.bin", star).ok());
  spec.set_train_bin(dir + "/train_*.bin");
  auto literal = LoadTokenData(spec, 0, T);
  ASSERT_TRUE(literal.ok()) << literal.status();
  ASSERT_EQ(literal->train.size(), 1u);
  EXPECT_EQ(literal->train[0].size(), 30u);
  // Shards shorter than a sequence: the longest decides.
  std::filesystem::remove(dir + "/train_*.bin");
  auto longer = LoadTokenData(spec, 0, 50);
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find(
                "the longest file of the train split (50 tokens)"),
            std::string::npos)
      << longer.status();
  std::filesystem::remove_all(dir);
}

// A token file truncated while mapped: reading past its new end ends the
// rank with exit 1 and a message naming the file, not a bare SIGBUS; a
// fault elsewhere is still the default crash.
TEST(TokenDataDeathTest, TruncatedMappedFileEndsTheRankNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string path = TempPath("truncated.bin");
  ASSERT_TRUE(WriteTokenFile(path, std::vector<uint16_t>(1 << 16, 5)).ok());
  auto read_after_truncation = [&] {
    const int fd = ::open(path.c_str(), O_RDONLY);
    auto stream = TokenStream::MapTokenFile(fd, "data.train_bin", path, 50257);
    ::close(fd);
    if (!stream.ok()) std::_Exit(3);
    std::filesystem::resize_file(path, 1024);
    volatile uint16_t last = stream->data()[stream->size() - 1];
    (void)last;
    std::_Exit(0);
  };
  EXPECT_EXIT(read_after_truncation(), ::testing::ExitedWithCode(1),
              "token file '.*truncated.bin' became shorter while this rank "
              "reads it");
  // The handler installed, a mapping that is no token file: SIGBUS as ever.
  const std::string other = TempPath("other.bin");
  auto read_other = [&] {
    ASSERT_TRUE(WriteTokenFile(path, std::vector<uint16_t>(64, 5)).ok());
    const int fd = ::open(path.c_str(), O_RDONLY);
    auto stream = TokenStream::MapTokenFile(fd, "data.train_bin", path, 50257);
    ::close(fd);
    std::ofstream(other) << std::string(1 << 16, 'x');
    const int ofd = ::open(other.c_str(), O_RDONLY);
    void* map = ::mmap(nullptr, 1 << 16, PROT_READ, MAP_SHARED, ofd, 0);
    ::close(ofd);
    std::filesystem::resize_file(other, 0);
    volatile char c = static_cast<const char*>(map)[(1 << 16) - 1];
    (void)c;
    std::_Exit(0);
  };
  EXPECT_EXIT(read_other(), ::testing::KilledBySignal(SIGBUS), "");
  std::filesystem::remove(other);
  std::filesystem::remove(path);
}

TEST(TokenData, VocabularyMismatchNamesTheField) {
  const std::string path = TempPath("vocab.txt");
  std::ofstream(path) << std::string(100, 'a') + std::string(100, 'b');
  v1::DataSpec spec;
  spec.set_path(path);
  spec.set_val_fraction(0.5);
  auto data = LoadTokenData(spec, 65, 8);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("model.vocab_size=65"),
            std::string::npos)
      << data.status();
  std::filesystem::remove(path);
}

TEST(TokenData, LlmcTokenFilesLoadAndBadHeadersAreRefused) {
  const std::string train = TempPath("train.bin"), val = TempPath("val.bin");
  std::vector<uint16_t> toks(64);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = (i * 7) % 100;
  ASSERT_TRUE(WriteTokenFile(train, toks).ok());
  ASSERT_TRUE(WriteTokenFile(val, toks).ok());
  v1::DataSpec spec;
  spec.set_train_bin(train);
  spec.set_val_bin(val);
  auto data = LoadTokenData(spec, 0, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->vocab_size, 50257);
  ASSERT_EQ(data->train.size(), 1u);
  EXPECT_EQ(std::vector<uint16_t>(data->train[0].begin(), data->train[0].end()),
            toks);
  // The file's body, mapped: no copy of it in the process.
  EXPECT_TRUE(data->train[0].mapped());

  // Token 99 does not fit a vocabulary of 50.
  auto small = LoadTokenData(spec, 50, 16);
  ASSERT_FALSE(small.ok());
  // The first one out of range: (8·7) % 100 = 56 at position 8.
  EXPECT_NE(small.status().message().find("data.train_bin: token 56 at "
                                          "position 8 "),
            std::string::npos)
      << small.status();

  // Wrong magic.
  {
    std::fstream f(train, std::ios::in | std::ios::out | std::ios::binary);
    int32_t bad = 1234;
    f.write(reinterpret_cast<char*>(&bad), 4);
  }
  auto magic = LoadTokenData(spec, 0, 16);
  ASSERT_FALSE(magic.ok());
  EXPECT_NE(magic.status().message().find("bad magic 1234"), std::string::npos)
      << magic.status();

  // Truncated body.
  ASSERT_TRUE(WriteTokenFile(train, toks).ok());
  std::filesystem::resize_file(train, 1024 + 2 * 60);
  auto size = LoadTokenData(spec, 0, 16);
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("header says 64 tokens"),
            std::string::npos)
      << size.status();

  // A header with no tokens parses to nothing (fuzz/corpus/llmc keeps the
  // input that once made this copy from a null pointer), and is too short.
  ASSERT_TRUE(WriteTokenFile(train, std::vector<uint16_t>{}).ok());
  std::ifstream empty_in(train, std::ios::binary);
  const std::string empty((std::istreambuf_iterator<char>(empty_in)), {});
  auto none = ParseTokenFile(empty, "data.train_bin", train, 50257);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_NE(LoadTokenData(spec, 0, 16)
                .status()
                .message()
                .find("model.block_size=16 is too large for the data"),
            std::string::npos);

  spec.set_val_bin(TempPath("missing.bin"));
  ASSERT_TRUE(WriteTokenFile(train, toks).ok());
  EXPECT_EQ(LoadTokenData(spec, 0, 16).status().code(),
            absl::StatusCode::kNotFound);
  std::filesystem::remove(train);
  std::filesystem::remove(val);
}

// Version 2 files (uint32 tokens, vocabularies past 65536) load wide to
// the same ids, mapped; a version 1 file beside them still loads narrow;
// an id outside the vocabulary and a body of the other width are refused.
TEST(TokenData, Version2TokenFilesLoadWideBesideVersion1) {
  const std::string train = TempPath("wide_train.bin");
  const std::string val = TempPath("narrow_val.bin");
  std::vector<uint32_t> wide(64);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = 70000 + 1000 * i;
  const std::vector<uint16_t> narrow(64, 7);
  ASSERT_TRUE(WriteTokenFile(train, wide).ok());
  ASSERT_TRUE(WriteTokenFile(val, narrow).ok());
  v1::DataSpec spec;
  spec.set_train_bin(train);
  spec.set_val_bin(val);
  auto data = LoadTokenData(spec, 200000, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->train.size(), 1u);
  const TokenStream& w = data->train[0];
  EXPECT_TRUE(w.wide());
  EXPECT_TRUE(w.mapped());
  ASSERT_EQ(w.size(), wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    EXPECT_EQ(w[i], static_cast<int32_t>(wide[i]));
  }
  EXPECT_FALSE(data->val[0].wide());
  EXPECT_EQ(data->val[0][3], 7);
  BatchSampler sampler(&data->train, 16, 2, 1, "train");
  std::vector<int32_t> in(32), tg(32);
  sampler.Fill(0, 0, 2, in.data(), tg.data());
  for (int i = 0; i < 32; ++i) {
    EXPECT_GE(in[i], 70000);
    EXPECT_EQ(tg[i], in[i] + 1000);
  }

  std::ifstream in_file(train, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in_file)), {});
  auto parsed = ParseTokenFile(bytes, "data.train_bin", train, 200000);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, std::vector<int32_t>(wide.begin(), wide.end()));

  auto small = LoadTokenData(spec, 100000, 16);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("data.train_bin: token 100000 at "
                                          "position 30 "),
            std::string::npos)
      << small.status();
  // A version 2 header over a uint16 body: its size says otherwise.
  ASSERT_TRUE(WriteTokenFile(train, narrow).ok());
  {
    std::fstream f(train, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    int32_t version = 2;
    f.write(reinterpret_cast<char*>(&version), 4);
  }
  auto mixed = LoadTokenData(spec, 200000, 16);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("header says 64 tokens (1280 bytes)"),
            std::string::npos)
      << mixed.status();
  std::filesystem::remove(train);
  std::filesystem::remove(val);
}

TEST(Schedule, WarmupRisesLinearlyThenCosineEndsAtMinLr) {
  v1::TrainSpec t;
  t.set_lr(1e-3);
  t.set_min_lr(1e-4);
  t.set_warmup_steps(10);
  t.set_steps(110);
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1e-3);
  EXPECT_NEAR(LearningRate(t, 10 + 99 / 2.0), 5.5e-4, 1e-5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 109), 1e-4);
  for (int s = 11; s < 110; ++s) {
    EXPECT_LT(LearningRate(t, s), LearningRate(t, s - 1));
  }
}

// After the same warmup: linear falls in a straight line to min_lr,
// constant stays at lr, and wsd stays at lr until the last decay_fraction
// of the steps, then falls in a straight line to min_lr at the last step.
TEST(Schedule, LinearConstantAndWarmupStableDecay) {
  v1::TrainSpec t;
  t.set_lr(1e-3);
  t.set_min_lr(1e-4);
  t.set_warmup_steps(10);
  t.set_steps(110);
  t.set_lr_schedule("linear");
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1e-3);
  EXPECT_NEAR(LearningRate(t, 10 + 33), 1e-3 - 9e-4 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(t, 109), 1e-4);
  t.set_lr_schedule("constant");
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 5e-4);
  for (int s : {10, 50, 109}) EXPECT_DOUBLE_EQ(LearningRate(t, s), 1e-3);
  t.set_lr_schedule("wsd");
  t.set_decay_fraction(0.2);  // the last 22 of 110 steps: 88..109
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 5e-4);
  for (int s = 10; s <= 88; ++s) EXPECT_DOUBLE_EQ(LearningRate(t, s), 1e-3);
  EXPECT_NEAR(LearningRate(t, 88 + 7), 1e-3 - 9e-4 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(LearningRate(t, 109), 1e-4);
  for (int s = 89; s < 110; ++s) {
    EXPECT_LT(LearningRate(t, s), LearningRate(t, s - 1));
  }
  // A decay longer than the steps after warmup starts when warmup ends.
  t.set_decay_fraction(1.0);
  t.set_lr_schedule("linear");
  const double linear = LearningRate(t, 60);
  t.set_lr_schedule("wsd");
  EXPECT_DOUBLE_EQ(LearningRate(t, 60), linear);
}

TEST(Clipping, ScaleBringsTheNormDownToTheThresholdOnly) {
  EXPECT_FLOAT_EQ(ClipScale(0.5, 1.0), 1.0f);
  EXPECT_NEAR(ClipScale(4.0, 1.0), 0.25f, 1e-6);
  EXPECT_FLOAT_EQ(ClipScale(100.0, 0.0), 1.0f);
}

TEST(AdamW, DecayAppliesToMatricesOnlyEvenInsideAShard) {
  const auto layout = BuildPlan(kTiny, {});
  const int64_t n = layout.back().offset + layout.back().numel;
  v1::TrainSpec t;
  t.set_beta1(0.9);
  t.set_beta2(0.95);
  t.set_eps(1e-8);
  t.set_weight_decay(0.5);
  // Zero gradients: only decay moves a parameter.
  std::vector<float> params(n, 1.0f), grads(n, 0.0f);
  // A shard that starts inside wpe and ends inside the first block.
  const int64_t lo = layout[1].offset + 3, hi = layout[4].offset + 5;
  AdamW opt(layout, lo, hi, t);
  opt.Step(params.data() + lo, nullptr, grads.data() + lo, 0.1f, 1.0f);
  for (const auto& p : layout) {
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      const bool inside = i >= lo && i < hi;
      const float want = inside && p.decay ? 0.95f : 1.0f;
      ASSERT_FLOAT_EQ(params[i], want) << p.name << " element " << i - p.offset;
    }
  }
  EXPECT_EQ(opt.bytes(), 2 * (hi - lo) * 4);
}

TEST(GptStage, MicrobatchAccumulationEqualsOneLargeBatch) {
  const int B = 4, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = CounterRandom64(1, 1, i) % kTiny.vocab_size;
    tg[i] = CounterRandom64(1, 2, i) % kTiny.vocab_size;
  }
  auto whole = Stage(kTiny, B, T), parts = Stage(kTiny, B / 2, T);
  whole->InitParams(3);
  parts->InitParams(3);
  whole->ZeroGrad();
  parts->ZeroGrad();
  const float dloss = 1.0f / (B * T);
  const float l = whole->Forward(0, in.data(), nullptr, tg.data(), B, T);
  whole->Backward(0, in.data(), tg.data(), dloss, nullptr);
  float l2 = 0;
  for (int half = 0; half < 2; ++half) {
    const int32_t* i = in.data() + half * (B / 2) * T;
    const int32_t* g = tg.data() + half * (B / 2) * T;
    l2 += parts->Forward(0, i, nullptr, g, B / 2, T) / 2;
    parts->Backward(0, i, g, dloss, nullptr);
  }
  EXPECT_NEAR(l, l2, 1e-6);
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < whole->buffer_size(); ++i) {
    diff = std::max(diff,
                    double(std::fabs(whole->grads()[i] - parts->grads()[i])));
    scale = std::max(scale, double(std::fabs(whole->grads()[i])));
  }
  std::printf("accumulated vs whole-batch gradient maxdiff %.3e (scale %.3e)\n",
              diff, scale);
  EXPECT_LE(diff, 1e-5 * scale);
  EXPECT_GT(scale, 0.0);
}

// The model cut into pipeline stages and run as a chain on one rank —
// each stage's output the next one's input, each stage's input gradient
// the previous one's output gradient — computes what the whole model does:
// the same loss (bit for bit: the same kernels in the same order) and the
// same gradients, wte's being the sum of stage 0's (embedding) and the last
// stage's tied copy (head), as the embedding group will sum them.
TEST(GptStage, StagesChainedComputeTheWholeModel) {
  GptConfig c = kTiny;
  c.n_layer = 4;
  const int B = 2, T = 8;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = CounterRandom64(4, 1, i) % c.vocab_size;
    tg[i] = CounterRandom64(4, 2, i) % c.vocab_size;
  }
  const float dloss = 1.0f / (B * T);
  auto whole = Stage(c, B, T);
  whole->InitParams(5);
  whole->ZeroGrad();
  const float want = whole->Forward(0, in.data(), nullptr, tg.data(), B, T);
  whole->Backward(0, in.data(), tg.data(), dloss, nullptr);
  std::map<std::string, std::vector<float>> want_grads;
  for (const ParamInfo& p : whole->layout()) {
    want_grads[p.name].assign(whole->grads() + p.offset,
                              whole->grads() + p.offset + p.numel);
  }
  for (int pp : {2, 4}) {
    std::vector<std::unique_ptr<GptStage>> stages = Stages(c, B, T, pp, 5);
    float loss = 0;
    for (int s = 0; s < pp; ++s) {
      loss = stages[s]->Forward(0, in.data(),
                                s > 0 ? stages[s - 1]->output(0) : nullptr,
                                s == pp - 1 ? tg.data() : nullptr, B, T);
    }
    EXPECT_EQ(loss, want) << "pp " << pp;
    for (int s = pp - 1; s >= 0; --s) {
      stages[s]->Backward(0, in.data(), tg.data(), dloss,
                          s < pp - 1 ? stages[s + 1]->dinput() : nullptr);
    }
    // Gather every stage's gradients by name; wte's two copies add up.
    std::map<std::string, std::vector<float>> got;
    for (const auto& st : stages) {
      for (const ParamInfo& p : st->layout()) {
        std::vector<float>& g = got[p.name];
        g.resize(p.numel, 0.0f);
        for (int64_t i = 0; i < p.numel; ++i) {
          g[i] += st->grads()[p.offset + i];
        }
      }
    }
    ASSERT_EQ(got.size(), want_grads.size());
    double diff = 0, scale = 0;
    std::string worst;
    for (const auto& [name, w] : want_grads) {
      ASSERT_EQ(got[name].size(), w.size()) << name;
      for (size_t i = 0; i < w.size(); ++i) {
        const double d = std::fabs(double(got[name][i]) - w[i]);
        if (d > diff) diff = d, worst = name;
        scale = std::max(scale, double(std::fabs(w[i])));
      }
    }
    std::printf(
        "pp=%d chained stages: loss %.6f (whole %.6f), gradients "
        "maxdiff %.3e (%s; scale %.3e)\n",
        pp, loss, want, diff, worst.c_str(), scale);
    EXPECT_LE(diff, 1e-6 * scale) << "pp " << pp << " worst " << worst;
    EXPECT_GT(scale, 0.0);
  }
}

// Recomputation (train.recompute: selective or full) is the same function:
// two microbatches in flight at once, forwards first and backwards after
// (as a pipeline stage runs them, both sharing the one recomputed layer),
// give bit-identical losses and gradients to a stage that keeps every
// block's activations, in less memory (full least). In bf16 too, where the
// MLP's GELU output is kept rounded per layer and microbatch (none under
// full recomputation): a kept copy of the wrong layer or microbatch breaks
// the identity.
void CheckRecomputation(kernels::Ops* ops);
TEST(GptStage, RecomputationGivesBitIdenticalGradients) {
  for (kernels::Ops* ops : {&kernels::CpuOps(), &kernels::CpuBf16Ops()}) {
    if (ops == &kernels::CpuBf16Ops() && !kernels::CpuHasBf16()) {
      continue;  // no bf16 matmul on this CPU (the trainer refuses bf16)
    }
    SCOPED_TRACE(ops->name());
    CheckRecomputation(ops);
  }
}

void CheckRecomputation(kernels::Ops* ops) {
  GptConfig c = kTiny;
  c.n_layer = 3;
  const int B = 2, T = 8;
  std::vector<int32_t> in(2 * B * T), tg(2 * B * T);
  for (int i = 0; i < 2 * B * T; ++i) {
    in[i] = CounterRandom64(9, 1, i) % c.vocab_size;
    tg[i] = CounterRandom64(9, 2, i) % c.vocab_size;
  }
  std::vector<std::unique_ptr<GptStage>> runs;
  std::vector<std::vector<float>> losses;
  for (Recompute recompute :
       {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    StageOptions o;
    o.max_B = B;
    o.max_T = T;
    o.slots = 2;
    o.recompute = recompute;
    o.ops = ops;
    runs.push_back(std::make_unique<GptStage>(c, BuildPlan(c, {}), o));
    GptStage& st = *runs.back();
    st.InitParams(7);
    st.ZeroGrad();
    losses.emplace_back();
    for (int mb = 0; mb < 2; ++mb) {
      losses.back().push_back(st.Forward(mb, in.data() + mb * B * T, nullptr,
                                         tg.data() + mb * B * T, B, T));
    }
    for (int mb = 0; mb < 2; ++mb) {
      st.Backward(mb, in.data() + mb * B * T, tg.data() + mb * B * T,
                  1.0f / (2 * B * T), nullptr);
    }
  }
  for (size_t r = 1; r < runs.size(); ++r) {
    SCOPED_TRACE(r == 1 ? "selective" : "full");
    EXPECT_EQ(losses[0], losses[r]);
    double scale = 0;
    for (int64_t i = 0; i < runs[0]->buffer_size(); ++i) {
      ASSERT_EQ(runs[0]->grads()[i], runs[r]->grads()[i]) << "element " << i;
      scale = std::max(scale, double(std::fabs(runs[0]->grads()[i])));
    }
    EXPECT_GT(scale, 0.0);
    EXPECT_LT(runs[r]->memory().activations, runs[r - 1]->memory().activations);
  }
}

// A zero-bubble schedule runs each backward as B (input gradients) and,
// later, W (the linear layers' weight gradients). Two pipeline stages with
// two microbatches in flight, run F0 F1 B0 B1 W0 W1 (W0 after the other
// microbatch's B: what B leaves for W must be the slot's own), give bit
// for bit the gradients and the input gradient
// Backward gives, with and without recomputation, fused classifier or not,
// in fp32 and bf16; and keep no fewer activations (the linear layers'
// output gradients), as ActivationFloats counts them — on a longer
// sequence, where what attention keeps is as large as fch's gradient, in
// fp32 without recomputation not one float more: every kept gradient sits
// where B is done.
void CheckSplitBackward(kernels::Ops* ops, Recompute recompute, bool fused,
                        bool long_sequence);
TEST(GptStage, SplitBackwardGivesBitIdenticalGradients) {
  for (kernels::Ops* ops : {&kernels::CpuOps(), &kernels::CpuBf16Ops()}) {
    if (ops == &kernels::CpuBf16Ops() && !kernels::CpuHasBf16()) {
      continue;  // no bf16 matmul on this CPU (the trainer refuses bf16)
    }
    for (Recompute r :
         {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      for (bool fused : {false, true}) {
        for (bool long_sequence : {false, true}) {
          SCOPED_TRACE(ops->name() + " recompute " +
                       std::to_string(static_cast<int>(r)) +
                       (fused ? " fused" : "") +
                       (long_sequence ? " long" : ""));
          CheckSplitBackward(ops, r, fused, long_sequence);
        }
      }
    }
  }
}

void CheckSplitBackward(kernels::Ops* ops, Recompute recompute, bool fused,
                        bool long_sequence) {
  GptConfig c = kTiny;
  c.n_layer = 4;
  // Long: 2 heads of 4 over 16 positions keep 2·16·16 probabilities a
  // sequence, fch's gradient 16·32.
  if (long_sequence) c.n_embd = 8, c.block_size = 16;
  const int B = 2, T = c.block_size, pp = 2, m = 2;
  std::vector<int32_t> in(m * B * T), tg(m * B * T);
  for (int i = 0; i < m * B * T; ++i) {
    in[i] = CounterRandom64(12, 1, i) % c.vocab_size;
    tg[i] = CounterRandom64(12, 2, i) % c.vocab_size;
  }
  const float dloss = 1.0f / (m * B * T);
  // [split][stage]
  std::vector<std::unique_ptr<GptStage>> runs[2];
  std::vector<float> dinputs[2];
  for (int split = 0; split < 2; ++split) {
    StageOptions o;
    o.slots = m;
    o.recompute = recompute;
    o.ops = ops;
    o.split_backward = split == 1;
    runs[split] = Stages(c, B, T, pp, 3, o);
    auto& st = runs[split];
    for (int s = 0; s < pp; ++s) {
      EXPECT_EQ(st[s]->memory().activations,
                static_cast<int64_t>(sizeof(float)) *
                    GptStage::ActivationFloats(c, B, T, m, 1, false, recompute,
                                               c.n_layer / pp, s == pp - 1, ops,
                                               o.split_backward));
    }
    for (int mb = 0; mb < m; ++mb) {
      st[0]->Forward(mb, in.data() + mb * B * T, nullptr, nullptr, B, T);
      st[1]->Forward(mb, nullptr, st[0]->output(mb), tg.data() + mb * B * T, B,
                     T, fused ? dloss : 0.0f);
    }
    for (int mb = 0; mb < m; ++mb) {
      for (int s = pp - 1; s >= 0; --s) {
        const float* dout = s == pp - 1 ? nullptr : st[1]->dinput();
        const int32_t* t = tg.data() + mb * B * T;
        if (split == 1) {
          st[s]->BackwardInput(mb, in.data() + mb * B * T, t, dloss, dout);
        } else {
          st[s]->Backward(mb, in.data() + mb * B * T, t, dloss, dout);
        }
      }
      std::vector<float>& d = dinputs[split];
      const int64_t n = int64_t{B} * T * c.n_embd;
      d.resize(d.size() + n);
      ops->ToHost(d.data() + d.size() - n, st[1]->dinput(), n);
    }
    if (split == 1) {
      for (int mb = 0; mb < m; ++mb) {
        for (int s = pp - 1; s >= 0; --s) st[s]->BackwardWeights(mb);
      }
    }
  }
  EXPECT_EQ(dinputs[0], dinputs[1]);
  for (int s = 0; s < pp; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const int64_t n = runs[0][s]->buffer_size();
    std::vector<float> whole(n), split(n);
    ops->ToHost(whole.data(), runs[0][s]->grads(), n);
    ops->ToHost(split.data(), runs[1][s]->grads(), n);
    double scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(whole[i], split[i]) << "element " << i;
      scale = std::max(scale, double(std::fabs(whole[i])));
    }
    EXPECT_GT(scale, 0.0);
    const int64_t whole_bytes = runs[0][s]->memory().activations;
    const int64_t split_bytes = runs[1][s]->memory().activations;
    if (long_sequence && recompute == Recompute::kNone &&
        ops == &kernels::CpuOps()) {
      EXPECT_EQ(split_bytes, whole_bytes);
    } else {
      EXPECT_GT(split_bytes, whole_bytes);
    }
  }
}

// Training's forward with dloss computes the logits' gradient with the loss
// (the fused classifier); its backward then starts from it. Two microbatches
// in flight, one fused and one not, give bit for bit what the unfused
// forward and backward give in fp32; under bf16 the fused classifier works
// from the logits stored in bf16 (its gradient rounded over them), so the
// loss and the gradients are those of the unfused run to bf16's rounding.
TEST(GptStage, FusedClassifierGivesTheUnfusedLossAndGradients) {
  const int B = 2, T = 8;
  std::vector<int32_t> in(2 * B * T), tg(2 * B * T);
  for (int i = 0; i < 2 * B * T; ++i) {
    in[i] = CounterRandom64(4, 1, i) % kTiny.vocab_size;
    tg[i] = CounterRandom64(4, 2, i) % kTiny.vocab_size;
  }
  const float dloss = 1.0f / (2 * B * T);
  for (kernels::Ops* ops : {&kernels::CpuOps(), &kernels::CpuBf16Ops()}) {
    if (ops == &kernels::CpuBf16Ops() && !kernels::CpuHasBf16()) {
      continue;  // no bf16 matmul on this CPU (the trainer refuses bf16)
    }
    SCOPED_TRACE(ops->name());
    std::vector<std::unique_ptr<GptStage>> runs;
    std::vector<std::vector<float>> losses;
    for (bool fused : {false, true}) {
      StageOptions o;
      o.max_B = B;
      o.max_T = T;
      o.slots = 2;
      o.ops = ops;
      runs.push_back(
          std::make_unique<GptStage>(kTiny, BuildPlan(kTiny, {}), o));
      GptStage& st = *runs.back();
      st.InitParams(5);
      st.ZeroGrad();
      losses.emplace_back();
      for (int mb = 0; mb < 2; ++mb) {
        // The fused run fuses the first microbatch only.
        const float fold = fused && mb == 0 ? dloss : 0.0f;
        losses.back().push_back(st.Forward(mb, in.data() + mb * B * T, nullptr,
                                           tg.data() + mb * B * T, B, T, fold));
        // The row holds the gradient (summing to 0) where fused, else the
        // probabilities (summing to 1); the gradient in bf16 under bf16.
        double row = 0;
        const bool packed = fold != 0.0f && ops == &kernels::CpuBf16Ops();
        std::vector<float> values(st.logits(mb),
                                  st.logits(mb) + st.vocab_local());
        if (packed) {
          kernels::FromBf16Values(
              values.data(), reinterpret_cast<const uint16_t*>(st.logits(mb)),
              st.vocab_local());
        }
        for (float v : values) row += v;
        EXPECT_NEAR(row, fold != 0.0f ? 0.0 : 1.0, packed ? 1e-6 : 1e-5)
            << "microbatch " << mb;
      }
      for (int mb = 0; mb < 2; ++mb) {
        st.Backward(mb, in.data() + mb * B * T, tg.data() + mb * B * T, dloss,
                    nullptr);
      }
    }
    double scale = 0, diff = 0;
    for (int64_t i = 0; i < runs[0]->buffer_size(); ++i) {
      scale = std::max(scale, double(std::fabs(runs[0]->grads()[i])));
      diff = std::max(
          diff, double(std::fabs(runs[0]->grads()[i] - runs[1]->grads()[i])));
    }
    EXPECT_GT(scale, 0.0);
    if (ops == &kernels::CpuOps()) {
      EXPECT_EQ(losses[0], losses[1]);
      for (int64_t i = 0; i < runs[0]->buffer_size(); ++i) {
        ASSERT_EQ(runs[0]->grads()[i], runs[1]->grads()[i]) << "element " << i;
      }
    } else {
      for (int mb = 0; mb < 2; ++mb) {
        // The unfused second microbatch is the same either way.
        if (mb == 1) {
          EXPECT_EQ(losses[1][mb], losses[0][mb]);
        } else {
          EXPECT_NEAR(losses[1][mb], losses[0][mb], 1e-2 * losses[0][mb]);
          EXPECT_NE(losses[1][mb], losses[0][mb]);  // the stored logits
        }
      }
      EXPECT_LE(diff, 2e-2 * scale);
    }
  }
}

// One call over every run of decay settings updates each run as
// adamw_update does on it alone, with weight decay only where the run
// decays, and leaves the elements between runs untouched.
TEST(AdamW, UpdateOverRunsIsTheUpdateOfEachRun) {
  const int64_t n = 1000;
  std::vector<float> p0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = static_cast<float>(CounterRandom64(6, 1, i) % 1000) / 500.0f - 1;
    g[i] = static_cast<float>(CounterRandom64(6, 2, i) % 1000) / 500.0f - 1;
  }
  const std::vector<kernels::Ops::Run> runs = {
      {0, 300, 1}, {300, 10, 0}, {320, 500, 1}, {900, 100, 0}};
  std::vector<float> p = p0, m(n, 0.1f), v(n, 0.2f);
  std::vector<float> p_each = p0, m_each = m, v_each = v;
  // The same with the bf16 compute copy written beside (its gaps marked).
  std::vector<float> p_copy = p0, m_copy = m, v_copy = v;
  std::vector<uint16_t> copy(n, 0xabcd);
  kernels::Ops& ops = kernels::CpuOps();
  for (int t = 1; t <= 2; ++t) {
    ops.adamw_update_runs(p.data(), nullptr, m.data(), v.data(), g.data(),
                          runs.data(), static_cast<int>(runs.size()), 0.01f,
                          0.9f, 0.95f, 1e-8f, 0.1f, t, 0.5f);
    ops.adamw_update_runs(p_copy.data(), copy.data(), m_copy.data(),
                          v_copy.data(), g.data(), runs.data(),
                          static_cast<int>(runs.size()), 0.01f, 0.9f, 0.95f,
                          1e-8f, 0.1f, t, 0.5f);
    for (const auto& r : runs) {
      ops.adamw_update(p_each.data() + r.begin, m_each.data() + r.begin,
                       v_each.data() + r.begin, g.data() + r.begin, r.count,
                       0.01f, 0.9f, 0.95f, 1e-8f, r.tag ? 0.1f : 0.0f, t, 0.5f);
    }
  }
  EXPECT_EQ(p, p_each);
  EXPECT_EQ(m, m_each);
  EXPECT_EQ(v, v_each);
  EXPECT_EQ(p_copy, p_each);
  EXPECT_EQ(m_copy, m_each);
  EXPECT_EQ(v_copy, v_each);
  for (int64_t i = 310; i < 320; ++i) ASSERT_EQ(p[i], p0[i]) << i;
  for (int64_t i = 820; i < 900; ++i) ASSERT_EQ(p[i], p0[i]) << i;
  std::vector<uint16_t> rounded(n);
  kernels::RoundToBf16Rows(rounded.data(), p_each.data(), 1, n);
  for (const auto& r : runs) {
    for (int64_t i = r.begin; i < r.begin + r.count; ++i) {
      ASSERT_EQ(copy[i], rounded[i]) << i;
    }
  }
  for (int64_t i = 310; i < 320; ++i) ASSERT_EQ(copy[i], 0xabcd) << i;
  for (int64_t i = 820; i < 900; ++i) ASSERT_EQ(copy[i], 0xabcd) << i;
}

// A step in pieces (BeginStep, then Update over ranges that cut runs and
// fall in the gaps between them, in any order): bit for bit one Step, and
// the gaps untouched.
TEST(AdamW, StepInPiecesIsTheWholeStep) {
  const int64_t n = 1000;
  std::vector<ParamInfo> layout(3);
  layout[0].name = "a";
  layout[0].offset = 0;
  layout[0].numel = 300;
  layout[0].decay = true;
  layout[1].name = "b";
  layout[1].offset = 310;
  layout[1].numel = 500;
  layout[2].name = "c";
  layout[2].offset = 900;
  layout[2].numel = 100;
  layout[2].decay = true;
  v1::TrainSpec train = DefaultJobSpec().train();
  train.set_weight_decay(0.1);
  std::vector<float> p0(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = static_cast<float>(CounterRandom64(8, 1, i) % 1000) / 500.0f - 1;
    g[i] = static_cast<float>(CounterRandom64(8, 2, i) % 1000) / 500.0f - 1;
  }
  AdamW whole(layout, 0, n, train), pieces(layout, 0, n, train);
  std::vector<float> p = p0, q = p0;
  const std::vector<std::pair<int64_t, int64_t>> cuts = {
      {600, 1000}, {0, 150}, {305, 600}, {150, 305}};
  for (int t = 0; t < 3; ++t) {
    whole.Step(p.data(), nullptr, g.data(), 0.01f, 0.5f);
    pieces.BeginStep();
    for (const auto& [lo, hi] : cuts) {
      pieces.Update(q.data(), nullptr, g.data(), lo, hi, 0.01f, 0.5f);
    }
  }
  EXPECT_EQ(q, p);
  EXPECT_EQ(0, std::memcmp(pieces.m(), whole.m(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(pieces.v(), whole.v(), n * sizeof(float)));
  EXPECT_EQ(pieces.steps_taken(), 3);
  for (int64_t i = 300; i < 310; ++i) ASSERT_EQ(q[i], p0[i]) << i;
  for (int64_t i = 810; i < 900; ++i) ASSERT_EQ(q[i], p0[i]) << i;
}

// ZeRO-Offload's step (parallel.offload=optimizer: the moments and a
// master copy of the weights in host memory, AdamW on the CPU cores) gives
// the step on the store's backend bit for bit — weights, moments, gradient
// norm, and under bf16 the weights' compute copy — over steps with new
// weights written between (as a checkpoint load writes them: the master
// copy is taken again). On the CPU the store's memory is the host's too,
// so this holds the bookkeeping; tests/gpu holds the copies on a GPU.
TEST(DistributedOptimizer, OffloadedStepIsTheStepOnTheBackend) {
  // Over 2^21 elements: the offloaded step goes in pieces.
  const GptConfig config{4, 4, 256, 8, 33, 128};
  const std::vector<ParamInfo> layout = BuildPlan(config, {});
  v1::TrainSpec train = DefaultJobSpec().train();
  train.set_grad_clip(0.5);
  train.set_weight_decay(0.1);
  std::vector<bool> precisions = {false};
  if (kernels::CpuHasBf16()) precisions.push_back(true);
  for (const bool bf16 : precisions) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    ZeroOptions zo;
    zo.bf16_weights = bf16;
    kernels::Ops* ops = bf16 ? &kernels::CpuBf16Ops() : &kernels::CpuOps();
    ZeroStore plain_store(layout, 1, zo, nullptr, ops);
    ZeroStore off_store(layout, 1, zo, nullptr, ops);
    plain_store.InitParams(3);
    off_store.InitParams(3);
    DistributedOptimizer plain(&plain_store, train, {});
    DistributedOptimizer off(&off_store, train, {}, /*offload=*/true);
    const int64_t n = plain_store.update_size();
    ASSERT_GE(n, int64_t{2} << 20);
    for (int step = 0; step < 4; ++step) {
      for (ZeroStore* st : {&plain_store, &off_store}) {
        float* g = st->update_grads();
        uint32_t x = 2463534242u + step;  // xorshift: the same on both
        for (int64_t i = 0; i < n; ++i) {
          x ^= x << 13;
          x ^= x >> 17;
          x ^= x << 5;
          g[i] = static_cast<float>(x % 2001) / 1000.0f - 1.0f;
        }
        if (step == 2) {  // new weights, as a load writes them
          float* p = st->update_params();
          for (int64_t i = 0; i < n; ++i) p[i] *= 0.5f;
        }
      }
      const float lr = 1e-2f * (step + 1);
      EXPECT_EQ(off.Step(lr).grad_norm, plain.Step(lr).grad_norm) << step;
      ASSERT_EQ(0, std::memcmp(off_store.update_params(),
                               plain_store.update_params(), n * sizeof(float)))
          << step;
      ASSERT_EQ(
          0, std::memcmp(off.adam().m(), plain.adam().m(), n * sizeof(float)))
          << step;
      ASSERT_EQ(
          0, std::memcmp(off.adam().v(), plain.adam().v(), n * sizeof(float)))
          << step;
      if (!bf16) continue;
      for (int u = 0; u < static_cast<int>(plain_store.units().size()); ++u) {
        const int64_t bytes = plain_store.units()[u].size * 2;
        ASSERT_EQ(0, std::memcmp(off_store.Weights(u).p,
                                 plain_store.Weights(u).p, bytes))
            << step << " unit " << u;
      }
    }
    // Adam's moments are the host's; the store's buffers stay with it.
    EXPECT_EQ(&off.adam().ops(), &kernels::CpuOps());
  }
}

// The gradient norm's sums over tagged runs: each tag's runs summed in// The
// gradient norm's sums over tagged runs: each tag's runs summed in order, the
// elements between runs left out.
TEST(AdamW, SumSquaresOverRunsSumsEachTag) {
  std::vector<float> x(100);
  for (int i = 0; i < 100; ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  const std::vector<kernels::Ops::Run> runs = {
      {0, 10, 0}, {10, 5, 1}, {20, 30, 0}, {60, 40, 1}};
  double sums[2] = {-1.0, -1.0};
  kernels::CpuOps().SumSquaresRuns(x.data(), runs.data(), 4, sums);
  double want[2] = {0.0, 0.0};
  for (const auto& r : runs) {
    for (int64_t i = r.begin; i < r.begin + r.count; ++i) {
      want[r.tag] += double(x[i]) * x[i];
    }
  }
  EXPECT_EQ(sums[0], want[0]);
  EXPECT_EQ(sums[1], want[1]);
  EXPECT_GT(sums[0], 0.0);
  EXPECT_GT(sums[1], 0.0);
}

TEST(GptStage, ShorterSequencesUseTheFrontOfTheBuffers) {
  // Forward on (1,T') inside a model allocated for (2,8) gives the logits
  // that a model allocated for exactly (1,T') gives.
  std::vector<int32_t> in = {1, 5, 7, 2, 9};
  auto big = Stage(kTiny, 2, 8), exact = Stage(kTiny, 1, 5);
  big->InitParams(11);
  exact->InitParams(11);
  big->Forward(0, in.data(), nullptr, nullptr, 1, 5);
  exact->Forward(0, in.data(), nullptr, nullptr, 1, 5);
  for (int i = 0; i < 5 * kTiny.padded_vocab; ++i) {
    ASSERT_FLOAT_EQ(big->logits(0)[i], exact->logits(0)[i]) << i;
  }
}

// Generation: a sequence decoded in pieces through the key/value cache,
// on one stage and on two chained ones, gives every position the logits
// the whole sequence's forward gives it; a Decode at 0 starts afresh.
TEST(GptStage, DecodeInPiecesMatchesTheWholeForward) {
  GptConfig c = kTiny;
  c.block_size = 16;
  const int T = 16, Vp = c.padded_vocab;
  std::vector<int32_t> first(T), second(T);
  for (int i = 0; i < T; ++i) {
    first[i] = CounterRandom64(6, 1, i) % c.vocab_size;
    second[i] = CounterRandom64(6, 2, i) % c.vocab_size;
  }
  auto whole = Stage(c, 2, T);
  whole->InitParams(3);
  for (int pp : {1, 2}) {
    std::vector<std::unique_ptr<GptStage>> stages = Stages(c, 2, T, pp, 3);
    for (const std::vector<int32_t>* seq : {&first, &second}) {
      whole->Forward(0, seq->data(), nullptr, nullptr, 1, T);
      const std::vector<float> want(whole->logits(0),
                                    whole->logits(0) + int64_t{T} * Vp);
      float scale = 0.0f;
      for (float x : want) scale = std::max(scale, std::fabs(x));
      int pos = 0;
      for (int n : {3, 1, 1, 6, 1, 4}) {
        for (int s = 0; s < pp; ++s) {
          stages[s]->Decode(seq->data() + pos,
                            s > 0 ? stages[s - 1]->output(0) : nullptr, n, pos);
        }
        const float* got = stages.back()->logits(0);
        for (int64_t i = 0; i < int64_t{n} * Vp; ++i) {
          ASSERT_NEAR(got[i], want[pos * Vp + i], 1e-5f * scale)
              << "pp " << pp << " position " << pos + i / Vp;
        }
        pos += n;
      }
      ASSERT_EQ(pos, T);
    }
  }
}

// Sampling with the key/value cache picks the tokens that recomputing the
// whole context for every token picks, past the block size too (where the
// context restarts from its last half). The model is trained a little
// first, so that its text varies and each pick depends on the whole
// context.
TEST(TrainerSample, KvCacheGivesTheTokensOfRecomputation) {
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"model.n_layer=2", "model.n_embd=32", "model.n_head=2",
       "model.block_size=16", "train.sample_tokens=45", "train.lr=1e-2",
       "train.warmup_steps=0", "train.global_batch=16", "train.sample_top_k=0",
       "parallel.dp=1", "parallel.zero=0", "parallel.microbatches=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.peak_flops = 1e12;
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int64_t step = 0; step < 60; ++step) (*trainer)->TrainStep(step);
  for (uint64_t salt : {1u, 2u}) {
    const std::string cached =
        (*trainer)->sampler().Sample(salt, TextSampler::Mode::kKvCache);
    const std::string recomputed =
        (*trainer)->sampler().Sample(salt, TextSampler::Mode::kRecompute);
    std::printf("salt %llu: %s\n", static_cast<unsigned long long>(salt),
                cached.c_str());
    EXPECT_EQ(cached, recomputed) << "salt " << salt;
    EXPECT_EQ(cached.size(), std::string("ROMEO:").size() + 45);
  }
}

// A model of GPT-2 ids samples text: the prompt through GPT-2's encoder,
// the continuation decoded (UTF-8 whatever the ids), both runs alike.
TEST(TrainerSample, Gpt2SamplesAreText) {
  const std::string path = TempPath("gpt2_sample.txt");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "To be, or not to be: that is it.\n";
  std::ofstream(path) << text;
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"model.n_layer=1", "model.n_embd=32", "model.n_head=2",
       "model.block_size=16", "train.sample_tokens=12",
       "train.sample_prompt=To be", "data.path=" + path, "data.tokenizer=gpt2",
       "train.global_batch=4", "parallel.dp=1", "parallel.zero=0",
       "parallel.microbatches=1"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.peak_flops = 1e12;
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (int64_t step = 0; step < 30; ++step) (*trainer)->TrainStep(step);
  const std::string sample = (*trainer)->sampler().Sample(1);
  std::printf("sample: %s\n", sample.c_str());
  EXPECT_EQ(sample.rfind("To be", 0), 0u) << sample;
  EXPECT_GT(sample.size(), std::string("To be").size());
  EXPECT_EQ(FirstInvalidUtf8(sample), -1);
  std::filesystem::remove(path);
}

// The char tokenizer over Unicode: a character is one token whatever its
// UTF-8 length, and whatever ids a model samples decode to UTF-8.
const char kMixedScripts[] =
    "Ça va? Ελληνικά, русский, العربية, हिन्दी, 中文, 日本語, 한국어 "
    "😀👍🏽🇫🇷\n";

TEST(CharTokenizer, AMultibyteCharacterIsOneToken) {
  auto t = CharTokenizer::FromText("aé中😀", "data.path", "x");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 4);
  // Ids in code point order: a U+0061, é U+00E9, 中 U+4E2D, 😀 U+1F600.
  EXPECT_EQ(t->Encode("😀中éa"), (std::vector<int32_t>{3, 2, 1, 0}));
  EXPECT_EQ(t->vocab(), "aé中😀");
  EXPECT_EQ(t->Decode({1}), "é");
}

TEST(CharTokenizer, EncodeDecodeRoundTripsMixedScripts) {
  auto t = CharTokenizer::FromText(kMixedScripts, "data.path", "x");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<int32_t> ids = t->Encode(kMixedScripts);
  EXPECT_EQ(t->Decode(ids), kMixedScripts);
  // One id a character: fewer ids than bytes, each below the vocabulary.
  EXPECT_LT(ids.size(), std::string(kMixedScripts).size());
  for (int32_t id : ids) EXPECT_LT(id, t->size());
  // The recorded vocabulary rebuilds the same tokenizer.
  auto again = CharTokenizer::FromVocab(t->vocab());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->Encode(kMixedScripts), ids);
}

TEST(CharTokenizer, AnyIdsDecodeToUtf8) {
  auto t = CharTokenizer::FromText(kMixedScripts, "data.path", "x");
  ASSERT_TRUE(t.ok()) << t.status();
  // What sampling can produce, and worse: every id, in any order, and ids
  // outside the vocabulary.
  std::vector<int32_t> ids;
  for (int i = 0; i < 4000; ++i) {
    ids.push_back(
        static_cast<int32_t>(CounterRandom64(7, 1, static_cast<uint64_t>(i)) %
                             (t->size() + 10)) -
        5);
  }
  const std::string text = t->Decode(ids);
  EXPECT_GT(text.size(), 4000u);
  EXPECT_EQ(FirstInvalidUtf8(text), -1);
}

TEST(TokenData, TextThatIsNotUtf8IsRefusedNamingTheFieldOffsetAndLine) {
  const std::string path = TempPath("latin1.txt");
  for (const auto& [bytes, needle] :
       std::vector<std::pair<std::string, std::string>>{
           // Latin-1 é, a cut 3-byte character, a UTF-16 surrogate.
           {"hello\nwor\xE9ld", "byte 0xE9 at byte offset 9 (line 2)"},
           {"ab\n\ncd\xE4\xB8", "byte 0xE4 at byte offset 6 (line 3)"},
           {"x\xED\xA0\x80y", "byte 0xED at byte offset 1 (line 1)"}}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    v1::DataSpec spec;
    spec.set_path(path);
    spec.set_tokenizer("char");
    spec.set_val_fraction(0.25);
    const absl::Status s = LoadTokenData(spec, 0, 2).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("data.path: '" + path +
                               "' is not UTF-8 text: " + needle),
              std::string::npos)
        << s;
  }
  std::filesystem::remove(path);
}

TEST(CharTokenizer, MoreDistinctCharactersThanTokenIdsIsRefused) {
  // U+10000 onwards: one character more than 16-bit ids leave room for,
  // then exactly as many.
  std::string text;
  for (char32_t c = 0x10000; c < 0x10000 + CharTokenizer::kMaxSize + 1; ++c) {
    AppendChar(c, &text);
  }
  const absl::Status s =
      CharTokenizer::FromText(text, "data.path", "big.txt").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data.path: 'big.txt' has 65536 distinct "
                             "characters; the char tokenizer holds at most "
                             "65535"),
            std::string::npos)
      << s;
  text.resize(text.size() - 4);  // the last character
  auto fits = CharTokenizer::FromText(text, "data.path", "big.txt");
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->size(), CharTokenizer::kMaxSize);
}

TEST(RunLog, StringThatIsNotUtf8IsWrittenAsAValidJsonLine) {
  const std::string path = TempPath("runlog.jsonl");
  {
    auto log = RunLog::Open(path);
    ASSERT_TRUE(log.ok()) << log.status();
    // A cut 3-byte character and a byte that never begins one.
    (*log)->Write(
        {{"type", "sample"}, {"step", 1}, {"text", "ok \xE4\xB8\xFF!"}});
    (*log)->Write({{"type", "end"}, {"step", 1}});
  }
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> records;
  while (std::getline(in, line)) {
    EXPECT_EQ(FirstInvalidUtf8(line), -1) << line;
    records.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(records.size(), 2u);
  const std::string text = records[0]["text"];
  EXPECT_EQ(text.rfind("ok ", 0), 0u) << text;
  EXPECT_NE(text.find("\uFFFD"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '!');
  std::filesystem::remove(path);
}

// A model of a Unicode text samples whole characters, trained or not.
TEST(TrainerSample, SampleOfAUnicodeTextIsUtf8) {
  const std::string path = TempPath("mixed.txt");
  {
    std::ofstream out(path);
    for (int i = 0; i < 30; ++i) out << kMixedScripts;
  }
  auto spec = LoadJobSpecFile(
      "examples/shakespeare-char.yaml",
      {"data.path=" + path, "model.n_layer=1", "model.n_embd=32",
       "model.n_head=2", "model.block_size=16", "train.sample_tokens=200",
       "train.sample_prompt=Ça", "train.sample_top_k=0",
       "train.sample_temperature=2.0", "checkpoint.every=0",
       "checkpoint.dir=''"});
  ASSERT_TRUE(spec.ok()) << spec.status();
  TrainerOptions options;
  options.peak_flops = 1e12;
  auto trainer = Trainer::Create(*spec, options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (uint64_t salt : {1u, 2u, 3u}) {
    const std::string text = (*trainer)->sampler().Sample(salt);
    EXPECT_EQ(FirstInvalidUtf8(text), -1) << text;
    EXPECT_EQ(text.rfind("Ça", 0), 0u) << text;
  }
  std::filesystem::remove(path);
}

// A NaN or Inf loss or gradient norm is always an anomaly; a spike is a
// loss above spike_factor × the median of the window of good losses, once
// the window holds enough of them; a bad loss never joins the window.
TEST(AnomalyGuard, TellsNonFiniteNumbersAndSpikesOverTheMedian) {
  v1::AnomalySpec spec;
  spec.set_spike_factor(3.0);
  spec.set_window(20);
  AnomalyGuard g(spec);
  EXPECT_EQ(g.Check(1, std::nan(""), 1.0).kind, "nan");
  EXPECT_EQ(g.Check(2, 1.0, INFINITY).kind, "nan");
  EXPECT_NE(g.Check(2, 1.0, INFINITY).reason.find("gradient norm inf"),
            std::string::npos);
  EXPECT_EQ(g.Check(3, 100.0, 1.0).kind, "");  // too few losses to tell
  for (int s = 4; s < 30; ++s) EXPECT_EQ(g.Check(s, 2.0, 1.0).kind, "") << s;
  EXPECT_EQ(g.Check(30, 5.9, 1.0).kind, "");  // under 3 × 2
  const AnomalyGuard::Verdict spike = g.Check(31, 6.1, 1.0);
  EXPECT_EQ(spike.kind, "spike");
  EXPECT_NE(spike.reason.find("median of the last 20 steps"), std::string::npos)
      << spike.reason;
  EXPECT_EQ(g.Check(32, 6.1, 1.0).kind, "spike");  // it never joined
  spec.set_spike_factor(0);  // off: only NaN and Inf count
  AnomalyGuard off(spec);
  for (int s = 1; s < 30; ++s) off.Check(s, 2.0, 1.0);
  EXPECT_EQ(off.Check(30, 1e9, 1.0).kind, "");
}

// A rollback's candidates are the lineage's folders at or before the step
// it is at, newest first; a folder saved again moves to its new step; after
// a rollback the abandoned stretch past its target is forgotten.
TEST(CheckpointLineage, OffersOnlyItsOwnFoldersAtOrBeforeTheStep) {
  CheckpointLineage l;
  EXPECT_TRUE(l.At(100).empty());
  l.Add(10, "ck/step-10");
  l.Add(30, "ck/step-30");
  l.Add(20, "ck/step-20");
  EXPECT_EQ(l.At(12), std::vector<std::string>{"ck/step-10"});
  EXPECT_EQ(l.At(30), (std::vector<std::string>{"ck/step-30", "ck/step-20",
                                                "ck/step-10"}));
  EXPECT_TRUE(l.At(9).empty());
  l.DropAfter(20);
  EXPECT_EQ(l.At(100), (std::vector<std::string>{"ck/step-20", "ck/step-10"}));
  l.Add(5, "ck/step-20");  // the same folder again: one entry, its new step
  EXPECT_EQ(l.At(100), (std::vector<std::string>{"ck/step-10", "ck/step-20"}));
}

}  // namespace
}  // namespace ptrain
