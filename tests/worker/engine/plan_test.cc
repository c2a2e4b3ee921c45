// The parallel plan's steps, each on its own: the tensor table, stages, the
// tensor-parallel plan (every element of every tensor held by exactly one
// tp rank, or by all when replicated), ZeRO units.
#include "worker/engine/model/plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/model/model_parts.h"

namespace ptrain {
namespace {

GptConfig Config(int tp = 1) {
  GptConfig c{/*n_layer=*/4, /*n_head=*/4, /*n_embd=*/24, /*block_size=*/16,
              /*vocab_size=*/65};
  c.padded_vocab = PaddedVocab(c.vocab_size, tp);
  return c;
}

TEST(PaddedVocab, IsAMultipleOf128TimesTp) {
  EXPECT_EQ(PaddedVocab(65, 1), 128);
  EXPECT_EQ(PaddedVocab(128, 1), 128);
  EXPECT_EQ(PaddedVocab(129, 1), 256);
  EXPECT_EQ(PaddedVocab(50257, 1), 50304);  // GPT-2's, as llm.c pads it
  EXPECT_EQ(PaddedVocab(65, 4), 512);
}

TEST(GptTensors, AreTheGpt2StateInOrderWithGlobalShapes) {
  const GptConfig c = Config();
  const std::vector<ParamInfo> t = GptTensors(c);
  ASSERT_EQ(t.size(), 2 + 12 * 4 + 2u);
  EXPECT_EQ(t[0].name, "wte");
  EXPECT_EQ(t[0].global_shape, (std::vector<int64_t>{65, 24}));
  EXPECT_EQ(t[1].name, "wpe");
  EXPECT_EQ(t[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(t[4].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(t[4].global_shape, (std::vector<int64_t>{72, 24}));
  EXPECT_EQ(t[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(t[12].global_shape, (std::vector<int64_t>{24, 96}));
  EXPECT_EQ(t.back().name, "ln_f.bias");
  // Decay on matrices only.
  for (const ParamInfo& p : t) {
    EXPECT_EQ(p.decay, p.global_shape.size() == 2) << p.name;
  }
  // llm.c's count: V·C + T·C + L·(12C² + 13C) + 2C.
  const int64_t C = 24, L = 4;
  EXPECT_EQ(GptNumParams(c),
            65 * C + 16 * C + L * (12 * C * C + 13 * C) + 2 * C);
}

// GPT-2 is its parts: the block's tensors are its parts' in order, and a
// token's FLOPs are 6 per weight but the position table's, plus
// attention's 12·C·T per layer (the count llm.c and PaLM use).
// The plans of pipeline ranks 0 and 1 of two, for rank tp_rank of tp.
std::pair<std::vector<ParamInfo>, std::vector<ParamInfo>> EndStagePlans(
    const GptConfig& c, int tp, int tp_rank) {
  PlanOptions o;
  o.tp = tp;
  o.tp_rank = tp_rank;
  o.pp = 2;
  std::vector<ParamInfo> first = BuildPlan(c, o);
  o.pp_rank = 1;
  return {std::move(first), BuildPlan(c, o)};
}

TEST(ModelParts, Gpt2TensorsAndFlopsAreTheSumOfItsParts) {
  const GptConfig c = Config();
  std::vector<std::string> block;
  for (const auto& part : Gpt2Parts().block) {
    for (const PartTensor& t : part->Tensors(c)) block.push_back(t.name);
  }
  EXPECT_EQ(block, GptBlockTensorNames());
  EXPECT_EQ(block.front(), "ln_1.weight");
  EXPECT_EQ(block.back(), "mlp.c_proj.bias");
  const int64_t C = 24, L = 4, T = 16;
  const double weights = static_cast<double>(GptNumParams(c) - 16 * C);
  EXPECT_EQ(GptFlopsPerToken(c, T), 6.0 * weights + 12.0 * L * C * T);
  EXPECT_EQ(PositionEmbeddingPart()->FlopsPerToken(c, T), 0.0);
  EXPECT_EQ(MultiHeadAttentionPart()->FlopsPerToken(c, T),
            6.0 * (4 * C * C + 4 * C) + 12.0 * C * T);
}

// A Llama token's FLOPs, written out: 6 per weight (the tied head's V·C
// once; per block the query and output projections' C² each, the key and
// value projections' K·C each at their grouped width K, the SwiGLU MLP's
// 3·H·C, two RMSNorm vectors; the final norm's C) plus 12·C·T per block
// for every query head's scores and mix. An untied head counts the same.
TEST(ModelParts, LlamaFlopsPerTokenCountGroupedKeyValueProjectionsByShape) {
  GptConfig c = Config();
  c.arch = "llama";
  c.n_kv_head = 2;
  c.ffn_hidden = 64;
  const double C = 24, L = 4, T = 16, V = 65, H = 64, K = 2 * (24 / 4);
  const double block = 2 * C * C + 2 * K * C + 3 * H * C + 2 * C;
  const double expected = 6.0 * (V * C + L * block + C) + 12.0 * L * C * T;
  EXPECT_EQ(GptFlopsPerToken(c, T), expected);
  EXPECT_EQ(GroupedQueryAttentionPart()->FlopsPerToken(c, T),
            6.0 * (2 * C * C + 2 * K * C) + 12.0 * C * T);
  EXPECT_EQ(SwigluMlpPart()->FlopsPerToken(c, T), 6.0 * 3 * H * C);
  // Fewer key/value heads: fewer FLOPs, by the projections' shapes only.
  GptConfig mqa = c;
  mqa.n_kv_head = 1;
  EXPECT_EQ(GptFlopsPerToken(c, T) - GptFlopsPerToken(mqa, T),
            6.0 * L * 2 * (K / 2) * C);
  c.tie_embeddings = false;
  EXPECT_EQ(GptFlopsPerToken(c, T), expected);
}

// The model config chooses the parts: model.arch "gpt" is GPT-2's; an
// arch without parts is refused where a model would be built from it.
TEST(ModelParts, TheModelConfigChoosesItsParts) {
  GptConfig c = Config();
  EXPECT_EQ(&ModelPartsOf(c), &Gpt2Parts());
  EXPECT_EQ(Gpt2Parts().pairs.size(), 2u);
  EXPECT_EQ(Gpt2Parts().pairs[0].first, Gpt2Parts().block[0].get());
  EXPECT_EQ(Gpt2Parts().pairs[1].second, Gpt2Parts().block[3].get());
  c.arch = "mamba";
  EXPECT_DEATH(ModelPartsOf(c), "a model.arch without parts");
  EXPECT_DEATH(GptTensors(c), "a model.arch without parts");
}

TEST(SplitStages, ContiguousLayersEmbeddingFirstFinalNormLast) {
  std::vector<ParamInfo> t = GptTensors(Config());
  SplitStages(&t, EvenStageLayers(4, 2));
  for (const ParamInfo& p : t) {
    if (p.layer >= 0) {
      EXPECT_EQ(p.stage, p.layer / 2) << p.name;
    } else if (p.name.rfind("ln_f", 0) == 0 || p.tied_copy) {
      EXPECT_EQ(p.stage, 1) << p.name;
    } else {
      EXPECT_EQ(p.stage, 0) << p.name;
    }
  }
  EXPECT_DEATH(EvenStageLayers(4, 3), "pp must divide n_layer");
}

// parallel.first_stage_layers / last_stage_layers: stages of different
// sizes, still contiguous, every layer on exactly one of them; counts that
// do not add up to the model's layers are a programming error.
TEST(SplitStages, UnevenStagesHoldTheirCountsOfContiguousLayers) {
  const GptConfig c = Config();  // 4 layers
  const std::vector<int> counts = {1, 3};
  std::vector<ParamInfo> t = GptTensors(c);
  SplitStages(&t, counts);
  for (const ParamInfo& p : t) {
    if (p.layer >= 0) {
      EXPECT_EQ(p.stage, p.layer < 1 ? 0 : 1) << p.name;
    }
  }
  for (int rank : {0, 1}) {
    PlanOptions o;
    o.pp = 2;
    o.pp_rank = rank;
    o.stage_layers = counts;
    std::set<int> layers;
    for (const ParamInfo& p : BuildPlan(c, o)) {
      if (p.layer >= 0) layers.insert(p.layer);
    }
    EXPECT_EQ(layers, rank == 0 ? (std::set<int>{0}) : (std::set<int>{1, 2, 3}))
        << rank;
  }
  std::vector<ParamInfo> fewer = GptTensors(c);
  EXPECT_DEATH(SplitStages(&fewer, {1, 2}), "fewer layers than the model");
  std::vector<ParamInfo> more = GptTensors(c);
  EXPECT_DEATH(SplitStages(&more, {2, 3}), "more layers than the model");
  std::vector<ParamInfo> empty = GptTensors(c);
  EXPECT_DEATH(SplitStages(&empty, {0, 4}), "a pipeline stage without layers");
}

TEST(SplitStages, LastStageHoldsATiedCopyOfWteForTheHead) {
  // One stage: no copy.
  std::vector<ParamInfo> one = GptTensors(Config());
  SplitStages(&one, EvenStageLayers(4, 1));
  for (const ParamInfo& p : one) EXPECT_FALSE(p.tied_copy) << p.name;
  for (int tp : {1, 2}) {
    GptConfig c = Config();
    c.padded_vocab = PaddedVocab(c.vocab_size, tp);
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      const auto [first, last] = EndStagePlans(c, tp, tp_rank);
      const ParamInfo* wte = nullptr;
      for (const ParamInfo& p : first) {
        EXPECT_FALSE(p.tied_copy) << p.name;
        if (p.name == "wte") wte = &p;
      }
      ASSERT_NE(wte, nullptr);
      const ParamInfo* copy = nullptr;
      const ParamInfo* lnf = nullptr;
      for (const ParamInfo& p : last) {
        if (p.tied_copy) copy = &p;
        if (p.name == "ln_f.weight") lnf = &p;
      }
      ASSERT_NE(copy, nullptr) << "tp " << tp;
      ASSERT_NE(lnf, nullptr);
      // The same tensor, part and placement rules as stage 0's, in the
      // final unit (after ln_f, so that unit keeps its place).
      EXPECT_EQ(copy->name, "wte");
      EXPECT_EQ(copy->shape, wte->shape);
      EXPECT_EQ(copy->boxes.size(), wte->boxes.size());
      for (size_t i = 0; i < copy->boxes.size(); ++i) {
        EXPECT_EQ(copy->boxes[i].lo, wte->boxes[i].lo);
        EXPECT_EQ(copy->boxes[i].hi, wte->boxes[i].hi);
      }
      EXPECT_EQ(copy->unit, lnf->unit);
      EXPECT_GT(copy->unit_offset, lnf->unit_offset);
      EXPECT_EQ(&last.back(), copy);
      // Both are the tied table, whose gradients the optimizer sums.
      EXPECT_TRUE(wte->tied && copy->tied);
    }
  }
}

// model.tie_embeddings=false: the head is a part with a table of its own,
// lm_head.weight, after the final norm on the last stage, split by
// vocabulary rows over tp as wte is; wte is not tied, so no stage holds a
// copy of it. The FLOPs count the head's matmul once, with lm_head.
TEST(SplitStages, AnUntiedHeadHasItsOwnTableOnTheLastStage) {
  GptConfig tied = Config();
  GptConfig c = Config();
  c.tie_embeddings = false;
  EXPECT_NE(&ModelPartsOf(c), &Gpt2Parts());
  EXPECT_FALSE(ModelPartsOf(c).head->tied());
  const std::vector<ParamInfo> all = GptTensors(c);
  ASSERT_EQ(all.size(), GptTensors(tied).size() + 1);
  EXPECT_EQ(all.back().name, "lm_head.weight");
  EXPECT_EQ(all.back().global_shape, (std::vector<int64_t>{65, 24}));
  EXPECT_EQ(all.back().layer, kAfterBlocks);
  EXPECT_EQ(all.back().init, ParamInfo::Init::kNormal);
  EXPECT_TRUE(all.back().decay);
  for (const ParamInfo& p : all) EXPECT_FALSE(p.tied) << p.name;
  EXPECT_EQ(GptNumParams(c), GptNumParams(tied) + 65 * 24);
  EXPECT_EQ(GptFlopsPerToken(c, 16), GptFlopsPerToken(tied, 16));
  for (int tp : {1, 2}) {
    c.padded_vocab = PaddedVocab(c.vocab_size, tp);
    for (int tp_rank = 0; tp_rank < tp; ++tp_rank) {
      const auto [first, last] = EndStagePlans(c, tp, tp_rank);
      for (const ParamInfo& p : first) {
        EXPECT_NE(p.name, "lm_head.weight");
        EXPECT_FALSE(p.tied || p.tied_copy) << p.name;
      }
      const ParamInfo* lnf = nullptr;
      const ParamInfo* head = nullptr;
      for (const ParamInfo& p : last) {
        EXPECT_FALSE(p.tied || p.tied_copy) << p.name;
        if (p.name == "ln_f.weight") lnf = &p;
        if (p.name == "lm_head.weight") head = &p;
      }
      ASSERT_NE(lnf, nullptr);
      ASSERT_NE(head, nullptr);
      EXPECT_EQ(head->split, TpSplit::kVocab);
      EXPECT_EQ(head->shape, (std::vector<int64_t>{c.padded_vocab / tp, 24}));
      EXPECT_EQ(head->unit, lnf->unit);
      EXPECT_EQ(&last.back(), head);
    }
  }
}

TEST(ApplyTensorParallel, SplitsFollowMegatronsPlan) {
  const GptConfig c = Config(2);
  std::vector<ParamInfo> t = GptTensors(c);
  ApplyTensorParallel(&t, c, 2, 1);
  std::map<std::string, const ParamInfo*> by;
  for (const ParamInfo& p : t) by[p.name] = &p;
  const ParamInfo& qkv = *by["h.0.attn.c_attn.weight"];
  EXPECT_EQ(qkv.split, TpSplit::kQkv);
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{36, 24}));
  ASSERT_EQ(qkv.boxes.size(), 3u);  // rank 1's heads of q, of k, of v
  EXPECT_EQ(qkv.boxes[0].lo[0], 12);
  EXPECT_EQ(qkv.boxes[1].lo[0], 36);
  EXPECT_EQ(qkv.boxes[2].lo[0], 60);
  EXPECT_EQ(by["h.0.attn.c_proj.weight"]->split, TpSplit::kRow);
  EXPECT_EQ(by["h.0.attn.c_proj.weight"]->shape,
            (std::vector<int64_t>{24, 12}));
  EXPECT_EQ(by["h.0.attn.c_proj.bias"]->split, TpSplit::kReplicated);
  EXPECT_EQ(by["h.0.mlp.c_fc.weight"]->split, TpSplit::kColumn);
  EXPECT_EQ(by["h.0.mlp.c_fc.bias"]->shape, (std::vector<int64_t>{48}));
  EXPECT_EQ(by["h.0.mlp.c_proj.weight"]->split, TpSplit::kRow);
  EXPECT_TRUE(by["h.0.ln_2.bias"]->sequence_partial);
  EXPECT_TRUE(by["wpe"]->sequence_partial);
  EXPECT_FALSE(by["h.0.mlp.c_fc.weight"]->sequence_partial);
  // wte: 256 padded rows, 128 per rank; rank 1 holds only padding.
  const ParamInfo& wte = *by["wte"];
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{128, 24}));
  EXPECT_TRUE(wte.boxes[0].empty());
}

// Every element of every tensor is held by exactly one tp rank (split
// tensors) or by every rank (replicated), and GlobalIndex names each once.
TEST(ApplyTensorParallel, RanksTileEveryTensorExactly) {
  for (int tp : {1, 2, 4}) {
    const GptConfig c = Config(tp);
    std::map<std::string, std::map<int64_t, int>> seen;
    std::map<std::string, int64_t> numel;
    std::map<std::string, bool> replicated;
    for (int r = 0; r < tp; ++r) {
      std::vector<ParamInfo> t = GptTensors(c);
      ApplyTensorParallel(&t, c, tp, r);
      for (const ParamInfo& p : t) {
        int64_t n = 1;
        for (int64_t d : p.global_shape) n *= d;
        numel[p.name] = n;
        replicated[p.name] = p.tp_replicated();
        int64_t held = 0;
        for (const Box& b : p.boxes) held += b.numel();
        for (int64_t i = 0; i < p.numel; ++i) {
          if (auto g = GlobalIndex(p, i)) {
            ASSERT_GE(*g, 0);
            ASSERT_LT(*g, n) << p.name;
            ++seen[p.name][*g];
          }
        }
        EXPECT_LE(held, p.numel) << p.name;
      }
    }
    for (const auto& [name, counts] : seen) {
      const int want = replicated[name] ? tp : 1;
      ASSERT_EQ(static_cast<int64_t>(counts.size()), numel[name])
          << name << " tp=" << tp;
      for (const auto& [index, n] : counts) {
        ASSERT_EQ(n, want) << name << "[" << index << "] tp=" << tp;
      }
    }
  }
}

// Routed experts over tp slices (parallel.expert_tp) and ep: every element
// of every expert's tensors is held by exactly one (tp, ep) rank, a slice
// of expert_tp ranks holding tp/expert_tp's share of the experts and each
// of its ranks 1/expert_tp of each.
TEST(KeepExperts, EveryExpertElementLivesOnOneRankOfTpSlicesAndEp) {
  for (int tp : {1, 2, 4}) {
    for (int etp = 1; etp <= tp; etp *= 2) {
      for (int ep : {1, 2}) {
        if (4 % (ep * (tp / etp)) != 0) continue;
        GptConfig c = Config(tp);
        c.moe.experts = 4;
        c.moe.top_k = 2;
        c.moe.hidden = 24;
        c.moe.ep = ep;
        c.moe.expert_tp = etp;
        std::map<std::string, std::map<int64_t, int>> seen;
        std::map<std::string, int64_t> numel;
        for (int r = 0; r < tp; ++r) {
          for (int e = 0; e < ep; ++e) {
            std::vector<ParamInfo> t = GptTensors(c);
            ApplyTensorParallel(&t, c, tp, r);
            KeepExperts(&t, c, tp, r, e);
            int experts = 0;
            for (const ParamInfo& p : t) {
              if (p.expert < 0) continue;
              ++experts;
              numel[p.name] = ShapeNumel(p.global_shape);
              // Its slice's experts, 1/etp of each.
              EXPECT_EQ(p.numel * etp, numel[p.name]) << p.name;
              EXPECT_EQ(p.expert / (4 / (tp / etp)), r / etp) << p.name;
              for (int64_t i = 0; i < p.numel; ++i) {
                ++seen[p.name][*GlobalIndex(p, i)];
              }
            }
            // Two linears an expert in each of 4 layers.
            EXPECT_EQ(experts, 2 * 4 * c.moe.LocalExperts(tp));
          }
        }
        ASSERT_EQ(seen.size(), size_t{2 * 4 * 4});
        for (const auto& [name, counts] : seen) {
          ASSERT_EQ(static_cast<int64_t>(counts.size()), numel[name])
              << name << " tp=" << tp << " expert_tp=" << etp << " ep=" << ep;
          for (const auto& [index, n] : counts) ASSERT_EQ(n, 1) << name;
        }
      }
    }
  }
}

TEST(ApplyTensorParallel, RefusesADegreeThatDoesNotDivideTheHeads) {
  GptConfig c = Config(3);
  std::vector<ParamInfo> t = GptTensors(c);
  EXPECT_DEATH(ApplyTensorParallel(&t, c, 3, 0), "tp must divide n_head");
}

TEST(LayoutUnits, UnitsArePaddedSlicesInTableOrderPerStage) {
  const GptConfig c = Config();
  std::vector<ParamInfo> t = GptTensors(c);
  SplitStages(&t, EvenStageLayers(4, 2));
  ApplyTensorParallel(&t, c, 1, 0);
  for (int stage : {0, 1}) {
    const std::vector<ParamInfo> layout = LayoutUnits(t, stage, 3);
    const std::vector<UnitRange> units = Units(layout, 3);
    // Stage 0: [wte wpe] + 4 units per block of its 2 blocks; stage 1: the
    // blocks' 8 and [ln_f, the head's tied copy of wte].
    EXPECT_EQ(units.size(), 9u) << stage;
    int64_t expect_begin = 0;
    for (const UnitRange& u : units) {
      EXPECT_EQ(u.begin, expect_begin);
      EXPECT_EQ(u.size % 3, 0);
      expect_begin = u.begin + u.size;
    }
    for (size_t i = 1; i < layout.size(); ++i) {
      const ParamInfo& a = layout[i - 1];
      const ParamInfo& b = layout[i];
      if (a.unit == b.unit) {
        EXPECT_EQ(b.offset, a.offset + a.numel);
      }
      EXPECT_EQ(b.offset - units[b.unit].begin, b.unit_offset);
    }
    EXPECT_EQ(layout.front().name, stage == 0 ? "wte" : "h.2.ln_1.weight");
    EXPECT_EQ(layout.back().name, stage == 0 ? "h.1.mlp.c_proj.bias" : "wte");
    EXPECT_EQ(layout.back().tied_copy, stage == 1);
  }
}

// An interleaved rank holds virtual stages r, r+pp, ...: one flat buffer of
// them in order, each of which, sliced out, is laid out exactly as that
// stage alone would be.
TEST(BuildPlan, InterleavedRanksHoldEveryPpThStageOneAfterAnother) {
  const GptConfig c = Config(2);
  std::vector<ParamInfo> t = GptTensors(c);
  SplitStages(
      &t, EvenStageLayers(4, 4));  // pp 2 × v 2: one layer per virtual stage
  ApplyTensorParallel(&t, c, 2, 1);
  for (int rank : {0, 1}) {
    PlanOptions o{2, 1, 2, rank, 3, 2, {}};
    EXPECT_EQ(RankStages(o), (std::vector<int>{rank, rank + 2}));
    const std::vector<ParamInfo> layout = BuildPlan(c, o);
    std::set<int> layers;
    for (const ParamInfo& p : layout) {
      if (p.layer >= 0) layers.insert(p.layer);
    }
    EXPECT_EQ(layers, (std::set<int>{rank, rank + 2}));
    // The second chunk's units follow the first's without a gap.
    const std::vector<UnitRange> units = Units(layout, 3);
    for (size_t u = 1; u < units.size(); ++u) {
      EXPECT_EQ(units[u].begin, units[u - 1].begin + units[u - 1].size);
    }
    int expect_first = 0;
    for (int stage : RankStages(o)) {
      int first = -1;
      const std::vector<ParamInfo> slice = StageSlice(layout, stage, &first);
      const std::vector<ParamInfo> alone = LayoutUnits(t, stage, 3);
      EXPECT_EQ(first, expect_first) << "stage " << stage;
      ASSERT_EQ(slice.size(), alone.size()) << "stage " << stage;
      for (size_t i = 0; i < slice.size(); ++i) {
        EXPECT_EQ(slice[i].name, alone[i].name);
        EXPECT_EQ(slice[i].unit, alone[i].unit) << slice[i].name;
        EXPECT_EQ(slice[i].offset, alone[i].offset) << slice[i].name;
        EXPECT_EQ(slice[i].unit_offset, alone[i].unit_offset) << slice[i].name;
        EXPECT_EQ(slice[i].tied_copy, alone[i].tied_copy) << slice[i].name;
      }
      expect_first += static_cast<int>(Units(alone, 3).size());
    }
  }
}

// A tp rank's shard initialises to the single-rank values at the same
// global elements: layout invariance starts here.
TEST(BuildPlan, InitialValuesDoNotDependOnTheLayout) {
  const GptConfig one = Config(1);
  std::map<std::string, ParamInfo> whole;
  for (const ParamInfo& p : BuildPlan(one, {})) whole[p.name] = p;
  const GptConfig two = Config(2);
  for (const ParamInfo& p : BuildPlan(two, {2, 1, 1, 0, 2, 1, {}})) {
    for (int64_t i = 0; i < p.numel; i += 7) {
      if (auto g = GlobalIndex(p, i)) {
        ASSERT_EQ(InitialValue(p, 1337, *g),
                  InitialValue(whole[p.name], 1337, *g));
      }
    }
  }
}

}  // namespace
}  // namespace ptrain
