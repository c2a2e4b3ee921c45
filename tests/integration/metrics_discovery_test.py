#!/usr/bin/python3
"""Prometheus finds a job's ranks through ptcoord: with --metrics-listen,
ptcoord's /sd lists every live rank's /metrics endpoint (http_sd_configs
format) and its own /metrics counts jobs by state, and a pause as a
requeue, not a restart; each listed endpoint serves that rank's series. Endpoints are advertised under an address
others can dial, not the host name: as root the test runs in a UTS
namespace whose host name resolves nowhere (as in many containers), and
the endpoints must still be scraped.

    metrics_discovery_test.py PTCOORD PTCTL SOURCE_DIR
"""
import json
import os
import ipaddress
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from promtest import get, wait_for


UNRESOLVABLE = "ptrain-no-such-node.invalid"


def unresolvable_host_name():
    """Re-runs this script in a UTS namespace named UNRESOLVABLE when it can
    (root); returns whether the host name is now unresolvable."""
    if os.environ.get("PTRAIN_SD_TEST_UTS") == "1":
        socket.sethostname(UNRESOLVABLE)
        return True
    if os.geteuid() == 0 and shutil.which("unshare"):
        os.environ["PTRAIN_SD_TEST_UTS"] = "1"
        os.execvp("unshare", ["unshare", "--uts", sys.executable] + sys.argv)
    print("note: not root; the host name is left as it is")
    return False


def resolves(name):
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


def main():
    ptcoord, ptctl, src = sys.argv[1:4]
    renamed = unresolvable_host_name()
    tmp = tempfile.mkdtemp(prefix="ptrain_sd_")
    with open(os.path.join(tmp, "tokens"), "w") as f:
        f.write("sd-test-token\n")
    os.makedirs(os.path.join(tmp, "ck"))
    coord = subprocess.Popen(
        [ptcoord, "--listen", "127.0.0.1:0", "--state-dir", f"{tmp}/state",
         "--local-slots", "2", "--token-file", f"{tmp}/tokens",
         "--data-root", os.path.join(src, "data"), "--data-root", f"{tmp}/ck",
         "--metrics-listen", "127.0.0.1:0", "--log-level", "warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checks = []
    if renamed:
        checks.append(("the host name resolves nowhere (precondition)",
                       not resolves(socket.gethostname())))
    try:
        read = lambda name: (open(f"{tmp}/state/{name}").read().strip()
                             if os.path.exists(f"{tmp}/state/{name}") else "")
        server = wait_for(lambda: read("address"), 30, "ptcoord's address")
        metrics = wait_for(lambda: read("metrics_address"), 30, "metrics")
        env = dict(os.environ, PTCTL_SERVER=server, PTCTL_TOKEN="sd-test-token")
        job = subprocess.run(
            [ptctl, "submit", os.path.join(src, "examples/shakespeare-char.yaml"),
             "--set", "parallel.dp=2", "--set", "train.steps=100000",
             "--set", "model.n_layer=1", "--set", "model.n_embd=32",
             "--set", f"checkpoint.dir={tmp}/ck"],
            env=env, capture_output=True, text=True, check=True).stdout.split()[0]

        def two_targets():
            sd = json.loads(get(f"http://{metrics}/sd"))
            return sd if len(sd) == 2 else None
        sd = wait_for(two_targets, 60, "two ranks in /sd")
        ranks = sorted(t["labels"]["ptrain_rank"] for t in sd)
        checks.append(("sd lists ranks 0 and 1", ranks == ["0", "1"]))
        checks.append(("sd labels name the job",
                       all(t["labels"]["ptrain_job_id"] == job for t in sd)))
        checks.append(("sd labels name the node (this host)",
                       all(t["labels"].get("ptrain_node") == socket.gethostname()
                           for t in sd)))
        for t in sd:
            host = t["targets"][0].rsplit(":", 1)[0].strip("[]")
            try:
                ipaddress.ip_address(host)
                numeric = True
            except ValueError:
                numeric = False
            checks.append((f"rank {t['labels']['ptrain_rank']} is advertised "
                           f"under an address ({host})", numeric))
            page = get(f"http://{t['targets'][0]}/metrics")
            rank = t["labels"]["ptrain_rank"]
            checks.append((f"rank {rank} endpoint serves its series",
                           f'ptrain_step{{' in page and f'rank="{rank}"' in page))
        page = get(f"http://{metrics}/metrics")
        checks.append(("coordinator counts the running job",
                       'ptrain_jobs{state="RUNNING"} 1' in page))
        checks.append(("coordinator counts the job's attempts",
                       f'ptrain_job_attempts{{job_id="{job}",'
                       f'name="shakespeare-char"}} 1' in page))
        host = socket.gethostname()
        checks.append(("coordinator counts its host's slots, 2 of 2 used",
                       f'ptrain_node_slots{{kind="total",node="{host}"}} 2'
                       in page and
                       f'ptrain_node_slots{{kind="used",node="{host}"}} 2'
                       in page))
        checks.append(("coordinator counts the job's restarts, none",
                       f'ptrain_job_restarts{{job_id="{job}",'
                       f'name="shakespeare-char"}} 0' in page))
        def ranks_gone_after(verb):
            subprocess.run([ptctl, verb, job], env=env, check=True,
                           capture_output=True)
            wait_for(lambda: json.loads(get(f"http://{metrics}/sd")) == [],
                     60, f"an empty /sd after {verb}")
            return True

        # A pause and a resume start a second attempt: a requeue, not a
        # restart (the restart alert must not fire on pauses).
        checks.append(("paused ranks leave /sd", ranks_gone_after("pause")))
        wait_for(lambda: 'ptrain_jobs{state="PAUSED"} 1' in
                 get(f"http://{metrics}/metrics"), 60, "the job PAUSED")
        subprocess.run([ptctl, "resume", job], env=env, check=True,
                       capture_output=True)
        second = (f'ptrain_job_attempts{{job_id="{job}",'
                  f'name="shakespeare-char"}} 2')

        def second_attempt():
            p = get(f"http://{metrics}/metrics")
            return p if second in p else None
        page = wait_for(second_attempt, 60, "the job's second attempt")
        checks.append(("a pause is counted as a requeue",
                       'ptrain_job_requeues_total{reason="paused"} 1' in page))
        checks.append(("a pause is not counted as a restart",
                       "\nptrain_job_restarts_total 0\n" in page and
                       f'ptrain_job_restarts{{job_id="{job}",'
                       f'name="shakespeare-char"}} 0' in page))
        checks.append(("cancelled ranks leave /sd", ranks_gone_after("cancel")))
    finally:
        coord.terminate()
        coord.wait()
        # A leftover attempt (on failure) must not outlive the test.
        subprocess.run(["pkill", "-f", f"{tmp}/state"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    failed = sum(1 for _, ok in checks if not ok)
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed or not checks else 0


if __name__ == "__main__":
    sys.exit(main())
