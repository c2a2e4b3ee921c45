#!/usr/bin/env bash
# The same one-rank job trained by ptworker by hand and under ptcoord, side
# by side on this machine: each run's median step time (the run log's `ms`,
# past the first WARMUP steps) and their ratio. Under ptcoord the job holds
# every slot of `--local-slots SLOTS` (default 1: all of ptcoord's CPUs), so
# it is bound to as many CPUs as the run by hand may use and runs as many
# threads; with more slots it gets its share (`--local-slots` in
# docs/control-plane.md).
#
#   bench/under_ptcoord.sh [STEPS [SLOTS]]   (default 200 steps, 1 slot)
#
# Needs a build (scripts/setup.sh); BUILD overrides build/.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
SLOTS=${2:-1}
WARMUP=10
BUILD=${BUILD:-build}
if ! [[ $STEPS =~ ^[0-9]+$ ]] || ((STEPS <= WARMUP)); then
  echo "under_ptcoord: STEPS must be a whole number over $WARMUP" >&2
  exit 2
fi
if ! [[ $SLOTS =~ ^[1-9][0-9]*$ ]]; then
  echo "under_ptcoord: SLOTS must be a whole number from 1" >&2
  exit 2
fi
TMP=$(mktemp -d /tmp/ptrain-under-ptcoord.XXXXXX)
COORD=
cleanup() {
  [[ -n $COORD ]] && kill "$COORD" 2>/dev/null && wait "$COORD" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
mkdir -p "$TMP/checkpoints"
SETS=(--set train.steps="$STEPS" --set train.eval_every=0 --set train.sample_every=0
  --set train.log_every=50 --set checkpoint.dir="$TMP/checkpoints")

# median_ms RUN_LOG: the median `ms` of its step records past WARMUP.
median_ms() {
  python3 - "$1" "$WARMUP" <<'EOF'
import json, statistics, sys
ms = [r["ms"] for r in map(json.loads, open(sys.argv[1]))
      if r.get("type") == "step" and r["step"] > int(sys.argv[2])]
print(f"{statistics.median(ms):.2f}" if ms else "nan")
EOF
}

echo "under_ptcoord: examples/shakespeare-char.yaml, $STEPS steps, $(nproc) CPUs"
"$BUILD/worker/ptworker" --config examples/shakespeare-char.yaml "${SETS[@]}" \
  --log-json "$TMP/by-hand.jsonl" >"$TMP/by-hand.log" 2>&1 ||
  { tail -n 20 "$TMP/by-hand.log"; exit 1; }
by_hand=$(median_ms "$TMP/by-hand.jsonl")

head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/tokens"
"$BUILD/coordinator/ptcoord" --listen 127.0.0.1:0 --state-dir "$TMP/state" \
  --local-slots "$SLOTS" --token-file "$TMP/tokens" --data-root data --data-root "$TMP/checkpoints" \
  --log-level warn >"$TMP/ptcoord.log" 2>&1 &
COORD=$!
for _ in $(seq 100); do [[ -s $TMP/state/address ]] && break; sleep 0.1; done
export PTCTL_SERVER=$(cat "$TMP/state/address") PTCTL_TOKEN=$(cat "$TMP/tokens")
JOB=$("$BUILD/ptctl/ptctl" submit examples/shakespeare-char.yaml "${SETS[@]}")
"$BUILD/ptctl/ptctl" watch "$JOB" >/dev/null 2>&1 || true
state=$("$BUILD/ptctl/ptctl" -o json get "$JOB" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["state"])')
if [[ $state != JOB_STATE_SUCCEEDED ]]; then
  echo "under_ptcoord: the job under ptcoord ended $state" >&2
  "$BUILD/ptctl/ptctl" get "$JOB" >&2
  exit 1
fi
under=$(median_ms "$TMP/state/jobs/$JOB/attempt-1/run.jsonl")
placement=$("$BUILD/ptctl/ptctl" get "$JOB" | sed -n 's/^nodes: *//p')

printf '%-28s %10s\n' run "median ms"
printf '%-28s %10s\n' "ptworker by hand" "$by_hand"
printf '%-28s %10s   %s\n' "under ptcoord ($SLOTS slot(s))" "$under" "${placement:-unbound}"
python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'ratio (under / by hand): {b / a:.3f}')" \
  "$by_hand" "$under"
