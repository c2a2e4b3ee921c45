#!/bin/bash
# Multi-node tests of the control plane: pretend nodes made of network and
# PID namespaces (cluster.sh), one ptworkerd per node, ptcoord in the root
# namespace on the nodes' bridge, jobs launched by mpirun through ptrsh.
#
#   multinode_test.sh SCENARIO BUILD_DIR SOURCE_DIR
#
# Scenarios: two_nodes, node_death_shrink, node_returns_grow,
# node_death_spare, link_cut, node_frozen, daemon_killed, refusals,
# coordinator_restart, coordinator_lost, rank_stopped, preemption,
# auto_layout. Needs root
# and iproute2;
# exits 77 (skipped) with a message when namespaces cannot be made here.
# Everything (namespaces, processes, files) is removed on exit, failed or
# not. Figures are printed as "FIGURE name value".
set -euo pipefail

SCENARIO=${1:?scenario}
BUILD=$(cd "${2:?build dir}" && pwd)
SRC=$(cd "${3:?source dir}" && pwd)
# Each scenario its own names and subnet, so that a leftover of one never
# meets another.
case $SCENARIO in
  two_nodes) N=11 ;; node_death_shrink) N=12 ;; node_death_spare) N=13 ;;
  link_cut) N=14 ;; daemon_killed) N=15 ;; refusals) N=16 ;;
  coordinator_restart) N=17 ;; node_frozen) N=18 ;; node_returns_grow) N=19 ;;
  coordinator_lost) N=20 ;; rank_stopped) N=21 ;; preemption) N=22 ;;
  auto_layout) N=23 ;;
  *) echo "unknown scenario $SCENARIO" >&2; exit 2 ;;
esac
export MN_PREFIX="pm$N" MN_SUBNET3="10.78.$N"
# shellcheck source=cluster.sh
source "$SRC/tests/multinode/cluster.sh"

PTCOORD=$BUILD/coordinator/ptcoord
PTCTL=$BUILD/ptctl/ptctl
PTWORKERD=$BUILD/worker/ptworkerd
PTRSH=$BUILD/worker/ptrsh
PTWORKER=$BUILD/worker/ptworker

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: multinode tests need root (network namespaces)"; exit 77
fi
if ! command -v ip >/dev/null || ! unshare --net --pid --fork true 2>/dev/null; then
  echo "SKIP: cannot create network and PID namespaces here (unshare --net --pid failed)"
  exit 77
fi

T=$(mktemp -d /tmp/ptrain-multinode.XXXXXX)
chmod 700 "$T"
CKPT="$SRC/checkpoints/multinode-$SCENARIO-$$"
mkdir -p "$SRC/checkpoints"  # a data root of ptcoord: it must exist
COORD_PID=""
cleanup() {
  local rc=$?
  if [[ -n $COORD_PID ]]; then kill -9 "$COORD_PID" 2>/dev/null; wait "$COORD_PID" 2>/dev/null; fi || true
  pkill -9 -f "ptrain-multinode-mpirun-$$" 2>/dev/null || true
  mn_down >/dev/null 2>&1 || true
  if [[ $rc != 0 && $rc != 77 ]]; then
    echo "---- FAILED ($rc); logs:"
    for f in "$T"/*.log "$T"/state/jobs/*/attempt-*/stderr.log; do
      [[ -f $f ]] || continue
      echo "== $f"; tail -n 25 "$f"
    done
  fi
  # A rank killed above can still be finishing a write (a checkpoint):
  # try again rather than fail a test that passed.
  local i
  for i in 1 2 3 4 5; do
    rm -rf "$T" "$CKPT" 2>/dev/null && break
    sleep 1
  done
  exit "$rc"
}
trap cleanup EXIT
mn_down >/dev/null 2>&1 || true

fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
# JSON field of `ptctl -o json get JOB` by a Python expression over j.
jget() {
  "$PTCTL" -o json get "$1" 2>/dev/null |
    python3 -c "import json,sys; j=json.load(sys.stdin)['job']; print($2)" 2>/dev/null || true
}
events() { sqlite3 "$T/state/ptcoord.db" "SELECT message FROM events WHERE job_id='$1' ORDER BY id"; }

echo "tok-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')" > "$T/join"
chmod 600 "$T/join"

# ptcoord on the bridge; PORT fixed after the first start so a restarted
# one is found at the same address.
PORT=0
COORD_EXTRA=()
start_coordinator() {
  "$PTCOORD" --listen "$(mn_host_addr):$PORT" --state-dir "$T/state" \
    --join-token-file "$T/join" --node-timeout-s 6 \
    --cluster-network "$MN_SUBNET3.0/24" --cancel-grace-s 3 \
    --work-root "$SRC" --metrics-listen "$(mn_host_addr):0" \
    "${COORD_EXTRA[@]}" >> "$T/ptcoord.log" 2>&1 &
  COORD_PID=$!
  rm -f "$T/state/address.seen"
  mn_wait_for 20 test -s "$T/state/address" || fail "ptcoord did not start"
  ADDR=$(cat "$T/state/address")
  PORT=${ADDR##*:}
  export PTCTL_SERVER=$ADDR PTCTL_TOKEN
  PTCTL_TOKEN=$(cat "$T/state/user-token")
}

# start_node K [SLOTS] [wrapped]: ptworkerd as node K. "wrapped": under a
# shell that stays the node's init, so the daemon can die alone.
start_node() {
  local k=$1 slots=${2:-2} mode=${3:-}
  local -a cmd=("$PTWORKERD" --coordinator "$ADDR" --name "$(mn_ns "$k")"
    --slots "$slots" --listen 0.0.0.0:7071 --advertise "$(mn_addr "$k"):7071"
    --join-token-file "$T/join" --orphan-timeout-s "${ORPHAN_S:-20}"
    --state-dir "$T/node$k-state")
  if [[ $mode == wrapped ]]; then
    mn_node_run "$k" "$T/node$k.log" sh -c '"$@" & wait; exec sleep 100000' sh "${cmd[@]}"
  else
    mn_node_run "$k" "$T/node$k.log" "${cmd[@]}"
  fi
}
node_state() {
  "$PTCTL" -o json nodes | python3 -c "
import json,sys
for n in json.load(sys.stdin).get('nodes', []):
    if n['spec']['name'] == sys.argv[1]:
        print(n.get('state', '') + (',DRAINING' if n.get('draining') else ''))" "$1"
}
wait_nodes_up() {
  local k
  for k in "$@"; do
    mn_wait_for 20 bash -c "[[ \$(\"$PTCTL\" -o json nodes | grep -c NODE_STATE_UP) -ge $# ]]" ||
      fail "nodes $* did not come up"
  done
}

# A small job: 2-layer GPT, dp=2 x tp=2 (4 ranks) unless overridden.
JOB_SETS=(--set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
  --set parallel.dp=2 --set parallel.tp=2 --set train.sample_every=0
  --set train.sample_tokens=0 --set train.log_every=10
  --set "checkpoint.dir=$CKPT")
submit() {
  "$PTCTL" submit "$SRC/examples/shakespeare-char.yaml" "${JOB_SETS[@]}" "$@" | head -n1
}
wait_state() {  # JOB STATE TIMEOUT
  mn_wait_for "$3" bash -c "[[ \$(\"$PTCTL\" -o json get $1 | grep -o '\"state\": *\"[A-Z_]*\"' | head -1) == *$2* ]]"
}
wait_step() {  # JOB STEP TIMEOUT: reported progress reaches STEP
  mn_wait_for "$3" bash -c "s=\$(\"$PTCTL\" -o json get $1 | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))'); [[ \$s -ge $2 ]]"
}
# Live (not zombie) processes named NAME in node K.
live_in_node() {
  local k=$1 name=$2 p n=0
  for p in $(mn_node_pids "$k"); do
    [[ -r /proc/$p/stat ]] || continue
    [[ $(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) == Z ]] && continue
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == "$name" ]] && n=$((n + 1))
  done
  echo $n
}
# shellcheck source=../testing/run_log.sh
source "$SRC/tests/testing/run_log.sh"  # final_loss

mn_up 3 >/dev/null
if [[ $SCENARIO == auto_layout ]]; then
  # ptcoord plans parallel: auto jobs with a profile of this host
  # (measured under mpirun, quick); the pretend nodes' link is this host's
  # too, so the measured one stands for it.
  (cd "$SRC" && OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe \
      -n 2 "$PTWORKER" profile --quick --out "$T/profile.json" > "$T/profile.log" 2>&1) ||
    fail "ptworker profile failed: $(tail -n 20 "$T/profile.log")"
  python3 - "$T/profile.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["links"]["inter_node"] = p["links"]["intra_node"]
json.dump(p, open(sys.argv[1], "w"))
PY
  COORD_EXTRA=(--planner-profile "$T/profile.json")
fi
start_coordinator

case $SCENARIO in
auto_layout)
  # parallel: auto on two nodes of 2 slots: ptcoord plans on 2 nodes × 2
  # ranks as `ptctl plan` does, and the job runs that layout over both
  # nodes to the end.
  start_node 1; start_node 2; wait_nodes_up 1 2
  AUTO_SETS=(--set parallel=auto --set model.vocab_size=65 --set model.n_layer=2
    --set model.n_embd=32 --set model.n_head=2 --set train.steps=20
    --set train.sample_every=0 --set "checkpoint.dir=$CKPT")
  want=$("$PTCTL" -o json plan "$SRC/examples/shakespeare-char.yaml" "${AUTO_SETS[@]}" \
      --nodes 2 --gpus-per-node 2 --profile "$T/profile.json" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["best"][0]["layout"])') ||
    fail "ptctl plan failed"
  id=$("$PTCTL" submit "$SRC/examples/shakespeare-char.yaml" "${AUTO_SETS[@]}" | head -n1)
  wait_state "$id" SUCCEEDED 120 || fail "$id did not succeed: $(events "$id")"
  [[ $(jget "$id" "j['plan']['layout']") == "$want" ]] ||
    fail "planned $(jget "$id" "j['plan']"), ptctl plan proposes $want"
  [[ $(jget "$id" "(j['plan']['nodes'], j['plan']['ranks_per_node'], j['world_size'])") == "(2, 2, 4)" ]] ||
    fail "plan: $(jget "$id" "j['plan']"), world $(jget "$id" "j['world_size']")"
  [[ $(jget "$id" "j['placement']") == *"${MN_PREFIX}node1"*"'ranks': 2"*"${MN_PREFIX}node2"*"'ranks': 2"* ]] ||
    fail "placement: $(jget "$id" "j['placement']")"
  events "$id" | grep -q "layout chosen by the planner: $want (profile" ||
    fail "no event of the choice: $(events "$id")"
  "$PTCTL" get "$id" | grep -q '^measured: ' || fail "ptctl get: $("$PTCTL" get "$id")"
  echo "FIGURE auto_layout_chosen $want"
  ;;

preemption)
  # A job of low priority holds both nodes; one of high priority preempts
  # it: its ranks save the step they are in and stop, the high job runs,
  # and the low one resumes from that step on the nodes and ends with the
  # final loss of an uninterrupted run, bit for bit.
  start_node 1; start_node 2; wait_nodes_up 1 2
  low=$(submit --set train.steps=200 --set checkpoint.every=50 --set priority=low)
  wait_step "$low" 20 90 || fail "no progress"
  high=$(submit --set train.steps=20 --set priority=high)
  for _ in $(seq 240); do
    events "$low" | grep -q "queued again after its preemption" && break
    sleep 0.5
  done
  events "$low" | grep -q "preempted for $high" || fail "$low was not preempted: $(events "$low")"
  wait_state "$high" SUCCEEDED 180 || fail "$high did not succeed: $(events "$high")"
  wait_state "$low" SUCCEEDED 240 || fail "$low did not succeed: $(events "$low")"
  [[ $(jget "$low" "j['requeues'].get('preempted', 0)") == 1 ]] ||
    fail "requeues: $(jget "$low" "j['requeues']")"
  resumed=$(events "$low" | sed -n 's/^attempt 2 resumed from the checkpoint at step \([0-9]*\).*/\1/p')
  [[ -n $resumed && $resumed -ge 20 && $resumed -lt 200 ]] ||
    fail "attempt 2 did not resume from the preempted step: $(events "$low")"
  echo "FIGURE preempted_at_step $resumed"
  nodes_loss=$(final_loss "$T/state/jobs/$low/attempt-2/run.jsonl")
  (cd "$SRC" && OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe \
      -n 4 "$PTWORKER" --config "$T/state/jobs/$low/spec.yaml" --log-json "$T/local.jsonl" \
      --set "checkpoint.dir=$T/local-ckpt" --set checkpoint.every=0 > "$T/local.log" 2>&1) || fail "local mpirun failed"
  local_loss=$(final_loss "$T/local.jsonl")
  echo "final loss: preempted on nodes $nodes_loss, uninterrupted $local_loss"
  [[ $nodes_loss == "$local_loss" ]] || fail "final loss differs: $nodes_loss vs $local_loss"
  ;;

two_nodes)
  # dp=2 x tp=2 over two nodes of 2 slots: each tp pair inside one node;
  # the final loss equals plain mpirun on one host, bit for bit.
  start_node 1; start_node 2; wait_nodes_up 1 2
  t0=$(now)
  id=$(submit --set train.steps=30 --set checkpoint.every=10)
  wait_step "$id" 1 60 || fail "no first step"
  echo "FIGURE launch_submit_to_first_step_s $(since "$t0")"
  # Each node's two ranks are bound to CPUs of their own, which the
  # placement names: every CPU of the node (2 slots cut its CPUs in two).
  for k in 1 2; do
    want=$(jget "$id" "sorted([c for p in j['placement'] if p['node'] == '${MN_PREFIX}node$k' for c in p.get('cpus', [])])")
    got=()
    for p in $(mn_node_pids "$k"); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == ptworker ]] || continue
      got+=("$(awk '/^Cpus_allowed_list:/ {print $2}' "/proc/$p/status")")
    done
    python3 - "$want" "$(nproc)" "${got[@]}" <<'PY' || fail "node $k: ranks' CPUs ${got[*]}, placement $want"
import sys
want, ncpu, got = eval(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
def cpus(text):
    out = set()
    for r in text.split(","):
        lo, _, hi = r.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out
ranks = [cpus(g) for g in got]
assert len(ranks) == 2, ranks
assert not ranks[0] & ranks[1], ranks
assert sorted(ranks[0] | ranks[1]) == want, (ranks, want)
assert all(len(r) == ncpu // 2 for r in ranks), (ranks, ncpu)
PY
  done
  wait_state "$id" SUCCEEDED 120 || fail "$id did not succeed: $(jget "$id" "j['state']")"
  echo "FIGURE cluster_job_submit_to_succeeded_s $(since "$t0")"
  [[ $(jget "$id" "j['placement']") == *"${MN_PREFIX}node1"*"'ranks': 2"*"${MN_PREFIX}node2"*"'ranks': 2"* ]] ||
    fail "placement: $(jget "$id" "j['placement']")"
  cluster_loss=$(final_loss "$T/state/jobs/$id/attempt-1/run.jsonl")
  # The same spec, one host, plain mpirun.
  t0=$(now)
  (cd "$SRC" && OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe \
      -n 4 "$PTWORKER" --config "$T/state/jobs/$id/spec.yaml" --log-json "$T/local.jsonl" \
      --set "checkpoint.dir=$T/local-ckpt" > "$T/local.log" 2>&1) || fail "local mpirun failed"
  echo "FIGURE local_mpirun_whole_run_s $(since "$t0")"
  local_loss=$(final_loss "$T/local.jsonl")
  echo "final loss: nodes $cluster_loss, local $local_loss"
  [[ $cluster_loss == "$local_loss" ]] || fail "final loss differs: $cluster_loss vs $local_loss"
  # Rank lines come back through mpirun, tagged with the rank, and
  # ptctl logs shows them.
  "$PTCTL" logs "$id" > "$T/logs.out" 2>&1 || fail "ptctl logs failed"
  grep -q '^\[1,0\]<stderr>:.*step *30/30' "$T/logs.out" ||
    fail "rank 0's tagged lines are not in ptctl logs"
  # Rank 3 ran on node 2; its lines are here, and only its with --rank 3.
  "$PTCTL" logs "$id" --rank 3 > "$T/logs3.out" 2>&1 || fail "ptctl logs --rank failed"
  grep -q '^\[1,3\]<stderr>:.*rank 3 serves metrics' "$T/logs3.out" ||
    fail "rank 3's lines (node 2) are not in ptctl logs --rank 3: $(head -3 "$T/logs3.out")"
  ! grep -qv '^\[1,3\]<' "$T/logs3.out" || fail "ptctl logs --rank 3 shows other lines"
  "$PTCTL" logs "$id" --rank 0 | grep -q 'step *30/30' || fail "ptctl logs --rank 0 misses rank 0"
  ;;

node_death_shrink)
  # Node 2 dies: the job comes back on node 1 alone, shrunk to dp=1, from
  # its last checkpoint, and succeeds.
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=600 --set checkpoint.every=20 --set restart.allow_shrink=true)
  wait_step "$id" 60 60 || fail "no progress"
  t0=$(now)
  mn_node_kill 2
  mn_wait_for 30 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -c '\"attempts\": 2') == 1 ]]" ||
    fail "no second attempt"
  echo "FIGURE node_death_to_running_s $(since "$t0")"
  wait_state "$id" SUCCEEDED 180 || fail "$id did not succeed"
  [[ $(jget "$id" "j['dp']") == 1 ]] || fail "not shrunk: dp=$(jget "$id" "j['dp']")"
  events "$id" | grep -q "lost node ${MN_PREFIX}node2.*not counted as a restart" ||
    fail "no lost-node event: $(events "$id" | grep -v checkpoint)"
  events "$id" | grep -q "shrunk to dp=1" || fail "no shrink event"
  "$PTCTL" get "$id" | grep -q "shrunk to dp=1 (spec dp=2)" || fail "ptctl get does not say it shrank"
  # Resumed from the newest checkpoint before the death: steps lost <= every.
  python3 "$SRC/tests/testing/resume_point.py" "$T/state/jobs/$id" 1 2 21 steps_lost ||
    fail "resume point"
  events "$id" | grep -q "attempt 2 resumed from the checkpoint at step" ||
    fail "no resume event: $(events "$id" | grep -v checkpoint)"
  ;;

node_returns_grow)
  # Node 2 dies, the job shrinks to dp=1; node 2 comes back: SIGUSR1 has
  # the ranks save the step they are in and stop, and the job resumes at
  # dp=2 on both nodes from that step and succeeds.
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=1500 --set checkpoint.every=50 \
    --set restart.allow_shrink=true --set restart.allow_grow=true)
  wait_step "$id" 60 60 || fail "no progress"
  mn_node_kill 2
  mn_wait_for 30 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -c '\"dp\": 1') == 1 ]]" ||
    fail "did not shrink"
  start_node 2
  mn_wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -c '\"attempts\": 3') == 1 ]]" ||
    fail "did not grow back: $(events "$id" | grep -v checkpoint)"
  wait_state "$id" SUCCEEDED 180 || fail "$id did not succeed"
  [[ $(jget "$id" "j['dp']") == 2 ]] || fail "not at dp=2 at the end"
  events "$id" | grep -q "to grow back to dp=2.*not counted as a restart" ||
    fail "no grow event: $(events "$id" | grep -v checkpoint)"
  # Stopped at a checkpoint of its last step: attempt 3 starts right after
  # attempt 2's last step, no step lost.
  python3 "$SRC/tests/testing/resume_point.py" "$T/state/jobs/$id" 2 3 0 grow_steps_lost ||
    fail "grow resume point"
  ;;

node_death_spare)
  # Three nodes, node 3 drained: the job runs on 1 and 2. Node 3 is
  # uncordoned, node 2 dies: the job restarts on 1 and 3 at full size.
  start_node 1; start_node 2; start_node 3; wait_nodes_up 1 2 3
  "$PTCTL" drain "${MN_PREFIX}node3" >/dev/null
  [[ $(node_state "${MN_PREFIX}node3") == NODE_STATE_UP,DRAINING ]] || fail "drain: $(node_state "${MN_PREFIX}node3")"
  id=$(submit --set train.steps=500 --set checkpoint.every=20 --set restart.allow_shrink=true)
  wait_step "$id" 40 60 || fail "no progress"
  [[ $(jget "$id" "j['placement']") != *node3* ]] || fail "placed on a drained node"
  "$PTCTL" uncordon "${MN_PREFIX}node3" >/dev/null
  mn_node_kill 2
  wait_state "$id" SUCCEEDED 180 || fail "$id did not succeed"
  [[ $(jget "$id" "j['attempts']") == 2 ]] || fail "attempts $(jget "$id" "j['attempts']")"
  [[ $(jget "$id" "j['dp']") == 2 ]] || fail "not at full size: dp=$(jget "$id" "j['dp']")"
  [[ $(jget "$id" "j['placement']") == *node1*node3* ]] || fail "placement $(jget "$id" "j['placement']")"
  ;;

link_cut)
  # Node 2's link goes down: noticed (node down, attempt ended) within 15 s.
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=100000 --set checkpoint.every=50)
  wait_step "$id" 20 60 || fail "no progress"
  # Prometheus discovery: every rank, at its node's address, labelled with
  # its node; the address answers from the coordinator's namespace.
  python3 - "$(cat "$T/state/metrics_address")" "$MN_PREFIX" "$MN_SUBNET3" <<'EOF' || fail "/sd"
import json, sys, time, urllib.request
at, prefix, net = sys.argv[1:]
for _ in range(50):
    sd = json.loads(urllib.request.urlopen(f"http://{at}/sd", timeout=5).read())
    if len(sd) == 4: break
    time.sleep(0.2)
by_rank = {int(t["labels"]["ptrain_rank"]): t for t in sd}
assert sorted(by_rank) == [0, 1, 2, 3], sd
for r, t in by_rank.items():
    k = 1 if r < 2 else 2
    assert t["labels"]["ptrain_node"] == f"{prefix}node{k}", t
    assert t["targets"][0].startswith(f"{net}.{10 + k}:"), t
    page = urllib.request.urlopen(f"http://{t['targets'][0]}/metrics", timeout=5).read().decode()
    assert f'rank="{r}"' in page, r
print("sd: 4 ranks, each at its node's address with its node label")
EOF
  t0=$(now)
  mn_link_down 2
  mn_wait_for 15 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o '\"state\": *\"[A-Z_]*\"' | head -1) != *RUNNING* ]]" ||
    fail "still running 15 s after the link went down"
  echo "FIGURE link_down_noticed_s $(since "$t0")"
  [[ $(node_state "${MN_PREFIX}node2") == NODE_STATE_DOWN ]] || fail "node 2 not down"
  events "$id" | grep -q "lost node ${MN_PREFIX}node2" || fail "no lost-node event"
  # No restart.allow_shrink: it waits in the queue for its 4 slots.
  sleep 2
  [[ $(jget "$id" "j['state']") == JOB_STATE_RESTARTING && $(jget "$id" "j['attempts']") == 1 ]] ||
    fail "did not wait in the queue: $(jget "$id" "j['state']"), attempts $(jget "$id" "j['attempts']")"
  "$PTCTL" cancel "$id" >/dev/null
  ;;

node_frozen)
  # Every process of node 2 stopped (its kernel still answers): its
  # heartbeats stop, so the attempt ends without waiting for the hang
  # timeout (300 s here).
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=100000 --set checkpoint.every=50)
  wait_step "$id" 20 60 || fail "no progress"
  t0=$(now)
  mn_node_stop 2
  mn_wait_for 20 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o '\"state\": *\"[A-Z_]*\"' | head -1) != *RUNNING* ]]" ||
    fail "still running 20 s after node 2 froze"
  echo "FIGURE frozen_node_noticed_s $(since "$t0")"
  events "$id" | grep -q "lost node ${MN_PREFIX}node2" || fail "no lost-node event"
  "$PTCTL" cancel "$id" >/dev/null
  mn_node_cont 2
  ;;

rank_stopped)
  # One rank of node 2 stopped (SIGSTOP): its node and its daemon live on,
  # so only the hang timeout ends the attempt. Before it does, ptcoord asks
  # each node's ptworkerd (DumpAttempt) to have its ranks dump their flight
  # recorders into the shared attempt folder and to say how their
  # processes are: the stopped one cannot answer, and node 2's daemon sees
  # it in state T. The analysis names it, its node and the collective the
  # others wait in.
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=100000 --set restart.hang_timeout_s=12 \
    --set restart.max_restarts=0)
  wait_step "$id" 5 60 || fail "no progress"
  victim=""
  for p in $(mn_node_pids 2); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == ptworker ]] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null |
      grep -qx OMPI_COMM_WORLD_RANK=3 && victim=$p
  done
  [[ -n $victim ]] || fail "rank 3 is not on node 2"
  kill -STOP "$victim"
  wait_state "$id" FAILED 90 || fail "the hang did not end the attempt"
  error=$(jget "$id" "j.get('error', '')")
  [[ $error == *"rank 3 (node ${MN_PREFIX}node2"*"is stopped"* ]] ||
    fail "the job's error does not name rank 3 of node 2 as stopped: $error"
  events "$id" | grep -q "hang analysis of attempt 1: .*rank 3" ||
    fail "no hang analysis event"
  "$PTCTL" -o json diagnose "$id" | python3 -c "
import json, sys
d = json.load(sys.stdin)
r = {x['rank']: x for x in d['ranks']}
assert d['culprits'] == [3], d
assert r[3]['state'] == 'stopped' and r[3]['host'] == sys.argv[1], r[3]
assert 'state T' in r[3]['detail'], r[3]  # as node 2's daemon saw it
assert all(r[k]['state'] == 'waiting' for k in (0, 1, 2)), r
assert 3 in r[2]['waits_for'] and ' #' in r[2]['where'], r[2]
" "${MN_PREFIX}node2" || fail "ptctl diagnose: $("$PTCTL" diagnose "$id")"
  kill -CONT "$victim" 2>/dev/null || true
  ;;

daemon_killed)
  # Only ptworkerd dies on node 2: no rank or orted of the job stays alive
  # there, and the job is requeued.
  start_node 1; start_node 2 2 wrapped; wait_nodes_up 1 2
  id=$(submit --set train.steps=100000 --set checkpoint.every=50)
  wait_step "$id" 20 60 || fail "no progress"
  [[ $(live_in_node 2 ptworker) == 2 ]] || fail "expected 2 ranks on node 2"
  for p in $(mn_node_pids 2); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == ptworkerd ]] && kill -9 "$p"
  done
  mn_wait_for 15 bash -c "source '$SRC/tests/multinode/cluster.sh'; $(declare -f live_in_node); [[ \$(live_in_node 2 ptworker) == 0 && \$(live_in_node 2 orted) == 0 ]]" ||
    fail "ranks left running on node 2: $(live_in_node 2 ptworker) ptworker, $(live_in_node 2 orted) orted"
  mn_wait_for 20 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o '\"state\": *\"[A-Z_]*\"' | head -1) != *RUNNING* ]]" ||
    fail "the job did not notice"
  "$PTCTL" cancel "$id" >/dev/null
  ;;

refusals)
  # A wrong join token registers nothing; Exec refuses programs outside the
  # allow-list, and tokens that are not a running attempt's.
  start_node 1; wait_nodes_up 1
  echo "not-the-token" > "$T/bad"; chmod 600 "$T/bad"
  set +e
  mn_exec 2 "$PTWORKERD" --coordinator "$ADDR" --name "${MN_PREFIX}node2" \
    --listen 0.0.0.0:7071 --join-token-file "$T/bad" > "$T/bad.log" 2>&1
  rc=$?
  set -e
  [[ $rc == 2 ]] || fail "wrong join token: exit $rc"
  grep -q "join token refused" "$T/bad.log" || fail "no refusal message: $(cat "$T/bad.log")"
  [[ -z $(node_state "${MN_PREFIX}node2") ]] || fail "a node registered with a wrong token"
  echo "${MN_PREFIX}node1 $(mn_addr 1):7071" > "$T/nodes"
  run_rsh() { PTRAIN_NODES_FILE="$T/nodes" PTRAIN_JOB_TOKEN="$1" "$PTRSH" "${MN_PREFIX}node1" "${@:2}"; }
  # A token that is no running attempt's is refused before the command is
  # read: whatever it asks for, the answer is the same.
  for cmd in "/bin/sh -c id" "orted --version"; do
    set +e
    out=$(run_rsh some-token $cmd 2>&1); rc=$?
    set -e
    [[ $rc == 255 && $out != *uid=* && $out == *"not that of a running attempt"* ]] ||
      fail "a foreign token was not refused for '$cmd' ($rc): $out"
  done
  # A running attempt's token (a rank's environment holds it) runs only the
  # allow-list's programs, one command.
  JOB_SETS+=(--set parallel.dp=1)
  id=$(submit --set train.steps=100000)
  wait_step "$id" 1 90 || fail "no progress"
  token=""
  for p in $(mn_node_pids 1); do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == ptworker ]] || continue
    token=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^PTRAIN_JOB_TOKEN=//p')
    [[ -n $token ]] && break
  done
  [[ -n $token ]] || fail "no rank of the job on node 1"
  set +e
  out=$(run_rsh "$token" /bin/sh -c id 2>&1); rc=$?
  set -e
  [[ $rc == 255 && $out == *"not a program this node runs"* ]] || fail "sh was not refused ($rc): $out"
  set +e
  out=$(run_rsh "$token" "PATH=/tmp:\$PATH ; export PATH ; orted -mca ess env ; id" 2>&1); rc=$?
  set -e
  echo "second command: $out"
  [[ $rc == 255 && $out != *uid=* && $out == *refused* ]] || fail "a second command was not refused ($rc): $out"
  "$PTCTL" cancel "$id" >/dev/null
  ;;

coordinator_restart)
  # ptcoord dies mid-job and comes back on the same state and port: the
  # nodes register again and the job is re-adopted, then succeeds.
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=1500 --set checkpoint.every=100)
  wait_step "$id" 50 60 || fail "no progress"
  kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
  sleep 2
  rm -f "$T/state/address"
  start_coordinator
  mn_wait_for 20 bash -c "[[ \$(\"$PTCTL\" -o json nodes | grep -c NODE_STATE_UP) -ge 2 ]]" ||
    fail "nodes did not register again"
  wait_state "$id" SUCCEEDED 180 || fail "$id did not succeed after the restart"
  [[ $(jget "$id" "j['attempts']") == 1 ]] || fail "restarted instead of re-adopted"
  events "$id" | grep -q "re-adopted" || fail "no re-adopt event"
  ;;
coordinator_lost)
  # ptcoord dies for good: after --orphan-timeout-s (4 s here) every
  # daemon kills what it started; no rank or orted is left on any node.
  ORPHAN_S=4
  start_node 1; start_node 2; wait_nodes_up 1 2
  id=$(submit --set train.steps=100000 --set checkpoint.every=100)
  wait_step "$id" 20 60 || fail "no progress"
  [[ $(live_in_node 1 ptworker) == 2 && $(live_in_node 2 ptworker) == 2 ]] || fail "ranks not placed 2+2"
  kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null || true
  COORD_PID=""
  t0=$(now)
  # Not at the first failed heartbeat: a ptcoord restart must not kill jobs.
  sleep 1.5
  [[ $(live_in_node 1 ptworker) == 2 ]] || fail "ranks killed before the orphan timeout"
  mn_wait_for 20 bash -c "source '$SRC/tests/multinode/cluster.sh'; $(declare -f live_in_node); [[ \$(live_in_node 1 ptworker) == 0 && \$(live_in_node 2 ptworker) == 0 && \$(live_in_node 1 orted) == 0 && \$(live_in_node 2 orted) == 0 ]]" ||
    fail "processes left after the orphan timeout"
  echo "FIGURE orphans_killed_after_s $(since "$t0") (orphan timeout 4 s)"
  # The daemon whose timer fires first kills its part of the job; on the
  # other node the orted may then end by itself before that node's timer
  # fires. Either way nothing is left (above), and a daemon says why.
  grep -q "killing every attempt process" "$T/node1.log" "$T/node2.log" ||
    fail "no node says why"
  ;;
esac
echo "PASS: $SCENARIO"
