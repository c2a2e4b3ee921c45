// ptworker's `export` and `sample`; see checkpoint_tools.h.
#include "worker/checkpoint_tools.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/confined_fs.h"
#include "common/exit_codes.h"
#include "common/logging.h"
#include "common/spec.h"
#include "spdlog/spdlog.h"
#include "worker/engine/checkpoint.h"
#include "worker/engine/data.h"
#include "worker/engine/trainer.h"
#include "worker/exit_status.h"

namespace ptrain {
namespace {

absl::Status ExportStatus(const std::string& checkpoint,
                          const std::string& out) {
  auto fs = ConfinedFs::FromEnvironment();
  if (!fs.ok()) return fs.status();
  auto reader = CheckpointReader::Open(checkpoint, *fs, "--checkpoint");
  if (!reader.ok()) return reader.status();
  // Open checked that the tensors are those of the manifest's model, so
  // the export allocates no more than the checkpoint holds.
  const GptConfig& model = (*reader)->meta().model;
  return ExportLlmc(**reader, model, out, *fs, "--llmc");
}

// The checkpoint's model on one rank (whatever layout trained it) on the
// CPU in fp32, with the checkpoint's own vocabulary: no data file is read,
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
  *spec.mutable_parallel() = DefaultJobSpec().parallel();
  spec.mutable_resources()->set_device("cpu");
  *spec.mutable_checkpoint() = DefaultJobSpec().checkpoint();
  spec.mutable_model()->set_init_from("");
  v1::TrainSpec& train = *spec.mutable_train();
  train.set_precision("fp32");
  train.set_steps(std::max(train.steps(), meta.step));
  if (f.prompt.has_value()) {
    if (meta.vocab.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: checkpoint ", f.checkpoint,
          " is of a model trained on token files, which has no tokenizer to "
          "read a prompt with"));
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
  return (*trainer)->Sample(static_cast<uint64_t>(meta.step));
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

int RunExport(const std::string& checkpoint, const std::string& out) {
  return RunTool("export", [&] {
    absl::Status s = ExportStatus(checkpoint, out);
    if (s.ok()) {
      std::printf("wrote %s (llm.c GPT-2 fp32) from %s\n", out.c_str(),
                  checkpoint.c_str());
    }
    return s;
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
