// The tiny GPT that tests/reference/make_gpt_reference.py checks against
// PyTorch, and the record file format both sides read and write.
#ifndef PTRAIN_TESTS_WORKER_ENGINE_REFERENCE_IO_H_
#define PTRAIN_TESTS_WORKER_ENGINE_REFERENCE_IO_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ptrain/v1/job.pb.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/rng.h"

namespace ptrain::testing {

// Odd sizes on purpose: nothing a power of two except where the model needs it.
struct ReferenceSetup {
  GptConfig config{
      /*n_layer=*/2,    /*n_head=*/2,      /*n_embd=*/16,
      /*block_size=*/8, /*vocab_size=*/11, /*padded_vocab=*/128};
  int B = 3, T = 8;
  uint64_t seed = 1337;
  v1::TrainSpec train;
  std::vector<int32_t> inputs, targets;

  ReferenceSetup() {
    train.set_lr(1e-2);
    train.set_min_lr(1e-3);
    train.set_warmup_steps(2);
    train.set_steps(10);
    train.set_weight_decay(0.1);
    train.set_grad_clip(0.5);
    train.set_beta1(0.9);
    train.set_beta2(0.95);
    train.set_eps(1e-8);
    for (int i = 0; i < B * T; ++i) {
      inputs.push_back(static_cast<int32_t>(CounterRandom64(seed, 1, i) %
                                            config.vocab_size));
      targets.push_back(static_cast<int32_t>(CounterRandom64(seed, 2, i) %
                                             config.vocab_size));
    }
  }
};

// The single-rank model of the setup, with its own buffers, initialised.
inline std::unique_ptr<GptStage> ReferenceModel(const ReferenceSetup& setup) {
  StageOptions o;
  o.max_B = setup.B;
  o.max_T = setup.T;
  auto model =
      std::make_unique<GptStage>(setup.config, BuildPlan(setup.config, {}), o);
  model->InitParams(setup.seed);
  return model;
}

struct Record {
  std::vector<int64_t> dims;
  std::vector<float> f32;
  std::vector<int32_t> i32;
};
using Records = std::map<std::string, Record>;

inline constexpr char kRefMagic[8] = {'P', 'T', 'R', 'E', 'F', '1', 0, 0};

class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path)
      : out_(path, std::ios::binary | std::ios::trunc) {
    out_.write(kRefMagic, 8);
  }
  void F32(const std::string& name, std::vector<int64_t> dims, const float* p) {
    Head(name, 0, dims);
    out_.write(reinterpret_cast<const char*>(p), 4 * Count(dims));
  }
  void I32(const std::string& name, std::vector<int64_t> dims,
           const int32_t* p) {
    Head(name, 1, dims);
    out_.write(reinterpret_cast<const char*>(p), 4 * Count(dims));
  }
  bool ok() const { return static_cast<bool>(out_); }

 private:
  static int64_t Count(const std::vector<int64_t>& dims) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    return n;
  }
  void Head(const std::string& name, int32_t dtype,
            const std::vector<int64_t>& dims) {
    const auto n = static_cast<int32_t>(name.size());
    const auto ndim = static_cast<int32_t>(dims.size());
    out_.write(reinterpret_cast<const char*>(&n), 4);
    out_.write(name.data(), n);
    out_.write(reinterpret_cast<const char*>(&dtype), 4);
    out_.write(reinterpret_cast<const char*>(&ndim), 4);
    out_.write(reinterpret_cast<const char*>(dims.data()), 8 * ndim);
  }
  std::ofstream out_;
};

inline Records ReadRecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, kRefMagic, 8) != 0) {
    throw std::runtime_error("not a reference file: " + path);
  }
  Records out;
  int32_t n;
  while (in.read(reinterpret_cast<char*>(&n), 4)) {
    std::string name(n, '\0');
    int32_t dtype, ndim;
    in.read(name.data(), n);
    in.read(reinterpret_cast<char*>(&dtype), 4);
    in.read(reinterpret_cast<char*>(&ndim), 4);
    Record r;
    r.dims.resize(ndim);
    in.read(reinterpret_cast<char*>(r.dims.data()), 8 * ndim);
    int64_t count = 1;
    for (int64_t d : r.dims) count *= d;
    if (dtype == 0) {
      r.f32.resize(count);
      in.read(reinterpret_cast<char*>(r.f32.data()), 4 * count);
    } else {
      r.i32.resize(count);
      in.read(reinterpret_cast<char*>(r.i32.data()), 4 * count);
    }
    if (!in) throw std::runtime_error("truncated reference file: " + path);
    out[name] = std::move(r);
  }
  return out;
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_WORKER_ENGINE_REFERENCE_IO_H_
