# Shell helpers over a rank's run log (docs/run-log.md) for the process-level
# scripts (tests/multinode, tests/slurm): source it.

# final_loss RUN_JSONL: the last training step's loss, as written (Python's
# repr of the double, so two runs compare bit for bit as text).
final_loss() {
  python3 -c "
import json, sys
last = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get('type') == 'step': last = r
print(repr(last['loss']))" "$1"
}
