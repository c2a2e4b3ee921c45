// PT_CHECK: the one way the engine reports a programming error or a failure
// of MPI, CUDA or NCCL it cannot recover from — it names the file and the
// line, then takes the whole job down. Not for bad input: that is an
// absl::Status the caller returns (exit code 2). Thread-safe.
#ifndef PTRAIN_COMMON_CHECK_H_
#define PTRAIN_COMMON_CHECK_H_

namespace ptrain {

// Prints "file:line: check failed: what: detail" to stderr, runs the abort
// hook (ptworker's takes every MPI rank down) and aborts.
[[noreturn]] void CheckFailed(const char* file, int line, const char* what,
                              const char* detail);

// Called by CheckFailed before abort(); e.g. MPI_Abort on the world, so
// the launcher sees the failure instead of ranks waiting forever. The hook
// must not return if it can end the process itself.
using CheckAbortHook = void (*)();
void SetCheckAbortHook(CheckAbortHook hook);

}  // namespace ptrain

// PT_CHECK(cond, detail): detail is a C string (a literal, or .c_str()).
#define PT_CHECK(cond, detail)                                    \
  do {                                                            \
    if (!(cond)) {                                                \
      ::ptrain::CheckFailed(__FILE__, __LINE__, #cond, (detail)); \
    }                                                             \
  } while (0)

#endif  // PTRAIN_COMMON_CHECK_H_
