// Fuzzes the job-spec parser that ptctl, ptcoord and ptworker share: YAML
// text plus `--set` overrides, then validation. Input: the spec text, then
// optionally "\n---overrides---\n" and one override per line. Whatever the
// bytes, the parser returns a spec or an error; an accepted spec round-trips
// through JobSpecToYaml.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/spec.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const std::string kSplit = "\n---overrides---\n";
  std::string text = input;
  std::vector<std::string> overrides;
  if (const size_t at = input.find(kSplit); at != std::string::npos) {
    text = input.substr(0, at);
    overrides = absl::StrSplit(input.substr(at + kSplit.size()), '\n',
                               absl::SkipEmpty());
  }
  absl::StatusOr<ptrain::v1::JobSpec> spec =
      ptrain::ParseJobSpec(text, overrides, "fuzz");
  if (!spec.ok()) {
    // Every refusal says why.
    if (spec.status().message().empty()) std::abort();
    return 0;
  }
  absl::StatusOr<ptrain::v1::JobSpec> again =
      ptrain::ParseJobSpec(ptrain::JobSpecToYaml(*spec), {}, "round trip");
  if (!again.ok() ||
      !google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) {
    std::abort();
  }
  return 0;
}
