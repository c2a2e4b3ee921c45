// Hugging Face's safetensors files: what ptrain writes reads back bit for
// bit; BF16 and F16 widen exactly; every malformed file is refused naming
// the file and what is wrong, before any tensor is read.
#include "worker/engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hf_config.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/hf_checkpoint.h"
#include "worker/engine/model/plan.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// Whole tensors in memory, as a TensorSource.
class MapSource : public TensorSource {
 public:
  void Add(const std::string& name, std::vector<int64_t> shape,
           std::vector<float> values) {
    shapes_[name] = std::move(shape);
    values_[name] = std::move(values);
  }
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override {
    const Box whole = WholeBox(shapes_.at(name));
    const int64_t row = box.hi.back() - box.lo.back();
    ForEachBoxRow(box, [&](const std::vector<int64_t>& c) {
      std::memcpy(dst + BoxIndex(box, c),
                  values_.at(name).data() + BoxIndex(whole, c), row * 4);
    });
    return absl::OkStatus();
  }

 private:
  std::map<std::string, std::vector<int64_t>> shapes_;
  std::map<std::string, std::vector<float>> values_;
};

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("safetensors_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A file of an 8-byte length, `header` and `data`.
  std::string File(const std::string& header, const std::string& data,
                   int64_t length = -1) {
    const uint64_t n = length >= 0 ? length : header.size();
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    const std::string path = (dir_ / "m.safetensors").string();
    std::ofstream(path, std::ios::binary) << bytes << header << data;
    return path;
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, WhatIsWrittenReadsBackBitForBit) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> a(5 * 7), b(11);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  a[0] = -0.0f;
  a[1] = 1e-40f;  // subnormal
  MapSource src;
  src.Add("model.layers.0.mlp.up_proj.weight", {5, 7}, a);
  src.Add("model.norm.weight", {11}, b);
  const std::string path = (dir_ / "out.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"model.layers.0.mlp.up_proj.weight", {5, 7}},
                                {"model.norm.weight", {11}}},
                               src, {{"format", "pt"}})
                  .ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto in = SafetensorsSource::Open(path);
  ASSERT_TRUE(in.ok()) << in.status();
  const SafetensorsHeader& h = (*in)->header();
  EXPECT_EQ(h.data_begin % 8, 0);  // the header is padded
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(h.tensors[0].dtype, SafetensorsDtype::kF32);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(fs::file_size(path), h.data_begin + (35 + 11) * 4);
  std::vector<float> got(35);
  ASSERT_TRUE(
      (*in)->Read(h.tensors[0].name, WholeBox({5, 7}), got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), a.data(), 35 * 4));
  // A box reads its rows only: rows 1..3, columns 2..5.
  std::vector<float> part(3 * 3);
  ASSERT_TRUE(
      (*in)->Read(h.tensors[0].name, Box{{1, 2}, {4, 5}}, part.data()).ok());
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(part[r * 3 + c], a[(1 + r) * 7 + 2 + c]);
    }
  }
  EXPECT_EQ((*in)->Read("model.norm.weight", Box{{0}, {12}}, got.data()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*in)->Read("lm_head.weight", Box{{0}, {1}}, got.data()).code(),
            absl::StatusCode::kNotFound);
}

// BF16 is the top half of a float; F16 widens exactly, its subnormals,
// infinities and signs included.
TEST_F(SafetensorsTest, Bf16AndF16WidenExactly) {
  const uint16_t bf[] = {0x3f80, 0xbf00, 0x7f80, 0x0001};
  const uint16_t hf[] = {0x3c00, 0xc000, 0x7c00, 0x0001, 0x8400, 0x3555};
  std::string data(reinterpret_cast<const char*>(bf), sizeof(bf));
  data.append(reinterpret_cast<const char*>(hf), sizeof(hf));
  const std::string path =
      File(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
           R"("b":{"dtype":"F16","shape":[2,3],"data_offsets":[8,20]}})",
           data);
  auto in = SafetensorsSource::Open(path);
  ASSERT_TRUE(in.ok()) << in.status();
  std::vector<float> a(4), b(6);
  ASSERT_TRUE((*in)->Read("a", WholeBox({4}), a.data()).ok());
  ASSERT_TRUE((*in)->Read("b", WholeBox({2, 3}), b.data()).ok());
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], -0.5f);
  EXPECT_EQ(a[2], INFINITY);
  EXPECT_EQ(a[3], std::ldexp(1.0f, -133));
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  EXPECT_EQ(b[2], INFINITY);
  EXPECT_EQ(b[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(b[4], -std::ldexp(1.0f, -14));
  EXPECT_EQ(b[5], 0x555 * std::ldexp(1.0f, -10) * 0.25f);  // 0.333..
}

struct BadCase {
  const char* header;
  int data_bytes;
  const char* says;
};

class SafetensorsBadTest : public SafetensorsTest,
                           public ::testing::WithParamInterface<BadCase> {};

TEST_P(SafetensorsBadTest, IsRefusedNamingTheFileAndTheFault) {
  const BadCase& c = GetParam();
  const std::string path = File(c.header, std::string(c.data_bytes, '\0'));
  auto in = SafetensorsSource::Open(path, ConfinedFs(), "model.init_from");
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(in.status().message());
  EXPECT_NE(msg.find("model.init_from: "), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Headers, SafetensorsBadTest,
    ::testing::Values(
        BadCase{"[1, 2]", 0, "its header is not a JSON object"},
        BadCase{"{\"a\": 1", 0, "its header is not a JSON object"},
        BadCase{R"({"a": 3})", 0, "tensor 'a' is number, not an object"},
        BadCase{R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],)"
                R"("x":1}})",
                4, "tensor 'a' has an unknown key 'x'"},
        BadCase{R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8,
                "tensor 'a' has dtype I64; ptrain reads F32, BF16 and F16"},
        BadCase{R"({"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,8]}})", 8,
                "tensor 'a' has an unknown dtype 'Q4'"},
        BadCase{R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
                "tensor 'a' has a dimension that is not an integer"},
        BadCase{R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],)"
                R"("data_offsets":[0,4]}})",
                4, "tensor 'a' has no shape of at most 8 dimensions"},
        BadCase{R"({"a":{"dtype":"F32","shape":[1048576,1048576,2],)"
                R"("data_offsets":[0,4]}})",
                4, "tensor 'a' has more than 2^40 elements"},
        BadCase{R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", 8,
                "tensor 'a' has no data_offsets [begin, end]"},
        BadCase{R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                "tensor 'a' has data_offsets [0, 8], 8 bytes, but its shape "
                "and dtype need 12"},
        BadCase{R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                12, "tensor 'b' begins at byte 4 of the data, inside another"},
        BadCase{R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
                "tensor 'a' begins at byte 4 of the data, after a gap"},
        BadCase{R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8,
                "its tensors end at byte 4 of the data but 8 bytes follow"},
        BadCase{R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
                "its tensors end at byte 8 of the data but 4 bytes follow"},
        BadCase{R"({"__metadata__":{"format":1}})", 0,
                "__metadata__ 'format' is not a string"},
        BadCase{R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4,
                "a tensor has an empty name"}));

// The length before the header: longer than the file, or than any header
// ptrain reads, is refused before the header is read.
TEST_F(SafetensorsTest, AHeaderLengthPastTheFileOrTheLimitIsRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],)"
                             R"("data_offsets":[0,4]}})";
  for (int64_t length :
       {int64_t{1000}, kMaxSafetensorsHeader + 1, int64_t{1} << 62}) {
    const std::string path = File(header, "abcd", length);
    auto in = SafetensorsSource::Open(path);
    ASSERT_FALSE(in.ok()) << length;
    EXPECT_NE(in.status().message().find("its header is " +
                                         std::to_string(length) + " bytes"),
              std::string::npos)
        << in.status();
  }
  std::ofstream((dir_ / "short").string()) << "1234";
  auto in = SafetensorsSource::Open((dir_ / "short").string());
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find("shorter than a safetensors header"),
            std::string::npos)
      << in.status();
}

// ---------------------------------------------- Hugging Face model folders

// A model's tensors, random, as MapSource holds them.
MapSource RandomModel(const GptConfig& c,
                      std::map<std::string, std::vector<float>>* values) {
  MapSource src;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const ParamInfo& p : GptTensors(c)) {
    std::vector<float> v(ShapeNumel(p.global_shape));
    for (float& x : v) x = u(rng);
    (*values)[p.name] = v;
    src.Add(p.name, p.global_shape, v);
  }
  return src;
}

GptConfig LlamaConfigForTest() {
  GptConfig c{2, 4, 16, 8, 11};
  c.arch = "llama";
  c.n_kv_head = 2;
  c.ffn_hidden = 24;
  c.tie_embeddings = false;
  c.rope.theta = 500000.0f;
  c.rope.factor = 8.0f;
  c.padded_vocab = 128;
  return c;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// A Llama with 3 experts a block, 2 a token (Mixtral's layout).
GptConfig MixtralConfigForTest() {
  GptConfig c = LlamaConfigForTest();
  c.rope.factor = 0.0f;  // Mixtral's config has no rope scaling
  c.moe.experts = 3;
  c.moe.top_k = 2;
  c.moe.hidden = 12;
  return c;
}

GptConfig Gpt2ConfigForTest() {
  GptConfig c{2, 2, 8, 8, 11};
  c.padded_vocab = 128;
  return c;
}

// Reads every tensor back through HfSource: the bits written, whole and in
// a box that crosses the stacked gate/up halves and a transposed one.
void ExpectReadsBack(const std::string& dir, const GptConfig& c,
                     const std::map<std::string, std::vector<float>>& values) {
  auto in = HfSource::Open(dir, c);
  ASSERT_TRUE(in.ok()) << in.status();
  for (const ParamInfo& p : GptTensors(c)) {
    std::vector<float> got(ShapeNumel(p.global_shape));
    ASSERT_TRUE((*in)->Read(p.name, WholeBox(p.global_shape), got.data()).ok())
        << p.name;
    EXPECT_EQ(got, values.at(p.name)) << p.name;
    if (p.global_shape.size() != 2 || p.global_shape[0] < 3) continue;
    Box box = WholeBox(p.global_shape);
    box.lo = {1, 1};
    box.hi = {p.global_shape[0] - 1, p.global_shape[1]};
    std::vector<float> part(box.numel());
    ASSERT_TRUE((*in)->Read(p.name, box, part.data()).ok()) << p.name;
    const int64_t cols = box.hi[1] - box.lo[1];
    for (int64_t r = box.lo[0]; r < box.hi[0]; ++r) {
      for (int64_t k = box.lo[1]; k < box.hi[1]; ++k) {
        ASSERT_EQ(part[(r - box.lo[0]) * cols + k - box.lo[1]],
                  values.at(p.name)[r * p.global_shape[1] + k])
            << p.name << " [" << r << "," << k << "]";
      }
    }
  }
}

// Export then import: the same bits, in one file and in shards with an
// index; the config read back is the model's.
TEST_F(SafetensorsTest, AHuggingFaceFolderWrittenReadsBackBitExactly) {
  for (const GptConfig& c :
       {LlamaConfigForTest(), Gpt2ConfigForTest(), MixtralConfigForTest()}) {
    std::map<std::string, std::vector<float>> values;
    MapSource src = RandomModel(c, &values);
    for (int64_t shard : {int64_t{1} << 30, int64_t{2000}}) {
      const std::string out = (dir_ / (c.arch + std::to_string(c.moe.experts) +
                                       std::to_string(shard)))
                                  .string();
      ASSERT_TRUE(ExportHf(src, c, out, {}, ConfinedFs(), "--hf",
                           SafetensorsDtype::kF32, shard)
                      .ok());
      EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"),
                shard == 2000);
      EXPECT_EQ(fs::exists(out + "/model.safetensors"), shard != 2000);
      ExpectReadsBack(out, c, values);
      std::ifstream f(out + "/config.json");
      const std::string text((std::istreambuf_iterator<char>(f)), {});
      auto config = ParseHfConfig(text, "config.json");
      ASSERT_TRUE(config.ok()) << config.status();
      EXPECT_EQ(config->model.arch(), c.arch);
      EXPECT_EQ(config->model.n_layer(), c.n_layer);
      EXPECT_EQ(config->model.vocab_size(), c.vocab_size);
      EXPECT_EQ(config->max_positions, c.block_size);
      EXPECT_EQ(config->model.tie_embeddings(), c.tie_embeddings);
      if (c.has_moe()) {
        EXPECT_EQ(config->model.moe().experts(), 3);
        EXPECT_EQ(config->model.moe().top_k(), 2);
        EXPECT_EQ(config->model.moe().expert_hidden(), 12);
      } else if (c.arch == "llama") {
        EXPECT_EQ(config->model.n_kv_head(), 2);
        EXPECT_EQ(config->model.ffn_hidden(), 24);
        EXPECT_EQ(config->model.rope_theta(), 500000.0);
        EXPECT_EQ(config->model.rope_scaling().factor(), 8.0);
      }
    }
  }
}

// The bf16 nearest x, ties to even, found by arithmetic on doubles rather
// than by the bits the writer adds: the two bf16 values either side of x
// (x's bits cut to 16, and one bf16 step further from zero), the nearer,
// on a tie the one whose last bit is 0. For finite x below bf16's largest.
float NearestBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t lo_bits = u & 0xFFFF0000u, hi_bits = lo_bits + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &lo_bits, 4);
  std::memcpy(&hi, &hi_bits, 4);
  const double to_lo = std::fabs(double{x} - lo),
               to_hi = std::fabs(double{hi} - x);
  if (to_lo != to_hi) return to_lo < to_hi ? lo : hi;
  return (lo_bits & 0x10000u) == 0 ? lo : hi;
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// --hf-dtype bf16: every tensor stored as BF16, each weight the bf16
// nearest it (ties to even: exact halfway values among them); read back,
// those bf16 values exactly. config.json says bfloat16; shards count 2
// bytes an element (a size that splits fp32 in two holds bf16 whole).
TEST_F(SafetensorsTest, ABf16FolderReadsBackAsTheWeightsRoundedToNearestEven) {
  for (const GptConfig& c : {LlamaConfigForTest(), Gpt2ConfigForTest()}) {
    std::map<std::string, std::vector<float>> values;
    RandomModel(c, &values);
    // Halfway cases (down to even, up to even, negative, subnormal), one
    // just past halfway, values bf16 holds as they are.
    const std::vector<float> special = {FromBits(0x3F808000),
                                        FromBits(0x3F818000),
                                        FromBits(0xBF818000),
                                        FromBits(0x00018000),
                                        FromBits(0x3F808001),
                                        FromBits(0x3F800000),
                                        0.0f,
                                        -0.0f,
                                        1e30f,
                                        -3.0e-20f};
    MapSource src;
    std::map<std::string, std::vector<float>> rounded;
    for (const ParamInfo& p : GptTensors(c)) {
      std::vector<float>& v = values[p.name];
      if (p.name == "wte") std::copy(special.begin(), special.end(), v.begin());
      src.Add(p.name, p.global_shape, v);
      for (const float x : v) rounded[p.name].push_back(NearestBf16(x));
    }
    ASSERT_EQ(rounded["wte"][0], FromBits(0x3F800000));
    ASSERT_EQ(rounded["wte"][1], FromBits(0x3F820000));
    ASSERT_EQ(rounded["wte"][2], FromBits(0xBF820000));
    ASSERT_EQ(rounded["wte"][3], FromBits(0x00020000));
    ASSERT_EQ(rounded["wte"][4], FromBits(0x3F810000));
    // The model's tensors less a tied head, as the folder holds them.
    int64_t stored = 0;
    for (const HfTensorName& n : HfTensorNames(c, "")) {
      stored += ShapeNumel(n.hf_shape);
    }
    const std::string one = (dir_ / (c.arch + "_bf16")).string();
    ASSERT_TRUE(ExportHf(src, c, one, {}, ConfinedFs(), "--hf",
                         SafetensorsDtype::kBf16, stored * 4 / 2 + 64)
                    .ok());
    EXPECT_FALSE(fs::exists(one + "/model.safetensors.index.json"));
    auto file = SafetensorsSource::Open(one + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    for (const SafetensorsEntry& e : (*file)->header().tensors) {
      EXPECT_EQ(e.dtype, SafetensorsDtype::kBf16) << e.name;
    }
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(one + "/model.safetensors")),
              (*file)->header().data_begin + stored * 2);
    ExpectReadsBack(one, c, rounded);
    const std::string config = ReadAll(one + "/config.json");
    EXPECT_NE(config.find("\"torch_dtype\": \"bfloat16\""), std::string::npos)
        << config;
    // Sharded: the index counts 2 bytes an element.
    const std::string sharded = (dir_ / (c.arch + "_bf16_shards")).string();
    ASSERT_TRUE(ExportHf(src, c, sharded, {}, ConfinedFs(), "--hf",
                         SafetensorsDtype::kBf16, 2000)
                    .ok());
    ExpectReadsBack(sharded, c, rounded);
    const auto index = nlohmann::json::parse(
        ReadAll(sharded + "/model.safetensors.index.json"));
    EXPECT_EQ(index["metadata"]["total_size"], stored * 2);
    // fp32 of the same size: two shards, the exact weights.
    const std::string f32 = (dir_ / (c.arch + "_f32")).string();
    ASSERT_TRUE(ExportHf(src, c, f32, {}, ConfinedFs(), "--hf",
                         SafetensorsDtype::kF32, stored * 4 / 2 + 64)
                    .ok());
    EXPECT_TRUE(fs::exists(f32 + "/model.safetensors.index.json"));
    ExpectReadsBack(f32, c, values);
    EXPECT_NE(
        ReadAll(f32 + "/config.json").find("\"torch_dtype\": \"float32\""),
        std::string::npos);
  }
}

// The names and layouts Hugging Face's loaders expect: GPT-2's linear
// weights transposed under "transformer.", Llama's gate and up projections
// as two tensors.
TEST_F(SafetensorsTest, HuggingFaceLayoutsAreThePublishedOnes) {
  {
    const GptConfig c = Gpt2ConfigForTest();
    std::map<std::string, std::vector<float>> values;
    MapSource src = RandomModel(c, &values);
    const std::string out = (dir_ / "gpt").string();
    ASSERT_TRUE(ExportHf(src, c, out, {}).ok());
    auto file = SafetensorsSource::Open(out + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    const SafetensorsEntry* e =
        (*file)->Find("transformer.h.1.attn.c_attn.weight");
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->shape, (std::vector<int64_t>{8, 24}));
    std::vector<float> w(8 * 24);
    ASSERT_TRUE((*file)->Read(e->name, WholeBox(e->shape), w.data()).ok());
    const std::vector<float>& ours = values.at("h.1.attn.c_attn.weight");
    for (int i = 0; i < 8; ++i) {
      for (int j = 0; j < 24; ++j) ASSERT_EQ(w[i * 24 + j], ours[j * 8 + i]);
    }
    EXPECT_NE((*file)->Find("transformer.wte.weight"), nullptr);
    EXPECT_NE((*file)->Find("transformer.ln_f.bias"), nullptr);
    EXPECT_EQ((*file)->Find("lm_head.weight"), nullptr);  // tied
  }
  const GptConfig c = LlamaConfigForTest();
  std::map<std::string, std::vector<float>> values;
  MapSource src = RandomModel(c, &values);
  const std::string out = (dir_ / "llama").string();
  ASSERT_TRUE(ExportHf(src, c, out, {}).ok());
  auto file = SafetensorsSource::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<float>& gate_up = values.at("h.1.mlp.gate_up_proj.weight");
  for (const char* half : {"gate", "up"}) {
    const std::string name =
        absl::StrCat("model.layers.1.mlp.", half, "_proj.weight");
    const SafetensorsEntry* e = (*file)->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->shape, (std::vector<int64_t>{24, 16}));
    std::vector<float> w(24 * 16);
    ASSERT_TRUE((*file)->Read(name, WholeBox(e->shape), w.data()).ok());
    const int64_t at = std::string(half) == "gate" ? 0 : 24 * 16;
    EXPECT_TRUE(std::equal(w.begin(), w.end(), gate_up.begin() + at)) << name;
  }
  for (const char* name :
       {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.k_proj.weight"}) {
    EXPECT_NE((*file)->Find(name), nullptr) << name;
  }
  EXPECT_EQ((*file)->Find("model.layers.0.self_attn.k_proj.weight")->shape,
            (std::vector<int64_t>{8, 16}));  // 2 key heads of 4
}

// Experts in Mixtral's names: the router is block_sparse_moe.gate, each
// expert's gate and up halves w1 and w3, its down projection w2. Experts
// Mixtral cannot hold are refused naming why, nothing written.
TEST_F(SafetensorsTest, ExpertsAreWrittenAsMixtralsOrRefused) {
  const GptConfig c = MixtralConfigForTest();
  std::map<std::string, std::vector<float>> values;
  MapSource src = RandomModel(c, &values);
  const std::string out = (dir_ / "mixtral").string();
  ASSERT_TRUE(ExportHf(src, c, out, {}).ok());
  auto file = SafetensorsSource::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  auto read = [&](const std::string& name, std::vector<int64_t> shape) {
    const SafetensorsEntry* e = (*file)->Find(name);
    EXPECT_NE(e, nullptr) << name;
    if (e == nullptr) return std::vector<float>();
    EXPECT_EQ(e->shape, shape) << name;
    std::vector<float> w(ShapeNumel(e->shape));
    EXPECT_TRUE((*file)->Read(name, WholeBox(e->shape), w.data()).ok());
    return w;
  };
  EXPECT_EQ(read("model.layers.1.block_sparse_moe.gate.weight", {3, 16}),
            values.at("h.1.mlp.router.weight"));
  const std::vector<float>& gate_up =
      values.at("h.1.mlp.experts.2.gate_up_proj.weight");
  const std::string at = "model.layers.1.block_sparse_moe.experts.2.";
  const std::vector<float> w1 = read(at + "w1.weight", {12, 16});
  const std::vector<float> w3 = read(at + "w3.weight", {12, 16});
  EXPECT_TRUE(std::equal(w1.begin(), w1.end(), gate_up.begin()));
  EXPECT_TRUE(std::equal(w3.begin(), w3.end(), gate_up.begin() + 12 * 16));
  EXPECT_EQ(read(at + "w2.weight", {16, 12}),
            values.at("h.1.mlp.experts.2.down_proj.weight"));
  for (auto [edit, why] :
       std::vector<std::pair<std::function<void(GptConfig&)>, std::string>>{
           {[](GptConfig& m) { m.moe.shared = 1; },
            "Mixtral has no shared experts"},
           {[](GptConfig& m) {
              m.moe.router = kernels::math::RouterScore::kSigmoid;
            },
            "Mixtral's router is a softmax"},
           {[](GptConfig& m) { m.moe.top_k = 1; },
            "Mixtral weighs one expert a token by 1"},
           {[](GptConfig& m) { m.moe.every = 2; },
            "every Mixtral block has experts"},
           {[](GptConfig& m) { m.rope.factor = 8; },
            "Mixtral's config has no rope scaling"}}) {
    GptConfig bad = c;
    edit(bad);
    std::map<std::string, std::vector<float>> v;
    MapSource s = RandomModel(bad, &v);
    const std::string where = (dir_ / "refused").string();
    const absl::Status st = ExportHf(s, bad, where, {}, ConfinedFs(), "--hf");
    EXPECT_EQ(st.message(),
              "--hf: the model's experts (model.moe) have no Hugging Face "
              "layout: " +
                  why);
    EXPECT_FALSE(fs::exists(where + "/config.json")) << why;
  }
}

// A Qwen3-MoE (query/key norms, heads of 8 over a width of 16 in 4 heads,
// experts in block 1 of 2): Qwen3-MoE's names (the router mlp.gate, each
// expert's gate_proj, up_proj and down_proj, the dense block's MLP as
// Llama's, the norms under self_attn), its config, and every tensor read
// back bit for bit.
TEST_F(SafetensorsTest, Qwen3MoeIsWrittenInItsLayoutAndReadsBack) {
  GptConfig c = MixtralConfigForTest();
  c.qk_norm = true;
  c.head_dim = 8;
  c.moe.every = 2;
  std::map<std::string, std::vector<float>> values;
  MapSource src = RandomModel(c, &values);
  const std::string out = (dir_ / "qwen3moe").string();
  ASSERT_TRUE(ExportHf(src, c, out, {}).ok());
  auto file = SafetensorsSource::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"model.layers.1.mlp.gate.weight", {3, 16}},
           {"model.layers.1.mlp.experts.2.gate_proj.weight", {12, 16}},
           {"model.layers.1.mlp.experts.2.up_proj.weight", {12, 16}},
           {"model.layers.1.mlp.experts.2.down_proj.weight", {16, 12}},
           {"model.layers.0.mlp.gate_proj.weight", {24, 16}},
           {"model.layers.0.self_attn.q_proj.weight", {32, 16}},
           {"model.layers.0.self_attn.o_proj.weight", {16, 32}},
           {"model.layers.0.self_attn.k_proj.weight", {16, 16}},
           {"model.layers.0.self_attn.q_norm.weight", {8}},
           {"model.layers.1.self_attn.k_norm.weight", {8}}}) {
    const SafetensorsEntry* e = (*file)->Find(name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->shape, shape) << name;
  }
  EXPECT_EQ((*file)->Find("model.layers.1.block_sparse_moe.gate.weight"),
            nullptr);
  ExpectReadsBack(out, c, values);
  auto config = ParseHfConfig(ReadAll(out + "/config.json"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->model.qk_norm());
  EXPECT_EQ(config->model.head_dim(), 8);
  EXPECT_EQ(config->model.moe().every(), 2);
  EXPECT_EQ(config->model.moe().experts(), 3);
}

// A folder whose tensors are not the model's: one missing, one misshapen,
// one too many; an index that names a file outside the folder. Each named.
TEST_F(SafetensorsTest, AFolderThatIsNotTheModelIsRefusedNamingTheTensor) {
  const GptConfig c = LlamaConfigForTest();
  std::map<std::string, std::vector<float>> values;
  MapSource src = RandomModel(c, &values);
  // The model's folder, and its tensors rewritten without one or with one
  // more.
  const std::string whole = (dir_ / "whole").string();
  ASSERT_TRUE(ExportHf(src, c, whole, {}).ok());
  auto hf = SafetensorsSource::Open(whole + "/model.safetensors");
  ASSERT_TRUE(hf.ok());
  std::vector<SafetensorsTensorOut> tensors;
  for (const SafetensorsEntry& e : (*hf)->header().tensors) {
    tensors.push_back({e.name, e.shape});
  }
  struct Case {
    std::string name;
    std::vector<SafetensorsTensorOut> tensors;
    std::string message;
  };
  std::vector<SafetensorsTensorOut> missing = tensors, extra = tensors;
  missing.erase(missing.begin() + 1);
  extra.push_back({"model.extra", {2}});
  for (const Case& k :
       {Case{"missing", missing, "has no tensor '" + tensors[1].name + "'"},
        Case{"extra", extra, "holds tensor 'model.extra', which the model"}}) {
    const std::string d = (dir_ / k.name).string();
    fs::create_directories(d);
    class Both : public TensorSource {
     public:
      explicit Both(TensorSource& a) : a_(a) {}
      absl::Status Read(const std::string& name, const Box& box,
                        float* dst) override {
        if (name == "model.extra") {
          dst[0] = 1;
          dst[1] = 2;
          return absl::OkStatus();
        }
        return a_.Read(name, box, dst);
      }
      TensorSource& a_;
    } both(**hf);
    ASSERT_TRUE(
        WriteSafetensors(d + "/model.safetensors", k.tensors, both, {}).ok());
    auto in = HfSource::Open(d, c);
    ASSERT_FALSE(in.ok()) << k.name;
    EXPECT_NE(in.status().message().find(k.message), std::string::npos)
        << in.status();
  }
  // Another model: one layer more than the folder has.
  GptConfig deeper = c;
  deeper.n_layer = 3;
  auto in = HfSource::Open(whole, deeper);
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find(
                "has no tensor 'model.layers.2.input_layernorm.weight'"),
            std::string::npos)
      << in.status();
  // Wider: every shape named.
  GptConfig wider = c;
  wider.ffn_hidden = 32;
  in = HfSource::Open(whole, wider);
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find("has shape [24, 16]; the model needs "
                                       "[32, 16]"),
            std::string::npos)
      << in.status();
  // An index naming a file elsewhere.
  const std::string d = (dir_ / "escape").string();
  fs::create_directories(d);
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "../whole/model.safetensors"}})";
  in = HfSource::Open(d, c);
  ASSERT_FALSE(in.ok());
  EXPECT_NE(in.status().message().find("is not a file of the folder"),
            std::string::npos)
      << in.status();
}

}  // namespace
}  // namespace ptrain
