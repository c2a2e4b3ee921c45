// UnitStore: where a stage's weights and gradients live while its passes
// use them, unit by unit (plan.h's units), and UnitStoreSlice, one model
// chunk's view of a rank's store.
#ifndef PTRAIN_WORKER_ENGINE_MODEL_UNIT_STORE_H_
#define PTRAIN_WORKER_ENGINE_MODEL_UNIT_STORE_H_

#include "kernels/ops.h"

namespace ptrain {

// Where the weights and gradients of each unit (plan.h) live while a pass
// runs. The stage brackets its use of unit u with Begin/End calls, with E
// the embedding unit (0, first stage only) and F the final one (ln_f, last
// stage only):
//   forward:  B(E) [B(u) E(u) for blocks in order] B(F) E(F) E(E);
//   backward: B(E) B(F) E(F) [B(u) E(u) for blocks in reverse] E(E);
// A backward split in two (a zero-bubble schedule: StageOptions::
// split_backward) makes the input-gradient pass B the backward without its
// Ends, B(E) B(F) [B(u) in reverse], and the weight pass W, later (other
// microbatches' passes may run in between), the Ends: E(F) [E(u) in
// reverse] E(E). Between them the units' gradients must stay valid (a
// store that keeps them whole through the step: a pipeline's); W reads no
// weights but under full recomputation, whose W runs the forward again
// ([Bf(u) Ef(u)] for u..u+2) before each block's weight gradients.
// with recomputation, each block's backward is preceded by the forward of
// its first three units again: [Bf(u) Ef(u)] for u..u+2, then B(u+3)...
// A last stage that does not embed reads the head's weights from the tied
// copy of wte in F, so there F stays begun until the head is done.
// Params(u)/Grads(u) are valid between Begin and End and point at the
// unit's first element (unit-relative offsets). Gradients accumulate (+=).
class UnitStore {
 public:
  virtual ~UnitStore() = default;
  virtual const float* Params(int u) = 0;
  // The unit's weights as the matmuls read them (same layout as Params):
  // a bf16 compute copy of Params where the store keeps one (bf16 compute),
  // else Params itself. Valid where Params is.
  virtual kernels::ConstAct Weights(int u) { return Params(u); }
  virtual float* Grads(int u) = 0;
  virtual void BeginForward(int u) {}
  virtual void EndForward(int u) {}
  virtual void BeginBackward(int u) {}
  // The unit's gradients of this pass are complete.
  virtual void EndBackward(int u) {}
  // Called between kernels of backward: a chance to progress communication.
  virtual void Poll() {}
  // Issues now what Weights() would otherwise issue at its next call (a
  // bf16 copy of weights written since it was made): called before a pass
  // is recorded or replayed (StageOptions::graphs), whose Weights() calls
  // then issue nothing of the store's own.
  virtual void Settle() {}
};

// One model chunk's view of its rank's UnitStore: the chunk's units are
// the store's from `first` on (StageSlice in plan.h numbers them from 0).
class UnitStoreSlice : public UnitStore {
 public:
  UnitStoreSlice(UnitStore* store, int first) : store_(store), first_(first) {}
  const float* Params(int u) override { return store_->Params(first_ + u); }
  kernels::ConstAct Weights(int u) override {
    return store_->Weights(first_ + u);
  }
  float* Grads(int u) override { return store_->Grads(first_ + u); }
  void BeginForward(int u) override { store_->BeginForward(first_ + u); }
  void EndForward(int u) override { store_->EndForward(first_ + u); }
  void BeginBackward(int u) override { store_->BeginBackward(first_ + u); }
  void EndBackward(int u) override { store_->EndBackward(first_ + u); }
  void Poll() override { store_->Poll(); }
  void Settle() override { store_->Settle(); }

 private:
  UnitStore* store_;
  const int first_;
};

}  // namespace ptrain

#endif  // PTRAIN_WORKER_ENGINE_MODEL_UNIT_STORE_H_
