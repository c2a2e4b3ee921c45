// A committed checkpoint as ptcoord judges one (common/checkpoint_commit.h),
// without training: one small shard, a manifest naming it with its size,
// and the manifest's digest. For tests of what ptcoord records and lists.
#ifndef PTRAIN_TESTS_TESTING_COMMITTED_CHECKPOINT_H_
#define PTRAIN_TESTS_TESTING_COMMITTED_CHECKPOINT_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_commit.h"

namespace ptrain::testing {

inline constexpr int64_t kFakeShardBytes = 16;

// The manifest text of a fake checkpoint of `step` (of `job_uid` when not
// empty), naming shard-00000.bin of kFakeShardBytes.
inline std::string FakeManifest(int64_t step, const std::string& job_uid = "") {
  return absl::StrCat(
      "{\"step\":", step,
      job_uid.empty() ? "" : absl::StrCat(",\"job_uid\":\"", job_uid, "\""),
      ",\"files\":{\"shard-00000.bin\":{\"bytes\":", kFakeShardBytes, "}}}");
}

// Writes a committed fake checkpoint of `step` into `dir` (created) and
// returns `dir`.
inline std::filesystem::path WriteCommittedCheckpoint(
    const std::filesystem::path& dir, int64_t step,
    const std::string& job_uid = "") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "shard-00000.bin") << std::string(kFakeShardBytes, 'x');
  const std::string manifest = FakeManifest(step, job_uid);
  std::ofstream(dir / kManifestFile) << manifest;
  std::ofstream(dir / kManifestDigestFile) << ManifestDigestLine(manifest);
  return dir;
}

// The same for a shell script (a fake mpirun): defines
// `commit_checkpoint DIR STEP`.
inline constexpr const char* kShellCommitCheckpoint = R"(commit_checkpoint() {
  mkdir -p "$1" && printf 'xxxxxxxxxxxxxxxx' > "$1/shard-00000.bin" &&
  printf '{"step":%s,"files":{"shard-00000.bin":{"bytes":16}}}' "$2" \
    > "$1/manifest.json" &&
  (cd "$1" && sha256sum manifest.json > manifest.sha256)
}
)";

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_COMMITTED_CHECKPOINT_H_
