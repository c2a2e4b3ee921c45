// Fuzzes the safetensors reader (Hugging Face checkpoints in, issue 61):
// the header's parser on any text and any file size, then the bytes as a
// file opened by SafetensorsSource and every tensor read whole, past its
// end and before its start. Whatever the bytes: OK or an error with a
// message; never a crash, an overflow or an out-of-bounds read; an
// accepted header's tensors tile the data exactly.
//
// Seed corpus: fuzz/corpus/safetensors/ holds small real files (F32 as
// ptrain writes them; BF16 and F16 with metadata).
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_file.h"
#include "worker/engine/checkpoint/safetensors.h"
#include "worker/engine/model/plan.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  ptrain::fuzz::FuzzFile("safetensors", "model.safetensors");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path =
      ptrain::fuzz::FuzzFile("safetensors", "model.safetensors");
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  // The parser alone: the text after the first 8 bytes, against a file
  // size from them (any size, also one the text does not fit).
  if (size >= 8) {
    int64_t claimed = 0;
    std::memcpy(&claimed, data, 8);
    for (int64_t file_size : {static_cast<int64_t>(size), claimed}) {
      auto h =
          ptrain::ParseSafetensorsHeader(bytes.substr(8), file_size, "fuzz");
      if (!h.ok()) {
        if (h.status().message().empty()) std::abort();
        continue;
      }
      int64_t at = 0;
      for (const ptrain::SafetensorsEntry& e : h->tensors) {
        if (e.begin != at || e.end < e.begin) std::abort();
        at = e.end;
      }
      if (at != file_size - h->data_begin) std::abort();
    }
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();
  }
  auto src = ptrain::SafetensorsSource::Open(path);
  if (!src.ok()) {
    if (src.status().message().empty()) std::abort();
    return 0;
  }
  std::vector<float> buf;
  for (const ptrain::SafetensorsEntry& e : (*src)->header().tensors) {
    if (e.shape.empty() || ptrain::ShapeNumel(e.shape) > (1 << 20)) continue;
    buf.assign(ptrain::ShapeNumel(e.shape) + 1, 0.0f);
    const ptrain::Box whole = ptrain::WholeBox(e.shape);
    ptrain::Box past = whole, before = whole;
    past.hi[0] += 1;
    before.lo[0] = -1;
    if (!(*src)->Read(e.name, whole, buf.data()).ok()) std::abort();
    for (const ptrain::Box& b : {past, before}) {
      if ((*src)->Read(e.name, b, buf.data()).ok()) std::abort();
    }
  }
  return 0;
}
