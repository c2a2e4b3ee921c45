#!/usr/bin/env bash
# The control plane in one command: builds when needed, starts ptcoord on a
# temporary state folder, submits examples/shakespeare-char.yaml (dp=2,
# ZeRO-1, $PTRAIN_DEMO_STEPS steps, default 300) and watches it live (a
# progress bar on a terminal, a line per tenth of the run otherwise) with the
# web UI on (its address and token printed: open it while the job runs),
# prints the sample, keeps the web UI up until Enter (on a terminal), stops
# ptcoord and removes its temporary folder (kept when the job failed).
# Ctrl-C cancels the job, then stops ptcoord: ptcoord runs in a session of
# its own, so the terminal's Ctrl-C reaches only this script and ptctl.
# Exits with the job's outcome (0: SUCCEEDED).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${PT_BUILD_DIR:-build}
STEPS=${PTRAIN_DEMO_STEPS:-300}

if [[ ! -x $BUILD/coordinator/ptcoord || ! -x $BUILD/ptctl/ptctl || ! -x $BUILD/worker/ptworker ]]; then
  scripts/setup.sh
fi

TMP=$(mktemp -d /tmp/ptrain-demo.XXXXXX)
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$TMP/tokens"
mkdir -p "$TMP/checkpoints"
setsid "$BUILD/coordinator/ptcoord" --listen 127.0.0.1:0 --state-dir "$TMP/state" --local-slots 2 \
  --token-file "$TMP/tokens" --data-root data --data-root "$TMP/checkpoints" \
  --ui-listen 127.0.0.1:0 \
  --log-level warn > "$TMP/ptcoord.log" 2>&1 &
COORD=$!
JOB=""
WATCHED=0
KEEP=1
# Interrupted (Ctrl-C): cancel the job before stopping ptcoord, which would
# otherwise leave its ranks running for a later ptcoord to re-adopt.
cleanup() {
  if [[ -n $JOB && $WATCHED == 0 ]]; then
    echo "demo: cancelling $JOB"
    "$BUILD/ptctl/ptctl" cancel "$JOB" >/dev/null 2>&1 &&
      "$BUILD/ptctl/ptctl" watch "$JOB" >/dev/null 2>&1 || true
  fi
  kill "$COORD" 2>/dev/null
  wait "$COORD" 2>/dev/null || true
  if ((KEEP)); then
    echo "demo: ptcoord's state, logs and checkpoints stay in $TMP"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for _ in $(seq 100); do
  [[ -s $TMP/state/address ]] && break
  kill -0 "$COORD" 2>/dev/null || { cat "$TMP/ptcoord.log"; exit 1; }
  sleep 0.1
done
export PTCTL_SERVER PTCTL_TOKEN
PTCTL_SERVER=$(cat "$TMP/state/address")
PTCTL_TOKEN=$(cat "$TMP/tokens")
echo "demo: ptcoord at $PTCTL_SERVER, state in $TMP"
for _ in $(seq 50); do [[ -s $TMP/state/ui_address ]] && break; sleep 0.1; done
echo "demo: web UI at $(cat "$TMP/state/ui_address" 2>/dev/null) (token: $PTCTL_TOKEN)"

JOB=$("$BUILD/ptctl/ptctl" submit examples/shakespeare-char.yaml \
  --set parallel.dp=2 --set parallel.zero=1 --set train.steps="$STEPS" \
  --set train.eval_every=100 --set checkpoint.every=100 \
  --set checkpoint.dir="$TMP/checkpoints")
echo "demo: submitted $JOB ($STEPS steps); watching it"
rc=0
"$BUILD/ptctl/ptctl" watch "$JOB" || rc=$?
# Ctrl-C while watching: ptctl says so and exits 130 (bash goes on, since
# ptctl handled the signal); the job still runs, and cleanup cancels it.
if ((rc == 130)); then KEEP=0; exit 130; fi
WATCHED=1

# The sample is the last "sample" record of the final attempt's run log.
LOG=$(ls -d "$TMP"/state/jobs/"$JOB"/attempt-* 2>/dev/null | sort -V | tail -n 1)/run.jsonl
if [[ -f $LOG ]]; then
  python3 - "$LOG" <<'PY'
import json, sys
sample = None
for line in open(sys.argv[1]):
    record = json.loads(line)
    if record.get("type") == "sample":
        sample = record
if sample:
    print(f"--- sample after step {sample.get('step')} ---")
    print(sample["text"])
PY
fi
"$BUILD/ptctl/ptctl" checkpoints "$JOB" || true
if [[ -t 0 && -t 1 ]]; then
  echo "demo: the web UI stays at $(cat "$TMP/state/ui_address" 2>/dev/null) until you press Enter"
  read -r _ || true
else
  echo "demo: the job has ended; ptcoord and its web UI stop now"
fi
((rc != 0)) || KEEP=0
exit "$rc"
