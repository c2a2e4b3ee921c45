// Fuzzes Hugging Face tokenizer.json loading (common/hf_tokenizer.h).
// Input: any bytes, read as a tokenizer.json. Most are refused, as
// InvalidArgument naming the file; never a crash, a leak or a hang. One that
// loads must encode a few texts (fixed ones, invalid UTF-8, text not in NFC
// and added-token look-alikes among them, and the input's own bytes) to
// ids of its vocabulary that decode back to the text as normalized
// (Normalize: the text itself without a normalizer), its words put back
// together being that too, every id's piece not empty.
//
// Seed corpus: fuzz/corpus/hf_tokenizer/ (small byte-level files that load:
// Llama 3's pattern, GPT-2's through ByteLevel, ignore_merges, merges as
// pairs, the NFC normalizer; and files refused: not JSON, another model, a
// normalizer but NFC, a pattern that does not compile, a merge of an
// unknown token, ids twice).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/hf_tokenizer.h"

namespace {

void Fail(const char* what) {
  std::fprintf(stderr, "hf_tokenizer_fuzzer: %s\n", what);
  std::abort();
}

void Check(const ptrain::HfTokenizer& t, std::string_view text) {
  const std::vector<int32_t> ids = t.Encode(text);
  for (const int32_t id : ids) {
    if (id < 0 || id >= t.size()) Fail("an id outside the vocabulary");
    if (t.Piece(id).empty()) Fail("an empty piece");
  }
  const std::string normalized = t.Normalize(text);
  if (t.Decode(ids) != normalized)
    Fail("decode(encode(x)) is not x as normalized");
  if (!text.empty() && ids.empty()) Fail("no ids for a text");
  std::string joined;
  for (const std::string& w : t.Split(text)) {
    if (w.empty()) Fail("an empty word");
    joined.append(w);
  }
  if (joined != normalized) {
    Fail("the words put back together are not the text as normalized");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto t = ptrain::HfTokenizer::Parse(bytes, "fuzz.json");
  if (!t.ok()) {
    if (t.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a refusal that is not InvalidArgument");
    }
    if (t.status().message().rfind("fuzz.json: ", 0) != 0) {
      Fail("a refusal that does not name the file");
    }
    return 0;
  }
  const ptrain::HfTokenizer& tok = **t;
  if (tok.size() <= 0) Fail("an empty vocabulary loaded");
  if (tok.end_of_text() < -1 || tok.end_of_text() >= tok.size()) {
    Fail("an end of text outside the vocabulary");
  }
  for (const std::string_view text :
       {std::string_view("Hello world! It's 12345 o'clock;  \n\n x\ty"),
        std::string_view("IT'S   \r\n\r\n<|end_of_text|><|endoftext|></s><|"),
        std::string_view(
            "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x91\x8D"),
        std::string_view("\xFF \xC3(\xED\xA0\x80 a\x80\x80  \xF4\x90\x80\x80"),
        std::string_view("cafe\xCC\x81 \xFF\xCC\x81 A\xCC\x8A\xCC\xA3 "
                         "\xE1\x84\x80\xE1\x85\xA1"),
        std::string_view("\0\0 \0", 4)}) {
    Check(tok, text);
  }
  Check(tok, bytes);
  return 0;
}
