#!/bin/sh
# Pipeline parallelism on this machine (a build with -DPT_BUILD_BENCH=ON):
#  1. the bubble of GPipe, 1F1B and interleaved 1F1B (v=2 chunks per rank)
#     at pp 2 and 4 over m = 1, 4, 8, 16 microbatches of 4 sequences
#     (config S; 8 layers at pp=4 so that it interleaves), measured per stage
#     (10 steps a run, the median of ROUNDS runs: shorter runs swing by
#     a fifth on this shared machine) against (pp-1)/(m+pp-1),
#     (pp-1)/(v·m+pp-1) for interleaved, and the
#     cut interleaving makes in the measured 1F1B bubble (target >= 0.6·v);
#     also against the schedule simulated with each stage's measured pass
#     times (stages are not equal: the last computes the head and the loss,
#     and cores differ from run to run), which the textbook leaves out.
#     pp=4 runs 4 ranks on this machine's cores: when there are fewer
#     cores than stages, a waiting stage lends its core to another and the
#     idle fraction is not a pipeline bubble alone;
#  1b. the same on config M at pp=2 (its head is a smaller share of the
#     last stage: the stages are closer to equal), 1F1B and interleaved
#     with v=3;
#  1c. stages of different sizes: config M with an 8192-word vocabulary,
#     whose head makes the last of 3 + 3 layers the slow stage, against
#     parallel.last_stage_layers=2 (4 + 2): tok/s and bubble;
#  1d. zero-bubble ZB-H1 against 1F1B (config M, pp=2, m 4 and 8) in one
#     run: bubble ratio, against the simulated one, losses bit-identical;
#  2. config M at pp=2 (one thread per rank, m=8) against one rank with
#     every core's thread, side by side, ROUNDS times: the tok/s ratio;
#  3. the full 3D layout dp=2 tp=2 pp=2 (8 ranks, one thread each) on
#     config S and on the names example: tok/s and the per-rank phase table.
#
#   bench/pipeline.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=${PTRAIN_BUILD:-build}/bench/pipeline_bench
cores=$(nproc)
mpi="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp"
export OMPI_MCA_mpi_yield_when_idle=1

echo "=== 1. bubble (config S, microbatches of 4 sequences, one thread per rank; median of $rounds)"
# pp m schedule v layers [config sequences] -> the median run's measured
# fraction, its ratio to the analytic and to the simulation with the
# stages' measured pass times.
bubble() {
  r=0
  while [ "$r" -lt "$rounds" ]; do
    r=$((r + 1))
    $mpi -n "$1" -x OMP_NUM_THREADS=1 "$bin" --config "${6:-S}" \
      --microbatches "$2" --micro-batch "${7:-4}" --schedule "$3" \
      --virtual-stages "$4" --layers "$5" --steps 10 | awk '
        /^  bubble: measured/ { f = $3; a = $NF }
        /^  bubble simulated/ { print f, a, $NF }'
  done | sort -n | awk '{l[NR] = $0} END {print l[int((NR + 1) / 2)]}'
}
for pp in 2 4; do
  layers=$((pp * 2))
  [ "$layers" -lt 4 ] && layers=4
  for m in 1 4 8 16; do
    for schedule in gpipe 1f1b interleaved; do
      v=1
      if [ "$schedule" = interleaved ]; then
        v=2
        [ $((m % pp)) -eq 0 ] || continue
      fi
      set -- $(bubble "$pp" "$m" "$schedule" "$v" "$layers")
      printf 'pp=%d m=%-2d %-11s v=%d: bubble %.3f, %.2f x analytic, %.2f x simulated' \
        "$pp" "$m" "$schedule" "$v" "$1" "$2" "$3"
      if [ "$schedule" = 1f1b ]; then
        plain=$1
        echo
      else
        [ "$schedule" = interleaved ] &&
          awk -v a="$plain" -v b="$1" -v v="$v" 'BEGIN {
            printf ", cut %.2f x vs 1f1b (target >= %.1f)", a / b, 0.6 * v }'
        echo
      fi
    done
  done
done

echo "=== 1b. bubble, config M (6 layers, microbatches of 1 sequence), pp=2"
for m in 8 16; do
  set -- $(bubble 2 "$m" 1f1b 1 6 M 1)
  plain=$1
  printf 'pp=2 m=%-2d 1f1b        v=1: bubble %.3f, %.2f x analytic, %.2f x simulated\n' \
    "$m" "$1" "$2" "$3"
  set -- $(bubble 2 "$m" interleaved 3 6 M 1)
  printf 'pp=2 m=%-2d interleaved v=3: bubble %.3f, %.2f x analytic, %.2f x simulated' \
    "$m" "$1" "$2" "$3"
  awk -v a="$plain" -v b="$1" 'BEGIN {
    printf ", cut %.2f x vs 1f1b (target >= 1.8)\n", a / b }'
done

echo "=== 1d. zero-bubble ZB-H1 against 1F1B, config M, pp=2, side by side in one run (alternating steps; median of $rounds)"
# Each round trains both schedules in one process, their steps alternating:
# zb1p's measured bubble against 1f1b's (target <= 0.5 x), against the
# simulation from its measured F, B and W times (target within 25%), and
# its losses against 1f1b's (target: bit-identical).
for m in 4 8; do
  i=0
  while [ "$i" -lt "$rounds" ]; do
    i=$((i + 1))
    $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --config M --microbatches "$m" \
      --schedule 1f1b,zb1p --steps 6 | awk '
        /^  bubble simulated/ { sim = $NF }
        /^zb1p against 1f1b/ {
          r = $12; gsub(/[),]/, "", r); print r, sim, $NF }'
  done | sort -n | awk -v m="$m" '{l[NR] = $0} END {
    split(l[int((NR + 1) / 2)], f, " ")
    printf "pp=2 m=%d: zb1p bubble %.2f x 1f1b'"'"'s (target <= 0.5), %.2f x simulated, losses %s\n",
      m, f[1], f[2], f[3] }'
done

echo "=== 1c. stages of different sizes: config M with a vocabulary of 8192 (random tokens), pp=2, 1f1b, m=8"
# The head (2·C·V multiply-adds a token) is about 1.8 blocks' worth here:
# 3 + 3 layers leave the first stage waiting for the last every microbatch;
# parallel.last_stage_layers=2 (4 + 2) moves a block to the first stage.
# Alternated ROUNDS times, median tok/s of each.
uneven=$(mktemp)
i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  for last in 0 2; do
    $mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --config M --vocab 8192 \
      --microbatches 8 --micro-batch 1 --last-stage-layers "$last" --steps 4 |
      awk -v last="$last" '
        /tok\/s$/ { t = $(NF - 1) }
        /^  bubble: measured/ {
          f = $11; l = $13; gsub(/[,)]/, "", f); gsub(/[,)]/, "", l)
          print last, t, $3, f, l }'
  done
done | tee "$uneven" | awk '{
  printf "last_stage_layers=%s: %s tok/s, bubble %s (first stage %s, last %s)\n",
    $1, $2, $3, $4, $5 }'
med() { grep "^$1 " "$uneven" | cut -d' ' -f"$2" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
awk -v a="$(med 0 2)" -v b="$(med 2 2)" -v ba="$(med 0 3)" -v bb="$(med 2 3)" 'BEGIN {
  printf "median: 3+3 layers %s tok/s (bubble %s), 4+2 layers %s tok/s (bubble %s) = %.3f x\n",
    a, ba, b, bb, b / a }'
rm -f "$uneven"

echo "=== 2. config M: pp=2 (1 thread/rank, m=8) vs one rank ($cores threads)"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
tok() { sed -n 's/.* ms\/step, \([0-9.]*\) tok\/s$/\1/p'; }
i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  # One rank must not be bound to one core: its threads use them all.
  one=$(OMP_NUM_THREADS="$cores" $mpi --bind-to none -n 1 -x OMP_NUM_THREADS "$bin" --config M \
    --microbatches 1 --steps 3 | tok)
  two=$($mpi -n 2 -x OMP_NUM_THREADS=1 "$bin" --config M --microbatches 8 \
    --steps 3 | tok)
  echo "round $i: one rank $one tok/s, pp=2 $two tok/s" | tee -a "$out"
done
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
m1=$(awk '{print $5}' "$out" | median)
m2=$(awk '{print $8}' "$out" | median)
awk -v a="$m1" -v b="$m2" 'BEGIN {
  printf "median: one rank %s tok/s, pp=2 %s tok/s = %.3f x (target >= 0.8)\n",
    a, b, b / a }'

echo "=== 3. dp=2 tp=2 pp=2 (8 ranks, 1 thread each), 1f1b, m=4, ZeRO-1"
for config in S names; do
  $mpi -n 8 -x OMP_NUM_THREADS=1 "$bin" --config "$config" --dp 2 --tp 2 \
    --microbatches 4 --zero 1 --steps 3
done
