// Gradient checks by central differences, for the kernel tests.
#ifndef PTRAIN_TESTS_TESTING_FINITE_DIFFERENCE_H_
#define PTRAIN_TESTS_TESTING_FINITE_DIFFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ptrain::testing {

// Largest |analytic - numeric| / max(1, |analytic|, |numeric|) over the
// elements of *x, numeric being the central difference (steps of `step`)
// of loss(); prints it with `name` and the tolerance `tol` it is held to.
inline double MaxGradError(const std::string& name, std::vector<double>* x,
                           const std::vector<double>& analytic,
                           const std::function<double()>& loss, double step,
                           double tol) {
  double maxdiff = 0, maxrel = 0;
  for (size_t i = 0; i < x->size(); i++) {
    const double saved = (*x)[i];
    (*x)[i] = saved + step;
    const double plus = loss();
    (*x)[i] = saved - step;
    const double minus = loss();
    (*x)[i] = saved;
    const double numeric = (plus - minus) / (2 * step);
    const double diff = std::abs(analytic[i] - numeric);
    maxdiff = std::max(maxdiff, diff);
    maxrel = std::max(maxrel, diff / std::max({1.0, std::abs(analytic[i]),
                                               std::abs(numeric)}));
  }
  std::printf("%-32s maxdiff %.3e  maxrel %.3e  (tol %.0e)\n", name.c_str(),
              maxdiff, maxrel, tol);
  return maxrel;
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_FINITE_DIFFERENCE_H_
