// The entry of every thread ptrain starts (std::thread) and of its
// processes' main: an exception that escapes the thread's work ends the
// process with exit 1 and one line on stderr naming the thread and the
// error, where it would otherwise call std::terminate (an abort, exit 134,
// a core and no word of which thread or why). Not error handling: code
// that can fail returns a Status; this is for what should never happen
// (std::bad_alloc, a library's exception nobody expected).
#ifndef PTRAIN_COMMON_THREAD_ENTRY_H_
#define PTRAIN_COMMON_THREAD_ENTRY_H_

#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace ptrain {

// Ends the process: "PROGRAM: error: thread NAME: WHAT" on stderr, then
// _Exit(1) (kExitFailed), without running other threads' or static
// objects' destructors, which may be in use. Thread-safe; never returns.
[[noreturn]] void EndOnThreadException(std::string_view thread,
                                       std::string_view what);

// Names the calling thread `name` for ps/top/gdb (its first 15 bytes).
void NameThisThread(const std::string& name);

// `body` as a thread's entry: std::thread(ThreadEntry("supervisor", [this]
// { Loop(); })). The thread takes `name` (NameThisThread); an exception
// out of `body` ends the process (EndOnThreadException). `body` is moved
// into the entry and called once.
template <typename F>
auto ThreadEntry(std::string name, F body) {
  return [name = std::move(name), body = std::move(body)]() mutable {
    try {
      NameThisThread(name);
      std::invoke(body);
    } catch (const std::exception& e) {
      EndOnThreadException(name, e.what());
    } catch (...) {
      EndOnThreadException(name, "an exception that is not a std::exception");
    }
  };
}

// main's body under the same rule: returns what `body` returns (the exit
// code); an exception out of it ends the process as above, thread "main".
template <typename F>
int MainEntry(F body) {
  try {
    return std::invoke(body);
  } catch (const std::exception& e) {
    EndOnThreadException("main", e.what());
  } catch (...) {
    EndOnThreadException("main", "an exception that is not a std::exception");
  }
}

}  // namespace ptrain

#endif  // PTRAIN_COMMON_THREAD_ENTRY_H_
