// Hugging Face's safetensors files, read and written by ptrain (issue 61:
// checkpoints in and out). A file is an 8-byte little-endian length N, N
// bytes of a JSON object, then the tensors' bytes. The object maps each
// tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (bytes
// counted from the end of the header); the key "__metadata__" maps strings
// to strings. The tensors' bytes are the whole rest of the file: no two
// overlap and none is left out. Tensors are row-major, little-endian.
//
// ptrain reads F32, BF16 and F16 (into fp32, exactly) and writes F32 and
// BF16 (rounded to nearest even); a file with any other dtype is refused
// naming the tensor.
#ifndef PTRAIN_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_
#define PTRAIN_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/confined_fs.h"
#include "worker/engine/checkpoint/checkpoint.h"

namespace ptrain {

enum class SafetensorsDtype { kF32, kBf16, kF16 };
int SafetensorsDtypeBytes(SafetensorsDtype dtype);

struct SafetensorsEntry {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // bytes, from the start of the data
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of their bytes
  std::map<std::string, std::string> metadata;
  int64_t data_begin = 0;  // 8 + N: the data's first byte in the file
};

// The largest header read (the format's own reader's limit).
inline constexpr int64_t kMaxSafetensorsHeader = int64_t{100} << 20;

// The header of a file of `file_size` bytes whose first 8 bytes say its
// JSON is `json` long: every rule above checked, and each tensor at most
// 8 dimensions of at most 2^40 elements in all. InvalidArgument naming
// `where` (the file) and the tensor or key at fault.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    absl::string_view json, int64_t file_size, absl::string_view where);

// A safetensors file open for reads of parts of its tensors: Read reads
// only the bytes of the box asked for.
class SafetensorsSource : public TensorSource {
 public:
  // Reads and checks the header; keeps the file open. Errors name `field`
  // and the path.
  static absl::StatusOr<std::unique_ptr<SafetensorsSource>> Open(
      const std::string& path, const ConfinedFs& fs = ConfinedFs(),
      const std::string& field = "model.init_from");
  const SafetensorsHeader& header() const { return header_; }
  // The tensor named `name`, or null.
  const SafetensorsEntry* Find(const std::string& name) const;
  // The box of `name` as fp32 (BF16 and F16 widened exactly). NotFound for
  // a tensor the file lacks or a box outside its shape.
  absl::Status Read(const std::string& name, const Box& box,
                    float* dst) override;

 private:
  std::string path_;
  UniqueFd fd_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> header_.tensors[i]
};

// One tensor to write: its name, global shape and the dtype it is stored
// in (F32 or BF16); the values come from a TensorSource (its whole box).
struct SafetensorsTensorOut {
  std::string name;
  std::vector<int64_t> shape;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
};

// Writes `tensors` (in this order; F32 as read, BF16 each value rounded to
// the nearest bf16, ties to even) and `metadata` to `path`, beside it first
// and renamed: never a half-written file. Errors name `field`; F16 is not
// written (InvalidArgument).
absl::Status WriteSafetensors(
    const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
    TensorSource& source, const std::map<std::string, std::string>& metadata,
    const ConfinedFs& fs = ConfinedFs(), const std::string& field = "--hf");

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_CHECKPOINT_SAFETENSORS_H_
