#!/bin/sh
# Context parallelism on this machine, side by side in one run: config M at
# T=1024 with one rank holding every core's thread (cp=1) against cp=2 with
# one thread per rank, alternated ROUNDS times; prints each run's figures
# (the ring's traffic, activations per rank against cp=1's), the median
# tok/s of each and their ratio.
#
#   bench/context_parallel.sh [ROUNDS] [STEPS]   (a build with -DPT_BUILD_BENCH=ON)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-3}
bin=${PTRAIN_BUILD:-build}/bench/context_parallel_bench
cores=$(nproc)
. bench/side_by_side.sh

i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  echo "--- round $i of $rounds"
  run cp1 env OMP_NUM_THREADS="$cores" "$bin" --steps "$steps"
  run cp2 $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --steps "$steps"
done

m1=$(median cp1)
m2=$(median cp2)
echo "--- config M at T=1024, median of $rounds rounds"
echo "cp=1 ($cores threads): $m1 tok/s"
awk -v a="$m2" -v b="$m1" 'BEGIN {printf "cp=2 (1 thread/rank): %s tok/s = %.3f x cp=1 (target >= 0.8)\n", a, a / b}'
