// A job's tokenizer as the files of a Hugging Face model folder (what
// `ptworker export --hf` writes beside the weights): GPT-2's compiled-in
// byte-level BPE as a tokenizer.json, a SentencePiece model as
// tokenizer.model, each with a tokenizer_config.json naming the class
// transformers loads it with; a tokenizer.json (hf:PATH) as it is. Not the
// char tokenizer, which Hugging Face has no class for, and not llm.c's
// tokenizer file, which only decodes.
#ifndef PTRAIN_COMMON_HF_TOKENIZER_EXPORT_H_
#define PTRAIN_COMMON_HF_TOKENIZER_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer.h"

namespace ptrain {

// The ids of the tokens a model's text begins and ends with, as
// config.json gives them (bos_token_id, eos_token_id); -1: not given.
struct HfTokenIds {
  int bos = -1, eos = -1;
};

// One file of the folder: its name there and its bytes.
struct HfFile {
  std::string name;
  std::string bytes;
};

// GPT-2's tokenizer (Gpt2Bpe::Builtin) as the tokenizer.json Hugging Face
// publishes for GPT-2: model BPE with the vocabulary and the merges in rank
// order, a ByteLevel pre-tokenizer (GPT-2's pattern), post-processor and
// decoder, and <|endoftext|> (50256) an added special token. Opened with
// OpenTokenizer("hf:..."), it encodes a text to the ids "gpt2" gives, but
// for "<|endoftext|>" inside a text: that is the token 50256 here (as
// transformers reads it), and text to "gpt2" (which never gives 50256).
std::string Gpt2TokenizerJson();

// The files for data.tokenizer `name`:
//   gpt2       tokenizer.json (Gpt2TokenizerJson) and tokenizer_config.json
//              (GPT2Tokenizer; <|endoftext|> its bos, eos and unk);
//   spm:PATH   tokenizer.model (PATH's bytes) and tokenizer_config.json
//              (LlamaTokenizer; bos, eos and unk the model's pieces, or null
//              where it has none; legacy: SentencePiece encodes the text as
//              it is, adding no token, with add_prefix_space as the model
//              puts a space in front of a text);
//   hf:PATH    the tokenizer.json and, when there is one beside it, the
//              tokenizer_config.json, as they are.
// A written config's model_max_length is `max_length` (the model's
// positions). Files are read through `read_file` (null: read directly;
// NotFound for the tokenizer_config.json beside a tokenizer.json means
// there is none). Errors name `field`; InvalidArgument for another name or
// a SentencePiece model that does not load. `ids`, when given, receives
// the tokenizer's special ids from the files as read (a tokenizer.json is
// then opened as `hf:` opens it, and its errors returned): gpt2's <|endoftext|>
// as bos and eos (as GPT-2's published configuration has them), a
// SentencePiece model's <s> and </s>, a tokenizer.json's end of text.
absl::StatusOr<std::vector<HfFile>> HfTokenizerFiles(
    absl::string_view name, int max_length, absl::string_view field,
    const ReadFile& read_file = nullptr, HfTokenIds* ids = nullptr);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_HF_TOKENIZER_EXPORT_H_
