#!/bin/sh
# Tensor parallelism on this machine, side by side in one run: config M at
# tp=1 with every core's thread in one rank, against tp=2 (and tp=2 with
# sequence parallelism) with one thread per rank, alternated ROUNDS times;
# prints each run's figures, the median tok/s of each and their ratios.
# Then config S at tp=4 for the memory table at a degree M cannot take.
#
#   bench/tensor_parallel.sh [ROUNDS] [STEPS]   (a build with -DPT_BUILD_BENCH=ON)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-6}
bin=${PTRAIN_BUILD:-build}/bench/tensor_parallel_bench
cores=$(nproc)
. bench/side_by_side.sh

i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  echo "--- round $i of $rounds"
  run tp1 env OMP_NUM_THREADS="$cores" "$bin" --steps "$steps"
  run tp2 $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --steps "$steps"
  run tp2sp $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --steps "$steps" --sp 1
done
rm -f "$out.run"

m1=$(median tp1)
m2=$(median tp2)
m2sp=$(median tp2sp)
echo "--- config M, median of $rounds rounds"
echo "tp=1 ($cores threads): $m1 tok/s"
awk -v a="$m2" -v b="$m1" 'BEGIN {printf "tp=2 (1 thread/rank): %s tok/s = %.3f x tp=1 (target >= 0.85)\n", a, a / b}'
awk -v a="$m2sp" -v b="$m1" 'BEGIN {printf "tp=2 sp (1 thread/rank): %s tok/s = %.3f x tp=1\n", a, a / b}'

echo "--- config S at tp=4 with sp (memory at a degree config M cannot take)"
$mpi -n 4 -x OMP_NUM_THREADS=1 "$bin" --config S --steps 1 --warmup 1 --sp 1 | grep -v "^  tp "
