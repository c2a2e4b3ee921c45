// Fuzzes the checkpoint reader: each input becomes the manifest.json of a
// small real checkpoint (tiny GPT, one rank, written once at start-up), with
// a correct manifest.sha256 recomputed, so the input gets past the digest
// and meets the validation. Then CheckpointReader::Open, CheckCompatible
// with the real model, a read of every tensor (and of ranges inside and
// outside them) and an llm.c export, as `ptworker export` does. Whatever
// the bytes: OK or an error with a message; never a crash, an overflow, an
// out-of-bounds read or a hang.
//
// Seed corpus: fuzz/corpus/checkpoint/ holds the real manifest; regenerate
// it with PTRAIN_FUZZ_WRITE_SEED=fuzz/corpus/checkpoint
// build-fuzz/fuzz/checkpoint_fuzzer -runs=0.
#include <openssl/evp.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "worker/engine/checkpoint/checkpoint.h"
#include "worker/engine/model/plan.h"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  std::string root, dir;
  ptrain::GptConfig config;
  std::vector<ptrain::ParamInfo> layout;
};
Fixture* g = nullptr;

std::string Sha256Hex(const std::string& data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < len; ++i) out += absl::StrFormat("%02x", md[i]);
  return out;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) std::abort();  // the harness itself failed
}

void RemoveRoot() {
  if (g != nullptr) {
    std::error_code ec;
    fs::remove_all(g->root, ec);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  g = new Fixture();
  std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  std::string tmpl = base + "/ptrain_checkpoint_fuzz_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  g->root = tmpl;
  std::atexit(RemoveRoot);

  // A real checkpoint of a tiny model at step 3: weights and both moments,
  // each tensor written as two boxes (the first rows, then the rest) so
  // that the index has several entries.
  g->config = ptrain::GptConfig{1, 2, 8, 4, 5, 128};
  g->layout = ptrain::GptTensors(g->config);
  int64_t total = 0;
  for (const auto& p : g->layout) total += p.numel;
  static std::vector<float> values;
  values.resize(3 * total);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * i - 0.5f;
  std::vector<ptrain::ShardRun> runs;
  int64_t at = 0;
  for (int kind = 0; kind < 3; ++kind) {
    for (const auto& p : g->layout) {
      const std::string name = kind == 0   ? p.name
                               : kind == 1 ? ptrain::ExpAvgName(p.name)
                                           : ptrain::ExpAvgSqName(p.name);
      ptrain::Box first = ptrain::WholeBox(p.global_shape), rest = first;
      const int64_t rows = p.global_shape[0] / 2;
      first.hi[0] = rows;
      rest.lo[0] = rows;
      if (rows > 0) runs.push_back({name, first, values.data() + at});
      runs.push_back({name, rest, values.data() + at + first.numel()});
      at += p.numel;
    }
  }
  ptrain::CheckpointMeta meta;
  meta.step = 3;
  meta.tokens_seen = 3 * 4 * 4;
  meta.optimizer_step = 3;
  meta.seed = 1337;
  meta.model = g->config;
  meta.vocab = "abcde";
  meta.spec_yaml = "name: fuzz\n";
  meta.job_uid = "fuzz-job";
  auto dir = ptrain::SaveCheckpoint(g->root, meta, runs, nullptr,
                                    ptrain::SaveOptions());
  if (!dir.ok()) std::abort();
  g->dir = *dir;
  if (const char* seed = std::getenv("PTRAIN_FUZZ_WRITE_SEED")) {
    fs::copy_file(fs::path(g->dir) / "manifest.json",
                  fs::path(seed) / "manifest.json",
                  fs::copy_options::overwrite_existing);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  WriteFile(g->dir + "/manifest.json", text);
  WriteFile(g->dir + "/manifest.sha256", Sha256Hex(text) + "  manifest.json\n");
  auto reader = ptrain::CheckpointReader::Open(g->dir);
  if (!reader.ok()) {
    if (reader.status().message().empty()) std::abort();  // errors say why
    return 0;
  }
  ptrain::CheckpointReader& r = **reader;
  (void)r.CheckCompatible(g->config, g->layout);
  std::vector<float> buf;
  for (const auto& p : g->layout) {
    for (const std::string& name :
         {p.name, ptrain::ExpAvgName(p.name), ptrain::ExpAvgSqName(p.name)}) {
      buf.assign(p.numel + 2, 0.0f);
      const ptrain::Box whole = ptrain::WholeBox(p.global_shape);
      ptrain::Box inner = whole, past = whole, before = whole;
      inner.lo[0] = 1;
      past.hi[0] += 1;  // past the end: refused
      before.lo[0] = -1;
      for (const ptrain::Box& b : {whole, inner, past, before}) {
        (void)r.Read(name, b, buf.data());
      }
    }
  }
  // What `ptworker export` does with an accepted checkpoint.
  const ptrain::GptConfig& model = r.meta().model;
  const std::string out = g->root + "/export.bin";
  (void)ptrain::ExportLlmc(r, model, out);
  return 0;
}
