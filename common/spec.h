// The job spec: YAML text <-> ptrain.v1.JobSpec, defaults, `--set` overrides
// and validation. Shared by ptctl, ptcoord and ptworker so that all three
// accept and refuse exactly the same files. Checks that need the data (the
// vocabulary) or the MPI world (its size) live with those, not here.
#ifndef PTRAIN_COMMON_SPEC_H_
#define PTRAIN_COMMON_SPEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ptrain/v1/job.pb.h"

namespace ptrain {

// A JobSpec with every field at its documented default (docs/job-spec.md).
v1::JobSpec DefaultJobSpec();

// Parses YAML onto DefaultJobSpec(), applies `overrides` ("a.b.c=value", in
// order) and validates. Errors are InvalidArgument and name the field path and
// the rule, e.g. "train.steps: expected an integer, got 'abc' (line 4, column
// 10)" or "parallel.tp=3 does not divide model.n_head=4". An unknown key is an
// error. `source` names the text in messages (a file name).
absl::StatusOr<v1::JobSpec> ParseJobSpec(
    std::string_view yaml_text, const std::vector<std::string>& overrides = {},
    std::string_view source = "job spec");

// Reads `path` and calls ParseJobSpec. A missing or unreadable file is
// NotFound/InvalidArgument naming the path.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(
    const std::string& path, const std::vector<std::string>& overrides = {});

// Applies one "dotted.path=value" assignment; the value is parsed as a YAML
// scalar of the field's type. Does not validate the whole spec.
absl::Status ApplyOverride(v1::JobSpec* spec, std::string_view assignment);

// Checks ranges and cross-field rules (degrees dividing heads, layers, batch).
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Every field, defaults included, as YAML that ParseJobSpec reads back to an
// equal JobSpec.
std::string JobSpecToYaml(const v1::JobSpec& spec);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_SPEC_H_
