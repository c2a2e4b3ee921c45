#!/bin/sh
# Expert parallelism on this machine, side by side in one run: an 8-expert
# top-2 MoE at config M's width on 2 ranks (one thread each), the experts
# split over ep=2 against every rank holding them all (ep=1, dp only),
# alternated ROUNDS times; prints each run's figures (the all-to-all's
# share of the step, the experts' memory per rank), the median tok/s of
# each, and the ratios the goals name. Then, on the same 2 ranks as tp=2,
# each expert split over both (parallel.expert_tp=2, the default) against
# each rank holding half the experts whole (expert_tp=1).
#
#   bench/expert_parallel.sh [ROUNDS] [STEPS]   (a build with -DPT_BUILD_BENCH=ON)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-3}
bin=${PTRAIN_BUILD:-build}/bench/expert_parallel_bench
. bench/side_by_side.sh

mem=$(mktemp)
i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  echo "--- round $i of $rounds"
  for ep in 1 2; do
    run "ep$ep" $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --ep "$ep" --steps "$steps"
    sed -n "s/.*experts' memory per rank.*: \([0-9.]*\) MB/ep$ep \1/p" "$out.run" >>"$mem"
  done
  for et in 2 1; do
    run "etp$et" $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --tp 2 --expert-tp "$et" --steps "$steps"
    sed -n "s/.*experts' memory per rank.*: \([0-9.]*\) MB/etp$et \1/p" "$out.run" >>"$mem"
  done
done

m1=$(median ep1)
m2=$(median ep2)
e1=$(grep '^ep1 ' "$mem" | tail -1 | cut -d' ' -f2)
e2=$(grep '^ep2 ' "$mem" | tail -1 | cut -d' ' -f2)
t2=$(median etp2)
t1=$(median etp1)
x2=$(grep '^etp2 ' "$mem" | tail -1 | cut -d' ' -f2)
x1=$(grep '^etp1 ' "$mem" | tail -1 | cut -d' ' -f2)
rm -f "$mem"
echo "--- 8 experts top-2 at config M's width, 2 ranks, median of $rounds rounds"
echo "ep=1 (dp=2): $m1 tok/s, experts $e1 MB per rank"
awk -v a="$m2" -v b="$m1" -v x="$e2" -v y="$e1" 'BEGIN {
  printf "ep=2 (dp=2): %s tok/s = %.3f x ep=1 (goal >= 0.9)\n", a, a / b
  printf "experts per rank: %s MB = %.3f x ep=1 (goal <= 0.55)\n", x, x / y }'
echo "tp=2, expert_tp=2 (each expert split over both ranks): $t2 tok/s, experts $x2 MB per rank"
awk -v a="$t1" -v b="$t2" -v x="$x1" -v y="$x2" 'BEGIN {
  printf "tp=2, expert_tp=1 (4 whole experts a rank): %s tok/s = %.3f x expert_tp=2, experts %s MB per rank = %.3f x\n", a, a / b, x, x / y }'
