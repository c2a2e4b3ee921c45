// The options of a Coordinator under test: its state and data in `dir`,
// two local slots, one user token ("user"), ranks that are /bin/true. A
// test sets what it needs beyond these (its own mpirun, a planner).
#ifndef PTRAIN_TESTS_TESTING_COORDINATOR_OPTIONS_H_
#define PTRAIN_TESTS_TESTING_COORDINATOR_OPTIONS_H_

#include <filesystem>

#include "coordinator/coordinator.h"

namespace ptrain::testing {

inline CoordinatorOptions LocalCoordinatorOptions(
    const std::filesystem::path& dir) {
  CoordinatorOptions o;
  o.state_dir = (dir / "state").string();
  o.local_slots = 2;
  o.user_tokens = {"user"};
  o.data_roots = {(dir / "data").string()};
  o.work_root = dir.string();
  o.ptworker = "/bin/true";
  o.mpirun = "/bin/true";
  o.advertise_address = "127.0.0.1:1";
  return o;
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_COORDINATOR_OPTIONS_H_
