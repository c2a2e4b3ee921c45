#include "worker/engine/parallel/pipeline_runtime.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/seconds.h"

namespace ptrain {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

PipelineRuntime::PipelineRuntime(Options options)
    : pp_(options.pp),
      pp_rank_(options.pp_rank),
      pp_size_(options.pp != nullptr ? options.pp->size() : 1),
      chunks_(std::move(options.chunks)),
      store_(options.store),
      microbatches_(options.microbatches),
      seq_split_(options.seq_split),
      recorder_(options.recorder),
      n_embd_(chunks_.front()->config().n_embd),
      forward_order_(ForwardOrder(static_cast<int>(chunks_.size()))),
      backwards_(chunks_.size(), 0) {
  if (pp_ != nullptr) {
    for (auto& buffer : received_) {
      buffer = kernels::Buffer(
          &store_->ops(),
          int64_t{options.max_B} * (options.max_T / seq_split_) * n_embd_);
    }
  }
}

std::vector<PipeAction> PipelineRuntime::SequentialOrder(int m) {
  std::vector<PipeAction> order;
  for (int mb = 0; mb < m; ++mb) {
    order.push_back({PipeAction::kForward, mb, 0});
    order.push_back({PipeAction::kBackward, mb, 0});
  }
  return order;
}

std::vector<PipeAction> PipelineRuntime::ForwardOrder(int chunks) {
  std::vector<PipeAction> order;
  for (int c = 0; c < chunks; ++c)
    order.push_back({PipeAction::kForward, 0, c});
  return order;
}

void PipelineRuntime::SendCopy(const float* data, int64_t n, int peer,
                               int tag) {
  Outgoing* out = nullptr;
  for (Outgoing& o : outgoing_) {
    if (o.send != nullptr && o.send->Test()) o.send.reset();
    if (out == nullptr && o.send == nullptr) out = &o;
  }
  if (out == nullptr) out = &outgoing_.emplace_back();
  kernels::Ops& ops = store_->ops();
  if (out->data.size() < n) out->data = kernels::Buffer(&ops, n);
  ops.Copy(out->data.data(), data, n);
  out->send = pp_->SendAsync(out->data.data(), n, peer, tag);
}

void PipelineRuntime::WaitSends() {
  for (Outgoing& o : outgoing_) {
    if (o.send != nullptr) o.send->Wait();
    o.send.reset();
  }
}

double PipelineRuntime::TrainStep(const std::vector<PipeAction>& order,
                                  const int32_t* inputs, const int32_t* targets,
                                  int B, int T, float dloss,
                                  PhaseSeconds* phases) {
  const Run run{inputs,
                targets,
                B,
                T,
                int64_t{B} * (T / seq_split_) * n_embd_,
                /*decode_pos=*/-1,
                dloss,
                /*train=*/true};
  const double loss_sum = Execute(order, run, phases);
  if (recorder_ != nullptr) recorder_->Enter(FlightPhase::kBackward);
  auto t = Clock::now();
  store_->FinishGradients();
  phases->backward += SecondsSince(t);
  if (pp_ != nullptr) {
    // Stages finish at different times: waiting for the last one is the
    // bubble's tail, not optimizer time.
    t = Clock::now();
    pp_->Barrier();
    phases->bubble += SecondsSince(t);
  }
  return loss_sum;
}

float PipelineRuntime::Forward(const int32_t* tokens, const int32_t* targets,
                               int B, int T, int decode_pos) {
  // A generation step passes every position (no sequence split).
  const int64_t floats = decode_pos < 0
                             ? int64_t{B} * (T / seq_split_) * n_embd_
                             : int64_t{T} * n_embd_;
  PhaseSeconds unused;
  return static_cast<float>(
      Execute(forward_order_,
              Run{tokens, targets, B, T, floats, decode_pos, /*dloss=*/0.0f,
                  /*train=*/false},
              &unused));
}

void PipelineRuntime::MarkPass(const PipeAction& a) {
  if (recorder_ == nullptr) return;
  recorder_->Enter(a.kind == PipeAction::kForward ? FlightPhase::kForward
                                                  : FlightPhase::kBackward,
                   a.microbatch);
}

double PipelineRuntime::Execute(const std::vector<PipeAction>& order,
                                const Run& run, PhaseSeconds* phases) {
  const int64_t tokens = int64_t{run.B} * run.T;
  const int64_t n = run.floats;
  const int prev = (pp_rank_ + pp_size_ - 1) % pp_size_;
  const int next = (pp_rank_ + 1) % pp_size_;
  // The receive each pass needs, posted one receiving pass ahead into the
  // buffer the current pass does not use, so that it arrives while this
  // rank computes: a forward's input from the previous virtual stage (none
  // for the first), a backward's gradient from the next (none for the last).
  const int n_actions = static_cast<int>(order.size());
  auto receives = [&](int i) {
    const PipeAction& a = order[i];
    const int vs = VirtualStage(a.chunk);
    if (a.kind == PipeAction::kWeight) return false;  // nothing comes in
    return a.kind == PipeAction::kForward ? vs > 0 : vs != last_virtual_stage();
  };
  std::unique_ptr<CommHandle> posted;
  int posted_for = n_actions, posted_buffer = 0;
  auto post_after = [&](int i, int buffer) {
    posted_for = i + 1;
    while (posted_for < n_actions && !receives(posted_for)) ++posted_for;
    if (posted_for == n_actions) return;
    const PipeAction& a = order[posted_for];
    const bool forward = a.kind == PipeAction::kForward;
    posted_buffer = buffer;
    posted = pp_->RecvAsync(received_[buffer].data(), n, forward ? prev : next,
                            Tag(a.microbatch, a.chunk, forward));
  };
  post_after(-1, 0);
  // Backwards run so far per chunk: a chunk's last one issues the
  // reductions of its units — its last W in an order that splits the
  // backward (the units' gradients end there).
  std::fill(backwards_.begin(), backwards_.end(), 0);
  const bool split = HasWeightPasses(order);
  double loss_sum = 0.0;
  for (int i = 0; i < n_actions; ++i) {
    const PipeAction& a = order[i];
    const int mb = a.microbatch, c = a.chunk;
    GptStage& chunk = *chunks_[c];
    // A chunk's microbatches in flight are consecutive (ChunkSlots).
    const int slot = mb % chunk.slots();
    const int vs = VirtualStage(c);
    const bool last = vs == last_virtual_stage();
    const int32_t* in = run.inputs + mb * tokens;
    const int32_t* tg =
        run.targets != nullptr ? run.targets + mb * tokens : nullptr;
    const float* received = nullptr;
    if (run.train) MarkPass(a);
    auto t = Clock::now();
    if (posted_for == i) {
      posted->Wait();
      phases->bubble += SecondsSince(t);
      received = received_[posted_buffer].data();
      post_after(i, 1 - posted_buffer);
    }
    t = Clock::now();
    if (a.kind == PipeAction::kForward) {
      float loss = 0.0f;
      if (run.decode_pos < 0) {
        // Training's last stage computes the logits' gradient with the
        // loss (the fused classifier); run.dloss is 0 without a backward.
        loss = chunk.Forward(slot, in, received, last ? tg : nullptr, run.B,
                             run.T, last ? run.dloss : 0.0f);
      } else {
        chunk.Decode(in, received, run.T, run.decode_pos);
      }
      phases->forward += SecondsSince(t);
      if (last) {
        loss_sum += loss;
      } else {
        SendCopy(chunk.output(slot), n, next,
                 Tag(mb, (vs + 1) / pp_size_, true));
      }
    } else if (a.kind == PipeAction::kWeight) {
      store_->BeginMicrobatch(++backwards_[c] == microbatches_);
      chunk.BackwardWeights(slot);
      const double seconds = SecondsSince(t);
      phases->backward += seconds;
      phases->weight += seconds;
    } else {
      if (split) {
        chunk.BackwardInput(slot, in, tg, run.dloss, received);
      } else {
        store_->BeginMicrobatch(++backwards_[c] == microbatches_);
        chunk.Backward(slot, in, tg, run.dloss, received);
      }
      phases->backward += SecondsSince(t);
      if (vs > 0) {
        SendCopy(chunk.dinput(), n, prev, Tag(mb, (vs - 1) / pp_size_, false));
      }
    }
  }
  const auto t = Clock::now();
  WaitSends();
  phases->backward += SecondsSince(t);
  return loss_sum;
}

}  // namespace ptrain
