// Typed access to a checkpoint manifest's JSON that never throws and names
// the field it refuses ("layout.dp=0 is outside [1, 65536]"): what the
// reader's validation (checkpoint_manifest.cc) is written in. Errors are
// InvalidArgument; the reader reports them as a damaged checkpoint. Not
// the rules themselves, nor the manifest's writing (checkpoint_writer.cc).
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_JSON_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_JSON_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ptrain::manifest_json {

// The deepest nesting of [ and { a manifest may have.
inline constexpr int kMaxJsonDepth = 16;

// Parses a manifest-like JSON text without exceptions; nullopt if it is not
// JSON or nests too deeply.
std::optional<nlohmann::json> ParseJson(const std::string& text);

// In each, `where` is the path of `obj` ("" for the manifest itself) and
// `key` the member's name: "where.key" names it in errors.

// Member `key` of object `obj`: an error when obj is not an object or has
// no such member.
absl::StatusOr<const nlohmann::json*> Member(const nlohmann::json& obj,
                                             absl::string_view where,
                                             absl::string_view key);
// The same, and it must be an object.
absl::StatusOr<const nlohmann::json*> ObjectAt(const nlohmann::json& obj,
                                               absl::string_view where,
                                               absl::string_view key);

// An integer in [lo, hi]: a JSON integer (not 5.0, not 1e30, not "5").
// `path` names v in errors.
absl::Status IntValue(const nlohmann::json& v, const std::string& path,
                      int64_t lo, int64_t hi, int64_t* out);
absl::Status Int(const nlohmann::json& obj, absl::string_view where,
                 absl::string_view key, int64_t lo, int64_t hi, int64_t* out);
absl::Status Int32(const nlohmann::json& obj, absl::string_view where,
                   absl::string_view key, int64_t lo, int64_t hi, int* out);
// Any integer from 0 to 2^64-1.
absl::Status Uint64(const nlohmann::json& obj, absl::string_view where,
                    absl::string_view key, uint64_t* out);
// A finite number in [lo, hi] (an integer or not).
absl::Status Number(const nlohmann::json& obj, absl::string_view where,
                    absl::string_view key, double lo, double hi, double* out);
// true or false.
absl::Status Bool(const nlohmann::json& obj, absl::string_view where,
                  absl::string_view key, bool* out);
// A string of at most max_len bytes.
absl::Status String(const nlohmann::json& obj, absl::string_view where,
                    absl::string_view key, size_t max_len, std::string* out);

// A 64-bit hash written by Hex (checkpoint_internal.h): exactly 16
// lowercase hex digits.
bool Hex64(const nlohmann::json& h, uint64_t* out);

}  // namespace ptrain::manifest_json

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_CHECKPOINT_JSON_H_
