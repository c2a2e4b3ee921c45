// ptworker's `export` and `sample`; see checkpoint_tools.h.
#include "worker/checkpoint_tools.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"
#include "common/exit_codes.h"
#include "common/hf_config.h"
#include "common/hf_tokenizer_export.h"
#include "common/logging.h"
#include "common/mesh.h"
#include "common/spec.h"
#include "common/tokenizer.h"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/hf_checkpoint.h"
#include "worker/engine/data/data.h"
#include "worker/engine/train/trainer.h"
#include "worker/exit_status.h"

namespace ptrain {
namespace {

// The tokenizer of a checkpoint's job for llm.c's tokenizer file: its
// data.tokenizer's (gpt2, spm:MODEL, hf:TOKENIZER_JSON, the file beside its
// token files).
absl::StatusOr<std::shared_ptr<const Tokenizer>> ExportedTokenizer(
    const std::string& checkpoint, const CheckpointMeta& meta,
    const ConfinedFs& fs) {
  constexpr char kField[] = "--llmc-tokenizer";
  if (!meta.vocab.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": checkpoint ", checkpoint,
        " is of a char-tokenizer model, which has no end-of-text token; "
        "llm.c's tokenizer file needs one (train with data.tokenizer: gpt2, "
        "spm:MODEL or hf:TOKENIZER_JSON)"));
  }
  auto spec = ParseJobSpec(meta.spec_yaml, {},
                           absl::StrCat("--checkpoint ", checkpoint, ": spec"));
  if (!spec.ok()) return spec.status();
  auto tokenizer = OpenDataTokenizer(spec->data(), fs);
  if (!tokenizer.ok()) return tokenizer.status();
  if (*tokenizer == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": checkpoint ", checkpoint,
        "'s job names no tokenizer (data.tokenizer) and its token files have "
        "no tokenizer file beside them"));
  }
  if ((*tokenizer)->end_of_text() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kField, ": data.tokenizer=", spec->data().tokenizer(),
        " has no end-of-text token, which llm.c's tokenizer file needs"));
  }
  return tokenizer;
}

absl::Status ExportStatus(const std::string& checkpoint, const std::string& out,
                          const std::string& tokenizer_out) {
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  auto reader = CheckpointReader::Open(checkpoint, *fs, "--checkpoint");
  if (!reader.ok()) return reader.status();
  // Everything is checked before anything is written.
  std::shared_ptr<const Tokenizer> tokenizer;
  if (!tokenizer_out.empty()) {
    if (absl::Status s = fs->Check(tokenizer_out, "--llmc-tokenizer");
        !s.ok()) {
      return s;
    }
    auto t = ExportedTokenizer(checkpoint, (*reader)->meta(), *fs);
    if (!t.ok()) return t.status();
    tokenizer = std::move(*t);
  }
  // Open checked that the tensors are those of the manifest's model, so
  // the export allocates no more than the checkpoint holds.
  const GptConfig& model = (*reader)->meta().model;
  if (absl::Status s = ExportLlmc(**reader, model, out, *fs, "--llmc");
      !s.ok() || tokenizer == nullptr) {
    return s;
  }
  return WriteLlmcTokenizer(*tokenizer, tokenizer_out);
}

// The checkpoint's model on one rank (whatever layout trained it) on the
// CPU in fp32, with the checkpoint's own vocabulary (or, for a model of
// token files, its job's data.tokenizer): no training data is read,
// nothing is written.
absl::StatusOr<std::string> SampleStatus(const SampleFlags& f,
                                         const NodeShare& node) {
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  std::error_code ec;
  if (!std::filesystem::exists(f.checkpoint, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--checkpoint ", f.checkpoint, ": no such folder"));
  }
  auto reader = CheckpointReader::Open(f.checkpoint, *fs, "--checkpoint");
  if (!reader.ok()) return reader.status();
  const CheckpointMeta meta = (*reader)->meta();
  reader->reset();
  auto parsed =
      ParseJobSpec(meta.spec_yaml, {},
                   absl::StrCat("--checkpoint ", f.checkpoint, ": spec"));
  if (!parsed.ok()) return parsed.status();
  v1::JobSpec spec = *parsed;
  ResetParallel(&spec);
  spec.mutable_resources()->set_device("cpu");
  *spec.mutable_checkpoint() = DefaultJobSpec().checkpoint();
  spec.mutable_model()->set_init_from("");
  v1::TrainSpec& train = *spec.mutable_train();
  train.set_precision("fp32");
  train.set_steps(std::max(train.steps(), meta.step));
  // A model of token files samples through the job's data.tokenizer
  // (gpt2, spm:MODEL, hf:TOKENIZER_JSON, the tokenizer file beside its
  // shards), if any.
  std::shared_ptr<const Tokenizer> words;
  if (meta.vocab.empty()) {
    auto opened = OpenDataTokenizer(spec.data(), *fs);
    if (!opened.ok()) return opened.status();
    words = std::move(*opened);
  }
  if (f.prompt.has_value()) {
    if (meta.vocab.empty() && (words == nullptr || !words->can_encode())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: checkpoint ", f.checkpoint,
          " is of a model trained on token files whose job names no "
          "tokenizer that encodes (data.tokenizer: gpt2, spm:MODEL or "
          "hf:TOKENIZER_JSON)"));
    }
    train.set_sample_prompt(*f.prompt);
  }
  if (f.tokens.has_value()) train.set_sample_tokens(*f.tokens);
  if (f.temperature.has_value()) train.set_sample_temperature(*f.temperature);
  if (f.top_k.has_value()) train.set_sample_top_k(*f.top_k);
  if (f.seed.has_value()) train.set_seed(*f.seed);
  if (auto s = ValidateJobSpec(spec); !s.ok()) return s;
  SetThreads(spec.resources().threads_per_rank(), node);

  TokenData data;
  data.vocab_size = meta.model.vocab_size;
  data.words = std::move(words);
  if (!meta.vocab.empty()) {
    data.has_tokenizer = true;
    data.tokenizer = CharTokenizer(meta.vocab);
    const std::string& prompt = train.sample_prompt();
    if (data.tokenizer.Decode(data.tokenizer.Encode(prompt)) != prompt) {
      spdlog::warn(
          "--prompt: characters the model never saw in training are left "
          "out");
    }
  }
  // A trainer's batch samplers need one sequence to draw from; sampling
  // draws none.
  const size_t sequence = static_cast<size_t>(spec.model().block_size()) + 1;
  data.train.emplace_back(std::vector<uint16_t>(sequence, 0));
  data.val.emplace_back(std::vector<uint16_t>(sequence, 0));
  TrainerOptions options;
  options.fs = *fs;
  options.resume_from = f.checkpoint;
  options.quiet = true;
  auto trainer = Trainer::CreateWithData(spec, options, std::move(data));
  if (!trainer.ok()) return trainer.status();
  // The salt of the run's own sample at this step: with the job's settings
  // the text is the one its run log holds for this step.
  return (*trainer)->sampler().Sample(static_cast<uint64_t>(meta.step));
}

// Runs `body` (one process, no training) and turns its failure into one
// error line and an exit code.
int RunTool(const char* what, const std::function<absl::Status()>& body) {
  absl::Status s;
  try {
    s = body();
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of memory reading the checkpoint"));
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ptworker: error: %s\n",
                 std::string(s.message()).c_str());
    return IsInputError(s) ? kExitBadInput : 1;
  }
  return 0;
}

}  // namespace

int RunExport(const std::string& checkpoint, const std::string& out,
              const std::string& tokenizer_out) {
  return RunTool("export", [&] {
    absl::Status s = ExportStatus(checkpoint, out, tokenizer_out);
    if (s.ok()) {
      std::printf("wrote %s (llm.c GPT-2 fp32) from %s\n", out.c_str(),
                  checkpoint.c_str());
      if (!tokenizer_out.empty()) {
        std::printf("wrote %s (llm.c tokenizer)\n", tokenizer_out.c_str());
      }
    }
    return s;
  });
}

int RunExportHf(const std::string& checkpoint, const std::string& out,
                const std::string& dtype) {
  return RunTool("export", [&]() -> absl::Status {
    // Everything is checked before anything is written.
    SafetensorsDtype weights;
    if (dtype == "fp32") {
      weights = SafetensorsDtype::kF32;
    } else if (dtype == "bf16") {
      weights = SafetensorsDtype::kBf16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--hf-dtype=", dtype, ": not one of fp32, bf16 (the weights' type)"));
    }
    auto fs = ConfinedFs::FromEnvironment();
    if (!fs.ok()) return fs.status();
    auto reader = CheckpointReader::Open(checkpoint, *fs, "--checkpoint");
    if (!reader.ok()) return reader.status();
    if (absl::Status s = fs->Check(out, "--hf"); !s.ok()) return s;
    const CheckpointMeta& meta = (*reader)->meta();
    auto spec =
        ParseJobSpec(meta.spec_yaml, {},
                     absl::StrCat("--checkpoint ", checkpoint, ": spec"));
    if (!spec.ok()) return spec.status();
    // The job's tokenizer goes with the model where Hugging Face has one
    // like it; else a line says why none does.
    std::vector<HfFile> tokenizer_files;
    HfTokenIds tokens;
    std::string no_tokenizer;
    if (!meta.vocab.empty()) {
      no_tokenizer = "the char tokenizer has no Hugging Face equivalent";
    } else {
      auto name = DataTokenizerName(spec->data(), *fs);
      if (!name.ok()) return name.status();
      if (name->empty()) {
        no_tokenizer = "the job's token files have no tokenizer beside them";
      } else if (absl::StartsWith(*name, "llmc:")) {
        no_tokenizer = absl::StrCat("llm.c's tokenizer file ", name->substr(5),
                                    " only decodes");
      } else {
        const std::string field = "--hf: the job's data.tokenizer";
        // Its special ids go into config.json (generation stops at eos).
        auto files =
            HfTokenizerFiles(*name, meta.model.block_size, field,
                             fs->Reader(field, int64_t{1} << 30), &tokens);
        if (!files.ok()) return files.status();
        tokenizer_files = std::move(*files);
      }
    }
    absl::Status s = ExportHf(**reader, meta.model, out, tokenizer_files, *fs,
                              "--hf", weights, kHfShardBytes, tokens);
    if (!s.ok()) return s;
    std::string written;
    for (const HfFile& f : tokenizer_files) {
      absl::StrAppend(&written, ", ", f.name);
    }
    std::printf("wrote %s (Hugging Face %s, %s%s) from %s\n", out.c_str(),
                HfArchitecture(meta.model.arch == "llama", meta.model.has_moe(),
                               meta.model.qk_norm),
                dtype.c_str(), written.c_str(), checkpoint.c_str());
    if (!no_tokenizer.empty()) {
      std::printf("wrote no tokenizer files: %s\n", no_tokenizer.c_str());
    }
    return absl::OkStatus();
  });
}

int RunSample(const SampleFlags& flags, const NodeShare& node) {
  SetupLogging("warn");
  return RunTool("sample", [&]() -> absl::Status {
    auto text = SampleStatus(flags, node);
    if (!text.ok()) return text.status();
    text->push_back('\n');
    std::fwrite(text->data(), 1, text->size(), stdout);
    return absl::OkStatus();
  });
}

}  // namespace ptrain
