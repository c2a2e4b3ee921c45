// See header_value.h.
#include "common/header_value.h"

#include "absl/strings/str_cat.h"

namespace ptrain {

absl::Status CheckHeaderValue(absl::string_view what, absl::string_view value) {
  constexpr absl::string_view kRule =
      "a header value is 1 to 4096 printable ASCII characters (0x20-0x7E)";
  static_assert(kMaxHeaderValueBytes == 4096, "kRule states the limit");
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty; ", kRule));
  }
  if (value.size() > kMaxHeaderValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", value.size(), " bytes long; ", kRule));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": byte ", i + 1, " is 0x",
                       absl::Hex(c, absl::kZeroPad2), "; ", kRule));
    }
  }
  return absl::OkStatus();
}

}  // namespace ptrain
