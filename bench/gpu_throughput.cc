// Training throughput of the model on one GPU: GptStage on the CUDA
// backend over a ZeroStore (the weights as the trainer keeps them: under
// bf16 with their bf16 compute copy, written by the AdamW pass), a whole
// step (forward, backward, gradient norm, AdamW over every parameter) at
// GPT-2 sizes, T = 1024. Prints tokens/s and MFU against the
// GPU's bf16 dense peak (--peak-tflops; 989 is the H100 SXM's), for fp32
// compute and for bf16 tensor-core compute, the latter with attention as
// cuBLAS products over (T,T) scores and as the fused kernels.
//
//   gpu_throughput [--model 124m|350m] [--batch 8] [--steps 10] [--trainer]
//                  [--recompute]
//   gpu_throughput --trainer --offload [--model 124m|350m|1.5b|6b] ...
//   gpu_throughput --trainer --cuda-graphs [--model small --seq 256
//                  --batch 64] ...
//   gpu_throughput --trainer --arch llama [--model 124m|350m|small] ...
//
// --trainer runs the whole Trainer instead (as ptworker does, without MPI):
// data loading, the learning-rate schedule, the distributed optimizer's
// gradient norm and clipping, metrics — on llm.c token files of random
// GPT-2 tokens it writes under /tmp. Run from the project root.
// --recompute recomputes every block in backward (train.recompute=full;
// with --trainer only). --offload (with --trainer) runs bf16 with the
// optimizer on the GPU and with parallel.offload=optimizer and prints the
// ratio of their steps; at --model 6b (fp32 weights, gradients and Adam
// state past 80 GB) the first is refused by the memory check and only the
// offloaded one trains (--batch 1 --recompute). --cuda-graphs (with
// --trainer) runs bf16 launching op by op and with train.cuda_graphs=on
// (each microbatch's forward and backward one replay) and prints the ratio
// of their speeds and how many passes were replayed; --model small --seq
// 256 --batch 64 is a model whose step launches dominate.
//
// --arch llama (with --trainer) trains a Llama 3-style model of the
// size instead (LlamaShapeOf): RMSNorm, rotary positions (theta 500000),
// grouped-query attention, a SwiGLU MLP and an untied head, on GPT-2's
// vocabulary; its lines name "Llama" where GPT-2's name "GPT-2", and its
// FLOPs are the engine's count for it (GptFlopsPerToken).
//
// bench/pytorch_gpt_cuda.py runs the same model in PyTorch on the same GPU
// (--arch llama for the Llama).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/spec.h"
#include "kernels/backends.h"
#include "worker/engine/model/gpt_stage.h"
#include "worker/engine/model/plan.h"
#include "worker/engine/parallel/optimizer.h"
#include "worker/engine/parallel/zero_store.h"
#include "worker/engine/train/trainer.h"

namespace {

struct Args {
  std::string arch = "gpt";
  std::string model = "124m";
  int batch = 8;
  int steps = 10;
  double peak_tflops = 989.0;
  bool trainer = false;
  bool recompute = false;
  bool offload = false;
  bool graphs = false;
  int seq = 1024;
};

// GPT-2 shapes by name (layers, heads, width): the two the bench compares
// with PyTorch, and two for offloading (GPT-2 XL, and a 6.6B model whose
// fp32 weights, gradients and Adam state do not fit one 80 GB GPU).
struct Shape {
  int n_layer, n_head, n_embd;
};
Shape ShapeOf(const std::string& model) {
  if (model == "350m") return {24, 16, 1024};
  if (model == "1.5b") return {48, 25, 1600};
  if (model == "6b") return {32, 32, 4096};
  if (model == "small") return {6, 6, 384};
  return {12, 12, 768};
}

// The Llama of a size: GPT-2's layers, heads and width, with a third of
// the heads as key/value heads (a quarter at 350m, whose 16 heads three
// does not divide) and the MLP's hidden width by Llama's rule (8C/3
// rounded up to a multiple of 256), which keeps the MLP's weights near
// GPT-2's 8C^2.
struct LlamaShape {
  int n_kv_head, ffn_hidden;
};
LlamaShape LlamaShapeOf(const std::string& model) {
  if (model == "350m") return {4, 2816};
  if (model == "small") return {2, 1024};
  return {4, 2048};
}

// The rope base of Llama 3.
constexpr const char* kLlamaRopeTheta = "500000";

// How the output lines name the model.
const char* ModelName(const Args& a) {
  return a.arch == "llama" ? "Llama" : "GPT-2";
}

void AddFlags(CLI::App& app, Args& a) {
  app.add_option("--arch", a.arch,
                 "gpt (GPT-2) or llama (a Llama 3-style model of the size: "
                 "grouped-query attention, SwiGLU, RoPE, untied head; with "
                 "--trainer, --model 124m, 350m or small)")
      ->check(CLI::IsMember({"gpt", "llama"}));
  app.add_option("--model", a.model,
                 "size: 124m or 350m; 1.5b, 6b and small (6 layers of "
                 "384) with --trainer")
      ->check(CLI::IsMember({"124m", "350m", "1.5b", "6b", "small"}));
  app.add_option("--batch", a.batch, "sequences per step")
      ->check(CLI::Range(1, 4096));
  app.add_option("--seq", a.seq, "positions per sequence (with --trainer)")
      ->check(CLI::Range(8, 1024));
  app.add_option("--steps", a.steps, "measured steps")
      ->check(CLI::Range(1, 100000));
  app.add_option("--peak-tflops", a.peak_tflops,
                 "MFU denominator in TFLOP/s (default: 989, the H100 SXM's "
                 "bf16 dense peak)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--trainer", a.trainer,
               "run the whole Trainer (data, schedule, norm, AdamW) on "
               "random GPT-2 tokens");
  app.add_flag("--recompute", a.recompute,
               "recompute every block in backward (with --trainer)");
  app.add_flag("--offload", a.offload,
               "with --trainer: bf16 with the optimizer on the GPU and with "
               "parallel.offload=optimizer, side by side (a run that does "
               "not fit says why)");
  app.add_flag("--cuda-graphs", a.graphs,
               "with --trainer: bf16 launching op by op and with "
               "train.cuda_graphs=on, side by side");
}

void Run(const Args& a, bool bf16, bool fused_attention) {
  const Shape shape = ShapeOf(a.model);
  ptrain::GptConfig config;
  config.n_layer = shape.n_layer;
  config.n_head = shape.n_head;
  config.n_embd = shape.n_embd;
  config.block_size = 1024;
  config.vocab_size = 50257;
  config.padded_vocab = 50304;
  const int B = a.batch, T = 1024;
  std::string error;
  ptrain::kernels::CudaOptions o;
  o.bf16_compute = bf16;
  o.fused_attention = fused_attention;
  std::unique_ptr<ptrain::kernels::Ops> ops =
      ptrain::kernels::MakeCudaOps(o, &error);
  if (ops == nullptr) {
    std::fprintf(stderr, "gpu_throughput: %s\n", error.c_str());
    std::exit(1);
  }
  // The weights in a store as the trainer keeps them (under bf16 with
  // their bf16 compute copy, which the AdamW pass writes).
  const std::vector<ptrain::ParamInfo> layout = ptrain::BuildPlan(config, {});
  ptrain::ZeroOptions zo;
  zo.bf16_weights = bf16;
  ptrain::ZeroStore store(layout, /*dp=*/1, zo, /*dp_group=*/nullptr,
                          ops.get());
  ptrain::StageOptions so;
  so.max_B = B;
  so.max_T = T;
  so.ops = ops.get();
  so.store = &store;
  ptrain::GptStage model(config, layout, so);
  store.InitParams(42);
  const int64_t n = store.update_size();
  ptrain::v1::TrainSpec train = ptrain::DefaultJobSpec().train();
  train.set_weight_decay(0.1);
  ptrain::AdamW adam(layout, 0, n, train, ops.get());
  std::mt19937 gen(1);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = gen() % config.vocab_size;
    targets[i] = gen() % config.vocab_size;
  }
  auto step = [&](int t) {
    (void)t;
    store.BeginStep();
    store.BeginMicrobatch(/*last=*/true);
    // The loss's gradient with the loss (the fused classifier), as the
    // trainer does.
    const float dloss = 1.0f / (B * T);
    const float loss =
        model.Forward(0, tokens.data(), nullptr, targets.data(), B, T, dloss);
    model.Backward(0, tokens.data(), targets.data(), dloss, nullptr);
    store.FinishGradients();
    const double norm = std::sqrt(ops->SumSquares(store.update_grads(), n));
    const float scale = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f;
    float* params = store.update_params();
    void* copy = store.update_weights_copy();
    adam.Step(params, copy, store.update_grads(), 6e-4f, scale);
    if (copy != nullptr) store.WeightsCopyWritten();
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
      "ptrain cuda %-4s %-13s GPT-2 %-4s B%-2d T%d: %7.1f ms/step %9.0f "
      "tok/s %6.1f TFLOP/s  MFU %5.1f%% of %.0f  loss %.3f  GPU memory %.1f "
      "GiB\n",
      bf16 ? "bf16" : "fp32",
      bf16 && fused_attention ? "fused attn" : "cuBLAS attn", a.model.c_str(),
      B, T, secs * 1e3, tokens_per_s, flops / secs / 1e12,
      100.0 * flops / secs / (a.peak_tflops * 1e12), a.peak_tflops, loss,
      mem.used / double(1 << 30));
  std::fflush(stdout);
}

}  // namespace

// An llm.c token file of `n` random GPT-2 tokens.
std::string RandomTokenFile(const std::string& name, int64_t n) {
  std::mt19937 gen(7);
  std::vector<uint16_t> tokens(n);
  for (uint16_t& t : tokens) t = gen() % 50257;
  const std::string path = "/tmp/ptrain_gpu_throughput_" + name + ".bin";
  const absl::Status s = ptrain::WriteTokenFile(path, tokens);
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_throughput: %s\n",
                 std::string(s.message()).c_str());
    std::exit(1);
  }
  return path;
}

// The whole Trainer's step in ms (0 when the run is refused, which is
// printed instead).
double RunTrainer(const Args& a, const std::string& precision,
                  bool offload = false, bool graphs = false) {
  const Shape shape = ShapeOf(a.model);
  const int T = a.seq;
  std::vector<std::string> sets = {
      "model.n_layer=" + std::to_string(shape.n_layer),
      "model.n_head=" + std::to_string(shape.n_head),
      "model.n_embd=" + std::to_string(shape.n_embd),
      "model.block_size=" + std::to_string(T),
      "data.path=''",
      "data.tokenizer=''",
      "data.train_bin=" + RandomTokenFile("train", 1 << 22),
      "data.val_bin=" + RandomTokenFile("val", 1 << 16),
      "train.global_batch=" + std::to_string(a.batch),
      "train.steps=" + std::to_string(a.steps + 2),
      "train.eval_every=0",
      "train.sample_tokens=0",
      "checkpoint.every=0",
      "checkpoint.dir=''",
      "resources.device=cuda",
      "train.precision=" + precision,
      std::string("train.recompute=") + (a.recompute ? "full" : "none"),
      std::string("parallel.offload=") + (offload ? "optimizer" : "none"),
      std::string("train.cuda_graphs=") + (graphs ? "on" : "off")};
  if (a.arch == "llama") {
    const LlamaShape llama = LlamaShapeOf(a.model);
    sets.insert(sets.end(),
                {"model.arch=llama",
                 "model.n_kv_head=" + std::to_string(llama.n_kv_head),
                 "model.ffn_hidden=" + std::to_string(llama.ffn_hidden),
                 std::string("model.rope_theta=") + kLlamaRopeTheta,
                 "model.tie_embeddings=false"});
  }
  auto spec = ptrain::LoadJobSpecFile("examples/shakespeare-char.yaml", sets);
  if (!spec.ok()) {
    std::fprintf(stderr, "gpu_throughput: %s\n",
                 std::string(spec.status().message()).c_str());
    std::exit(2);
  }
  const char* what = offload ? " offload" : graphs ? " graphs" : "";
  ptrain::TrainerOptions opt;
  opt.peak_flops = a.peak_tflops * 1e12;
  opt.quiet = true;
  auto trainer = ptrain::Trainer::Create(*spec, opt);
  if (!trainer.ok()) {
    std::printf("ptrain trainer %-4s%s %s %-4s B%-2d T%d: refused: %s\n",
                precision.c_str(), what, ModelName(a), a.model.c_str(), a.batch,
                T, std::string(trainer.status().message()).c_str());
    std::fflush(stdout);
    return 0.0;
  }
  ptrain::Trainer& t = **trainer;
  for (int s = 0; s < 2; ++s) t.TrainStep(s);  // warm-up
  double seconds = 0.0;
  float loss = 0.0f;
  for (int s = 2; s < 2 + a.steps; ++s) {
    const ptrain::StepResult r = t.TrainStep(s);
    seconds += r.seconds;
    loss = r.loss;
  }
  const double secs = seconds / a.steps;
  const double flops = t.flops_per_step();
  const ptrain::kernels::CudaMemory mem = ptrain::kernels::CudaMemoryInfo();
  std::printf(
      "ptrain trainer %-4s%s%s %s %-4s B%-2d T%d: %7.1f ms/step %9.0f "
      "tok/s %6.1f TFLOP/s  MFU %5.1f%% of %.0f  loss %.3f  GPU memory %.1f "
      "GiB\n",
      precision.c_str(), a.recompute ? " recompute" : "", what, ModelName(a),
      a.model.c_str(), a.batch, T, secs * 1e3, a.batch * T / secs,
      flops / secs / 1e12, 100.0 * flops / secs / (a.peak_tflops * 1e12),
      a.peak_tflops, loss, mem.used / double(1 << 30));
  if (graphs) {
    const ptrain::GptStage::GraphCounts g = t.graph_counts();
    std::printf("  passes recorded %lld, replayed %lld, failed %lld\n",
                static_cast<long long>(g.captured),
                static_cast<long long>(g.replayed),
                static_cast<long long>(g.failed));
  }
  std::fflush(stdout);
  return secs * 1e3;
}

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "gpu_throughput: the model on one GPU, tokens/s and MFU, fp32 and bf16 "
      "compute"};
  AddFlags(app, a);
  CLI11_PARSE(app, argc, argv);
  if ((a.recompute || a.seq != 1024 || a.model == "small") && !a.trainer) {
    std::fprintf(stderr,
                 "--recompute, --seq and --model small need --trainer\n");
    return 2;
  }
  if ((a.offload || a.model == "1.5b" || a.model == "6b") && !a.trainer) {
    std::fprintf(stderr, "--offload and --model 1.5b|6b need --trainer\n");
    return 2;
  }
  if (a.graphs && !a.trainer) {
    std::fprintf(stderr, "--cuda-graphs needs --trainer\n");
    return 2;
  }
  // The model-alone run builds GPT-2's GptConfig by hand; the Trainer
  // builds a Llama's from the job spec.
  if (a.arch == "llama" && !a.trainer) {
    std::fprintf(stderr, "--arch llama needs --trainer\n");
    return 2;
  }
  if (a.arch == "llama" && (a.model == "1.5b" || a.model == "6b")) {
    std::fprintf(stderr,
                 "--arch llama takes --model 124m, 350m or small, not %s\n",
                 a.model.c_str());
    return 2;
  }
  if (a.trainer && a.graphs) {
    const double eager = RunTrainer(a, "bf16");
    const double graphed = RunTrainer(a, "bf16", false, /*graphs=*/true);
    if (eager > 0.0 && graphed > 0.0) {
      std::printf("cuda graphs: %.2fx the speed of launching op by op\n",
                  eager / graphed);
    }
    return 0;
  }
  if (a.trainer && a.offload) {
    const double plain = RunTrainer(a, "bf16");
    const double offloaded = RunTrainer(a, "bf16", /*offload=*/true);
    if (plain > 0.0 && offloaded > 0.0) {
      std::printf("offload: %.2fx the step with the optimizer on the GPU\n",
                  offloaded / plain);
    }
    return 0;
  }
  if (a.trainer) {
    RunTrainer(a, "fp32");
    RunTrainer(a, "bf16");
    return 0;
  }
  std::printf("device: %s\n",
              ptrain::kernels::CudaDeviceCount() > 0 ? "CUDA" : "none");
  Run(a, /*bf16=*/false, /*fused_attention=*/false);
  Run(a, /*bf16=*/true, /*fused_attention=*/false);
  Run(a, /*bf16=*/true, /*fused_attention=*/true);
  return 0;
}
