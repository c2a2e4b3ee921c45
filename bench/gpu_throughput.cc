// Training throughput of the model on one GPU: GptStage on the CUDA
// backend, a whole step (forward, backward, gradient norm, AdamW over every
// parameter) at GPT-2 sizes, T = 1024. Prints tokens/s and MFU against the
// GPU's bf16 dense peak (--peak-tflops; 989 is the H100 SXM's), for fp32
// compute and for bf16 tensor-core compute.
//
//   gpu_throughput [--model 124m|350m] [--batch 8] [--steps 10]
//
// bench/pytorch_gpt_cuda.py runs the same model in PyTorch on the same GPU.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "worker/engine/gpt_stage.h"
#include "worker/engine/plan.h"

namespace {

struct Args {
  std::string model = "124m";
  int batch = 8;
  int steps = 10;
  double peak_tflops = 989.0;
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") {
      a.model = v;
    } else if (k == "--batch") {
      a.batch = std::atoi(v.c_str());
    } else if (k == "--steps") {
      a.steps = std::atoi(v.c_str());
    } else if (k == "--peak-tflops") {
      a.peak_tflops = std::atof(v.c_str());
    } else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

void Run(const Args& a, bool bf16) {
  ptrain::GptConfig config;
  if (a.model == "350m") {
    config = {24, 16, 1024, 1024, 50257, 50304};
  } else {
    config = {12, 12, 768, 1024, 50257, 50304};
  }
  const int B = a.batch, T = 1024;
  std::string error;
  ptrain::kernels::CudaOptions o;
  o.bf16_compute = bf16;
  std::unique_ptr<ptrain::kernels::Ops> ops =
      ptrain::kernels::MakeCudaOps(o, &error);
  if (ops == nullptr) {
    std::fprintf(stderr, "gpu_throughput: %s\n", error.c_str());
    std::exit(1);
  }
  ptrain::StageOptions so;
  so.max_B = B;
  so.max_T = T;
  so.ops = ops.get();
  ptrain::GptStage model(config, ptrain::BuildPlan(config, {}), so);
  model.InitParams(42);
  const int64_t n = model.buffer_size();
  ptrain::kernels::Buffer m(ops.get(), n), v(ops.get(), n);
  std::mt19937 gen(1);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = gen() % config.vocab_size;
    targets[i] = gen() % config.vocab_size;
  }
  auto step = [&](int t) {
    model.ZeroGrad();
    const float loss =
        model.Forward(0, tokens.data(), nullptr, targets.data(), B, T);
    model.Backward(0, tokens.data(), targets.data(), 1.0f / (B * T), nullptr);
    const double norm = std::sqrt(ops->SumSquares(model.grads(), n));
    const float scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
    ops->adamw_update(model.params(), m.data(), v.data(), model.grads(), n,
                      6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, t, scale);
    return loss;
  };
  float loss = 0.0f;
  for (int t = 1; t <= 2; ++t) loss = step(t);  // warm-up: algorithms, memory
  ops->Synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int t = 3; t < 3 + a.steps; ++t) loss = step(t);
  ops->Synchronize();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count() /
      a.steps;
  const double tokens_per_s = B * T / secs;
  const double flops = ptrain::GptFlopsPerToken(config, T) * B * T;
  const ptrain::kernels::CudaMemory mem = ptrain::kernels::CudaMemoryInfo();
  std::printf(
      "ptrain cuda %-4s GPT-2 %-4s B%-2d T%d: %7.1f ms/step %9.0f tok/s "
      "%6.1f TFLOP/s  MFU %5.1f%% of %.0f  loss %.3f  GPU memory %.1f GiB\n",
      bf16 ? "bf16" : "fp32", a.model.c_str(), B, T, secs * 1e3, tokens_per_s,
      flops / secs / 1e12, 100.0 * flops / secs / (a.peak_tflops * 1e12),
      a.peak_tflops, loss, mem.used / double(1 << 30));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  std::printf("device: %s\n",
              ptrain::kernels::CudaDeviceCount() > 0 ? "CUDA" : "none");
  Run(a, /*bf16=*/false);
  Run(a, /*bf16=*/true);
  return 0;
}
