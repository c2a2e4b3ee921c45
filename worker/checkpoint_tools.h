// ptworker's subcommands over a checkpoint, run by one process with no
// training: `export` (the weights as an llm.c GPT-2 file) and `sample`
// (text the checkpoint's model generates). Each returns ptworker's exit
// code: 0, 2 for bad input, 1 otherwise, with one error line on stderr.
#ifndef PTRAIN_WORKER_CHECKPOINT_TOOLS_H_
#define PTRAIN_WORKER_CHECKPOINT_TOOLS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "worker/threads.h"

namespace ptrain {

// `ptworker export --checkpoint CHECKPOINT --llmc OUT [--llmc-tokenizer
// TOK]`: writes the checkpoint's weights to OUT and, when TOK is given, its
// job's tokenizer (data.tokenizer: gpt2, spm:MODEL, hf:TOKENIZER_JSON, or
// the file beside its token files) as llm.c's tokenizer file, so that llm.c
// decodes the model's samples; all confined to PTRAIN_DATA_ROOTS.
int RunExport(const std::string& checkpoint, const std::string& out,
              const std::string& tokenizer_out);

// `ptworker export --checkpoint CHECKPOINT --hf OUT [--hf-dtype DTYPE]`:
// the checkpoint's model as a Hugging Face folder (hf_checkpoint.h's
// ExportHf): config.json, safetensors in DTYPE (fp32, bit-exact, or bf16),
// and the job's tokenizer (common/hf_tokenizer_export.h: gpt2, spm:MODEL,
// hf:PATH, or the tokenizer beside its token files), or a line saying why
// there is none (the char tokenizer); confined to PTRAIN_DATA_ROOTS. A
// DTYPE of another name is refused (exit 2) before anything is read.
int RunExportHf(const std::string& checkpoint, const std::string& out,
                const std::string& dtype);

// `ptworker sample`'s flags; unset ones take the job's train.sample_*.
struct SampleFlags {
  std::string checkpoint;
  std::optional<std::string> prompt;
  std::optional<int> tokens, top_k;
  std::optional<double> temperature;
  std::optional<uint64_t> seed;
};

// `ptworker sample`: prints the text to stdout; logs only warnings.
int RunSample(const SampleFlags& flags, const NodeShare& node);

}  // namespace ptrain

#endif  // PTRAIN_WORKER_CHECKPOINT_TOOLS_H_
