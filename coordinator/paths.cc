// Path confinement for job specs; see paths.h. weakly_canonical resolves
// "..", "." and existing symlinks, so neither can step outside a root.
#include "coordinator/paths.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;

fs::path Resolve(const std::string& value, const std::string& base_dir) {
  fs::path p(value);
  if (p.is_relative()) p = fs::path(base_dir) / p;
  std::error_code ec;
  fs::path canonical = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : canonical;
}

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
  const fs::path resolved = Resolve(value, base_dir);
  for (const std::string& root : roots) {
    if (IsUnder(resolved, Resolve(root, base_dir))) return resolved.string();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, "='", value, "' resolves to ", resolved.string(),
                   ", outside the coordinator's data roots (",
                   absl::StrJoin(roots, ", "), ")"));
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
  for (const Field& f : fields) {
    if (f.value->empty()) continue;
    absl::StatusOr<std::string> p =
        ConfinePath(f.name, *f.value, base_dir, roots);
    if (!p.ok()) return p.status();
    *f.value = *p;
  }
  constexpr absl::string_view kLlmc = "llmc:";
  std::string* init = spec->mutable_model()->mutable_init_from();
  if (absl::StartsWith(*init, kLlmc)) {
    absl::StatusOr<std::string> p = ConfinePath(
        "model.init_from", init->substr(kLlmc.size()), base_dir, roots);
    if (!p.ok()) return p.status();
    *init = absl::StrCat(kLlmc, *p);
  }
  return absl::OkStatus();
}

}  // namespace ptrain
