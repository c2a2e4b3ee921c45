#!/bin/bash
# cluster_selftest.sh - check that the pretend-node library cluster.sh works
# on this machine.  Needs root.  Exits 0 on success, 1 with a message on the
# first failed check.  Leaves nothing behind (namespaces, links, processes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"

fail() {
    echo "cluster_selftest: FAIL: $*" >&2
    exit 1
}
step() {
    echo "cluster_selftest: $*"
}

tmp=$(mktemp -d /tmp/cluster_selftest.XXXXXX)
server_pid=""
cleanup() {
    local rc=$?
    if [[ -n $server_pid ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    mn_down || rc=1
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT

# Start from a clean slate even if an earlier run was interrupted.
mn_down
mn_up 2
ns1=$(mn_ns 1)
ns2=$(mn_ns 2)
host=$(mn_host_addr)

# can_reach K ADDR: true if node K can reach ADDR.  Uses ping when it is
# installed; otherwise a TCP connection attempt to port 9 (discard), where
# either success or "Connection refused" proves that the address answered.
can_reach() {
    local out
    if command -v ping >/dev/null 2>&1 && [[ -z ${MN_SELFTEST_NO_PING:-} ]]; then
        mn_exec "$1" ping -c1 -W1 "$2" >/dev/null 2>&1
    else
        out=$(mn_exec "$1" timeout 2 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1) && return 0
        [[ $out == *"Connection refused"* ]]
    fi
}

# ---------------------------------------------------------------------------
step "1. connectivity"
[[ $(mn_addr 1) == "${MN_SUBNET3:-10.78.0}.11" ]] || fail "mn_addr 1 printed $(mn_addr 1)"
can_reach 1 "$(mn_addr 2)" || fail "$ns1 cannot reach node 2 at $(mn_addr 2)"
can_reach 1 "$host" || fail "$ns1 cannot reach the host at $host"
# No default route inside a node: an outside address must be unreachable.
if mn_exec 1 ip route get 192.0.2.1 >/dev/null 2>&1; then
    fail "$ns1 has a route to 192.0.2.1 (it should only reach its subnet)"
fi
[[ $(mn_exec 1 ip -4 -o addr show dev eth0) == *"$(mn_addr 1)/24"* ]] || fail "$ns1 eth0 lacks $(mn_addr 1)/24"

# A TCP server in the root namespace on the bridge address, reached from node 2.
if py=$(command -v /usr/bin/python3 || command -v python3); then
    # Bind port 0 (the kernel picks a free port) and report it in a file.
    "$py" -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0))
s.listen(16)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write("%d\n" % s.getsockname()[1])
import os; os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    c, _ = s.accept()
    c.sendall(b"hello-from-host\n")
    c.close()
' "$host" "$tmp/port" &
    server_pid=$!
    mn_wait_for 5 test -s "$tmp/port" || fail "python3 TCP server did not start"
    port=$(cat "$tmp/port")
elif command -v socat >/dev/null 2>&1; then
    port=$(( 20000 + $$ % 20000 ))
    socat "TCP-LISTEN:$port,bind=$host,reuseaddr,fork" SYSTEM:'echo hello-from-host' &
    server_pid=$!
elif command -v ncat >/dev/null 2>&1; then
    port=$(( 20000 + $$ % 20000 ))
    ncat -lk "$host" "$port" -c 'echo hello-from-host' &
    server_pid=$!
else
    fail "no tool to run a TCP server (need python3, socat or ncat)"
fi
tcp_read() {
    mn_exec 2 timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port && head -n1 <&3" 2>/dev/null
}
got=""
mn_wait_for 5 eval 'got=$(tcp_read)' || true
[[ $got == hello-from-host ]] || fail "TCP server on $host:$port not reachable from $ns2 (got '$got')"
kill "$server_pid" 2>/dev/null || true
wait "$server_pid" 2>/dev/null || true
server_pid=""

# ---------------------------------------------------------------------------
step "2. node processes: hostname, PID namespace, kill the whole node"
log1=$tmp/node1.log
MN_NODE_ENV=(SELFTEST_MARK=42)
mn_node_run 1 "$log1" sh -c 'hostname; echo "mark=$SELFTEST_MARK user=${USER:-unset}"; sleep 1000 & sleep 1000 & wait'
mn_wait_for 5 grep -qx "$ns1" "$log1" || fail "log does not show hostname $ns1: $(cat "$log1")"
grep -qx "mark=42 user=unset" "$log1" || fail "node environment is not clean/complete: $(cat "$log1")"
count_ge() { [[ $(mn_node_pids "$1" | wc -l) -ge $2 ]]; }
mn_wait_for 5 count_ge 1 3 || fail "expected >= 3 processes in node 1, got: $(mn_node_pids 1 | tr '\n' ' ')"
pids=$(mn_node_pids 1)
init=$(mn_node_init 1)
[[ $(printf '%s\n' "$pids" | head -n1) == "$init" ]] || fail "init $init is not the lowest PID of node 1 ($pids)"
# Inside the node, the init must see itself as PID 1 and see only its own processes.
inside=$(nsenter -t "$init" -p -m ps -e -o pid= 2>/dev/null | wc -l || true)
[[ $inside -ge 3 && $inside -le 5 ]] || fail "node 1 sees $inside processes in its /proc (expected 3 + ps)"
# A process started by the node must not see the root's hostname.
[[ $(nsenter -t "$init" -u hostname) == "$ns1" ]] || fail "UTS namespace of node 1 has the wrong hostname"
[[ $(hostname) != "$ns1" ]] || fail "the root's hostname was changed"

# Freeze / thaw: every process stopped, kernel still answers pings.
mn_node_stop 1
for p in $pids; do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
    [[ $st == T ]] || fail "process $p of node 1 is not stopped after mn_node_stop (state '$st')"
done
can_reach 2 "$(mn_addr 1)" || fail "frozen node 1 does not answer network probes any more"
mn_node_cont 1
for p in $pids; do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || true)
    [[ $st != T ]] || fail "process $p of node 1 is still stopped after mn_node_cont"
done

mn_node_kill 1 || fail "mn_node_kill 1 failed"
for p in $pids; do
    if kill -0 "$p" 2>/dev/null; then
        fail "process $p of node 1 is still alive after mn_node_kill ($(cat /proc/$p/cmdline 2>/dev/null | tr '\0' ' '))"
    fi
done
[[ -z $(mn_node_pids 1) ]] || fail "mn_node_pids 1 not empty after mn_node_kill"
mn_node_kill 1 || fail "second mn_node_kill 1 failed"

# A daemonized grandchild (double fork, new session) also dies with the node.
mn_node_run 1 "$log1" sh -c 'setsid sh -c "sleep 1001 &" </dev/null >/dev/null 2>&1; exec sleep 1002'
mn_wait_for 5 count_ge 1 2 || fail "daemonized process did not start in node 1"
pids=$(mn_node_pids 1)
mn_node_kill 1 || fail "mn_node_kill 1 (daemon case) failed"
for p in $pids; do
    kill -0 "$p" 2>/dev/null && fail "daemonized process $p survived mn_node_kill"
done

# ---------------------------------------------------------------------------
step "3. link down / up"
mn_link_down 2
if can_reach 2 "$host"; then fail "node 2 still reaches $host after mn_link_down 2"; fi
if can_reach 1 "$(mn_addr 2)"; then fail "node 1 still reaches node 2 after mn_link_down 2"; fi
mn_link_up 2
mn_wait_for 5 can_reach 2 "$host" || fail "node 2 does not reach $host within 5 s after mn_link_up 2"

# ---------------------------------------------------------------------------
step "4. teardown"
# Leave a running node behind on purpose: mn_down must clean it up.
mn_node_run 2 "$tmp/node2.log" sleep 1003
pids=$(mn_node_pids 2)
mn_down || fail "mn_down failed"
for p in $pids; do
    kill -0 "$p" 2>/dev/null && fail "node 2 process $p survived mn_down"
done
prefix=${MN_PREFIX:-pt}
left=$(ip netns list | grep "^${prefix}node" || true)
[[ -z $left ]] || fail "namespaces left after mn_down: $left"
left=$(ip -br link | grep -E "^(${prefix}br0|${prefix}v[0-9]+)[@ ]" || true)
[[ -z $left ]] || fail "links left after mn_down: $left"
mn_down || fail "second mn_down failed"

step "PASS"
