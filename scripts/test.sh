#!/usr/bin/env bash
# The test command (README, CI): installs what the tests need and builds
# them (scripts/setup.sh --tests), then runs every ctest label (the `gpu`
# cases skip, saying so, where no CUDA device is present), then (unless
# ctest arguments narrow the run) the fuzz targets for $PTRAIN_FUZZ_SECONDS
# each (default 20; 0 skips them), whose build runs beside the tests. Extra
# arguments go to ctest (e.g. -L unit, -R spec).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests
fuzz=0
if (($# == 0)) && [[ ${PTRAIN_FUZZ_SECONDS:-} != 0 ]]; then fuzz=1; fi
# The fuzz targets' own build (clang, sanitizers) needs nothing from the
# tests: it runs beside them at the lowest priority, on the cores the tests
# leave idle (many of them wait on timeouts, restarts and other processes),
# and takes from them only what they do not use.
fuzz_build=
if ((fuzz)); then
  nice -n 19 scripts/fuzz.sh --build-only >build-fuzz.build.log 2>&1 &
  fuzz_build=$!
fi
cd build
start=$SECONDS
# The cores' time (/proc/stat): the tests' and the niced fuzz build's.
read -r _ user nice_ system idle iowait _ </proc/stat
busy0=$((user + system)) niced0=$nice_ all0=$((user + nice_ + system + idle + iowait))
rc=0
# Tests run one at a time: each already uses every core through OpenMP. The
# few that mostly wait (label `waits`) run beside them, one at a time too,
# when the whole set runs.
if (($# == 0)); then
  ctest --output-on-failure -L waits >waits.log 2>&1 &
  waits=$!
  ctest --output-on-failure -LE waits || rc=$?
  echo "test: the tests that mostly wait, run beside the others:"
  if wait "$waits"; then
    grep -E '^ *[0-9]+/[0-9]+ Test|tests passed' waits.log
  else
    rc=1
    cat waits.log
  fi
else
  ctest --output-on-failure "$@" || rc=$?
fi
read -r _ user nice_ system idle iowait _ </proc/stat
all=$((user + nice_ + system + idle + iowait - all0))
echo "test: ctest took $((SECONDS - start)) s; the cores were $((100 * (user + system - busy0) / all))%" \
  "busy with the tests, $((100 * (nice_ - niced0) / all))% with the fuzz build"
cd ..
if ((fuzz)); then
  build_rc=0
  wait "$fuzz_build" || build_rc=$?
  if ((build_rc != 0)); then
    echo "test: the fuzz targets' build failed (exit $build_rc):"
    tail -n 60 build-fuzz.build.log
    rc=1
  else
    tail -n 1 build-fuzz.build.log
    scripts/fuzz.sh || rc=$?
  fi
fi
exit "$rc"
