#!/usr/bin/python3
"""The web UI under load: CLIENTS page clients (default 50) poll ptcoord's
UI for SECONDS (default 10) as the job page does — the job, its metrics
since the last answer, the jobs list, every 2 s, all clients at once, after
one full metrics load each — against a two-rank job training at about
STEPS_PER_S steps a second (a small model; the figure reached is printed).
Prints the latency of each endpoint (p50, p99, max), the requests served,
the job's steps a second meanwhile, and whether ptcoord's supervision ran
late (its log's "supervision ran late" lines). Target: p99 of
/api/v1/jobs/ID/metrics < 50 ms and no late supervision. Never fails on
time.

    bench/ui_load.py [--build build] [--clients 50] [--seconds 10]
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

TOKEN = "ui-load-token"


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Client(threading.Thread):
    """One page: the job page's polling, a connection a request (ptcoord
    closes each after its answer, as civetweb keeps a thread per open
    connection), its set-up counted in the latency."""

    def __init__(self, host, port, job, stop_at, period):
        super().__init__(daemon=True)
        self.host, self.port = host, port
        self.job, self.stop_at, self.period = job, stop_at, period
        self.times = {"metrics (first, whole)": [], "metrics (since)": [],
                      "job": [], "jobs": []}
        self.errors = 0

    def get(self, kind, path):
        start = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", path,
                         headers={"Authorization": f"Bearer {TOKEN}"})
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                self.errors += 1
                return None
        except (OSError, http.client.HTTPException):
            self.errors += 1
            return None
        finally:
            conn.close()
        self.times[kind].append((time.monotonic() - start) * 1e3)
        return json.loads(body)

    def run(self):
        base = f"/api/v1/jobs/{self.job}"
        m = self.get("metrics (first, whole)", base + "/metrics")
        since = m["next_since"] if m else 0
        rank_since = m["next_rank_since"] if m else 0
        while time.monotonic() < self.stop_at:
            tick = time.monotonic()
            self.get("job", base)
            m = self.get("metrics (since)", base + "/metrics?" +
                         urllib.parse.urlencode({"since": since,
                                                 "rank_since": rank_since}))
            if m:
                since, rank_since = m["next_since"], m["next_rank_since"]
            self.get("jobs", "/api/v1/jobs")
            time.sleep(max(0.0, self.period - (time.monotonic() - tick)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--period", type=float, default=2.0,
                   help="seconds between a page's polls (the page: 2)")
    a = p.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(a.build)
    tmp = tempfile.mkdtemp(prefix="ptrain_ui_load_")
    with open(f"{tmp}/tokens", "w") as f:
        f.write(TOKEN + "\n")
    os.makedirs(f"{tmp}/ck")
    log = open(f"{tmp}/ptcoord.log", "w+")
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
    coord = subprocess.Popen(
        [f"{build}/coordinator/ptcoord", "--listen", "127.0.0.1:0",
         "--state-dir", f"{tmp}/state", "--local-slots", "2",
         "--token-file", f"{tmp}/tokens", "--data-root", f"{src}/data",
         "--data-root", f"{tmp}/ck", "--ui-listen", "127.0.0.1:0"],
        stdout=log, stderr=log, env=env, cwd=src)
    try:
        state = f"{tmp}/state"
        for _ in range(300):
            if os.path.exists(f"{state}/ui_address") and os.path.exists(
                    f"{state}/address"):
                break
            time.sleep(0.1)
        server = open(f"{state}/address").read().strip()
        ui = urllib.parse.urlparse(open(f"{state}/ui_address").read().strip())
        cenv = dict(env, PTCTL_SERVER=server, PTCTL_TOKEN=TOKEN)
        # About 20 steps a second on two cores, long enough for the run.
        job = subprocess.run(
            [f"{build}/ptctl/ptctl", "submit", "examples/shakespeare-char.yaml",
             "--set", "parallel.dp=2", "--set", "train.steps=100000",
             "--set", "model.n_layer=2", "--set", "model.n_embd=96",
             "--set", "train.eval_every=200", "--set", "train.log_every=1000",
             "--set", "checkpoint.every=0", "--set", f"checkpoint.dir={tmp}/ck"],
            env=cenv, cwd=src, capture_output=True, text=True,
            check=True).stdout.split()[0]
        probe = Client(ui.hostname, ui.port, job, 0, 0)

        def step():
            j = probe.get("job", f"/api/v1/jobs/{job}")
            return j["job"]["step"] if j else 0

        deadline = time.monotonic() + 120
        while step() < 50 and time.monotonic() < deadline:
            time.sleep(0.5)
        log.seek(0, os.SEEK_END)
        late_before = open(f"{tmp}/ptcoord.log").read().count("ran late")
        step0, t0 = step(), time.monotonic()
        stop_at = t0 + a.seconds
        clients = [Client(ui.hostname, ui.port, job, stop_at, a.period)
                   for _ in range(a.clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        step1, t1 = step(), time.monotonic()
        late = open(f"{tmp}/ptcoord.log").read().count("ran late") - late_before
        subprocess.run([f"{build}/ptctl/ptctl", "cancel", job], env=cenv,
                       capture_output=True)
        subprocess.run([f"{build}/ptctl/ptctl", "watch", job], env=cenv,
                       capture_output=True, timeout=60)
    finally:
        coord.send_signal(signal.SIGTERM)
        coord.wait()
    print(f"{a.clients} page clients polling every {a.period:g} s for "
          f"{a.seconds:g} s; the job trained {(step1 - step0) / (t1 - t0):.1f} "
          f"steps/s meanwhile (2 ranks; {os.cpu_count()} cores)")
    print(f"{'endpoint':<24} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for kind in clients[0].times:
        t = [x for c in clients for x in c.times[kind]]
        print(f"{kind:<24} {len(t):>8} {percentile(t, 0.5):>8.1f} "
              f"{percentile(t, 0.99):>8.1f} {max(t) if t else float('nan'):>8.1f}")
    errors = sum(c.errors for c in clients)
    metrics = [x for c in clients for x in c.times["metrics (since)"]]
    p99 = percentile(metrics, 0.99)
    print(f"errors: {errors}; supervision ran late: {late} time(s)")
    print(f"target: p99 of /api/v1/jobs/ID/metrics < 50 ms and no late "
          f"supervision: {'met' if p99 < 50 and late == 0 else 'NOT met'} "
          f"(p99 {p99:.1f} ms)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
