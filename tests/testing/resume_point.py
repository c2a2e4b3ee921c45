#!/usr/bin/env python3
"""Where a restarted attempt resumed: the first step of attempt B must be
the step after attempt A's newest checkpoint, and A must have run at most
MAX_LOST steps past that checkpoint (the steps the restart lost).

    resume_point.py JOB_DIR A B MAX_LOST NAME

Prints "FIGURE NAME LOST (...)"; exits 1 when either rule is broken.
"""
import json
import sys


def records(job_dir, attempt):
    with open(f"{job_dir}/attempt-{attempt}/run.jsonl") as f:
        return [json.loads(line) for line in f]


def main():
    job_dir, a, b, max_lost, name = sys.argv[1:6]
    ra, rb = records(job_dir, a), records(job_dir, b)
    ckpt = max(r["step"] for r in ra if r.get("type") == "checkpoint")
    last = max(r["step"] for r in ra if r.get("type") == "step")
    first = min(r["step"] for r in rb if r.get("type") == "step")
    print(f"FIGURE {name} {last - ckpt} (attempt {a}: checkpoint {ckpt}, "
          f"last step {last}; attempt {b} resumed at {first})")
    ok = first == ckpt + 1 and last - ckpt <= int(max_lost)
    if not ok:
        print(f"resume point wrong: first={first} checkpoint={ckpt} "
              f"last={last} max_lost={max_lost}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
