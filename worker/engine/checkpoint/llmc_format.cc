// llm.c's GPT-2 checkpoint files (checkpoint.h): ExportLlmc writes one from
// any TensorSource, LlmcSource reads one (model.init_from). Not ptrain's own
// checkpoints, nor llm.c's token files (data.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/checkpoint/checkpoint_internal.h"

namespace ptrain {

namespace {

constexpr int32_t kLlmcMagic = 20240326;
constexpr int32_t kLlmcVersion = 3;  // fp32, padded vocabulary

// llm.c's order: wte, wpe, then each block tensor kind across all layers,
// then ln_f; each tensor with its global shape as stored (wte padded to
// the multiple of 128 llm.c pads to, wpe with maxT rows).
std::vector<std::pair<std::string, std::vector<int64_t>>> LlmcOrder(
    const GptConfig& c, int64_t maxT) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const ParamInfo& p : GptTensors(c)) shapes[p.name] = p.global_shape;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.emplace_back(
      "wte", std::vector<int64_t>{PaddedVocab(c.vocab_size, 1), c.n_embd});
  out.emplace_back("wpe", std::vector<int64_t>{maxT, c.n_embd});
  for (const std::string& kind : GptBlockTensorNames()) {
    for (int l = 0; l < c.n_layer; ++l) {
      const std::string name = absl::StrCat("h.", l, ".", kind);
      out.emplace_back(name, shapes.at(name));
    }
  }
  out.emplace_back("ln_f.weight", shapes.at("ln_f.weight"));
  out.emplace_back("ln_f.bias", shapes.at("ln_f.bias"));
  return out;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A model config whose llm.c tensors can be counted in int64 without
// overflow (the header stores int32 dimensions; C·C must stay far inside).
bool LlmcSizable(const GptConfig& c) {
  return c.n_layer >= 1 && c.n_layer <= (1 << 20) && c.n_embd >= 1 &&
         c.n_embd <= (1 << 24) && c.vocab_size >= 1 && c.block_size >= 1;
}

}  // namespace

absl::Status ExportLlmc(TensorSource& source, const GptConfig& config,
                        const std::string& path, const ConfinedFs& fs,
                        const std::string& field) {
  if (!LlmcSizable(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model is too large for llm.c's format"));
  }
  if (config.arch != "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model is model.arch=", config.arch,
                     "; llm.c's format is GPT-2's (export it with --hf)"));
  }
  if (!config.tie_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        field,
        ": the model's head has a table of its own "
        "(model.tie_embeddings=false); llm.c's format ties it to wte"));
  }
  const int64_t V = config.vocab_size;
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = config.block_size;
  header[3] = config.vocab_size;
  header[4] = config.n_layer;
  header[5] = config.n_head;
  header[6] = config.n_embd;
  header[7] = PaddedVocab(config.vocab_size, 1);
  // Written beside the target and renamed: never a half-written file.
  return WriteReplacing(fs, path, field, [&](ChunkedWriter& w) {
    if (auto s = w.Write(reinterpret_cast<const char*>(header), sizeof(header));
        !s.ok()) {
      return s;
    }
    for (const auto& [name, shape] : LlmcOrder(config, config.block_size)) {
      const int64_t stored = Numel(shape);
      Box real = WholeBox(shape);
      if (name == "wte") real.hi[0] = V;  // rows past V stay zero
      std::vector<float> buf(stored, 0.0f);
      if (auto s = source.Read(name, real, buf.data()); !s.ok()) return s;
      if (auto s = w.Write(reinterpret_cast<const char*>(buf.data()),
                           stored * static_cast<int64_t>(sizeof(float)));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::unique_ptr<LlmcSource>> LlmcSource::Open(
    const std::string& path, const GptConfig& config, const ConfinedFs& fs,
    const std::string& field) {
  auto fd =
      fs.Open(path, O_RDONLY | O_NONBLOCK, field);  // never wait on a FIFO
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is not a regular file"));
  }
  int32_t h[256];
  if (::pread(fd->get(), h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h))) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is shorter than the llm.c header"));
  }
  if (h[0] != kLlmcMagic || h[1] != kLlmcVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", path, "' has magic ", h[0], " version ", h[1],
        " (expected ", kLlmcMagic, " version ", kLlmcVersion, ", fp32)"));
  }
  const int maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp = h[7];
  auto mismatch = [&](const char* what, int64_t file, int64_t model) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' has ", what, "=", file,
                     " but the model has ", model));
  };
  if (L != config.n_layer) return mismatch("n_layer", L, config.n_layer);
  if (NH != config.n_head) return mismatch("n_head", NH, config.n_head);
  if (C != config.n_embd) return mismatch("n_embd", C, config.n_embd);
  if (V != config.vocab_size)
    return mismatch("vocab_size", V, config.vocab_size);
  if (maxT < config.block_size) {
    return mismatch("max sequence length", maxT, config.block_size);
  }
  if (Vp != PaddedVocab(V, 1)) {
    return mismatch("padded vocab", Vp, PaddedVocab(V, 1));
  }
  if (!LlmcSizable(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the model is too large for llm.c's format"));
  }
  std::unique_ptr<LlmcSource> src(new LlmcSource());
  src->path_ = path;
  // Every count fits int64 (LlmcSizable, maxT < 2^31); their byte sum is
  // checked as it grows.
  int64_t offset = sizeof(h);
  for (const auto& [name, shape] : LlmcOrder(config, maxT)) {
    src->offsets_[name] = offset;
    src->shapes_[name] = shape;
    if (__builtin_add_overflow(offset, Numel(shape) * 4, &offset) ||
        offset > st.st_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", path, "' is ", st.st_size,
                       " bytes; its header implies more (at least ",
                       std::min<int64_t>(offset, INT64_MAX), ")"));
    }
  }
  if (st.st_size != offset) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is ", st.st_size,
                     " bytes; its header implies ", offset));
  }
  for (const ParamInfo& p : GptTensors(config)) {
    src->bounds_[p.name] = p.global_shape;
  }
  src->fd_ = std::move(*fd);
  return src;
}

absl::Status LlmcSource::Read(const std::string& name, const Box& box,
                              float* dst) {
  auto it = offsets_.find(name);
  auto bound = bounds_.find(name);
  bool inside = it != offsets_.end() && bound != bounds_.end();
  const std::vector<int64_t>* shape = inside ? &shapes_.at(name) : nullptr;
  const std::vector<int64_t>* limit = inside ? &bound->second : nullptr;
  for (size_t d = 0; inside && d < limit->size(); ++d) {
    inside = box.lo.size() == limit->size() && box.hi.size() == limit->size() &&
             limit->size() == shape->size() && box.lo[d] >= 0 &&
             box.lo[d] <= box.hi[d] && box.hi[d] <= (*limit)[d] &&
             (*limit)[d] <= (*shape)[d];
  }
  if (!inside) {
    return absl::NotFoundError(absl::StrCat("llm.c checkpoint '", path_,
                                            "' has no such part of ", name));
  }
  const Box whole = WholeBox(*shape);
  const int64_t row = box.hi.back() - box.lo.back();
  absl::Status status = absl::OkStatus();
  ForEachBoxRow(box, [&](const std::vector<int64_t>& coord) {
    if (!status.ok()) return;
    char* out = reinterpret_cast<char*>(dst + BoxIndex(box, coord));
    const int64_t bytes = row * static_cast<int64_t>(sizeof(float));
    const int64_t at = it->second + BoxIndex(whole, coord) *
                                        static_cast<int64_t>(sizeof(float));
    if (!PreadAll(fd_.get(), out, bytes, at)) {
      status =
          absl::DataLossError(absl::StrCat("short read from '", path_, "'"));
    }
  });
  return status;
}

}  // namespace ptrain
