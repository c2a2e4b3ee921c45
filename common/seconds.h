// Seconds measured on the steady clock, as the step times, phases and
// checkpoint waits are reported.
#ifndef PTRAIN_COMMON_SECONDS_H_
#define PTRAIN_COMMON_SECONDS_H_

#include <chrono>

namespace ptrain {

// Seconds from `t0` to now on the steady clock.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace ptrain

#endif  // PTRAIN_COMMON_SECONDS_H_
