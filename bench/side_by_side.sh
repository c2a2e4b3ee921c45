# Sourced by the benchmark scripts that alternate runs of one benchmark in
# several layouts (tensor_parallel.sh, context_parallel.sh): mpirun as this
# machine needs it, `run NAME COMMAND...` (runs it, shows its output but
# warnings, keeps its tok/s under NAME) and `median NAME` (of those kept).
mpi="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp"
export OMPI_MCA_mpi_yield_when_idle=1
out=$(mktemp)
trap 'rm -f "$out" "$out.run"' EXIT

run() {
  name=$1
  shift
  "$@" >"$out.run" 2>&1 || { cat "$out.run"; exit 1; }
  grep -v "warning" "$out.run" || true
  echo "$name $(sed -n 's/.* ms\/step, \([0-9.]*\) tok\/s.*/\1/p' "$out.run")" >>"$out"
}

median() { grep "^$1 " "$out" | cut -d' ' -f2 | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
