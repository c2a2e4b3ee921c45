// Writes the reference GPT's config, batch, hyperparameters and ptrain-
// initialised weights for tests/reference/make_gpt_reference.py.
#include <cstdio>

#include "tests/worker/engine/reference_io.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_reference_dump OUT.bin\n");
    return 2;
  }
  ptrain::testing::ReferenceSetup ref;
  const auto model = ptrain::testing::ReferenceModel(ref);
  ptrain::testing::RecordWriter w(argv[1]);
  const auto& c = ref.config;
  const float config[] = {float(c.n_layer),    float(c.n_head),
                          float(c.n_embd),     float(c.block_size),
                          float(c.vocab_size), float(ref.B),
                          float(ref.T)};
  w.F32("config", {7}, config);
  const auto& t = ref.train;
  const float hyper[] = {
      float(t.lr()),    float(t.min_lr()),       float(t.warmup_steps()),
      float(t.steps()), float(t.weight_decay()), float(t.grad_clip()),
      float(t.beta1()), float(t.beta2()),        float(t.eps())};
  w.F32("hyper", {9}, hyper);
  w.I32("inputs", {ref.B, ref.T}, ref.inputs.data());
  w.I32("targets", {ref.B, ref.T}, ref.targets.data());
  // Global shapes: wte's padding rows (past V) are not the model's.
  for (const auto& p : model->layout()) {
    w.F32(p.name, p.global_shape, model->params() + p.offset);
  }
  if (!w.ok()) {
    std::fprintf(stderr, "gpt_reference_dump: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
