#!/usr/bin/env bash
# The test command (README, CI): installs what the tests need and builds
# them (scripts/setup.sh --tests), then runs every ctest label (the `gpu`
# cases skip, saying so, where no CUDA device is present), then (unless ctest arguments narrow the run) the fuzz
# targets for $PTRAIN_FUZZ_SECONDS each (default 45; 0 skips them). Extra
# arguments go to ctest (e.g. -L unit, -R spec).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
cd build
start=$SECONDS
rc=0
# Tests run one at a time: each already uses every core through OpenMP.
ctest --output-on-failure "$@" || rc=$?
echo "test: ctest took $((SECONDS - start)) s"
cd ..
if (($# == 0)) && [[ ${PTRAIN_FUZZ_SECONDS:-45} != 0 ]]; then
  scripts/fuzz.sh || rc=$?
fi
exit "$rc"
