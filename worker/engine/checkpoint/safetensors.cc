#include "worker/engine/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/math.h"
#include "nlohmann/json.hpp"
#include "worker/engine/checkpoint/checkpoint_internal.h"
#include "worker/engine/checkpoint/checkpoint_json.h"
#include "worker/engine/model/plan.h"

namespace ptrain {
namespace {

using json = nlohmann::json;

constexpr int kMaxRank = 8;
constexpr int64_t kMaxElements = int64_t{1} << 40;

// The format's other dtypes: valid in a file, not read by ptrain.
constexpr const char* kOtherDtypes[] = {
    "F64",     "I64",     "I32",     "I16",     "I8",  "U64",
    "U32",     "U16",     "U8",      "BOOL",    "C64", "F8_E5M2",
    "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};

absl::Status Bad(absl::string_view where, auto&&... parts) {
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors file '", where, "': ", parts...));
}

// A JSON integer in [0, hi].
bool Count(const json& v, int64_t hi, int64_t* out) {
  return manifest_json::IntValue(v, "", 0, hi, out).ok();
}

absl::StatusOr<SafetensorsEntry> Entry(const std::string& name, const json& v,
                                       absl::string_view where) {
  auto bad = [&](auto&&... parts) {
    return Bad(where, "tensor '", name, "' ", parts...);
  };
  if (!v.is_object()) return bad("is ", v.type_name(), ", not an object");
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return bad("has an unknown key '", key, "'");
    }
  }
  SafetensorsEntry e;
  e.name = name;
  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return bad("has no dtype string");
  }
  const std::string& d = dtype->get_ref<const std::string&>();
  if (d == "F32") {
    e.dtype = SafetensorsDtype::kF32;
  } else if (d == "BF16") {
    e.dtype = SafetensorsDtype::kBf16;
  } else if (d == "F16") {
    e.dtype = SafetensorsDtype::kF16;
  } else if (std::find(std::begin(kOtherDtypes), std::end(kOtherDtypes), d) !=
             std::end(kOtherDtypes)) {
    return bad("has dtype ", d, "; ptrain reads F32, BF16 and F16");
  } else {
    return bad("has an unknown dtype '", d.substr(0, 32), "'");
  }
  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array() || shape->size() > kMaxRank) {
    return bad("has no shape of at most ", kMaxRank, " dimensions");
  }
  int64_t numel = 1;
  for (const json& dim : *shape) {
    int64_t n = 0;
    if (!Count(dim, kMaxElements, &n)) {
      return bad("has a dimension that is not an integer in [0, 2^40]");
    }
    e.shape.push_back(n);
    if (n != 0 && numel > kMaxElements / n) {
      return bad("has more than 2^40 elements");
    }
    numel *= n;
  }
  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !Count((*offsets)[0], INT64_MAX, &e.begin) ||
      !Count((*offsets)[1], INT64_MAX, &e.end) || e.end < e.begin) {
    return bad("has no data_offsets [begin, end] with 0 <= begin <= end");
  }
  const int64_t bytes = numel * SafetensorsDtypeBytes(e.dtype);
  if (e.end - e.begin != bytes) {
    return bad("has data_offsets [", e.begin, ", ", e.end, "], ",
               e.end - e.begin, " bytes, but its shape and dtype need ", bytes);
  }
  return e;
}

// IEEE half to float, exactly.
float HalfToFloat(uint16_t h) {
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31) {
    return mant == 0 ? sign * INFINITY : std::nanf("");
  }
  return sign * std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
}

// `n` elements of `dtype` at `src` as floats.
void Widen(SafetensorsDtype dtype, const char* src, int64_t n, float* dst) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case SafetensorsDtype::kBf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        const uint32_t bits = static_cast<uint32_t>(b) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    case SafetensorsDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
  }
}

// The header's length, n, against the limit and the file (`file_size`
// bytes): before the header is read, and again by the parser.
absl::Status CheckHeaderLength(uint64_t n, int64_t file_size,
                               absl::string_view where) {
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeader)) {
    return Bad(where, "its header is ", n, " bytes; at most ",
               kMaxSafetensorsHeader);
  }
  const int64_t after_length = file_size < 8 ? 0 : file_size - 8;
  if (static_cast<int64_t>(n) > after_length) {
    return Bad(where, "its header is ", n, " bytes but the file has only ",
               after_length, " after its length");
  }
  return absl::OkStatus();
}

}  // namespace

int SafetensorsDtypeBytes(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 ? 4 : 2;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view text, int64_t file_size, absl::string_view where) {
  const int64_t n = static_cast<int64_t>(text.size());
  if (absl::Status s = CheckHeaderLength(n, file_size, where); !s.ok()) {
    return s;
  }
  const std::optional<json> parsed =
      manifest_json::ParseJson(std::string(text));
  if (!parsed.has_value() || !parsed->is_object()) {
    return Bad(where, "its header is not a JSON object");
  }
  SafetensorsHeader h;
  h.data_begin = 8 + n;
  for (const auto& [key, value] : parsed->items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Bad(where, "__metadata__ is no object");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) {
          return Bad(where, "__metadata__ '", k.substr(0, 64),
                     "' is not a string");
        }
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (key.empty()) return Bad(where, "a tensor has an empty name");
    auto e = Entry(key, value, where);
    if (!e.ok()) return e.status();
    h.tensors.push_back(std::move(*e));
  }
  // The data is the tensors' bytes end to end, in some order.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  int64_t at = 0;
  for (const SafetensorsEntry& e : h.tensors) {
    if (e.begin != at) {
      return Bad(where, "tensor '", e.name, "' begins at byte ", e.begin,
                 " of the data, ",
                 e.begin < at ? "inside another tensor" : "after a gap",
                 " (the one before it ends at ", at, ")");
    }
    at = e.end;
  }
  if (at != file_size - h.data_begin) {
    return Bad(where, "its tensors end at byte ", at, " of the data but ",
               file_size - h.data_begin, " bytes follow the header");
  }
  return h;
}

absl::StatusOr<std::unique_ptr<SafetensorsSource>> SafetensorsSource::Open(
    const std::string& path, const ConfinedFs& fs, const std::string& field) {
  auto fd = fs.Open(path, O_RDONLY | O_NONBLOCK, field);  // never a FIFO's wait
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a regular file"));
  }
  unsigned char len[8];
  if (st.st_size < 8 ||
      !PreadAll(fd->get(), reinterpret_cast<char*>(len), 8, 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' is shorter than a safetensors header's length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (absl::Status s = CheckHeaderLength(n, st.st_size, path); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", s.message()));
  }
  std::string text(n, '\0');
  if (!PreadAll(fd->get(), text.data(), static_cast<int64_t>(n), 8)) {
    return absl::DataLossError(absl::StrCat("short read from '", path, "'"));
  }
  auto header = ParseSafetensorsHeader(text, st.st_size, path);
  if (!header.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", header.status().message()));
  }
  std::unique_ptr<SafetensorsSource> src(new SafetensorsSource());
  src->path_ = path;
  src->fd_ = std::move(*fd);
  src->header_ = std::move(*header);
  for (size_t i = 0; i < src->header_.tensors.size(); ++i) {
    src->index_[src->header_.tensors[i].name] = i;
  }
  return src;
}

const SafetensorsEntry* SafetensorsSource::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::Status SafetensorsSource::Read(const std::string& name, const Box& box,
                                     float* dst) {
  const SafetensorsEntry* e = Find(name);
  bool inside = e != nullptr && box.lo.size() == e->shape.size() &&
                box.hi.size() == e->shape.size() && !e->shape.empty();
  for (size_t d = 0; inside && d < e->shape.size(); ++d) {
    inside =
        box.lo[d] >= 0 && box.lo[d] <= box.hi[d] && box.hi[d] <= e->shape[d];
  }
  if (!inside) {
    return absl::NotFoundError(absl::StrCat("safetensors file '", path_,
                                            "' has no such part of ", name));
  }
  const Box whole = WholeBox(e->shape);
  const int bytes = SafetensorsDtypeBytes(e->dtype);
  const int64_t row = box.hi.back() - box.lo.back();
  std::vector<char> buf(row * bytes);
  absl::Status status = absl::OkStatus();
  ForEachBoxRow(box, [&](const std::vector<int64_t>& coord) {
    if (!status.ok()) return;
    const int64_t at =
        header_.data_begin + e->begin + BoxIndex(whole, coord) * bytes;
    if (!PreadAll(fd_.get(), buf.data(), row * bytes, at)) {
      status =
          absl::DataLossError(absl::StrCat("short read from '", path_, "'"));
      return;
    }
    Widen(e->dtype, buf.data(), row, dst + BoxIndex(box, coord));
  });
  return status;
}

absl::Status WriteSafetensors(
    const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
    TensorSource& source, const std::map<std::string, std::string>& metadata,
    const ConfinedFs& fs, const std::string& field) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t at = 0;
  for (const SafetensorsTensorOut& t : tensors) {
    if (t.shape.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": tensor '", t.name, "' has no dimensions"));
    }
    if (t.dtype == SafetensorsDtype::kF16) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": tensor '", t.name,
                       "': F16 is not written (F32, BF16 are)"));
    }
    const int64_t bytes = ShapeNumel(t.shape) * SafetensorsDtypeBytes(t.dtype);
    header[t.name] = {
        {"dtype", t.dtype == SafetensorsDtype::kBf16 ? "BF16" : "F32"},
        {"shape", t.shape},
        {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  // Padded with spaces so that the data begins 8-byte aligned.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = (text.size() >> (8 * i)) & 0xff;
  // Written beside the target and renamed: never a half-written file.
  return WriteReplacing(fs, path, field, [&](ChunkedWriter& w) {
    if (auto s = w.Write(reinterpret_cast<const char*>(len), 8); !s.ok()) {
      return s;
    }
    if (auto s = w.Write(text.data(), static_cast<int64_t>(text.size()));
        !s.ok()) {
      return s;
    }
    // A tensor at a time, in slabs of its leading dimension of about 16 MiB
    // of fp32.
    std::vector<float> buf;
    std::vector<uint16_t> bf16;
    for (const SafetensorsTensorOut& t : tensors) {
      if (ShapeNumel(t.shape) == 0) continue;
      const int64_t row = ShapeNumel(t.shape) / t.shape[0];
      const int64_t rows = std::max<int64_t>(1, (int64_t{4} << 20) / row);
      for (int64_t r = 0; r < t.shape[0]; r += rows) {
        Box box = WholeBox(t.shape);
        box.lo[0] = r;
        box.hi[0] = std::min(t.shape[0], r + rows);
        const int64_t n = (box.hi[0] - box.lo[0]) * row;
        buf.resize(n);
        if (auto s = source.Read(t.name, box, buf.data()); !s.ok()) return s;
        const char* bytes = reinterpret_cast<const char*>(buf.data());
        if (t.dtype == SafetensorsDtype::kBf16) {
          bf16.resize(n);
          for (int64_t i = 0; i < n; ++i) {
            bf16[i] = kernels::math::RoundToBf16(buf[i]);
          }
          bytes = reinterpret_cast<const char*>(bf16.data());
        }
        if (auto s = w.Write(bytes, n * SafetensorsDtypeBytes(t.dtype));
            !s.ok()) {
          return s;
        }
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace ptrain
