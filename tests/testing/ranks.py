"""The live ptworker processes whose environment holds given entries.

Tests run side by side, and job ids repeat across coordinators (every
coordinator's first job is job-0001): a test names its ranks by its own
coordinator's address as well as by the job.
"""
import os


def ptworker_pids(*entries, running_only=False):
    """pids of ptworker processes whose environment holds every
    NAME=VALUE (or bare NAME=, any value) in `entries`; `running_only`
    leaves out zombies and stopped ones. Sorted."""
    want = [e.encode() for e in entries]
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() != "ptworker":
                    continue
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if running_only:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in "ZT":
                        continue
        except OSError:
            continue
        if all(any(v == w or (w.endswith(b"=") and v.startswith(w))
                   for v in env) for w in want):
            out.append(int(p))
    return sorted(out)
