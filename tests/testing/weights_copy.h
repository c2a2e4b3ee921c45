// The invariant of a store's bf16 compute copy of the weights (ZeroStore,
// bf16_weights), for the tests that train with one: wherever the matmuls may
// read it, each unit's copy is its fp32 master weights rounded to nearest
// even. Header-only, for gtest binaries linking ptrain_engine.
#ifndef PTRAIN_TESTS_TESTING_WEIGHTS_COPY_H_
#define PTRAIN_TESTS_TESTING_WEIGHTS_COPY_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "worker/engine/parallel/zero_store.h"

namespace ptrain::testing {

// Every unit of `store` (CPU memory), gathered first where ZeRO-3 shards it
// (collective over the store's dp group: every rank calls this). `when`
// names the moment in failure messages.
inline void ExpectWeightsCopyIsTheRoundedMaster(ZeroStore& store,
                                                const std::string& when) {
  for (int u = 0; u < static_cast<int>(store.units().size()); ++u) {
    store.BeginForward(u);
    const kernels::ConstAct w = store.Weights(u);
    ASSERT_EQ(w.type, kernels::DType::kBf16) << when;
    const int64_t n = store.units()[u].size;
    std::vector<uint16_t> want(n);
    kernels::RoundToBf16Rows(want.data(), store.Params(u), 1, n);
    const auto* got = static_cast<const uint16_t*>(w.p);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], want[i]) << when << ": unit " << u << ", element " << i;
    }
    store.EndForward(u);
  }
}

}  // namespace ptrain::testing

#endif  // PTRAIN_TESTS_TESTING_WEIGHTS_COPY_H_
