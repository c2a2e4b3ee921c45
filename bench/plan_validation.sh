#!/bin/sh
# The layout planner against measured steps on this machine
# (docs/planner.md):
#  1. profile this CPU: `ptworker profile` over 4 ranks (the kernels on
#     rank 0 at one thread and at every core; the links over 2 and 4 ranks);
#  2. each layout below (configs S and M of the benchmarks, batch 8, over 1,
#     2 and 4 ranks: dp, ZeRO stages, tp with sp, pp under 1f1b, interleaved
#     and zb1p, cp, recompute): predicted with `ptctl plan --fixed -o json`
#     against that profile, then run with ptworker (STEPS steps, the median
#     `ms` of the run log after the first WARMUP);
#  3. a table of predicted against measured, the median absolute error
#     (goal <= 15%) and Spearman's rank correlation (goal >= 0.8).
#
#   bench/plan_validation.sh [STEPS] [WARMUP]
set -eu
cd "$(dirname "$0")/.."
steps=${1:-14}
warmup=${2:-4}
build=${PTRAIN_BUILD:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader,tcp"
export OMPI_MCA_mpi_yield_when_idle=1

echo "=== 1. profile ($(nproc) cores, 4 ranks)"
$mpi -n 4 "$build/worker/ptworker" profile --out "$work/profile.json" |
  sed 's/^/  /'

S="--set model.n_layer=4 --set model.n_head=4 --set model.n_embd=128 --set model.block_size=64"
M="--set model.n_layer=6 --set model.n_head=6 --set model.n_embd=384 --set model.block_size=256"
common="--set model.vocab_size=65 --set train.global_batch=8 --set train.eval_every=0 --set train.sample_every=0 --set train.sample_tokens=0 --set checkpoint.every=0 --set checkpoint.dir='' --set train.steps=$steps"

# name ranks model-sets layout-sets
run() {
  name=$1 ranks=$2 model=$3
  shift 3
  sets="$*"
  predicted=$("$build/ptctl/ptctl" plan examples/shakespeare-char.yaml $model \
    $common $sets --nodes 1 --gpus-per-node "$ranks" \
    --profile "$work/profile.json" --fixed -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["best"][0]["step_s"] * 1e3)')
  rm -f "$work/run.jsonl"
  $mpi -n "$ranks" "$build/worker/ptworker" --config examples/shakespeare-char.yaml \
    $model $common $sets --log-json "$work/run.jsonl" > "$work/out.txt" 2>&1 ||
    { cat "$work/out.txt"; exit 1; }
  measured=$(python3 - "$work/run.jsonl" "$warmup" <<'EOF'
import json, statistics, sys
ms = [r["ms"] for r in map(json.loads, open(sys.argv[1]))
      if r.get("type") == "step"]
print(statistics.median(ms[int(sys.argv[2]):]))
EOF
)
  printf '%-34s %5d %12.1f %12.1f %+8.0f%%\n' "$name" "$ranks" "$predicted" \
    "$measured" "$(awk -v p="$predicted" -v m="$measured" 'BEGIN {print 100 * (p / m - 1)}')"
  echo "$predicted $measured" >> "$work/pairs.txt"
}

echo "=== 2. predicted against measured (ms a step, median of steps $((warmup + 1))..$steps)"
printf '%-34s %5s %12s %12s %9s\n' layout ranks predicted measured error
run "S dp=1" 1 "$S"
run "M dp=1" 1 "$M"
run "M dp=1 recompute=full" 1 "$M" --set train.recompute=full
run "S dp=2" 2 "$S" --set parallel.dp=2
run "M dp=2 zero=1" 2 "$M" --set parallel.dp=2 --set parallel.zero=1
run "M dp=2 zero=3" 2 "$M" --set parallel.dp=2 --set parallel.zero=3
run "M tp=2 sp" 2 "$M" --set parallel.tp=2 --set parallel.sequence_parallel=true
run "M pp=2 1f1b m=4" 2 "$M" --set parallel.pp=2 --set parallel.microbatches=4
run "M pp=2 zb1p m=4" 2 "$M" --set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=zb1p
run "M pp=2 interleaved v=3 m=4" 2 "$M" --set parallel.pp=2 --set parallel.microbatches=4 --set parallel.schedule=interleaved --set parallel.virtual_stages=3
run "M cp=2" 2 "$M" --set parallel.cp=2
run "M dp=2 recompute=selective" 2 "$M" --set parallel.dp=2 --set train.recompute=selective
run "S dp=4" 4 "$S" --set parallel.dp=4
run "M dp=4 zero=2" 4 "$M" --set parallel.dp=4 --set parallel.zero=2
run "M dp=2 tp=2 sp" 4 "$M" --set parallel.dp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
run "M dp=2 pp=2 1f1b m=2" 4 "$M" --set parallel.dp=2 --set parallel.pp=2 --set parallel.microbatches=2
run "S pp=4 1f1b m=8" 4 "$S" --set parallel.pp=4 --set parallel.microbatches=8

echo "=== 3. accuracy"
python3 - "$work/pairs.txt" <<'EOF'
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
errors = [abs(p / m - 1) for p, m in pairs]
def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    for pos, i in enumerate(order):
        r[i] = pos + 1.0
    return r
rp, rm = ranks([p for p, _ in pairs]), ranks([m for _, m in pairs])
n = len(pairs)
rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(rp, rm)) / (n * (n * n - 1))
print(f"{n} layouts: median absolute error {100 * statistics.median(errors):.1f}% "
      f"(goal <= 15%), Spearman {rho:.2f} (goal >= 0.8)")
EOF
