#!/bin/bash
# ptcoord --launcher slurm against a real Slurm on this machine: munged (if
# none runs), slurmctld and one slurmd (NodeName=localhost) of our own, on
# private ports and folders, started without systemd and stopped at the end.
#
#   slurm_test.sh SCENARIO BUILD_DIR SOURCE_DIR
#
# Scenarios: succeeds, cancel, rank_killed, rank_stopped, preemption (one
# node, localhost), and
# node_death (two pretend nodes of tests/multinode/cluster.sh, one slurmd
# each). Root only; exits 77 (skipped) with a message when Slurm's daemons
# are not installed. Figures are printed as "FIGURE name value".
set -euo pipefail

SCENARIO=${1:?scenario}
BUILD=$(cd "${2:?build dir}" && pwd)
SRC=$(cd "${3:?source dir}" && pwd)
PTCOORD=$BUILD/coordinator/ptcoord
PTCTL=$BUILD/ptctl/ptctl
# shellcheck source=../testing/run_log.sh
source "$SRC/tests/testing/run_log.sh"  # final_loss

if [[ $(id -u) != 0 ]]; then echo "SKIP: the Slurm tests need root"; exit 77; fi
for tool in slurmctld slurmd sbatch scontrol squeue scancel munged; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    { echo "SKIP: $tool is not installed (scripts/setup.sh --tests installs it)"; exit 77; }
done

MODE=single
if [[ $SCENARIO == node_death ]]; then
  MODE=netns
  export MN_PREFIX=ps21 MN_SUBNET3=10.78.21
  # shellcheck source=../multinode/cluster.sh
  source "$SRC/tests/multinode/cluster.sh"
  unshare --net --pid --fork true 2>/dev/null ||
    { echo "SKIP: cannot create network and PID namespaces here"; exit 77; }
fi
T=$(mktemp -d /tmp/ptrain-slurm.XXXXXX)
chmod 700 "$T"
S=$T/slurm
mkdir -p "$S/state" "$S/spool-localhost" "$S/tmp-localhost"
CKPT="$SRC/checkpoints/slurm-$SCENARIO-$$"
mkdir -p "$SRC/checkpoints"  # a data root of ptcoord: it must exist
PIDS=()
MUNGED=""
cleanup() {
  local rc=$?
  local p
  # Our Slurm's jobs first, then its daemons and ptcoord, then any rank
  # left (its environment names our coordinator).
  [[ -n ${SLURM_CONF:-} ]] && scancel --full --signal=KILL --user=root 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [[ -n ${PTCTL_SERVER:-} ]]; then
    for p in /proc/[0-9]*; do
      grep -qz "^PTRAIN_COORDINATOR=$PTCTL_SERVER\$" "$p/environ" 2>/dev/null &&
        kill -9 "${p#/proc/}" 2>/dev/null || true
    done
  fi
  [[ -n $MUNGED ]] && kill "$MUNGED" 2>/dev/null || true
  [[ $MODE == netns ]] && { mn_down >/dev/null 2>&1 || true; }
  if [[ $rc != 0 && $rc != 77 ]]; then
    echo "---- FAILED ($rc); logs:"
    for f in "$T"/*.log "$S"/*.log "$T"/state/jobs/*/attempt-*/stderr.log; do
      [[ -f $f ]] || continue
      echo "== $f"; tail -n 20 "$f"
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

fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(now)"; }
wait_for() {  # TIMEOUT CMD...
  local end=$((SECONDS + $1)); shift
  until "$@"; do ((SECONDS < end)) || return 1; sleep 0.2; done
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Live ranks of this test's jobs: their environment names our coordinator
# (other ptworkers on the machine are not ours to count or kill).
our_ranks() {
  local p
  for p in $(pgrep -x ptworker); do
    grep -qz "^PTRAIN_COORDINATOR=$PTCTL_SERVER\$" "/proc/$p/environ" 2>/dev/null && echo "$p"
  done
  return 0
}
events() { sqlite3 "$T/state/ptcoord.db" "SELECT message FROM events WHERE job_id='$1' ORDER BY id"; }
state_of() {
  "$PTCTL" -o json get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["state"])'
}
attempts_of() {
  "$PTCTL" -o json get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job"].get("attempts", 0))'
}
step_of() {
  "$PTCTL" -o json get "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job"]["progress"].get("step", 0))'
}

# --- Slurm: one node (localhost) or two pretend nodes, its own ports.
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
LISTEN=127.0.0.1
NODE_CPUS=$(nproc)
# Two CPUs, which one job of two ranks fills, whatever the machine has.
[[ $SCENARIO == preemption ]] && NODE_CPUS=2
NODES="NodeName=localhost CPUs=$NODE_CPUS State=UNKNOWN"
CTLD_HOST=localhost
if [[ $MODE == netns ]]; then
  mn_down >/dev/null 2>&1 || true
  mn_up 2 >/dev/null
  LISTEN=$(mn_host_addr)
  CTLD_HOST="localhost($LISTEN)"
  NODES="NodeName=${MN_PREFIX}node1 NodeAddr=$(mn_addr 1) CPUs=2 State=UNKNOWN
NodeName=${MN_PREFIX}node2 NodeAddr=$(mn_addr 2) CPUs=2 State=UNKNOWN"
  mkdir -p "$S/spool-${MN_PREFIX}node1" "$S/spool-${MN_PREFIX}node2" \
    "$S/tmp-${MN_PREFIX}node1" "$S/tmp-${MN_PREFIX}node2"
fi
cat > "$S/slurm.conf" <<EOF
ClusterName=ptraintest
SlurmctldHost=$CTLD_HOST
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool-%n
TmpFS=$S/tmp-%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
KillWait=3
JobCompType=jobcomp/none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
$NODES
PartitionName=ptrain Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$S/slurm.conf
# munge authenticates Slurm's daemons to each other; Debian's package made
# the key, systemd would make the socket folder.
if [[ ! -S /run/munge/munge.socket.2 ]] || ! munge -n </dev/null >/dev/null 2>&1; then
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged -F > "$S/munged.log" 2>&1 &
  MUNGED=$!
  wait_for 10 test -S /run/munge/munge.socket.2 || fail "munged did not start"
fi
slurmctld -D -f "$SLURM_CONF" > "$S/slurmctld.out" 2>&1 &
PIDS+=($!)
if [[ $MODE == netns ]]; then
  for k in 1 2; do
    mn_node_run "$k" "$S/slurmd-$k.out" slurmd -D -f "$SLURM_CONF" -N "${MN_PREFIX}node$k"
  done
  wait_for 30 bash -c '[[ $(sinfo -h -N -o %t 2>/dev/null | grep -c idle) == 2 ]]' ||
    fail "Slurm did not come up: $(sinfo -N 2>&1)"
else
  slurmd -D -f "$SLURM_CONF" -N localhost > "$S/slurmd.out" 2>&1 &
  PIDS+=($!)
  wait_for 30 bash -c '[[ $(sinfo -h -N -o %t 2>/dev/null) == idle ]]' || fail "Slurm did not come up: $(sinfo -N 2>&1)"
fi

# --- ptcoord with the Slurm launcher.
"$PTCOORD" --listen "$LISTEN:0" --state-dir "$T/state" --launcher slurm \
  --slurm-partition ptrain --cancel-grace-s 5 --slurm-node-grace-s 15 \
  --work-root "$SRC" \
  > "$T/ptcoord.log" 2>&1 &
PIDS+=($!)
wait_for 20 test -s "$T/state/address" || fail "ptcoord did not start"
export PTCTL_SERVER PTCTL_TOKEN
PTCTL_SERVER=$(cat "$T/state/address")
PTCTL_TOKEN=$(cat "$T/state/user-token")

SETS=(--set model.n_layer=2 --set model.n_embd=32 --set model.n_head=2
  --set parallel.dp=2 --set train.sample_every=0 --set train.log_every=10
  --set "checkpoint.dir=$CKPT" --set "name=ptrain-slurm-test-$$")
submit() { "$PTCTL" submit "$SRC/examples/shakespeare-char.yaml" "${SETS[@]}" "$@" | head -n1; }

case $SCENARIO in
preemption)
  # A job of low priority holds the node's two CPUs; one of high priority
  # waits in Slurm's queue, and ptcoord preempts the low one (scancel
  # --signal=USR1 to its ranks: they save the step they are in and exit
  # 3). The high job runs; the low one, queued again, resumes from that
  # step and ends with the final loss of an uninterrupted run, bit for bit.
  low=$(submit --set train.steps=200 --set checkpoint.every=50 --set priority=low)
  wait_for 90 bash -c "[[ \$(\"$PTCTL\" -o json get $low | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 20 ]]" ||
    fail "no progress"
  high=$(submit --set train.steps=20 --set priority=high)
  for _ in $(seq 360); do
    events "$low" | grep -q "queued again after its preemption" && break
    sleep 0.5
  done
  events "$low" | grep -q "preempted for $high" || fail "$low was not preempted: $(events "$low")"
  wait_for 180 bash -c "[[ \$(\"$PTCTL\" -o json get $high | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_SUCCEEDED ]]" ||
    fail "$high did not succeed: $(events "$high")"
  wait_for 240 bash -c "[[ \$(\"$PTCTL\" -o json get $low | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_SUCCEEDED ]]" ||
    fail "$low did not succeed: $(events "$low")"
  resumed=$(events "$low" | sed -n 's/^attempt 2 resumed from the checkpoint at step \([0-9]*\).*/\1/p')
  [[ -n $resumed && $resumed -ge 20 && $resumed -lt 200 ]] ||
    fail "attempt 2 did not resume from the preempted step: $(events "$low")"
  echo "FIGURE preempted_at_step $resumed"
  slurm_loss=$(final_loss "$T/state/jobs/$low/attempt-2/run.jsonl")
  (cd "$SRC" && OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 mpirun --allow-run-as-root --oversubscribe \
      -n 2 "$BUILD/worker/ptworker" --config "$T/state/jobs/$low/spec.yaml" --log-json "$T/local.jsonl" \
      --set "checkpoint.dir=$T/local-ckpt" --set checkpoint.every=0 > "$T/local.log" 2>&1) || fail "local mpirun failed"
  local_loss=$(final_loss "$T/local.jsonl")
  echo "final loss: preempted under Slurm $slurm_loss, uninterrupted $local_loss"
  [[ $slurm_loss == "$local_loss" ]] || fail "final loss differs: $slurm_loss vs $local_loss; $(events "$low")"
  ;;
succeeds)
  # Submit -> SUCCEEDED with its loss history, the attempt a Slurm job.
  t0=$(now)
  # Steps enough that its ranks still run when their CPUs are looked at
  # (60 could end first on an idle machine).
  id=$(submit --set train.steps=600 --set checkpoint.every=200)
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 1 ]]" ||
    fail "no first step"
  echo "FIGURE slurm_submit_to_first_step_s $(since "$t0")"
  # srun binds each task to a core of its own (--cpu-bind=cores): the two
  # ranks' CPUs are disjoint, one each (resources.threads_per_rank 0).
  bound=()
  for p in $(pgrep -x ptworker); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "PTRAIN_JOB_ID=$id" || continue
    bound+=("$(awk '/^Cpus_allowed_list:/ {print $2}' "/proc/$p/status")")
  done
  [[ ${#bound[@]} == 2 && ${bound[0]} != *[,-]* && ${bound[1]} != *[,-]* &&
     ${bound[0]} != "${bound[1]}" ]] || fail "ranks' CPUs: ${bound[*]}"
  wait_for 120 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_SUCCEEDED ]]" ||
    fail "$id: $(state_of "$id")"
  "$PTCTL" -o json get "$id" | python3 -c '
import json, sys
r = json.load(sys.stdin)
h = [p for p in r.get("loss_history", []) if p.get("loss")]
assert len(h) >= 5, len(h)
assert h[-1]["loss"] < h[0]["loss"], (h[0], h[-1])
sid = r["attempts"][0].get("slurm_job_id", "")
assert sid.isdigit(), r["attempts"][0]
first, last = h[0]["loss"], h[-1]["loss"]
print(f"loss {first:.3f} -> {last:.3f} over {len(h)} points; Slurm job {sid}")' ||
    fail "loss history or Slurm job id"
  events "$id" | grep -q "is Slurm job [0-9]* (ptrain-$id-1)" || fail "no Slurm job event"
  events "$id" | grep -q "RUNNING on localhost" || fail "no RUNNING event"
  # srun --label: rank 1's lines carry "1: ", and ptctl logs --rank 1 has only those.
  "$PTCTL" logs "$id" --rank 0 | grep -q '^0: .*step *600/600' || fail "ptctl logs --rank 0"
  # The same submission to a ptcoord with the local launcher, for the
  # launch-time figure side by side.
  "$PTCOORD" --listen 127.0.0.1:0 --state-dir "$T/local-state" --launcher local \
    --work-root "$SRC" > "$T/ptcoord-local.log" 2>&1 &
  PIDS+=($!)
  wait_for 20 test -s "$T/local-state/address" || fail "local ptcoord did not start"
  (
    export PTCTL_SERVER PTCTL_TOKEN
    PTCTL_SERVER=$(cat "$T/local-state/address")
    PTCTL_TOKEN=$(cat "$T/local-state/user-token")
    t0=$(now)
    lid=$(submit --set train.steps=60 --set checkpoint.every=20)
    wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $lid | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 1 ]]" ||
      fail "local: no first step"
    echo "FIGURE local_submit_to_first_step_s $(since "$t0")"
    # Its ranks report to this ptcoord, not the one cleanup looks for, and
    # outlive it: end the job here, before cleanup removes its checkpoints.
    # (A loaded machine may finish its 60 steps first: ended either way.)
    "$PTCTL" cancel "$lid" >/dev/null
    wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $lid | grep -o 'JOB_STATE_[A-Z]*' | head -1) =~ ^JOB_STATE_(CANCELLED|SUCCEEDED)\$ ]]" ||
      fail "local: cancel did not end the job"
  )
  ;;

cancel)
  # ptctl cancel -> scancel: the Slurm job and every rank are gone.
  id=$(submit --set train.steps=100000 --set checkpoint.every=100)
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 20 ]]" ||
    fail "no progress"
  [[ -n $(squeue -h -n "ptrain-$id-1" -o %i) ]] || fail "no Slurm job"
  "$PTCTL" cancel "$id" >/dev/null
  wait_for 30 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_CANCELLED ]]" ||
    fail "not cancelled: $(state_of "$id")"
  [[ -z $(squeue -h -n "ptrain-$id-1" -o %i) ]] || fail "the Slurm job is still queued or running"
  wait_for 10 bash -c "$(declare -f our_ranks); PTCTL_SERVER=$PTCTL_SERVER; [[ -z \$(our_ranks) ]]" ||
    fail "ranks left running: $(our_ranks)"
  ;;

rank_killed)
  # One rank killed: srun ends the step, the attempt fails, and attempt 2
  # (a new Slurm job) resumes from the newest checkpoint and succeeds. (Steps
  # enough that the kill lands mid-run on a loaded machine.)
  id=$(submit --set train.steps=1000 --set checkpoint.every=50)
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 120 ]]" ||
    fail "no progress"
  t0=$(now)
  victim=$(our_ranks | tail -n1)
  [[ -n $victim ]] || fail "no rank of ours to kill"
  kill -9 "$victim"
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -c '\"attempts\": 2') == 1 ]]" || fail "no attempt 2"
  echo "FIGURE slurm_rank_death_to_next_attempt_s $(since "$t0")"
  wait_for 120 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_SUCCEEDED ]]" ||
    fail "$id: $(state_of "$id")"
  python3 "$SRC/tests/testing/resume_point.py" "$T/state/jobs/$id" 1 2 51 slurm_steps_lost ||
    fail "resume point"
  events "$id" | grep -q "attempt 2 resumed from the checkpoint at step" ||
    fail "no resume event: $(events "$id" | grep -v checkpoint)"
  events "$id" | grep -q "attempt 2 is Slurm job" || fail "attempt 2 was not a Slurm job"
  ;;
rank_stopped)
  # One rank stopped (SIGSTOP): only the hang timeout ends the attempt.
  # Before it does, ptcoord asks the ranks for their flight recorders
  # (scancel --signal=USR2: the job's steps, not its batch script, which
  # lives on); the other rank dumps into the attempt's folder, the stopped
  # one cannot and its process is in state T. The analysis names it.
  id=$(submit --set train.steps=100000 --set restart.hang_timeout_s=12 \
    --set restart.max_restarts=0)
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 5 ]]" ||
    fail "no progress"
  victim=$(our_ranks | tail -n1)
  [[ -n $victim ]] || fail "no rank of ours to stop"
  kill -STOP "$victim"
  wait_for 90 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_FAILED ]]" ||
    fail "the hang did not end the attempt: $(state_of "$id")"
  kill -CONT "$victim" 2>/dev/null || true
  "$PTCTL" -o json diagnose "$id" | python3 -c "
import json, sys
d = json.load(sys.stdin)
assert len(d['culprits']) == 1, d
r = {x['rank']: x for x in d['ranks']}
c = r[d['culprits'][0]]
assert c['state'] == 'stopped' and c['pid'] == int(sys.argv[1]), c
" "$victim" || fail "ptctl diagnose: $("$PTCTL" diagnose "$id")"
  # "waits in": the other rank's dump answered the request (an older one
  # would not count), so the signal reached it through Slurm.
  events "$id" | grep -q "hang analysis of attempt 1: .*is stopped.* waits\? in " ||
    fail "no hang analysis event: $(events "$id" | grep -v checkpoint)"
  ;;
node_death)
  # dp=2, one rank per node: the job spans both nodes. Node 2 dies (every
  # process in it): Slurm marks it down (SlurmdTimeout=10); the job ends
  # NODE_FAIL, or FAILED first when the surviving rank loses its peer before
  # that, and ptcoord, seeing the node down, resubmits it without counting a
  # restart, shrunk to dp=1 on node 1, from the newest checkpoint; it
  # succeeds.
  id=$(submit --set train.steps=500 --set checkpoint.every=50 \
    --set resources.ranks_per_node=1 --set restart.allow_shrink=true)
  wait_for 60 bash -c "[[ \$(\"$PTCTL\" -o json get $id | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"job\"][\"progress\"].get(\"step\", 0))') -ge 60 ]]" ||
    fail "no progress"
  # The attempt running now: an attempt that fails on its own before the
  # node dies (a rank crashing at start) is restarted as any job's would
  # be; the scenario goes on from the next one, and says so.
  a=$(attempts_of "$id")
  if ((a > 1)); then
    echo "NOTE: $((a - 1)) attempt(s) failed before node 2 died:"
    events "$id" | grep "failed (restart" || true
  fi
  nodes=$(squeue -h -n "ptrain-$id-$a" -o %N)
  [[ $nodes == "${MN_PREFIX}node[1-2]" ]] || fail "attempt $a is not on both nodes: $nodes"
  t0=$(now)
  mn_node_kill 2
  next=$((a + 1))
  wait_for 90 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -c '\"attempts\": $next') == 1 ]]" ||
    fail "no attempt $next: $(events "$id" | grep -v checkpoint)"
  echo "FIGURE slurm_node_death_to_resubmitted_s $(since "$t0") (SlurmdTimeout 10 s)"
  wait_for 120 bash -c "[[ \$(\"$PTCTL\" -o json get $id | grep -o 'JOB_STATE_[A-Z]*' | head -1) == JOB_STATE_SUCCEEDED ]]" ||
    fail "$id: $(state_of "$id"); $(events "$id" | grep -v checkpoint)"
  events "$id" | grep -Eq "(NODE_FAIL|down or not responding).*not counted as a restart" ||
    fail "no lost-node event: $(events "$id" | grep -v checkpoint)"
  events "$id" | grep -q "attempt $next started shrunk to dp=1" || fail "not shrunk: $(events "$id" | grep -v checkpoint)"
  ;;
*) fail "unknown scenario $SCENARIO" ;;
esac
echo "PASS: $SCENARIO"
