// See checkpoint_commit.h.
#include "common/checkpoint_commit.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/bounded_file.h"
#include "common/digest.h"
#include "nlohmann/json.hpp"

namespace ptrain {

namespace {

namespace fs = std::filesystem;

// A file of `dir` that must be a regular file itself, not a link to one.
absl::StatusOr<std::string> ReadOwnFile(absl::string_view field,
                                        const std::string& dir,
                                        const std::string& name,
                                        int64_t max_bytes) {
  const std::string path = (fs::path(dir) / name).string();
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(path, ec))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=", dir, " holds no ", name,
                     " (a regular file): not a committed checkpoint"));
  }
  return ReadBoundedFile(absl::StrCat(field, " ", name), path, max_bytes);
}

}  // namespace

std::string ManifestDigestLine(absl::string_view manifest_text) {
  return absl::StrCat(Sha256Hex(manifest_text), "  ", kManifestFile, "\n");
}

std::string CheckManifestDigest(absl::string_view digest_text,
                                absl::string_view manifest_text) {
  const std::string want = ManifestDigestLine(manifest_text);
  std::string got(digest_text);
  if (!got.empty() && got.back() != '\n') got.push_back('\n');
  if (got == want) return "";
  const bool well_formed =
      got.size() == want.size() && got.substr(64) == want.substr(64) &&
      std::all_of(got.begin(), got.begin() + 64, [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
      });
  return well_formed
             ? "manifest.json does not match its SHA-256 in manifest.sha256"
             : "manifest.sha256 is not a SHA-256 line for manifest.json";
}

absl::Status CheckCommittedCheckpoint(absl::string_view field,
                                      const std::string& dir, int64_t step,
                                      const std::string& job_uid) {
  auto not_committed = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=", dir, " is not a committed checkpoint: ", why));
  };
  absl::StatusOr<std::string> digest =
      ReadOwnFile(field, dir, kManifestDigestFile, 4096);
  if (!digest.ok()) return digest.status();
  absl::StatusOr<std::string> text =
      ReadOwnFile(field, dir, kManifestFile, kMaxManifestBytes);
  if (!text.ok()) return text.status();
  if (const std::string bad = CheckManifestDigest(*digest, *text);
      !bad.empty()) {
    return not_committed(bad);
  }
  const nlohmann::json m =
      nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!m.is_object())
    return not_committed("manifest.json is not a JSON object");
  auto it = m.find("step");
  if (it == m.end() || !it->is_number_integer() || it->get<int64_t>() != step) {
    return not_committed(
        absl::StrCat("its manifest.json does not say step ", step));
  }
  if (!job_uid.empty()) {
    auto uid = m.find("job_uid");
    if (uid != m.end() &&
        (!uid->is_string() || uid->get<std::string>() != job_uid)) {
      return not_committed(
          absl::StrCat("its manifest.json is not of job ", job_uid));
    }
  }
  auto files = m.find("files");
  if (files == m.end() || !files->is_object() || files->empty()) {
    return not_committed("its manifest.json lists no shard files");
  }
  for (const auto& [name, f] : files->items()) {
    const bool plain = !name.empty() && name.size() <= 255 && name != "." &&
                       name != ".." && name.find('/') == std::string::npos &&
                       name.find('\0') == std::string::npos;
    auto bytes = f.is_object() ? f.find("bytes") : f.end();
    if (!plain || !f.is_object() || bytes == f.end() ||
        !bytes->is_number_unsigned()) {
      return not_committed(
          "its manifest.json's files are not file names with their bytes");
    }
    struct stat st;
    const std::string path = (fs::path(dir) / name).string();
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return not_committed(absl::StrCat("shard file ", name, " is missing"));
    }
    if (static_cast<uint64_t>(st.st_size) != bytes->get<uint64_t>()) {
      return not_committed(absl::StrCat(
          "shard file ", name, " has ", st.st_size, " bytes, not the ",
          bytes->get<uint64_t>(), " its manifest gives"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ptrain
