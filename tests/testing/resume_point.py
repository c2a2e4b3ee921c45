#!/usr/bin/env python3
"""Where a restarted attempt resumed. Attempt B's run log names the
checkpoint it started from (its "resume" record); that checkpoint must be
one attempt A committed: no older than A's newest "checkpoint" record and no
newer than A's last step (A may die between committing a checkpoint and
logging it, so the record can lag the folder). B's first step must be the one
after it, and A must have run at most MAX_LOST steps past it (the steps the
restart lost).

    resume_point.py JOB_DIR A B MAX_LOST NAME

Prints "FIGURE NAME LOST (...)"; exits 1 when any rule is broken.
"""
import json
import sys


def records(job_dir, attempt):
    with open(f"{job_dir}/attempt-{attempt}/run.jsonl") as f:
        return [json.loads(line) for line in f]


def main():
    job_dir, a, b, max_lost, name = sys.argv[1:6]
    ra, rb = records(job_dir, a), records(job_dir, b)
    logged = max(r["step"] for r in ra if r.get("type") == "checkpoint")
    last = max(r["step"] for r in ra if r.get("type") == "step")
    resumes = [r["step"] for r in rb if r.get("type") == "resume"]
    first = min(r["step"] for r in rb if r.get("type") == "step")
    resumed = resumes[0] if len(resumes) == 1 else None
    print(f"FIGURE {name} {last - (resumed or logged)} (attempt {a}: newest "
          f"logged checkpoint {logged}, last step {last}; attempt {b} resumed "
          f"from {resumed} at {first})")
    ok = (resumed is not None and logged <= resumed <= last and
          first == resumed + 1 and last - resumed <= int(max_lost))
    if not ok:
        print(f"resume point wrong: resume records={resumes} first={first} "
              f"logged checkpoint={logged} last={last} max_lost={max_lost}",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
