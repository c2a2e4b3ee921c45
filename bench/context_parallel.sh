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
mpi="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp"
export OMPI_MCA_mpi_yield_when_idle=1
out=$(mktemp)
trap 'rm -f "$out" "$out.run"' EXIT

run() {  # NAME COMMAND...: runs it, keeps its tok/s under NAME
  name=$1
  shift
  "$@" >"$out.run" 2>&1 || { cat "$out.run"; exit 1; }
  grep -v "warning" "$out.run"
  echo "$name $(sed -n 's/.* ms\/step, \([0-9.]*\) tok\/s.*/\1/p' "$out.run")" >>"$out"
}

i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  echo "--- round $i of $rounds"
  run cp1 env OMP_NUM_THREADS="$cores" "$bin" --steps "$steps"
  run cp2 $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --steps "$steps"
done

median() { grep "^$1 " "$out" | cut -d' ' -f2 | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
m1=$(median cp1)
m2=$(median cp2)
echo "--- config M at T=1024, median of $rounds rounds"
echo "cp=1 ($cores threads): $m1 tok/s"
awk -v a="$m2" -v b="$m1" 'BEGIN {printf "cp=2 (1 thread/rank): %s tok/s = %.3f x cp=1 (target >= 0.8)\n", a, a / b}'
