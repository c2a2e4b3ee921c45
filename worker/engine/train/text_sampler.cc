#include "worker/engine/train/text_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "worker/engine/model/rng.h"

namespace ptrain {

namespace {

// The token drawn from `logits` (V of them): softmax at
// train.sample_temperature over the train.sample_top_k largest (all when 0),
// at the point `random` (64 random bits) of its cumulative sum; at
// temperature 0 the likeliest (the first of equals). `order` and `probs` (V
// each) are scratch.
int PickToken(const float* logits, int V, const v1::TrainSpec& train,
              uint64_t random, std::vector<int>* order,
              std::vector<float>* probs) {
  const double temp = train.sample_temperature();
  if (temp == 0)
    return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::iota(order->begin(), order->end(), 0);
  int keep = V;
  if (train.sample_top_k() > 0 && train.sample_top_k() < V) {
    keep = train.sample_top_k();
    std::partial_sort(order->begin(), order->begin() + keep, order->end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
  }
  const std::vector<int>& o = *order;
  float maxv = logits[o[0]];
  for (int j = 0; j < keep; ++j) maxv = std::max(maxv, logits[o[j]]);
  double total = 0.0;
  for (int j = 0; j < keep; ++j) {
    (*probs)[j] = static_cast<float>(std::exp((logits[o[j]] - maxv) / temp));
    total += (*probs)[j];
  }
  const double u = static_cast<double>(random >> 11) * 0x1.0p-53 * total;
  double acc = 0.0;
  for (int j = 0; j < keep; ++j) {
    acc += (*probs)[j];
    if (u < acc) return o[j];
  }
  return o[keep - 1];
}

}  // namespace

TextSampler::TextSampler(const v1::TrainSpec& train, const TokenData& data,
                         ParallelDims* dims, const RankBuild& build,
                         Model model)
    : train_(train), data_(data), dims_(dims), build_(build), model_(model) {}

std::string TextSampler::Sample(uint64_t salt, Mode mode) {
  const v1::TrainSpec& train = train_;
  const int V = data_.vocab_size;
  std::vector<int32_t> ids;
  const Tokenizer* text = data_.text_tokenizer();
  if (text != nullptr && text->can_encode()) {
    ids = text->Encode(train.sample_prompt());
  }
  // Without a prompt the sample starts after an end of text (a document's
  // start), or else after token 0.
  const bool starts_document = ids.empty() && text != nullptr &&
                               text->end_of_text() >= 0 &&
                               text->end_of_text() < V;
  if (ids.empty()) ids.push_back(starts_document ? text->end_of_text() : 0);
  const size_t prompt_len = ids.size();
  const uint64_t stream = StableHash("sample");
  std::vector<float> probs(V);
  std::vector<int> order(V);
  // Under sequence parallelism a forward's length is a multiple of tp: the
  // context is padded at its end, which causal attention keeps from the
  // positions that matter. (Decode steps are not split along the sequence.)
  Communicator* tp = dims_->tp_comm();
  const int multiple =
      tp != nullptr && build_.sequence_parallel ? tp->size() : 1;
  const int T_max = build_.T;
  const int Vl = model_.first_chunk->vocab_local();
  std::vector<float> gathered(tp != nullptr ? int64_t{Vl} * tp->size() : 0);
  std::vector<int32_t> context;
  std::vector<float> last_logits;
  // The context is ids[start, end); `cached` of its positions are in every
  // stage's cache.
  size_t start = 0;
  int cached = 0;
  for (int i = 0; i < train.sample_tokens(); ++i) {
    if (ids.size() - start > static_cast<size_t>(T_max)) {
      start = mode == Mode::kSlidingWindow
                  ? ids.size() - T_max
                  : ids.size() - std::max(1, T_max / 2);
      cached = 0;
    }
    const int T = static_cast<int>(ids.size() - start);
    int last_row = T - 1;  // the row of logits(0) at the context's end
    // Under context parallelism a forward takes a rank's zigzag positions:
    // every mode runs through the cache on each cp rank alike, the
    // recomputing ones from the context's start again for every token.
    if (mode == Mode::kKvCache || build_.cp > 1) {
      if (mode != Mode::kKvCache) cached = 0;
      while (cached < T) {
        const int n = std::min(T - cached, model_.first_chunk->decode_max());
        model_.runtime->Forward(ids.data() + start + cached, nullptr, 1, n,
                                cached);
        cached += n;
        last_row = n - 1;
      }
    } else {
      const int padded = (T + multiple - 1) / multiple * multiple;
      context.assign(ids.begin() + start, ids.end());
      context.resize(padded, 0);
      model_.runtime->Forward(context.data(), nullptr, 1, padded);
    }
    // The last stage picks the token; the others learn it from there.
    if (dims_->pp_rank() != build_.pp - 1) {
      float pick = 0.0f;
      dims_->pp_comm()->Broadcast(&pick, 1, build_.pp - 1);
      ids.push_back(static_cast<int32_t>(pick));
      continue;
    }
    // This rank's vocabulary columns at the last position; the whole
    // vocabulary is gathered only here, for sampling.
    const float* logits =
        model_.last_chunk->logits(0) + static_cast<int64_t>(last_row) * Vl;
    if (model_.device_ops !=
        nullptr) {  // only the last position leaves the GPU
      last_logits.resize(Vl);
      model_.device_ops->ToHost(last_logits.data(), logits, Vl);
      logits = last_logits.data();
    }
    if (tp != nullptr) {
      tp->AllGather(logits, gathered.data(), Vl);
      logits = gathered.data();
    }
    const int pick = PickToken(logits, V, train,
                               CounterRandom64(train.seed() + salt, stream, i),
                               &order, &probs);
    if (Communicator* pp = dims_->pp_comm()) {
      float f = static_cast<float>(pick);  // token ids are exact in a float
      pp->Broadcast(&f, 1, build_.pp - 1);
    }
    ids.push_back(pick);
  }
  if (text != nullptr) {
    if (starts_document) ids.erase(ids.begin());
    return ToValidUtf8(text->Decode(ids));
  }
  std::string out;
  for (size_t i = prompt_len; i < ids.size(); ++i) {
    absl::StrAppend(&out, i == prompt_len ? "" : " ", ids[i]);
  }
  return out;
}

}  // namespace ptrain
