// A hardware profile of a small CPU machine written by hand (the format
// of planner/profile.h, ptrain-profile/1), for tests of the planner and of
// what plans with it (parallel: auto), without measuring this one.
#ifndef PTRAIN_TESTS_TESTING_CPU_PROFILE_H_
#define PTRAIN_TESTS_TESTING_CPU_PROFILE_H_

namespace ptrain::testing {

// clang-format off
inline constexpr char kCpuProfile[] = R"({
  "format": "ptrain-profile/1", "name": "test-cpu", "source": "written by hand",
  "device": "cpu", "memory_bytes": 25769803776, "cores": 2,
  "matmul": [
    {"precision": "fp32", "pass": "forward", "m": 256, "n": 256, "k": 256, "threads": 1, "flops_per_s": 2e10},
    {"precision": "fp32", "pass": "forward", "m": 1024, "n": 1024, "k": 1024, "threads": 1, "flops_per_s": 4e10},
    {"precision": "fp32", "pass": "forward", "m": 1024, "n": 1024, "k": 1024, "threads": 2, "flops_per_s": 7e10},
    {"precision": "fp32", "pass": "forward", "m": 256, "n": 256, "k": 256, "threads": 2, "flops_per_s": 3e10},
    {"precision": "fp32", "pass": "backward", "m": 1024, "n": 1024, "k": 1024, "threads": 1, "flops_per_s": 3e10},
    {"precision": "fp32", "pass": "backward", "m": 1024, "n": 1024, "k": 1024, "threads": 2, "flops_per_s": 5e10}
  ],
  "attention": [
    {"precision": "fp32", "B": 4, "T": 256, "C": 256, "heads": 4, "threads": 1, "forward_s": 0.002, "backward_s": 0.005},
    {"precision": "fp32", "B": 4, "T": 256, "C": 256, "heads": 4, "threads": 2, "forward_s": 0.001, "backward_s": 0.003}
  ],
  "elementwise_bytes_per_s": 1e10,
  "optimizer_params_per_s": 5e8,
  "links": {"intra_node": {
    "allreduce": {"alpha_s": 2e-5, "bus_bytes_per_s": 3e9},
    "allgather": {"alpha_s": 2e-5, "bus_bytes_per_s": 3e9},
    "reduce_scatter": {"alpha_s": 2e-5, "bus_bytes_per_s": 3e9},
    "sendrecv": {"alpha_s": 1e-5, "bus_bytes_per_s": 4e9},
    "alltoall": {"alpha_s": 3e-5, "bus_bytes_per_s": 2e9}}}
})";
// clang-format on

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_CPU_PROFILE_H_
