// Path confinement for job specs; see paths.h. Paths are resolved one
// component at a time, as the kernel would walk them: a symlink is replaced
// by its target before the next component is looked at, and ".." steps back
// from what has been resolved so far (never from the text). So "..", a
// missing folder followed by "..", or a symlink anywhere along the way
// cannot leave a root unnoticed.
#include "coordinator/paths.h"

#include <glob.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/echo.h"
#include "common/tokenizer.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

// As Linux's MAXSYMLINKS: more links than this on one walk is a loop.
constexpr int kMaxSymlinks = 40;

// model.init_from's prefix for a file path (an llm.c checkpoint).
constexpr absl::string_view kLlmc = "llmc:";
// data.tokenizer's prefixes for a file path (a SentencePiece model; a
// Hugging Face tokenizer.json or its folder).
constexpr absl::string_view kSpm = "spm:";
constexpr absl::string_view kHf = "hf:";

absl::StatusOr<std::string> ReadLink(const std::string& path) {
  std::string target(PATH_MAX, '\0');
  const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read symlink ", Echo(path), ": ", std::strerror(errno)));
  }
  target.resize(static_cast<size_t>(n));
  return target;
}

void PushComponents(const fs::path& p, std::deque<std::string>* pending) {
  std::deque<std::string> parts;
  for (const fs::path& c : p.relative_path()) parts.push_back(c.string());
  pending->insert(pending->begin(), parts.begin(), parts.end());
}

}  // namespace

absl::StatusOr<std::string> ResolvePath(const std::string& value,
                                        const std::string& base_dir) {
  fs::path start(value);
  if (start.is_relative()) start = fs::absolute(fs::path(base_dir) / start);
  std::deque<std::string> pending;
  PushComponents(start, &pending);
  std::vector<std::string> resolved;  // components below "/", no symlinks
  int links = 0;
  while (!pending.empty()) {
    const std::string name = std::move(pending.front());
    pending.pop_front();
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      if (!resolved.empty()) resolved.pop_back();
      continue;
    }
    const std::string candidate = absl::StrCat(
        "/", absl::StrJoin(resolved, "/"), resolved.empty() ? "" : "/", name);
    struct stat st;
    if (::lstat(candidate.c_str(), &st) != 0) {
      // Not there (yet): kept as written. A later ".." steps back over it
      // and resolution goes on from a folder that does exist.
      if (errno != ENOENT && errno != ENOTDIR) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot resolve ", Echo(candidate), ": ", std::strerror(errno)));
      }
      resolved.push_back(name);
      continue;
    }
    if (!S_ISLNK(st.st_mode)) {
      resolved.push_back(name);
      continue;
    }
    if (++links > kMaxSymlinks) {
      return absl::InvalidArgumentError(
          absl::StrCat(EchoQuoted(value), " passes more than ", kMaxSymlinks,
                       " symlinks (a symlink loop?)"));
    }
    absl::StatusOr<std::string> target = ReadLink(candidate);
    if (!target.ok()) return target.status();
    if (fs::path(*target).is_absolute()) resolved.clear();
    PushComponents(fs::path(*target), &pending);
  }
  return absl::StrCat("/", absl::StrJoin(resolved, "/"));
}

namespace {

bool IsUnder(const fs::path& path, const fs::path& root) {
  auto r = root.begin();
  auto p = path.begin();
  for (; r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // trailing separator of the root
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ConfinePath(const std::string& field,
                                        const std::string& value,
                                        const std::string& base_dir,
                                        const std::vector<std::string>& roots) {
  absl::StatusOr<std::string> path = ResolvePath(value, base_dir);
  if (!path.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path.status().message()));
  }
  const fs::path resolved(*path);
  for (const std::string& root : roots) {
    absl::StatusOr<std::string> r = ResolvePath(root, base_dir);
    if (r.ok() && IsUnder(resolved, fs::path(*r))) return resolved.string();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, "=", EchoQuoted(value), " resolves to ", Echo(resolved.string()),
      ", outside the coordinator's data roots (", absl::StrJoin(roots, ", "),
      "); move it under one, or start ptcoord with --data-root DIR naming a "
      "folder that holds it"));
}

absl::Status ConfineSpecPaths(v1::JobSpec* spec, const std::string& base_dir,
                              const std::vector<std::string>& roots) {
  struct Field {
    const char* name;
    std::string* value;
  };
  const Field fields[] = {
      {"data.path", spec->mutable_data()->mutable_path()},
      {"data.train_bin", spec->mutable_data()->mutable_train_bin()},
      {"data.val_bin", spec->mutable_data()->mutable_val_bin()},
      {"checkpoint.dir", spec->mutable_checkpoint()->mutable_dir()},
  };
  std::vector<std::pair<std::string, std::string*>> confined;
  for (const Field& f : fields) confined.emplace_back(f.name, f.value);
  for (int i = 0; i < spec->data().blend_size(); ++i) {
    v1::BlendSource* b = spec->mutable_data()->mutable_blend(i);
    const std::string at = absl::StrCat("data.blend[", i, "].");
    confined.emplace_back(at + "train_bin", b->mutable_train_bin());
    confined.emplace_back(at + "val_bin", b->mutable_val_bin());
  }
  for (const auto& [name, value] : confined) {
    if (value->empty()) continue;
    absl::StatusOr<std::string> p = ConfinePath(name, *value, base_dir, roots);
    if (!p.ok()) return p.status();
    *value = *p;
  }
  struct Prefixed {
    const char* name;
    absl::string_view prefix;
    std::string* value;
  };
  const Prefixed prefixed[] = {
      {"model.init_from", kLlmc, spec->mutable_model()->mutable_init_from()},
      {"model.init_from", kHf, spec->mutable_model()->mutable_init_from()},
      {"data.tokenizer", kSpm, spec->mutable_data()->mutable_tokenizer()},
      {"data.tokenizer", kHf, spec->mutable_data()->mutable_tokenizer()},
  };
  for (const Prefixed& f : prefixed) {
    if (!absl::StartsWith(*f.value, f.prefix)) continue;
    absl::StatusOr<std::string> p =
        ConfinePath(f.name, f.value->substr(f.prefix.size()), base_dir, roots);
    if (!p.ok()) return p.status();
    *f.value = absl::StrCat(f.prefix, *p);
  }
  return absl::OkStatus();
}

namespace {

// OK when `path` (absolute) is a file, or has wildcards and matches one.
absl::Status CheckInputExists(absl::string_view field, const std::string& path,
                              bool may_be_pattern) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISREG(st.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", Echo(path), " is not a file"));
  }
  const int err = errno;
  if (may_be_pattern && path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), 0, nullptr, &g);
    const size_t matches = rc == 0 ? g.gl_pathc : 0;
    ::globfree(&g);
    if (matches > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": no file matches ", Echo(path)));
  }
  const bool missing = err == ENOENT || err == ENOTDIR;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", Echo(path),
      missing ? " does not exist" : absl::StrCat(": ", std::strerror(err))));
}

}  // namespace

absl::Status CheckSpecInputsExist(const v1::JobSpec& spec) {
  struct Input {
    const char* name;
    std::string path;
    bool may_be_pattern;
  };
  const std::string& init = spec.model().init_from();
  const std::string& tokenizer = spec.data().tokenizer();
  const Input inputs[] = {
      {"data.path", spec.data().path(), false},
      {"data.train_bin", spec.data().train_bin(), true},
      {"data.val_bin", spec.data().val_bin(), true},
      {"model.init_from",
       absl::StartsWith(init, kLlmc) ? init.substr(kLlmc.size())
       : absl::StartsWith(init, kHf)
           ? absl::StrCat(init.substr(kHf.size()), "/config.json")
           : "",
       false},
      {"data.tokenizer",
       absl::StartsWith(tokenizer, kSpm) ? tokenizer.substr(kSpm.size())
       : absl::StartsWith(tokenizer, kHf)
           ? HfTokenizerFile(tokenizer.substr(kHf.size()))
           : "",
       false},
  };
  for (const Input& in : inputs) {
    if (in.path.empty()) continue;
    if (absl::Status s = CheckInputExists(in.name, in.path, in.may_be_pattern);
        !s.ok()) {
      return s;
    }
  }
  for (int i = 0; i < spec.data().blend_size(); ++i) {
    const v1::BlendSource& b = spec.data().blend(i);
    const std::string at = absl::StrCat("data.blend[", i, "].");
    for (const auto& [field, path] :
         {std::pair{at + "train_bin", &b.train_bin()},
          std::pair{at + "val_bin", &b.val_bin()}}) {
      if (path->empty()) continue;
      if (absl::Status s = CheckInputExists(field, *path, true); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ptrain
