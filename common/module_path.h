// Where ptrain's dlopen'ed modules (libptrain_cuda.so,
// libptrain_sentencepiece.so) are looked for.
#ifndef PTRAIN_COMMON_MODULE_PATH_H_
#define PTRAIN_COMMON_MODULE_PATH_H_

#include <string>
#include <vector>

namespace ptrain {

// The paths to try, in order: $`env` when set, `module` beside the
// executable, in ../`subdir`/ and ../../`subdir`/ from it (the build tree:
// build/worker/ptworker, build/tests/x/test), then the bare name (the
// library path).
std::vector<std::string> ModuleCandidates(const char* env, const char* module,
                                          const char* subdir);

}  // namespace ptrain

#endif  // PTRAIN_COMMON_MODULE_PATH_H_
