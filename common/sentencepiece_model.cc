#include "common/sentencepiece_model.h"

#include <dlfcn.h>

#include "common/module_path.h"

namespace ptrain {

namespace {

constexpr char kModule[] = "libptrain_sentencepiece.so";

struct Module {
  std::string error;
  SentencePieceModel* (*load)(const std::string*, std::string*) = nullptr;
  bool (*train)(const std::function<bool(std::string*)>*,
                const std::vector<std::pair<std::string, std::string>>*,
                std::string*, std::string*) = nullptr;
};

const Module& Load() {
  static const Module* const module = [] {
    auto* m = new Module();
    void* handle = nullptr;
    std::string tried;
    for (const std::string& path :
         ModuleCandidates("PTRAIN_SENTENCEPIECE_LIBRARY", kModule, "common")) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle != nullptr) break;
      tried += std::string("\n  ") + dlerror();
    }
    if (handle == nullptr) {
      m->error = "cannot load SentencePiece (" + std::string(kModule) +
                 " or libsentencepiece):" + tried;
      return m;
    }
    m->load = reinterpret_cast<decltype(m->load)>(
        dlsym(handle, "ptrain_sentencepiece_load"));
    m->train = reinterpret_cast<decltype(m->train)>(
        dlsym(handle, "ptrain_sentencepiece_train"));
    if (m->load == nullptr || m->train == nullptr) {
      m->error = std::string(kModule) + " lacks its entry points";
      m->load = nullptr;
      m->train = nullptr;
    }
    return m;
  }();
  return *module;
}

}  // namespace

std::unique_ptr<SentencePieceModel> LoadSentencePieceModel(
    const std::string& bytes, std::string* error) {
  const Module& m = Load();
  if (m.load == nullptr) {
    *error = m.error;
    return nullptr;
  }
  return std::unique_ptr<SentencePieceModel>(m.load(&bytes, error));
}

bool TrainSentencePieceModel(
    const std::function<bool(std::string*)>& next_line,
    const std::vector<std::pair<std::string, std::string>>& args,
    std::string* model, std::string* error) {
  const Module& m = Load();
  if (m.train == nullptr) {
    *error = m.error;
    return false;
  }
  return m.train(&next_line, &args, model, error);
}

}  // namespace ptrain
