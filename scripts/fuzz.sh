#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer into build-fuzz/, then runs each for a bounded
# time from its seed corpus (fuzz/corpus/NAME/), as many at once as there are
# cores, and prints executions and coverage per target. Exits non-zero on any
# finding (a crash, a sanitizer report, a timeout or out-of-memory); the
# input that caused it is kept in build-fuzz/artifacts/. scripts/test.sh
# runs it; needs what `scripts/setup.sh --tests` installs (clang, its
# runtimes, libomp).
#
#   scripts/fuzz.sh [--build-only] [SECONDS_PER_TARGET [NAME...]]
#     --build-only: build the targets, run none
#     SECONDS_PER_TARGET: default $PTRAIN_FUZZ_SECONDS, else 20
#     NAME: only these targets (fuzz/NAME_fuzzer.cc); default all
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
seconds=${1:-${PTRAIN_FUZZ_SECONDS:-20}}
shift || true
names=("$@")
if ((${#names[@]} == 0)); then
  for src in fuzz/*_fuzzer.cc; do names+=("$(basename "$src" _fuzzer.cc)"); done
fi
start=$SECONDS

# -O1 and line tables (CMakeLists.txt) are what sanitizer reports need, and
# build faster than RelWithDebInfo's -O2 -g.
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -DNDEBUG" \
  -DPT_FUZZ=ON -DPT_CUDA=OFF -DPT_BUILD_TESTS=OFF -DPT_BUILD_BENCH=OFF >build-fuzz.configure.log 2>&1 ||
  { cat build-fuzz.configure.log; exit 1; }
cmake --build build-fuzz -j"$(nproc)" --target "${names[@]/%/_fuzzer}"
echo "fuzz: built in $((SECONDS - start)) s"
if ((build_only)); then exit 0; fi

mkdir -p build-fuzz/artifacts
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# run_target NAME: fuzzes NAME for $seconds and writes its line of the
# report to build-fuzz/NAME.result (first word ok or FAILED).
run_target() {
  local name=$1 bin=build-fuzz/fuzz/${1}_fuzzer work=build-fuzz/corpus/$1 # grows across runs
  local log=build-fuzz/$1.log rc=0 execs cov units
  mkdir -p "$work"
  # The outer timeout also ends a run whose slow-unit alarm deadlocks in the
  # allocator (seen with ASan): that is a finding too.
  timeout -k 10 $((seconds + 120)) \
    "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$name-" "$work" "fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE '(DONE|pulse|NEW|REDUCE|INITED) +cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 |
    sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+)/\1 edges, \2 features/' || echo "?")
  units=$(find "$work" -type f | wc -l)
  if ((rc != 0)); then
    printf 'FAILED %-12s FAILED  %12s execs  %s (exit %d)\n' "$name" "$execs" "$cov" "$rc"
  else
    printf 'ok %-12s ok      %12s execs  %s, corpus %d\n' "$name" "$execs" "$cov" "$units"
  fi >"build-fuzz/$name.result"
}

# One target a core: each fuzzer is a single process.
run_start=$SECONDS
jobs=$(nproc)
running=0
for name in "${names[@]}"; do
  if ((running >= jobs)); then
    wait -n || true
    running=$((running - 1))
  fi
  rm -f "build-fuzz/$name.result"
  run_target "$name" &
  running=$((running + 1))
done
wait
failed=0
report=()
for name in "${names[@]}"; do
  line=$(cat "build-fuzz/$name.result" 2>/dev/null || echo "FAILED $name FAILED (no result)")
  if [[ $line == FAILED* ]]; then
    failed=$((failed + 1))
    echo "fuzz: $name FAILED; the end of its log:"
    tail -n 60 "build-fuzz/$name.log"
  fi
  report+=("${line#* }")
done
echo "fuzz: results (${seconds} s each, ${jobs} at once, $((SECONDS - run_start)) s)"
for line in "${report[@]}"; do echo "  $line"; done
echo "fuzz: took $((SECONDS - start)) s, $failed target(s) with findings"
((failed == 0))
