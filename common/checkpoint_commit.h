// What makes a checkpoint folder committed, for ptworker, which writes and
// reads checkpoints, and for ptcoord, which lists them: the digest line of
// manifest.json in manifest.sha256, and the shard files the manifest names.
// Not the manifest's full rules nor the shards' checksums: those are the
// reader's (worker/engine/checkpoint/checkpoint.h).
#ifndef PTRAIN_COMMON_CHECKPOINT_COMMIT_H_
#define PTRAIN_COMMON_CHECKPOINT_COMMIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ptrain {

inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kManifestDigestFile[] = "manifest.sha256";
// The largest manifest.json either side reads.
inline constexpr int64_t kMaxManifestBytes = int64_t{256} << 20;

// manifest.sha256's text for `manifest_text`: its SHA-256 in sha256sum's
// format ("<64 hex>  manifest.json\n"), so `sha256sum -c` checks it too.
std::string ManifestDigestLine(absl::string_view manifest_text);

// "" when `digest_text` (its final newline optional) is the digest line of
// `manifest_text`; else what is wrong, for a message: the manifest does not
// match a well-formed digest, or the digest is not such a line.
std::string CheckManifestDigest(absl::string_view digest_text,
                                absl::string_view manifest_text);

// OK when `dir` (a real path: symlinks already resolved) holds a committed
// checkpoint of step `step`, judged without reading any shard: its
// manifest.sha256 is the digest line of its manifest.json, the manifest
// parses as a JSON object whose "step" is `step` (and whose "job_uid", when
// it has one and `job_uid` is not empty, is `job_uid`), and every file its
// "files" object names is a regular file directly in `dir` of the "bytes"
// it gives. Reads at most kMaxManifestBytes. InvalidArgument naming
// `field`, the folder and the first thing wrong otherwise.
absl::Status CheckCommittedCheckpoint(absl::string_view field,
                                      const std::string& dir, int64_t step,
                                      const std::string& job_uid);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_CHECKPOINT_COMMIT_H_
