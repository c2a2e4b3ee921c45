#!/bin/bash
# Multi-node figures on pretend nodes (network and PID namespaces on this
# machine; root): ROUNDS runs of the multinode test scenarios, each printing
# its figures, then their medians:
#  - launch: submit -> first step of a 4-rank dp=2 x tp=2 job on 2 nodes
#    (2 slots each), and submit -> SUCCEEDED of that 30-step job beside the
#    same spec run whole by plain local mpirun;
#  - node death -> the job running again (node timeout 6 s), and the steps
#    lost (<= checkpoint.every = 20);
#  - a cut link and a frozen node -> noticed.
#
#   bench/multinode.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${PTRAIN_BUILD:-build}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
  for s in two_nodes node_death_shrink link_cut node_frozen; do
    tests/multinode/multinode_test.sh "$s" "$build" . 2>&1 |
      grep -E '^(FIGURE|PASS|FAIL|SKIP)' | tee -a "$out"
  done
done
echo "== medians over $rounds rounds"
grep '^FIGURE' "$out" | python3 -c '
import collections, statistics, sys
v = collections.defaultdict(list)
for line in sys.stdin:
    f = line.split()
    v[f[1]].append(float(f[2]))
for k, xs in v.items():
    runs = " ".join("%.2f" % x for x in xs)
    print("%-40s median %7.2f  runs %s" % (k, statistics.median(xs), runs))'
