// data.blend: sources drawn by weight (each within one sequence of its
// share at every point of the run), each source's windows once per epoch
// in a shuffled order, a pure function of (seed, sequence), the same split
// over any ranks; the spec's rules and the loader's refusals.
#include "worker/engine/data/blend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/spec.h"
#include "nlohmann/json.hpp"
#include "worker/engine/data/data.h"
#include "worker/engine/data/step_feed.h"
#include "worker/engine/train/trainer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

TEST(ShuffledIndex, IsAPermutationThatTheKeyChanges) {
  for (uint64_t n : {1, 2, 3, 5, 17, 64, 1000, 4097}) {
    std::set<uint64_t> seen;
    std::vector<uint64_t> order, other;
    for (uint64_t x = 0; x < n; ++x) {
      order.push_back(ShuffledIndex(x, n, 7));
      other.push_back(ShuffledIndex(x, n, 8));
      seen.insert(order.back());
    }
    EXPECT_EQ(seen.size(), n) << n;
    EXPECT_LT(*seen.rbegin(), n) << n;
    if (n >= 17) {
      EXPECT_NE(order, other) << n;
      std::vector<uint64_t> identity(n);
      for (uint64_t x = 0; x < n; ++x) identity[x] = x;
      EXPECT_NE(order, identity) << n;
    }
  }
}

// Sources of `windows` windows of T tokens each (one shard of windows·T+1
// tokens), token i of source k being 1000·k + i (mod 65536).
TokenData Sources(const std::vector<double>& weights,
                  const std::vector<int>& windows, int T) {
  TokenData data;
  data.vocab_size = 65536;
  double total = 0;
  for (double w : weights) total += w;
  for (size_t k = 0; k < weights.size(); ++k) {
    BlendPart part{"s" + std::to_string(k), weights[k] / total};
    for (TokenShards* split : {&data.train, &data.val}) {
      std::vector<uint16_t> ids(static_cast<size_t>(windows[k]) * T + 1);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 * k + i;
      (split == &data.train ? part.train_begin : part.val_begin) =
          split->size();
      split->push_back(TokenStream(ids));
      (split == &data.train ? part.train_end : part.val_end) = split->size();
    }
    data.blend.push_back(part);
  }
  return data;
}

TEST(BlendSampler, EverySourceIsWithinOneSequenceOfItsShareThroughout) {
  const TokenData data = Sources({0.8, 0.2, 0.0, 1.0}, {50, 50, 50, 50}, 4);
  const BlendSampler sampler(&data, 4, 8, 1);
  std::vector<int64_t> taken(4, 0);
  for (int64_t s = 0; s < 2000; ++s) {
    ++taken[sampler.At(s).source];
    for (size_t k = 0; k < taken.size(); ++k) {
      const double share = data.blend[k].weight * static_cast<double>(s + 1);
      ASSERT_LT(std::abs(taken[k] - share), 1.0 + 1e-9)
          << "source " << k << " after " << s + 1 << " sequences";
    }
  }
  EXPECT_EQ(taken[2], 0) << "a source of weight 0 is for validation only";
}

TEST(BlendSampler, AnEpochSeesEveryWindowOnceInANewOrderEachTime) {
  const int W = 37;
  const TokenData data = Sources({1.0}, {W}, 4);
  const BlendSampler sampler(&data, 4, 5, 3);
  EXPECT_EQ(sampler.windows(0), W);
  std::vector<std::vector<int64_t>> epochs(3);
  for (int64_t s = 0; s < 3 * W; ++s) {
    const BlendSampler::Draw d = sampler.At(s);
    ASSERT_EQ(d.epoch, s / W);
    epochs[d.epoch].push_back(d.window);
  }
  std::vector<int64_t> in_order(W);
  for (int w = 0; w < W; ++w) in_order[w] = w;
  for (const auto& e : epochs) {
    std::vector<int64_t> sorted = e;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, in_order) << "every window once";
    EXPECT_NE(e, in_order) << "not in file order";
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_EQ(sampler.EpochsBegun(0), std::vector<int64_t>{0});
  EXPECT_EQ(sampler.EpochsBegun(W), std::vector<int64_t>{1});
  EXPECT_EQ(sampler.EpochsBegun(W + 1), std::vector<int64_t>{2});
}

TEST(BlendSampler, ADrawIsAPureFunctionOfSeedAndSequence) {
  const TokenData data = Sources({0.7, 0.3}, {40, 9}, 4);
  const BlendSampler a(&data, 4, 8, 11), b(&data, 4, 8, 11), c(&data, 4, 8, 12);
  std::vector<BlendSampler::Draw> forward;
  for (int64_t s = 0; s < 300; ++s) forward.push_back(a.At(s));
  bool differs = false;
  // Backwards (as after a rollback) and on a fresh sampler: the same.
  for (int64_t s = 299; s >= 0; --s) {
    const BlendSampler::Draw d = b.At(s);
    EXPECT_EQ(d.source, forward[s].source) << s;
    EXPECT_EQ(d.epoch, forward[s].epoch) << s;
    EXPECT_EQ(d.window, forward[s].window) << s;
    differs |= c.At(s).window != d.window;
  }
  EXPECT_TRUE(differs) << "another train.seed, another order";
}

TEST(BlendSampler, ASequenceIsItsWindowsTokensAndTheTargetsFollowOn) {
  const int T = 4;
  const TokenData data = Sources({0.5, 0.5}, {6, 6}, T);
  const BlendSampler sampler(&data, T, 4, 2);
  std::vector<int32_t> in(4 * T), tg(4 * T);
  sampler.Fill(5, 0, 4, in.data(), tg.data());
  for (int i = 0; i < 4; ++i) {
    const BlendSampler::Draw d = sampler.At(5 * 4 + i);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[i * T + t], 1000 * d.source + d.window * T + t);
      EXPECT_EQ(tg[i * T + t], 1000 * d.source + d.window * T + t + 1);
    }
  }
}

TEST(BlendSampler, AnyDataParallelSplitTrainsOnTheSameBatches) {
  const int T = 4, GB = 8;
  const TokenData data = Sources({0.6, 0.4}, {13, 7}, T);
  const auto batches = [&](int dp) {
    std::vector<std::vector<int32_t>> out;  // per step: the global batch
    std::vector<StepFeed> feeds;
    feeds.reserve(dp);
    for (int r = 0; r < dp; ++r) {
      StepFeed::Shape shape{T, GB, GB / dp, 1, dp, r, 9};
      feeds.emplace_back(&data, shape, CpGroup());
    }
    for (int64_t step = 0; step < 12; ++step) {
      std::vector<int32_t> batch;
      for (StepFeed& f : feeds) {
        f.FillStep(step);
        batch.insert(batch.end(), f.inputs(), f.inputs() + GB / dp * T);
      }
      out.push_back(batch);
    }
    return out;
  };
  const auto one = batches(1);
  EXPECT_EQ(batches(2), one);
  EXPECT_EQ(batches(4), one);
}

TEST(BlendSampler, TheStepASourceRunsOutIsReported) {
  const int T = 4, GB = 4;
  const TokenData data = Sources({0.5, 0.5}, {3, 100}, T);
  StepFeed feed(&data, StepFeed::Shape{T, GB, GB, 1, 1, 0, 1}, CpGroup());
  std::vector<std::pair<int64_t, int64_t>> begun;  // (step, epoch) of s0
  for (int64_t step = 0; step < 4; ++step) {
    for (const StepFeed::EpochBegun& e : feed.FillStep(step)) {
      EXPECT_EQ(e.source, 0);
      begun.emplace_back(step, e.epoch);
    }
  }
  // s0 takes 2 of each 4 sequences and has 3 windows: its 4th sequence
  // (step 1) begins epoch 2, its 7th (step 3) epoch 3.
  const std::vector<std::pair<int64_t, int64_t>> want = {{1, 2}, {3, 3}};
  EXPECT_EQ(begun, want);
}

TEST(BlendSampler, ValidationLossWeighsTheSourcesByTheirShares) {
  const TokenData data = Sources({3, 1, 0}, {5, 5, 5}, 4);
  StepFeed feed(&data, StepFeed::Shape{4, 4, 4, 1, 1, 0, 1}, CpGroup());
  EXPECT_EQ(feed.eval_sources(), 3);
  EXPECT_DOUBLE_EQ(feed.ValLoss({2.0, 4.0, 100.0}), 0.75 * 2.0 + 0.25 * 4.0);
}

// ------------------------------------------------------------- the spec

absl::StatusOr<v1::JobSpec> Parse(const std::string& data_yaml) {
  return ParseJobSpec("name: blend\ndata:\n" + data_yaml, {}, "job.yaml");
}

TEST(BlendSpec, ReadsAListOfSourcesAndWritesItBack) {
  auto spec = Parse(
      "  blend:\n"
      "    - {train_bin: d/web/web_train_*.bin, val_bin: d/web/web_val.bin, "
      "weight: 0.8}\n"
      "    - {name: code, train_bin: d/c_train.bin, val_bin: d/c_val.bin, "
      "weight: 0.2}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->data().blend_size(), 2);
  EXPECT_EQ(BlendSourceName(spec->data().blend(0)), "web");
  EXPECT_EQ(BlendSourceName(spec->data().blend(1)), "code");
  EXPECT_EQ(spec->data().blend(1).weight(), 0.2);
  auto again = ParseJobSpec(JobSpecToYaml(*spec), {}, "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), spec->SerializeAsString());
  // An override gives the whole list.
  auto set = ParseJobSpec(
      "name: blend\ndata: {train_bin: a_train.bin, val_bin: a_val.bin}\n",
      {"data.train_bin=''", "data.val_bin=''",
       "data.blend=[{train_bin: x_train.bin, val_bin: x_val.bin, weight: 1}]"},
      "job.yaml");
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ(set->data().blend_size(), 1);
  EXPECT_EQ(BlendSourceName(set->data().blend(0)), "x");
}

TEST(BlendSpec, BadSourcesAreRefusedNamingTheFieldAndTheRule) {
  const std::string a = "train_bin: a_train.bin, val_bin: a_val.bin";
  const std::string b = "train_bin: b_train.bin, val_bin: b_val.bin";
  std::vector<std::pair<std::string, std::string>> cases = {
      {"  blend:\n    - {" + a + ", weight: -1}\n",
       "data.blend[0].weight=-1 must be a finite number >= 0"},
      {"  blend:\n    - {" + a + ", weight: 0}\n    - {" + b + ", weight: 0}\n",
       "data.blend: the weights are all 0"},
      {"  blend:\n    - {" + a + ", weight: lots}\n",
       "data.blend[0].weight: expected a number"},
      {"  blend:\n    - {" + a + ", weight: .nan}\n",
       "data.blend[0].weight=nan must be a finite number >= 0"},
      {"  blend:\n    - {" + a + ", weight: 1}\n    - {" + a + ", weight: 1}\n",
       "data.blend[1]: the name 'a' is another source's too"},
      {"  blend:\n    - {train_bin: a_train.bin, weight: 1}\n",
       "data.blend[0]: give both train_bin and val_bin"},
      {"  blend:\n    - {train_bin: x.bin, val_bin: y.bin, weight: 1}\n",
       "data.blend[0]: give it a name"},
      {"  train_bin: t_train.bin\n  val_bin: t_val.bin\n  blend:\n    - {" + a +
           ", weight: 1}\n",
       "data.blend replaces data.path and data.train_bin"},
      {"  blend: {" + a + "}\n", "data.blend: expected a list of maps"},
      {"  blend:\n    - 3\n", "data.blend[0]: expected a map of fields"},
      {"  blend:\n    - {" + a + ", wieght: 1}\n",
       "data.blend[0].wieght: unknown key"},
      {"  blend:\n    - {" + a + ", weight: 1, name: " + std::string(65, 'n') +
           "}\n",
       "data.blend[0]: the name 'nnn"},
      {"  blend:\n    - {" + a + ", weight: 1, name: \"a\\tb\"}\n",
       "must be at most 64 bytes without control characters"},
  };
  std::string many = "  blend:\n";
  for (int i = 0; i < 65; ++i) {
    many += "    - {" + a + ", weight: 1, name: s" + std::to_string(i) + "}\n";
  }
  cases.push_back({many, "data.blend: 65 sources; at most 64"});
  for (const auto& [yaml, want] : cases) {
    auto spec = Parse(yaml);
    ASSERT_FALSE(spec.ok()) << yaml;
    EXPECT_NE(spec.status().message().find(want), std::string::npos)
        << spec.status() << "\nwanted: " << want;
  }
}

// ------------------------------------------------------------- loading

class BlendLoad : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("blend_load_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Token files DIR/NAME/NAME_{train,val}.bin of `count` tokens each.
  std::string Corpus(const std::string& name, int count) {
    fs::create_directories(dir_ / name);
    std::vector<uint16_t> ids(count);
    for (int i = 0; i < count; ++i) ids[i] = i % 60;
    for (const char* split : {"train", "val"}) {
      EXPECT_TRUE(
          WriteTokenFile(Prefix(name) + "_" + split + ".bin", ids).ok());
    }
    return Prefix(name);
  }
  std::string Prefix(const std::string& name) const {
    return (dir_ / name / name).string();
  }
  v1::DataSpec Blend(const std::vector<std::string>& prefixes) const {
    v1::DataSpec d = DefaultJobSpec().data();
    for (const std::string& p : prefixes) {
      v1::BlendSource* b = d.add_blend();
      b->set_train_bin(p + "_train.bin");
      b->set_val_bin(p + "_val.bin");
      b->set_weight(1);
    }
    return d;
  }
  fs::path dir_;
};

TEST_F(BlendLoad, SourcesLoadInOrderWithTheirShares) {
  v1::DataSpec d = Blend({Corpus("web", 500), Corpus("code", 300)});
  d.mutable_blend(0)->set_weight(3);
  auto data = LoadTokenData(d, 0, 16);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->blend.size(), 2u);
  EXPECT_EQ(data->blend[0].name, "web");
  EXPECT_DOUBLE_EQ(data->blend[0].weight, 0.75);
  EXPECT_EQ(data->train[data->blend[1].train_begin].size(), 300u);
  EXPECT_EQ(data->val[data->blend[0].val_begin].size(), 500u);
}

TEST_F(BlendLoad, ASourceTooShortForASequenceIsRefusedByName) {
  const v1::DataSpec d = Blend({Corpus("web", 500), Corpus("tiny", 10)});
  auto data = LoadTokenData(d, 0, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find(
                "data.blend[1].train_bin (tiny): its longest file holds 10 "
                "tokens; model.block_size=16 needs 17"),
            std::string::npos)
      << data.status();
}

TEST_F(BlendLoad, SourcesOfAnotherTokenizerAreRefused) {
  // web was prepared without a tokenizer beside it, code with
  // SentencePiece.
  const std::string web = Corpus("web", 500), code = Corpus("code", 500);
  std::ofstream(code + "_spm.model") << "a model";
  auto data = LoadTokenData(Blend({web, code}), 0, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find(
                "data.blend[1] (code): its tokenizer ('spm:"),
            std::string::npos)
      << data.status();
  EXPECT_NE(data.status().message().find("is not data.blend[0]'s (none)"),
            std::string::npos)
      << data.status();
  EXPECT_NE(data.status().message().find("prepare them with the same"),
            std::string::npos)
      << data.status();
}

TEST_F(BlendLoad, TokensPastTheVocabularyAreRefusedByField) {
  const v1::DataSpec d = Blend({Corpus("web", 500), Corpus("code", 500)});
  auto data = LoadTokenData(d, 50, 16);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.status().message().find("data.blend[0].train_bin"),
            std::string::npos)
      << data.status();
}

// A blend job trains, validates each source and, resumed from its
// checkpoint, trains on exactly what the uninterrupted run trained on.
TEST_F(BlendLoad, AJobValidatesEachSourceAndResumesExactly) {
  const std::string web = Corpus("web", 3000), code = Corpus("code", 900);
  const auto run = [&](const std::string& name,
                       const std::string& resume_from) {
    std::vector<std::string> set = {
        "model.n_layer=1",
        "model.n_embd=32",
        "model.vocab_size=64",
        "data.path=''",
        "train.steps=8",
        "train.global_batch=4",
        "train.eval_every=4",
        "train.eval_batches=1",
        "train.sample_tokens=0",
        "checkpoint.every=4",
        "checkpoint.dir=" + (dir_ / name).string(),
        "data.blend=[{train_bin: " + web + "_train.bin, val_bin: " + web +
            "_val.bin, weight: 0.7}, {train_bin: " + code +
            "_train.bin, val_bin: " + code + "_val.bin, weight: 0.3}]"};
    auto spec = LoadJobSpecFile(
        std::string(PT_SOURCE_DIR) + "/examples/shakespeare-char.yaml", set);
    EXPECT_TRUE(spec.ok()) << spec.status();
    TrainerOptions options;
    options.resume_from = resume_from;
    options.log_json_path = (dir_ / (name + ".jsonl")).string();
    options.peak_flops = 100e9;
    options.quiet = true;
    auto trainer = Trainer::Create(*spec, options);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    EXPECT_TRUE((*trainer)->Run().ok());
    std::vector<nlohmann::json> records;
    std::ifstream log(options.log_json_path);
    for (std::string line; std::getline(log, line);) {
      records.push_back(nlohmann::json::parse(line));
    }
    return records;
  };
  const auto whole = run("whole", "");
  const auto resumed = run("resumed", (dir_ / "whole/step-00000004").string());
  std::map<int64_t, float> whole_loss, resumed_loss;
  int evals = 0;
  for (const auto& r : whole) {
    if (r["type"] == "step") whole_loss[r["step"]] = r["loss"];
    if (r["type"] != "eval") continue;
    ++evals;
    const auto& by = r["val_loss_by_source"];
    ASSERT_TRUE(by.contains("web") && by.contains("code")) << r;
    EXPECT_NEAR(r["val_loss"].get<double>(),
                0.7 * by["web"].get<double>() + 0.3 * by["code"].get<double>(),
                1e-6)
        << r;
  }
  EXPECT_EQ(evals, 2);
  for (const auto& r : resumed) {
    if (r["type"] == "step") resumed_loss[r["step"]] = r["loss"];
  }
  ASSERT_EQ(resumed_loss.size(), 4u);
  for (const auto& [step, loss] : resumed_loss) {
    EXPECT_EQ(loss, whole_loss[step]) << "step " << step;
  }
}

}  // namespace
}  // namespace ptrain
