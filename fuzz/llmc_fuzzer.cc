// Fuzzes the readers of llm.c's files: the token file parser (data.cc:
// 256 × int32 header, magic 20240520, then uint16 tokens in version 1,
// uint32 in version 2) and the mapped
// token stream training reads, which must agree with it, and LlmcSource, the
// GPT-2 weight file reader behind model.init_from (header, then fp32
// tensors). Input: the file's bytes. For the weight file the model config is
// taken from the header when it is small (so the size check and the reads
// are reached) and is a fixed tiny one otherwise. Whatever the bytes: OK or
// an error with a message; never a crash, an overflow or an out-of-bounds
// read.
//
// Seed corpus: fuzz/corpus/llmc/ holds a real token file and a real weight
// file (a 1-layer model exported by `ptworker export`).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_file.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/data/data.h"
#include "worker/engine/model/plan.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  ptrain::fuzz::FuzzFile("llmc", "model.bin");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = ptrain::fuzz::FuzzFile("llmc", "model.bin");
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);

  // The token file parser, for a GPT-2 and a character vocabulary.
  for (int vocab : {50257, 65}) {
    auto tokens =
        ptrain::ParseTokenFile(bytes, "data.train_bin", "fuzz", vocab);
    if (!tokens.ok() && tokens.status().message().empty()) std::abort();
    if (tokens.ok()) {
      for (int32_t t : *tokens) {
        // Accepted tokens are in range.
        if (t < 0 || t >= vocab) std::abort();
      }
    }
  }

  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) std::abort();
  }
  // The same bytes as a file, mapped as training reads it: the same verdict
  // and, when accepted, the same tokens as the parser's.
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) std::abort();
    auto mapped =
        ptrain::TokenStream::MapTokenFile(fd, "data.train_bin", "fuzz", 50257);
    ::close(fd);
    auto parsed =
        ptrain::ParseTokenFile(bytes, "data.train_bin", "fuzz", 50257);
    if (mapped.ok() != parsed.ok()) std::abort();
    if (!mapped.ok() && mapped.status() != parsed.status()) std::abort();
    if (mapped.ok()) {
      if (mapped->size() != parsed->size()) std::abort();
      for (size_t i = 0; i < mapped->size(); ++i) {
        if ((*mapped)[i] != (*parsed)[i]) std::abort();
      }
    }
  }

  // The weight file reader (the same file).
  int32_t h[8] = {};
  std::memcpy(h, data, std::min(size, sizeof(h)));
  ptrain::GptConfig config{1, 1, 2, 4, 3, 128};
  if (h[4] >= 1 && h[4] <= 4 && h[5] >= 1 && h[6] >= 1 && h[6] <= 32 &&
      h[3] >= 1 && h[3] <= 512 && h[2] >= 1 && h[2] <= 64) {
    config = ptrain::GptConfig{h[4], h[5], h[6],
                               h[2], h[3], ptrain::PaddedVocab(h[3], 1)};
  }
  auto src = ptrain::LlmcSource::Open(path, config);
  if (!src.ok()) {
    if (src.status().message().empty()) std::abort();
    return 0;
  }
  std::vector<float> buf;
  for (const auto& p : ptrain::GptTensors(config)) {
    buf.assign(p.numel + 1, 0.0f);
    const ptrain::Box whole = ptrain::WholeBox(p.global_shape);
    ptrain::Box past = whole, before = whole;
    past.hi[0] += 1;  // past the end
    before.lo[0] = -1;
    for (const ptrain::Box& b : {whole, past, before}) {
      (void)(*src)->Read(p.name, b, buf.data());
    }
  }
  return 0;
}
