// Hugging Face's safetensors files: what ptrain writes reads back bit for
// bit; BF16 and F16 widen exactly; every malformed file is refused naming
// the file and what is wrong, before any tensor is read.
#include "worker/engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

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

}  // namespace
}  // namespace ptrain
