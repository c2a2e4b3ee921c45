// Small statistics the benchmarks print (header only).
#ifndef PTRAIN_BENCH_STATS_H_
#define PTRAIN_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace ptrain {

// The median of v (not empty): the middle value, or the mean of the two
// middle ones.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace ptrain

#endif  // PTRAIN_BENCH_STATS_H_
