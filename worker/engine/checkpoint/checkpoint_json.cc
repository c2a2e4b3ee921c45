// Typed access to a checkpoint manifest's JSON (checkpoint_json.h): never
// throws, names the field. The rules a manifest must follow are the
// reader's (checkpoint_manifest.cc).
#include "worker/engine/checkpoint/checkpoint_json.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ptrain::manifest_json {

using json = nlohmann::json;

namespace {

// Deepest nesting of [ and { outside strings: refused before parsing, so
// that no recursion anywhere sees an absurd depth.
int JsonDepth(const std::string& text) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::string Path(absl::string_view where, absl::string_view key) {
  return where.empty() ? std::string(key) : absl::StrCat(where, ".", key);
}

absl::Status Bad(const std::string& msg) {
  return absl::InvalidArgumentError(msg);
}

}  // namespace

std::optional<json> ParseJson(const std::string& text) {
  if (JsonDepth(text) > kMaxJsonDepth) return std::nullopt;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

absl::StatusOr<const json*> Member(const json& obj, absl::string_view where,
                                   absl::string_view key) {
  if (!obj.is_object()) {
    return Bad(absl::StrCat(where.empty() ? "the manifest" : where,
                            " is not an object"));
  }
  auto it = obj.find(key);
  if (it == obj.end()) return Bad(Path(where, key) + " is missing");
  return &*it;
}

absl::StatusOr<const json*> ObjectAt(const json& obj, absl::string_view where,
                                     absl::string_view key) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_object()) {
    return Bad(absl::StrCat(Path(where, key), " is ", (*v)->type_name(),
                            ", not an object"));
  }
  return v;
}

absl::Status IntValue(const json& v, const std::string& path, int64_t lo,
                      int64_t hi, int64_t* out) {
  if (v.is_number_float()) {
    return Bad(absl::StrCat(path, "=", v.get<double>(), " is not an integer"));
  }
  if (!v.is_number_integer()) {
    return Bad(absl::StrCat(path, " is ", v.type_name(), ", not an integer"));
  }
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      return Bad(
          absl::StrCat(path, "=", u, " is outside [", lo, ", ", hi, "]"));
    }
    *out = static_cast<int64_t>(u);
  } else {
    *out = v.get<int64_t>();
  }
  if (*out < lo || *out > hi) {
    return Bad(
        absl::StrCat(path, "=", *out, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Int(const json& obj, absl::string_view where,
                 absl::string_view key, int64_t lo, int64_t hi, int64_t* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  return IntValue(**v, Path(where, key), lo, hi, out);
}

absl::Status Int32(const json& obj, absl::string_view where,
                   absl::string_view key, int64_t lo, int64_t hi, int* out) {
  int64_t v = 0;
  if (auto s = Int(obj, where, key, lo, hi, &v); !s.ok()) return s;
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status Uint64(const json& obj, absl::string_view where,
                    absl::string_view key, uint64_t* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  const std::string path = Path(where, key);
  if (!(*v)->is_number_integer() ||
      (!(*v)->is_number_unsigned() && (*v)->get<int64_t>() < 0)) {
    return Bad(path + " is not an integer between 0 and 2^64-1");
  }
  *out = (*v)->get<uint64_t>();
  return absl::OkStatus();
}

absl::Status Number(const json& obj, absl::string_view where,
                    absl::string_view key, double lo, double hi, double* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  const std::string path = Path(where, key);
  if (!(*v)->is_number()) {
    return Bad(absl::StrCat(path, " is ", (*v)->type_name(), ", not a number"));
  }
  *out = (*v)->get<double>();
  if (!(*out >= lo && *out <= hi)) {
    return Bad(
        absl::StrCat(path, "=", *out, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Bool(const json& obj, absl::string_view where,
                  absl::string_view key, bool* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  if (!(*v)->is_boolean()) {
    return Bad(absl::StrCat(Path(where, key), " is ", (*v)->type_name(),
                            ", not true or false"));
  }
  *out = (*v)->get<bool>();
  return absl::OkStatus();
}

absl::Status String(const json& obj, absl::string_view where,
                    absl::string_view key, size_t max_len, std::string* out) {
  auto v = Member(obj, where, key);
  if (!v.ok()) return v.status();
  const std::string path = Path(where, key);
  if (!(*v)->is_string()) {
    return Bad(absl::StrCat(path, " is ", (*v)->type_name(), ", not a string"));
  }
  const auto& s = (*v)->get_ref<const std::string&>();
  if (s.size() > max_len) {
    return Bad(
        absl::StrCat(path, " is ", s.size(), " bytes long; at most ", max_len));
  }
  *out = s;
  return absl::OkStatus();
}

bool Hex64(const json& h, uint64_t* out) {
  if (!h.is_string()) return false;
  const std::string& s = h.get_ref<const std::string&>();
  return s.size() == 16 &&
         std::all_of(s.begin(), s.end(),
                     [](char ch) {
                       return (ch >= '0' && ch <= '9') ||
                              (ch >= 'a' && ch <= 'f');
                     }) &&
         absl::SimpleHexAtoi(s, out);
}

}  // namespace ptrain::manifest_json
