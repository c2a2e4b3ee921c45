// Path confinement: spec paths resolve under a data root or are refused
// naming the field; "..", symlinks and prefix tricks do not escape.
#include "coordinator/paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

class PathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ =
        fs::temp_directory_path() / ("paths_test_" + std::to_string(getpid()));
    fs::remove_all(base_);
    fs::create_directories(base_ / "data");
    fs::create_directories(base_ / "data2");
    fs::create_directories(base_ / "outside");
    fs::create_symlink(base_ / "outside", base_ / "data" / "link");
    roots_ = {(base_ / "data").string()};
  }
  void TearDown() override { fs::remove_all(base_); }
  fs::path base_;
  std::vector<std::string> roots_;
};

TEST_F(PathsTest, RelativePathUnderRootResolvesToAbsolute) {
  auto p = ConfinePath("data.path", "data/x.txt", base_.string(), roots_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (base_ / "data" / "x.txt").string());
}

// A pattern of token shards (data.train_bin): its folder resolves like any
// path's and its file name stays a pattern, for the ranks to match.
TEST_F(PathsTest, ShardPatternResolvesItsFolderAndKeepsItsName) {
  auto p =
      ConfinePath("data.train_bin", "data/train_*.bin", base_.string(), roots_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (base_ / "data" / "train_*.bin").string());
  EXPECT_FALSE(ConfinePath("data.train_bin", "data/link/train_*.bin",
                           base_.string(), roots_)
                   .ok());
}

TEST_F(PathsTest, DotDotEscapeIsRefusedNamingTheField) {
  auto p =
      ConfinePath("data.path", "data/../outside/x", base_.string(), roots_);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("data.path"), absl::string_view::npos);
}

TEST_F(PathsTest, SymlinkOutOfRootIsRefused) {
  EXPECT_FALSE(
      ConfinePath("data.path", "data/link/x", base_.string(), roots_).ok());
}

TEST_F(PathsTest, SiblingWithCommonPrefixIsNotUnderRoot) {
  EXPECT_FALSE(
      ConfinePath("data.path", "data2/x", base_.string(), roots_).ok());
}

TEST_F(PathsTest, AbsolutePathOutsideIsRefused) {
  EXPECT_FALSE(
      ConfinePath("data.path", "/etc/passwd", base_.string(), roots_).ok());
}

// A missing folder followed by "..": resolving the text lexically would
// land on data/link_out without ever resolving that symlink.
TEST_F(PathsTest, DotDotAfterAMissingFolderStillResolvesTheSymlinkAfterIt) {
  const std::string value =
      (base_ / "data" / "nonexistent" / ".." / "link" / "secret.txt").string();
  auto p = ConfinePath("data.path", value, base_.string(), roots_);
  ASSERT_FALSE(p.ok()) << "accepted as " << *p;
  EXPECT_NE(p.status().message().find("outside"), absl::string_view::npos)
      << p.status();
  // The same through a relative path and a deeper missing chain.
  EXPECT_FALSE(ConfinePath("checkpoint.dir", "data/a/b/../../link/ck",
                           base_.string(), roots_)
                   .ok());
}

TEST_F(PathsTest, SymlinkLoopIsRefusedNamingTheField) {
  fs::create_symlink(base_ / "data" / "loop2", base_ / "data" / "loop1");
  fs::create_symlink(base_ / "data" / "loop1", base_ / "data" / "loop2");
  auto p = ConfinePath("model.init_from", "data/loop1/x.bin", base_.string(),
                       roots_);
  ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("model.init_from"),
            absl::string_view::npos)
      << p.status();
  EXPECT_NE(p.status().message().find("loop"), absl::string_view::npos)
      << p.status();
}

TEST_F(PathsTest, RelativeSymlinkOutOfRootIsRefused) {
  fs::create_symlink(fs::path("..") / "outside", base_ / "data" / "rel");
  EXPECT_FALSE(
      ConfinePath("data.path", "data/rel/x", base_.string(), roots_).ok());
}

TEST_F(PathsTest, SymlinkThatStaysInsideIsResolvedToItsTarget) {
  fs::create_directories(base_ / "data" / "real");
  fs::create_symlink("real", base_ / "data" / "alias");
  auto p = ConfinePath("data.path", "data/alias/x.txt", base_.string(), roots_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (base_ / "data" / "real" / "x.txt").string());
}

TEST_F(PathsTest, ResolvedPathsHoldNoDotDotAndNoSymlink) {
  auto p = ResolvePath("data/x/../link/./y/../z", base_.string());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (base_ / "outside" / "z").string());
}

// A blend's sources are confined and checked as data.train_bin/val_bin
// are, each named by its place in the list.
TEST_F(PathsTest, BlendSourcesAreConfinedAndCheckedNamingTheSource) {
  v1::JobSpec spec;
  v1::BlendSource* web = spec.mutable_data()->add_blend();
  web->set_train_bin("data/web_train_*.bin");
  web->set_val_bin("data/web_val.bin");
  v1::BlendSource* code = spec.mutable_data()->add_blend();
  code->set_train_bin("data/code_train.bin");
  code->set_val_bin("data/link/code_val.bin");
  const absl::Status out = ConfineSpecPaths(&spec, base_.string(), roots_);
  EXPECT_NE(out.message().find("data.blend[1].val_bin"),
            absl::string_view::npos)
      << out;
  code->set_val_bin("data/code_val.bin");
  ASSERT_TRUE(ConfineSpecPaths(&spec, base_.string(), roots_).ok());
  EXPECT_EQ(spec.data().blend(0).train_bin(),
            (base_ / "data" / "web_train_*.bin").string());
  const absl::Status missing = CheckSpecInputsExist(spec);
  EXPECT_NE(missing.message().find("data.blend[0].train_bin: no file matches"),
            absl::string_view::npos)
      << missing;
  for (const char* name :
       {"web_train_0.bin", "web_val.bin", "code_train.bin"}) {
    std::ofstream(base_ / "data" / name) << "x";
  }
  const absl::Status val = CheckSpecInputsExist(spec);
  EXPECT_NE(val.message().find("data.blend[1].val_bin"),
            absl::string_view::npos)
      << val;
  std::ofstream(base_ / "data" / "code_val.bin") << "x";
  EXPECT_TRUE(CheckSpecInputsExist(spec).ok());
}

TEST_F(PathsTest, SpecFieldsAreCheckedAndRewritten) {
  v1::JobSpec spec;
  spec.mutable_data()->set_path("data/a.txt");
  spec.mutable_checkpoint()->set_dir("data/ckpt");
  ASSERT_TRUE(ConfineSpecPaths(&spec, base_.string(), roots_).ok());
  EXPECT_EQ(spec.checkpoint().dir(), (base_ / "data" / "ckpt").string());
  spec.mutable_checkpoint()->set_dir("/tmp/elsewhere");
  const absl::Status s = ConfineSpecPaths(&spec, base_.string(), roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("checkpoint.dir"), absl::string_view::npos) << s;
  v1::JobSpec bin;
  bin.mutable_data()->set_val_bin("../../x.bin");
  const absl::Status b = ConfineSpecPaths(&bin, base_.string(), roots_);
  EXPECT_NE(b.message().find("data.val_bin"), absl::string_view::npos) << b;
  v1::JobSpec init;
  init.mutable_model()->set_init_from("llmc:/etc/x.bin");
  EXPECT_NE(ConfineSpecPaths(&init, base_.string(), roots_)
                .message()
                .find("model.init_from"),
            absl::string_view::npos);
  // A SentencePiece model is a file like the others; gpt2 names none.
  v1::JobSpec spm;
  spm.mutable_data()->set_tokenizer("spm:data/m.model");
  ASSERT_TRUE(ConfineSpecPaths(&spm, base_.string(), roots_).ok());
  EXPECT_EQ(spm.data().tokenizer(),
            "spm:" + (base_ / "data" / "m.model").string());
  EXPECT_NE(CheckSpecInputsExist(spm).message().find(
                "data.tokenizer: " + (base_ / "data" / "m.model").string() +
                " does not exist"),
            absl::string_view::npos)
      << CheckSpecInputsExist(spm);
  spm.mutable_data()->set_tokenizer("spm:/etc/m.model");
  EXPECT_NE(ConfineSpecPaths(&spm, base_.string(), roots_)
                .message()
                .find("data.tokenizer"),
            absl::string_view::npos);
  // So is a tokenizer.json, named or in its folder.
  v1::JobSpec hf;
  hf.mutable_data()->set_tokenizer("hf:data/llama3");
  ASSERT_TRUE(ConfineSpecPaths(&hf, base_.string(), roots_).ok());
  EXPECT_EQ(hf.data().tokenizer(),
            "hf:" + (base_ / "data" / "llama3").string());
  EXPECT_NE(CheckSpecInputsExist(hf).message().find(
                "data.tokenizer: " +
                (base_ / "data" / "llama3" / "tokenizer.json").string() +
                " does not exist"),
            absl::string_view::npos)
      << CheckSpecInputsExist(hf);
  hf.mutable_data()->set_tokenizer("hf:/etc/tokenizer.json");
  EXPECT_NE(ConfineSpecPaths(&hf, base_.string(), roots_)
                .message()
                .find("data.tokenizer"),
            absl::string_view::npos);
  v1::JobSpec gpt2;
  gpt2.mutable_data()->set_tokenizer("gpt2");
  ASSERT_TRUE(ConfineSpecPaths(&gpt2, base_.string(), roots_).ok());
  EXPECT_EQ(gpt2.data().tokenizer(), "gpt2");
}

}  // namespace
}  // namespace ptrain
