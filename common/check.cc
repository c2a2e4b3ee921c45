// See check.h.
#include "common/check.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace ptrain {
namespace {
std::atomic<CheckAbortHook> g_hook{nullptr};
}  // namespace

void SetCheckAbortHook(CheckAbortHook hook) { g_hook.store(hook); }

void CheckFailed(const char* file, int line, const char* what,
                 const char* detail) {
  std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, what,
               detail != nullptr ? detail : "");
  std::fflush(stderr);
  if (CheckAbortHook hook = g_hook.load()) hook();
  std::abort();
}

}  // namespace ptrain
