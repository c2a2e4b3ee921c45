// Thread entries that let no exception out; see thread_entry.h.
#include "common/thread_entry.h"

#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ptrain {

void EndOnThreadException(std::string_view thread, std::string_view what) {
  // Formatted on the stack and written at once: after std::bad_alloc an
  // allocation may fail again, and stdio's or spdlog's locks may be held
  // by the thread that threw or by another.
  char line[1024];
  int n = std::snprintf(line, sizeof(line), "%s: error: thread %.*s: %.*s",
                        program_invocation_short_name,
                        static_cast<int>(thread.size()), thread.data(),
                        static_cast<int>(what.size()), what.data());
  n = std::min<int>(std::max(n, 0), sizeof(line) - 2);
  for (int i = 0; i < n; ++i) {
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  }
  line[n++] = '\n';
  for (int at = 0; at < n;) {
    const ssize_t w = ::write(STDERR_FILENO, line + at, n - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    at += static_cast<int>(w);
  }
  std::_Exit(1);
}

void NameThisThread(const std::string& name) {
  // The kernel keeps 15 bytes and a NUL; a longer name is refused whole.
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace ptrain
