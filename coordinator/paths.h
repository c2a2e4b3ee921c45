// Confinement of the file paths in a job spec to the coordinator's data
// roots, checked at submit. Path arithmetic plus symlink resolution; no
// spec parsing. The ranks open the same paths confined again
// (common/confined_fs.h), so a symlink swapped in later cannot escape.
#ifndef PTRAIN_COORDINATOR_PATHS_H_
#define PTRAIN_COORDINATOR_PATHS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// The absolute form of `value` (relative to `base_dir`) with every symlink
// of its existing part resolved and no "." or ".." left, resolved component
// by component. Components that do not exist are kept as written (a file a
// job will create). InvalidArgument on a symlink loop or an unreadable
// folder.
absl::StatusOr<std::string> ResolvePath(const std::string& value,
                                        const std::string& base_dir);

// Resolves `value` (relative paths against `base_dir`), following the
// symlinks that exist, and returns the absolute path when it lies under one
// of `roots` (each resolved the same way). Otherwise InvalidArgument naming
// `field`. `roots` are compared component-wise: /data2 is not under /data.
absl::StatusOr<std::string> ConfinePath(const std::string& field,
                                        const std::string& value,
                                        const std::string& base_dir,
                                        const std::vector<std::string>& roots);

// Applies ConfinePath to data.path, data.train_bin, data.val_bin,
// checkpoint.dir and model.init_from ("llmc:PATH"), rewriting each non-empty
// one to its absolute form. The first field outside the roots is the error.
absl::Status ConfineSpecPaths(v1::JobSpec* spec, const std::string& base_dir,
                              const std::vector<std::string>& roots);

// The inputs of a spec whose paths ConfineSpecPaths made absolute must be
// there at submit: data.path and model.init_from ("llmc:PATH") a file,
// data.train_bin and data.val_bin a file or a pattern (wildcards in the
// file name) that matches at least one. InvalidArgument naming the first
// field that is not, and the path looked at; a job refused here would
// only fail at launch.
absl::Status CheckSpecInputsExist(const v1::JobSpec& spec);

}  // namespace ptrain

#endif  // PTRAIN_COORDINATOR_PATHS_H_
