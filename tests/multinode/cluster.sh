# shellcheck shell=bash
#
# cluster.sh - "pretend nodes" for multi-node integration tests.
#
# Source this file from a bash test script (it is not meant to be executed).
# It turns one Linux machine into a small cluster made of network namespaces:
#
#   root namespace:  bridge ${MN_PREFIX}br0 with address ${MN_SUBNET3}.1/24
#   node K (1-based): network namespace ${MN_PREFIX}nodeK, interface eth0 with
#                     address ${MN_SUBNET3}.(10+K)/24, lo up, no default route.
#                     It is plugged into the bridge through the veth
#                     ${MN_PREFIX}vK on the host side.
#
# A node can only reach the cluster subnet and its own loopback.  Nothing is
# routed anywhere else and no global sysctl (such as ip_forward) is changed.
#
# Processes started with mn_node_run also get their own PID namespace (so a
# whole node can be killed at once) and their own UTS namespace (so that
# `hostname` prints the node name).
#
# Needs root, `ip` (iproute2) and `unshare` (util-linux).
#
# Typical use:
#
#   source tests/multinode/cluster.sh
#   mn_down                  # clean up whatever an interrupted run left behind
#   trap mn_down EXIT
#   mn_up 2
#   mn_node_run 1 "$tmp/node1.log" /path/to/server --listen "$(mn_addr 1)"
#   mn_wait_for 10 some_check ...
#
# Settings (environment variables, read every time a function runs):
#   MN_PREFIX      name prefix of namespaces and links (default "pt")
#   MN_SUBNET3     first three octets of the /24 subnet (default "10.78.0")
#   MN_BRIDGE      bridge name (default "${MN_PREFIX}br0")
#   MN_STATE_DIR   where node PIDs are recorded (default "/run/${MN_PREFIX}multinode")
#   MN_NODE_PATH   PATH given to node processes
#                  (default "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
#   MN_NODE_ENV    bash array of extra NAME=VALUE entries for node processes
#   MN_NETNS_ENTER how mn_node_run enters the network namespace: "nsenter"
#                  (default; `nsenter --net=`, which works in a chroot whose
#                  / is not a mount point) or "ip" (`ip netns exec`, which
#                  also mounts a /sys matching the namespace but fails
#                  there); nsenter keeps the
#                  host's /sys, including /sys/fs/cgroup).
#
# Every function is safe under `set -euo pipefail`.  Functions report problems
# on stderr and return non-zero instead of exiting.

# ---------------------------------------------------------------------------
# Internal helpers
# ---------------------------------------------------------------------------

# Run a command in network namespace $1 (nsenter only switches the network
# namespace; `ip -n`/`ip netns exec` also remount / and /sys, which fails in
# a chroot whose / is not a mount point).
_mn_in() {
    local ns=$1
    shift
    nsenter "--net=/run/netns/$ns" "$@"
}

# Print an error message and return 1.
_mn_err() {
    echo "cluster.sh: ERROR: $*" >&2
    return 1
}

# Print a warning message (does not fail).
_mn_warn() {
    echo "cluster.sh: warning: $*" >&2
}

_mn_prefix() { printf '%s\n' "${MN_PREFIX:-pt}"; }
_mn_subnet3() { printf '%s\n' "${MN_SUBNET3:-10.78.0}"; }
_mn_bridge() { printf '%s\n' "${MN_BRIDGE:-$(_mn_prefix)br0}"; }
_mn_veth() { printf '%s\n' "$(_mn_prefix)v$1"; }
_mn_state_dir() { printf '%s\n' "${MN_STATE_DIR:-/run/$(_mn_prefix)multinode}"; }

# Check the settings: prefix and subnet must be sane, and link names must fit
# in the kernel's 15-character limit.
_mn_check_cfg() {
    local prefix subnet3 br
    prefix=$(_mn_prefix)
    subnet3=$(_mn_subnet3)
    if [[ ! $prefix =~ ^[A-Za-z0-9]+$ ]]; then
        _mn_err "MN_PREFIX must be non-empty letters/digits, got '$prefix'"
        return 1
    fi
    if [[ ! $subnet3 =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]]; then
        _mn_err "MN_SUBNET3 must look like 10.78.0, got '$subnet3'"
        return 1
    fi
    br=$(_mn_bridge)
    # "<prefix>v244" and the bridge name must fit in 15 characters.
    if (( ${#prefix} + 4 > 15 || ${#br} > 15 )); then
        _mn_err "MN_PREFIX/MN_BRIDGE too long for Linux interface names (15 characters max)"
        return 1
    fi
    return 0
}

# Check that node number K is a positive integer that fits in the subnet.
_mn_check_k() {
    if [[ ! ${1:-} =~ ^[0-9]+$ ]] || (( 10#$1 < 1 || 10#$1 > 244 )); then
        _mn_err "node number must be 1..244, got '${1:-}'"
        return 1
    fi
    return 0
}

# Fail unless we are root and the needed tools exist.
_mn_check_tools() {
    local t
    if [[ ${EUID:-$(id -u)} -ne 0 ]]; then
        _mn_err "must run as root (network namespaces need CAP_SYS_ADMIN/CAP_NET_ADMIN)"
        return 1
    fi
    for t in "$@"; do
        if ! command -v "$t" >/dev/null 2>&1; then
            _mn_err "required tool '$t' not found in PATH"
            return 1
        fi
    done
    return 0
}

# Print the names of all namespaces that belong to us (prefix + "node" + number).
_mn_list_ns() {
    local out name rest prefix
    prefix=$(_mn_prefix)
    out=$(ip netns list 2>/dev/null || true)
    while read -r name rest; do
        [[ -n ${name:-} ]] || continue
        [[ $name =~ ^${prefix}node[0-9]+$ ]] && printf '%s\n' "$name"
    done <<<"$out"
    return 0
}

# Print the names of all host-side veths that belong to us (prefix + "v" + number).
_mn_list_veths() {
    local out _idx name rest prefix
    prefix=$(_mn_prefix)
    out=$(ip -o link show 2>/dev/null || true)
    while read -r _idx name rest; do
        [[ -n ${name:-} ]] || continue
        name=${name%:}      # "ptv1@if2:" -> "ptv1@if2"
        name=${name%%@*}    # "ptv1@if2"  -> "ptv1"
        [[ $name =~ ^${prefix}v[0-9]+$ ]] && printf '%s\n' "$name"
    done <<<"$out"
    return 0
}

# True if a network link with this name exists in the root namespace.
_mn_link_exists() {
    ip link show dev "$1" >/dev/null 2>&1
}

# True if the network namespace exists (its file under /run/netns is there).
_mn_ns_exists() {
    [[ -e /run/netns/$1 ]]
}

# Print the inode number of the PID namespace of process $1 (empty if gone).
_mn_pidns_of() {
    stat -L -c %i "/proc/$1/ns/pid" 2>/dev/null || true
}

# True if process $1 exists and is not a zombie.
_mn_pid_running() {
    local stat rest
    [[ -r /proc/$1/stat ]] || return 1
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $stat ]] || return 1
    rest=${stat##*) }       # skip "pid (comm) " -- comm may contain spaces
    [[ ${rest:0:1} != Z ]]
}

# Print the start time of process $1 (field 22 of /proc/PID/stat, in clock
# ticks since boot); together with the PID it identifies a process even if
# the PID number is reused later.  Prints nothing if the process is gone.
_mn_starttime() {
    local stat rest
    stat=$(cat "/proc/$1/stat" 2>/dev/null || true)
    [[ -n $stat ]] || return 0
    rest=${stat##*) }
    # shellcheck disable=SC2086  # split the fields on purpose
    set -- $rest
    printf '%s\n' "${20:-}"
}

# Print the child PIDs of process $1.
_mn_children_of() {
    local f out="" p
    for f in /proc/"$1"/task/*/children; do
        [[ -r $f ]] && out+=" $(cat "$f" 2>/dev/null || true)"
    done
    for p in $out; do printf '%s\n' "$p"; done
    return 0
}

# Print the current time in microseconds.
_mn_now_us() {
    if [[ -n ${EPOCHREALTIME:-} ]]; then
        local t=${EPOCHREALTIME/[.,]/}
        printf '%s\n' "$((10#$t))"
    else
        date +%s%6N
    fi
}

# Convert seconds ("5" or "2.5") into microseconds.
_mn_secs_to_us() {
    local s=$1 int frac
    int=${s%%.*}
    if [[ $s == *.* ]]; then frac=${s#*.}; else frac=0; fi
    [[ $int =~ ^[0-9]*$ && $frac =~ ^[0-9]*$ ]] || { _mn_err "bad number of seconds '$s'"; return 1; }
    frac=${frac}000000
    frac=${frac:0:6}
    printf '%s\n' "$(( 10#${int:-0} * 1000000 + 10#$frac ))"
}

# Read the record for node K, written by mn_node_run: sets _mn_r_unshare
# (PID of unshare), _mn_r_ustart (its start time), _mn_r_init (PID of the
# PID-namespace init) and _mn_r_pidns (inode of that PID namespace).
# Returns 1 (without a message) if the node has no record.
_mn_read_node() {
    _mn_r_unshare="" _mn_r_ustart="" _mn_r_init="" _mn_r_pidns=""
    local f
    f="$(_mn_state_dir)/node$1"
    [[ -r $f ]] || return 1
    read -r _mn_r_unshare _mn_r_ustart _mn_r_init _mn_r_pidns <"$f" || true
    [[ -n $_mn_r_pidns ]]
}

# True if node K's recorded unshare process is still running (same PID and
# same start time, so a reused PID does not count).
_mn_unshare_running() {
    [[ -n $_mn_r_unshare ]] || return 1
    _mn_pid_running "$_mn_r_unshare" || return 1
    [[ $(_mn_starttime "$_mn_r_unshare") == "$_mn_r_ustart" ]]
}

# ---------------------------------------------------------------------------
# Names and addresses
# ---------------------------------------------------------------------------

# mn_ns K: print the network namespace name of node K.
mn_ns() {
    _mn_check_k "${1:-}" || return 1
    printf '%s\n' "$(_mn_prefix)node$((10#$1))"
}

# mn_addr K: print the IPv4 address of node K.
mn_addr() {
    _mn_check_k "${1:-}" || return 1
    printf '%s\n' "$(_mn_subnet3).$((10 + 10#$1))"
}

# mn_host_addr: print the address of the bridge in the root namespace.
mn_host_addr() {
    printf '%s\n' "$(_mn_subnet3).1"
}

# ---------------------------------------------------------------------------
# Bringing the cluster up and down
# ---------------------------------------------------------------------------

# mn_up N: create the bridge and nodes 1..N.  Running it again is harmless:
# existing pieces are kept and missing ones are added.
mn_up() {
    local n=${1:-} k ns veth br subnet3 state others
    _mn_check_tools ip || return 1
    _mn_check_cfg || return 1
    if [[ ! $n =~ ^[0-9]+$ ]] || (( 10#$n < 1 || 10#$n > 244 )); then
        _mn_err "usage: mn_up N (N = number of nodes, 1..244)"
        return 1
    fi
    n=$((10#$n))
    br=$(_mn_bridge)
    subnet3=$(_mn_subnet3)
    state=$(_mn_state_dir)

    # Refuse to use a subnet that some other interface already has: the
    # routes would clash and tests could talk to the wrong machine.
    others=$(ip -o -4 addr show to "$subnet3.0/24" 2>/dev/null | awk -v br="$br" '$2 != br {print $2}' || true)
    if [[ -n $others ]]; then
        _mn_err "subnet $subnet3.0/24 is already used by: ${others//$'\n'/ } (set MN_SUBNET3 to another subnet)"
        return 1
    fi

    mkdir -p "$state" || { _mn_err "cannot create state directory $state"; return 1; }
    # Remember whether /run/netns existed before us, so mn_down removes it
    # only if we created it.
    if [[ ! -e /run/netns ]]; then
        : >"$state/made_run_netns"
    fi

    # The bridge in the root namespace, with the "host" address.
    if ! _mn_link_exists "$br"; then
        ip link add "$br" type bridge || { _mn_err "cannot create bridge $br"; return 1; }
    fi
    ip addr replace "$subnet3.1/24" dev "$br" || { _mn_err "cannot set address on $br"; return 1; }
    ip link set "$br" up || { _mn_err "cannot bring $br up"; return 1; }

    for ((k = 1; k <= n; k++)); do
        ns=$(mn_ns "$k")
        veth=$(_mn_veth "$k")
        if ! _mn_ns_exists "$ns"; then
            ip netns add "$ns" || { _mn_err "cannot create namespace $ns"; return 1; }
        elif [[ -n $(ip netns pids "$ns" 2>/dev/null || true) ]]; then
            _mn_warn "namespace $ns already has processes in it (left from an earlier run?); call mn_down first for a clean start"
        fi
        _mn_in "$ns" ip link set lo up || { _mn_err "cannot bring lo up in $ns"; return 1; }
        # Create the veth pair unless eth0 already exists inside the node.
        if ! _mn_in "$ns" ip link show dev eth0 >/dev/null 2>&1; then
            # A host-side veth without its peer is stale: remove it first.
            if _mn_link_exists "$veth"; then
                ip link del "$veth" 2>/dev/null || true
            fi
            ip link add "$veth" type veth peer name eth0 netns "$ns" ||
                { _mn_err "cannot create veth $veth for $ns"; return 1; }
        fi
        ip link set "$veth" master "$br" || { _mn_err "cannot attach $veth to $br"; return 1; }
        ip link set "$veth" up || { _mn_err "cannot bring $veth up"; return 1; }
        _mn_in "$ns" ip addr replace "$(mn_addr "$k")/24" dev eth0 ||
            { _mn_err "cannot set address of eth0 in $ns"; return 1; }
        _mn_in "$ns" ip link set eth0 up || { _mn_err "cannot bring eth0 up in $ns"; return 1; }
    done
    return 0
}

# mn_down: remove everything mn_up and mn_node_run made: node processes
# (whole PID namespaces), namespaces, veths, the bridge, the state directory,
# and /run/netns if we created it and it is now empty.  Safe to call any
# number of times, also when nothing exists.  Returns 1 if something could
# not be removed.
mn_down() {
    local ns f k p pids deadline br state left="" prefix
    # Without `ip` there is nothing we could have created.
    command -v ip >/dev/null 2>&1 || return 0
    _mn_check_cfg || return 1
    prefix=$(_mn_prefix)
    br=$(_mn_bridge)
    state=$(_mn_state_dir)

    # 1. Kill every node's PID namespace we know about (this also gets
    #    processes that left the node's network namespace).
    if [[ -d $state ]]; then
        for f in "$state"/node*; do
            [[ -e $f ]] || continue
            k=${f##*/node}
            [[ $k =~ ^[0-9]+$ ]] || continue
            mn_node_kill "$k" >/dev/null 2>&1 || true
        done
    fi

    # 2. Kill whatever else still runs inside our network namespaces
    #    (e.g. commands started with `ip netns exec`), then delete them.
    for ns in $(_mn_list_ns); do
        for p in $(ip netns pids "$ns" 2>/dev/null || true); do
            kill -KILL "$p" 2>/dev/null || true
        done
    done
    deadline=$(( $(_mn_now_us) + 5000000 ))
    for ns in $(_mn_list_ns); do
        while pids=$(ip netns pids "$ns" 2>/dev/null || true); [[ -n $pids ]]; do
            if (( $(_mn_now_us) > deadline )); then
                _mn_warn "processes still alive in $ns: ${pids//$'\n'/ }"
                break
            fi
            for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
            sleep 0.1
        done
        ip netns del "$ns" 2>/dev/null || true
    done

    # 3. The kernel removes each veth pair when its namespace goes away, but
    #    it does so in the background; delete any that remain ourselves.
    deadline=$(( $(_mn_now_us) + 2000000 ))
    while [[ -n $(_mn_list_veths) ]] && (( $(_mn_now_us) < deadline )); do
        sleep 0.1
    done
    for p in $(_mn_list_veths); do
        ip link del "$p" 2>/dev/null || true
    done

    # 4. The bridge.
    if _mn_link_exists "$br"; then
        ip link del "$br" 2>/dev/null || true
    fi

    # 5. /run/netns: only if we created it and no namespace is left in it.
    if [[ -e $state/made_run_netns && -d /run/netns ]]; then
        if [[ -z $(ls -A /run/netns 2>/dev/null || true) ]]; then
            if mountpoint -q /run/netns 2>/dev/null; then
                umount /run/netns 2>/dev/null || true
            fi
            rmdir /run/netns 2>/dev/null || true
        fi
    fi

    # 6. Check the result.
    f=$(_mn_list_ns)
    [[ -n $f ]] && left+=" namespaces: ${f//$'\n'/ };"
    f=$(_mn_list_veths)
    [[ -n $f ]] && left+=" veths: ${f//$'\n'/ };"
    _mn_link_exists "$br" && left+=" bridge: $br;"
    if [[ -n $left ]]; then
        _mn_err "mn_down could not remove:$left"
        return 1
    fi
    # Keep the "we made /run/netns" note if the directory is still there
    # (another user had namespaces in it); otherwise drop the state.
    if [[ -e $state/made_run_netns && -d /run/netns ]]; then
        rm -f "$state"/node* 2>/dev/null || true
    else
        rm -rf "$state" 2>/dev/null || true
    fi
    return 0
}

# ---------------------------------------------------------------------------
# Running and controlling node processes
# ---------------------------------------------------------------------------

# mn_node_run K LOGFILE CMD [ARGS...]: start CMD in the background as node K.
#
# CMD runs in node K's network namespace, in a new PID namespace (CMD's
# process tree sees itself as PID 1 and a fresh /proc), and in a new UTS
# namespace whose hostname is the namespace name.  The environment is
# cleared except PATH, HOME and the entries of MN_NODE_ENV.  stdin is
# /dev/null; stdout and stderr are appended to LOGFILE.
#
# Only one such process tree per node at a time.  Returns once the
# PID-namespace init exists; fails if CMD exits right away.
mn_node_run() {
    local k=${1:-} log=${2:-} ns upid ustart init pidns mypidns state deadline
    local -a envv enter
    if (( $# < 3 )); then
        _mn_err "usage: mn_node_run K LOGFILE CMD [ARGS...]"
        return 1
    fi
    _mn_check_k "$k" || return 1
    _mn_check_tools ip unshare || return 1
    k=$((10#$k))
    shift 2
    ns=$(mn_ns "$k")
    state=$(_mn_state_dir)
    _mn_ns_exists "$ns" || { _mn_err "namespace $ns does not exist (call mn_up first)"; return 1; }
    if [[ -n $(mn_node_pids "$k") ]]; then
        _mn_err "node $k is already running (mn_node_kill $k first)"
        return 1
    fi
    mkdir -p "$state" || { _mn_err "cannot create state directory $state"; return 1; }
    : >>"$log" || { _mn_err "cannot write log file $log"; return 1; }

    envv=(env -i "PATH=${MN_NODE_PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
          "HOME=${HOME:-/root}")
    envv+=(${MN_NODE_ENV[@]+"${MN_NODE_ENV[@]}"})
    case ${MN_NETNS_ENTER:-nsenter} in
        ip) enter=(ip netns exec "$ns") ;;
        nsenter)
            _mn_check_tools nsenter || return 1
            enter=(nsenter "--net=/run/netns/$ns") ;;
        *) _mn_err "MN_NETNS_ENTER must be 'ip' or 'nsenter'"; return 1 ;;
    esac

    # `ip netns exec`/`nsenter`, `env` and `unshare` all replace themselves
    # with the next program, so $! ends up being the unshare process.  With
    # --fork, unshare's child is PID 1 of the new PID namespace: a small
    # shell that sets the hostname and then becomes CMD.  --kill-child makes
    # that init die if unshare itself is killed.
    # The node's own /proc is mounted in a mount namespace of its own, after
    # making /proc private there (not `--mount-proc`, whose change of /'s
    # propagation fails in a chroot whose / is not a mount point).
    # shellcheck disable=SC2016  # $0/$@ are for the inner shell
    "${enter[@]}" "${envv[@]}" \
        unshare --pid --fork --kill-child --mount --propagation unchanged --uts \
        /bin/sh -c 'mount --make-rprivate /proc && mount -t proc proc /proc &&
                    hostname "$0" && exec "$@"' "$ns" "$@" \
        </dev/null >>"$log" 2>&1 &
    upid=$!
    ustart=$(_mn_starttime "$upid")

    # Wait for unshare's child (the PID-namespace init) to appear.
    mypidns=$(_mn_pidns_of $$)
    init="" pidns=""
    deadline=$(( $(_mn_now_us) + 5000000 ))
    while :; do
        for init in $(_mn_children_of "$upid"); do
            pidns=$(_mn_pidns_of "$init")
            [[ -n $pidns && $pidns != "$mypidns" ]] && break 2
        done
        init="" pidns=""
        if ! _mn_pid_running "$upid"; then
            wait "$upid" 2>/dev/null || true
            _mn_err "node $k: command exited right away (see $log)"
            return 1
        fi
        if (( $(_mn_now_us) > deadline )); then
            kill -KILL "$upid" 2>/dev/null || true
            _mn_err "node $k: PID namespace did not appear within 5 s (see $log)"
            return 1
        fi
        sleep 0.02
    done
    printf '%s %s %s %s\n' "$upid" "$ustart" "$init" "$pidns" >"$state/node$k"
    return 0
}

# mn_node_pids K: print (one per line) the host PIDs of every process in
# node K's PID namespace.  Prints nothing if the node is not running.
mn_node_pids() {
    local k=${1:-} out
    _mn_check_k "$k" || return 1
    k=$((10#$k))
    _mn_read_node "$k" || return 0
    # One `stat` call for all processes: "<pid-namespace inode> /proc/<pid>/ns/pid".
    out=$(stat -L -c '%i %n' /proc/[0-9]*/ns/pid 2>/dev/null || true)
    awk -v ino="$_mn_r_pidns" '$1 == ino { split($2, a, "/"); print a[3] }' <<<"$out" | sort -n
    return 0
}

# mn_node_init K: print the host PID of node K's PID-namespace init (the
# process that is PID 1 inside the node); fails if the node is not running.
mn_node_init() {
    local k=${1:-}
    _mn_check_k "$k" || return 1
    k=$((10#$k))
    if _mn_read_node "$k" && [[ $(_mn_pidns_of "$_mn_r_init") == "$_mn_r_pidns" ]]; then
        printf '%s\n' "$_mn_r_init"
        return 0
    fi
    _mn_err "node $k is not running"
    return 1
}

# mn_node_kill K: kill the whole node.  SIGKILL to the PID-namespace init
# makes the kernel kill every process in that namespace, including
# daemonized grandchildren.  Waits (up to about 5 s) until they are all gone.
# Returns 0 also when the node was not running.
mn_node_kill() {
    local k=${1:-} pids p deadline
    _mn_check_k "$k" || return 1
    k=$((10#$k))
    _mn_read_node "$k" || return 0
    pids=$(mn_node_pids "$k")
    if [[ -n $pids ]]; then
        if [[ $(_mn_pidns_of "$_mn_r_init") == "$_mn_r_pidns" ]]; then
            kill -KILL "$_mn_r_init" 2>/dev/null || true
        else
            # Should not happen (processes outlive their init only briefly):
            # kill them one by one.
            for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
        fi
    fi
    deadline=$(( $(_mn_now_us) + 5000000 ))
    while pids=$(mn_node_pids "$k"); [[ -n $pids ]] || _mn_unshare_running; do
        if (( $(_mn_now_us) > deadline )); then
            _mn_err "node $k: processes still alive after 5 s: ${pids//$'\n'/ }"
            return 1
        fi
        # unshare exits by itself once its child is gone; make sure anyway.
        if [[ -z $pids ]]; then
            kill -KILL "$_mn_r_unshare" 2>/dev/null || true
        fi
        sleep 0.05
    done
    # Reap unshare if it is our own background child (no zombie left behind).
    if [[ $(_mn_starttime "$_mn_r_unshare") == "$_mn_r_ustart" ]]; then
        wait "$_mn_r_unshare" 2>/dev/null || true
    fi
    return 0
}

# mn_node_stop K: freeze node K (SIGSTOP to every process in its PID
# namespace).  Its kernel side (network stack) keeps working, e.g. it still
# answers pings, but no process runs.
mn_node_stop() {
    local k=${1:-} pids p pass new
    local -A done_=()
    _mn_check_k "$k" || return 1
    k=$((10#$k))
    # Processes may fork while we go; repeat until a pass finds nothing new.
    for ((pass = 0; pass < 10; pass++)); do
        pids=$(mn_node_pids "$k")
        new=0
        for p in $pids; do
            [[ -n ${done_[$p]:-} ]] && continue
            kill -STOP "$p" 2>/dev/null || true
            done_[$p]=1
            new=1
        done
        (( new )) || break
    done
    return 0
}

# mn_node_cont K: resume a node frozen by mn_node_stop (SIGCONT to every
# process in its PID namespace).
mn_node_cont() {
    local k=${1:-} p
    _mn_check_k "$k" || return 1
    for p in $(mn_node_pids "$k"); do
        kill -CONT "$p" 2>/dev/null || true
    done
    return 0
}

# mn_exec K CMD [ARGS...]: run a command in node K's network namespace, in
# the foreground (no separate PID/UTS namespace; the environment is kept).
mn_exec() {
    local k=${1:-}
    _mn_check_k "$k" || return 1
    shift
    _mn_in "$(mn_ns "$k")" "$@"
}

# ---------------------------------------------------------------------------
# Network faults
# ---------------------------------------------------------------------------

# mn_link_down K: cut node K off the network (its host-side veth goes down;
# inside the node eth0 loses carrier).
mn_link_down() {
    _mn_check_k "${1:-}" || return 1
    ip link set "$(_mn_veth "$((10#$1))")" down || { _mn_err "cannot bring link of node $1 down"; return 1; }
}

# mn_link_up K: reconnect node K.
mn_link_up() {
    _mn_check_k "${1:-}" || return 1
    ip link set "$(_mn_veth "$((10#$1))")" up || { _mn_err "cannot bring link of node $1 up"; return 1; }
}

# ---------------------------------------------------------------------------
# Waiting
# ---------------------------------------------------------------------------

# mn_wait_for TIMEOUT_S CMD [ARGS...]: run CMD every 0.2 s until it succeeds
# (return 0) or TIMEOUT_S seconds (may be fractional) have passed (return 1).
# CMD runs at least once.  Its output is not redirected.
mn_wait_for() {
    local limit deadline
    if (( $# < 2 )); then
        _mn_err "usage: mn_wait_for TIMEOUT_S CMD [ARGS...]"
        return 1
    fi
    limit=$(_mn_secs_to_us "$1") || return 1
    shift
    deadline=$(( $(_mn_now_us) + limit ))
    while :; do
        if "$@"; then
            return 0
        fi
        if (( $(_mn_now_us) >= deadline )); then
            return 1
        fi
        sleep 0.2
    done
}
