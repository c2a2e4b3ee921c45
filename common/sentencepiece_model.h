// SentencePiece, opened as a module (libptrain_sentencepiece.so, built from
// sentencepiece_module.cc) with RTLD_DEEPBIND: Debian's libsentencepiece
// carries a protobuf-lite of its own (3.14) under the same symbol names as
// the libprotobuf ptrain links (3.21), so that loaded into one namespace
// the one would interpose on the other. The module's lookups stay inside
// it. Its header is of standard types only (SentencePiece's headers also
// declare an absl::string_view of their own).
#ifndef PTRAIN_COMMON_SENTENCEPIECE_MODEL_H_
#define PTRAIN_COMMON_SENTENCEPIECE_MODEL_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ptrain {

class SentencePieceModel {
 public:
  virtual ~SentencePieceModel() = default;
  virtual int size() const = 0;
  virtual int end_of_sentence() const = 0;  // -1: none
  // Empty when SentencePiece fails (it does not on text).
  virtual std::vector<int> Encode(std::string_view text) const = 0;
  // Ids within [0, size()); false when SentencePiece refuses them.
  virtual bool Decode(const std::vector<int>& ids, std::string* text) const = 0;
  virtual std::string IdToPiece(int id) const = 0;
  virtual bool IsByte(int id) const = 0;
  virtual bool IsControl(int id) const = 0;
  virtual bool IsUnknown(int id) const = 0;
  // The ids of the model's begin of sentence and unknown pieces; -1: none.
  virtual int begin_of_sentence() const = 0;
  virtual int unknown() const = 0;
};

// The model serialized in `bytes`; null with *error set when it does not
// load (or the module does not).
std::unique_ptr<SentencePieceModel> LoadSentencePieceModel(
    const std::string& bytes, std::string* error);

// Trains a model with SentencePiece's flags `args` on the lines
// `next_line` yields (false: no more): the serialized model in *model, or
// false with *error set.
bool TrainSentencePieceModel(
    const std::function<bool(std::string*)>& next_line,
    const std::vector<std::pair<std::string, std::string>>& args,
    std::string* model, std::string* error);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_SENTENCEPIECE_MODEL_H_
