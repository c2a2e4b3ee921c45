// libptrain_sentencepiece.so: SentencePiece behind the interface of
// sentencepiece_model.h. No Abseil header may be included here.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

#include "common/sentencepiece_model.h"

namespace ptrain {
namespace {

// SentencePiece's trainer reads sentences through this.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::function<bool(std::string*)>& next)
      : next_(next) {
    Next();
  }
  bool done() const override { return done_; }
  void Next() override { done_ = !next_(&line_); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::function<bool(std::string*)>& next_;
  std::string line_;
  bool done_ = false;
};

class Model : public SentencePieceModel {
 public:
  sentencepiece::SentencePieceProcessor sp;

  int size() const override { return sp.GetPieceSize(); }
  int end_of_sentence() const override { return sp.eos_id(); }
  std::vector<int> Encode(std::string_view text) const override {
    std::vector<int> ids;
    if (!sp.Encode(text, &ids).ok()) ids.clear();
    return ids;
  }
  bool Decode(const std::vector<int>& ids, std::string* text) const override {
    return sp.Decode(ids, text).ok();
  }
  std::string IdToPiece(int id) const override { return sp.IdToPiece(id); }
  bool IsByte(int id) const override { return sp.IsByte(id); }
  bool IsControl(int id) const override { return sp.IsControl(id); }
  bool IsUnknown(int id) const override { return sp.IsUnknown(id); }
  int begin_of_sentence() const override { return sp.bos_id(); }
  int unknown() const override { return sp.unk_id(); }
};

}  // namespace
}  // namespace ptrain

extern "C" {

ptrain::SentencePieceModel* ptrain_sentencepiece_load(const std::string* bytes,
                                                      std::string* error) {
  auto model = std::make_unique<ptrain::Model>();
  const auto status = model->sp.LoadFromSerializedProto(*bytes);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return model.release();
}

bool ptrain_sentencepiece_train(
    const std::function<bool(std::string*)>* next_line,
    const std::vector<std::pair<std::string, std::string>>* args,
    std::string* model, std::string* error) {
  const std::unordered_map<std::string, std::string> kwargs(args->begin(),
                                                            args->end());
  ptrain::LineIterator lines(*next_line);
  const auto status =
      sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, model);
  if (!status.ok()) {
    *error = status.ToString();
    return false;
  }
  return true;
}

}  // extern "C"
