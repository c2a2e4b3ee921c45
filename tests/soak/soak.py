#!/usr/bin/env python3
"""Chaos soak of the control plane: nothing a fault does may lose a job.

Several small jobs run under one ptcoord (on its own host, `--variant
local`, or on pretend nodes made of network and PID namespaces, `--variant
nodes`) while a seeded fault injector kills ranks (SIGKILL), stops ranks
past their hang timeout (SIGSTOP, then SIGCONT), kills ptcoord -9 and
restarts it on the same state, fills the checkpoint disk (a tmpfs) for a
while, submits a short job of high priority that preempts running ones
(they save the step they are in and resume from it), and on nodes kills a
node's ptworkerd or the whole node and brings it back. All the while a client polls every endpoint of ptcoord's web UI
and a slowloris client holds as many connections to it as it is let.
Then every job must have ended SUCCEEDED, every step any attempt trained
must have the loss the same job trained without faults has at that step,
bit for bit (resume is deterministic), every preempting job must have
ended SUCCEEDED too, no job may have trained a step past
the attempt that finished it nor started an attempt after it succeeded,
the store must pass its integrity checks, and the UI must have answered
every poll within UI_SECONDS but while ptcoord was down for a fault.

  soak.py --build BUILD --src SRC [--variant local|nodes] [--jobs N]
          [--faults N] [--seed S] [--long] [--references FILE]
  soak.py --build BUILD --src SRC [--jobs N] --write-references FILE

`--long` is the run by hand: 20 jobs and 100 faults. Prints the jobs, the
faults by kind, the restarts, the wall time and "N lost"; exits 0 when
nothing was lost, 1 otherwise, 77 (skipped) where it cannot make its tmpfs
or namespaces. Needs root.
"""

import argparse
import collections
import json
import os
import random
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from ranks import ptworker_pids  # noqa: E402

SKIP = 77
# The UI must answer a poll within this, whatever the faults and the
# slowloris client do (but while ptcoord itself is down).
UI_SECONDS = 2.0


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class UiLoad:
    """Polls every endpoint of ptcoord's web UI, one after the other, and
    holds slowloris connections to it from another address (127.0.0.2:
    the UI caps connections per address, and the poller's own must not be
    what it refuses). The UI's address is read again from the state dir
    after each failure: ptcoord restarts on another port."""

    SLOW = 100  # connections the slowloris client tries to hold

    def __init__(self, soak):
        self.soak = soak
        self.stop = threading.Event()
        self.polls = []  # (start, seconds, what, error or None)
        self.held_max = 0
        self.slow_opened = 0
        self.threads = [threading.Thread(target=self.poll_loop, daemon=True),
                        threading.Thread(target=self.slow_loop, daemon=True)]

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def address(self):
        try:
            with open(os.path.join(self.soak.state, "ui_address")) as f:
                url = f.read().strip()
        except OSError:
            return None
        return url.rstrip("/") if url.startswith("http://") else None

    def paths(self):
        job = self.soak.jobs[0][0] if self.soak.jobs else "job-0001"
        return ["/", "/nodes", f"/jobs/{job}", "/static/ui.js",
                "/api/v1/jobs", "/api/v1/nodes", f"/api/v1/jobs/{job}",
                f"/api/v1/jobs/{job}/metrics",
                f"/api/v1/jobs/{job}/log?stream=stderr"]

    def poll_loop(self):
        while not self.stop.is_set():
            base = self.address()
            if base is None:
                time.sleep(0.2)
                continue
            for path in self.paths():
                if self.stop.is_set():
                    break
                req = urllib.request.Request(
                    base + path,
                    headers={"Authorization": f"Bearer {self.soak.token}"})
                t0 = time.time()
                error = None
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        r.read()
                        if r.status != 200:
                            error = f"HTTP {r.status}"
                except urllib.error.HTTPError as e:
                    error = f"HTTP {e.code}"
                except (OSError, ValueError) as e:
                    error = f"{type(e).__name__}: {e}"
                self.polls.append((t0, time.time() - t0, path, error))
                if error is not None:
                    time.sleep(0.2)
                    break  # read the address again
            # A round a second, as a few open browser tabs poll: the UI's
            # answers are what is measured, not how much load a 2-core
            # machine's training can bear beside them.
            time.sleep(1.0)

    def slow_loop(self):
        """Opens connections from 127.0.0.2 until it holds SLOW of them,
        each sending its headers a line every 5 s and never ending them."""
        held = []  # (socket, next send)
        base = None
        while not self.stop.is_set():
            now = time.time()
            url = self.address()
            if url != base:  # ptcoord restarted: start over
                for sock, _ in held:
                    sock.close()
                held = []
                base = url
            if base is not None and len(held) < self.SLOW:
                host, port = base[len("http://"):].rsplit(":", 1)
                sock = socket.socket()
                sock.settimeout(1)
                try:
                    sock.bind(("127.0.0.2", 0))
                    sock.connect((host, int(port)))
                    sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\n"
                                 .encode())
                    held.append((sock, now + 5))
                    self.slow_opened += 1
                except OSError:
                    sock.close()
            alive = []
            for sock, due in held:
                if now < due:
                    alive.append((sock, due))
                    continue
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                    alive.append((sock, now + 5))
                except OSError:
                    sock.close()  # the UI let it go: another takes its place
            held = alive
            self.held_max = max(self.held_max, len(held))
            time.sleep(0.02 if len(held) < self.SLOW else 0.5)
        for sock, _ in held:
            sock.close()

    def failures(self, down):
        """Polls that failed or took longer than UI_SECONDS outside the
        windows `down` ([(from, to)]) when ptcoord was not running."""
        bad = []
        for t0, secs, path, error in self.polls:
            if any(t0 <= b and t0 + secs >= a for a, b in down):
                continue
            if error is not None or secs > UI_SECONDS:
                bad.append(f"{path} at +{t0 - self.polls[0][0]:.0f} s: "
                           f"{error or f'{secs:.1f} s'}")
        return bad

    def summary(self):
        secs = sorted(p[1] for p in self.polls if p[3] is None)
        worst = secs[-1] if secs else float("nan")
        median = secs[len(secs) // 2] if secs else float("nan")
        return (f"UI: {len(self.polls)} polls, median {median * 1000:.0f} ms, "
                f"slowest answered {worst:.2f} s; slowloris opened "
                f"{self.slow_opened}, held at most {self.held_max} at once")


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.t = tempfile.mkdtemp(prefix=f"ptrain-soak-{args.variant}-")
        os.chmod(self.t, 0o700)
        self.ckpt = os.path.join(self.t, "ckpt")  # the tmpfs
        self.state = os.path.join(self.t, "state")
        self.coord = None
        self.port = 0
        self.addr = ""
        self.token = ""
        self.stopped = {}  # pid -> time to SIGCONT it
        self.faults = collections.Counter()
        self.jobs = []  # (id, overrides, world)
        self.preemptors = []  # ids of the jobs of high priority submitted
        self.mounted = False
        self.nodes_up = False
        self.down = []  # (from, to): ptcoord killed until it listened again
        self.env_mn = dict(os.environ, MN_PREFIX="ps7", MN_SUBNET3="10.78.37",
                           MN_STATE_DIR=os.path.join(self.t, "mn"))
        self.bin = lambda *p: os.path.join(args.build, *p)

    # ---- the machinery -------------------------------------------------

    def mn(self, *cmd, check=True):
        """A function of tests/multinode/cluster.sh."""
        script = (f"source {shlex.quote(self.a.src)}/tests/multinode/cluster.sh; "
                  + " ".join(shlex.quote(c) for c in cmd))
        r = subprocess.run(["bash", "-c", script], env=self.env_mn,
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        return r.stdout.strip()

    def mount_disk(self):
        os.makedirs(self.ckpt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o",
                            f"size={self.a.disk_mb}m,mode=0700", "tmpfs",
                            self.ckpt], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"SKIP: cannot mount a tmpfs for the checkpoints: "
                  f"{r.stderr.strip()}")
            sys.exit(SKIP)
        self.mounted = True

    def listen_host(self):
        return self.mn("mn_host_addr") if self.a.variant == "nodes" \
            else "127.0.0.1"

    def start_coordinator(self):
        cmd = [self.bin("coordinator", "ptcoord"), "--state-dir", self.state,
               "--listen", f"{self.listen_host()}:{self.port}",
               "--data-root", self.ckpt,
               "--data-root", os.path.join(self.a.src, "data"),
               "--work-root", self.a.src, "--cancel-grace-s", "2",
               "--ui-listen", "127.0.0.1:0"]
        if self.a.variant == "local":
            cmd += ["--local-slots", str(self.a.slots)]
        else:
            cmd += ["--join-token-file", os.path.join(self.t, "join"),
                    "--node-timeout-s", "4",
                    "--cluster-network", "10.78.37.0/24",
                    "--ptrsh", self.bin("worker", "ptrsh")]
        address = os.path.join(self.state, "address")
        if os.path.exists(address):
            os.remove(address)
        out = open(os.path.join(self.t, "ptcoord.log"), "a")
        self.coord = subprocess.Popen(cmd, stdout=out, stderr=out,
                                      start_new_session=True)
        # A loaded machine (2 cores, other tests) can take seconds to start
        # it: it asks ptworker --help and recovers every attempt first.
        deadline = time.time() + 120
        while not (os.path.exists(address) and open(address).read().strip()):
            if self.coord.poll() is not None:
                raise RuntimeError("ptcoord exited at start (ptcoord.log)")
            if time.time() > deadline:
                raise RuntimeError("ptcoord did not listen within 120 s")
            time.sleep(0.05)
        self.addr = open(address).read().strip()
        self.port = int(self.addr.rsplit(":", 1)[1])
        self.token = open(os.path.join(self.state, "user-token")).read().strip()

    def kill_coordinator(self):
        self.coord.kill()
        self.coord.wait()

    def ptctl(self, *args, check=True):
        env = dict(os.environ, PTCTL_SERVER=self.addr, PTCTL_TOKEN=self.token)
        deadline = time.time() + 120
        while True:
            r = subprocess.run([self.bin("ptctl", "ptctl"), *args], env=env,
                               capture_output=True, text=True)
            # ptcoord may be down for a fault: ask again.
            if r.returncode == 0 or not check or time.time() > deadline:
                break
            time.sleep(0.2)
        if r.returncode == 0 or not check:
            return r
        raise RuntimeError(f"ptctl {' '.join(args)}: {r.stderr.strip()}")

    def job(self, job_id):
        return json.loads(self.ptctl("-o", "json", "get", job_id).stdout)

    def start_node(self, k):
        """Node K with its ptworkerd under a shell that stays the node's
        init, so that the daemon can die alone."""
        state = os.path.join(self.t, f"node{k}-state")
        self.mn("mn_node_run", str(k), os.path.join(self.t, f"node{k}.log"),
                "sh", "-c", '"$@" & wait; exec sleep 100000', "sh",
                self.bin("worker", "ptworkerd"), "--coordinator", self.addr,
                "--name", self.mn("mn_ns", str(k)), "--slots",
                str(self.a.slots), "--listen", "0.0.0.0:7071", "--advertise",
                f"{self.mn('mn_addr', str(k))}:7071", "--join-token-file",
                os.path.join(self.t, "join"), "--state-dir", state,
                "--orphan-timeout-s", "20")

    # ---- the jobs ------------------------------------------------------

    LAYOUTS = [
        (1, []),
        (2, ["parallel.dp=2", "parallel.zero=1"]),
        (2, ["parallel.tp=2"]),
        (2, ["parallel.pp=2", "parallel.microbatches=2"]),
        (2, ["parallel.dp=2", "parallel.zero=3"]),
    ]

    def overrides(self, i):
        world, layout = self.LAYOUTS[i % len(self.LAYOUTS)]
        return world, [
            f"name=soak-{i}", "model.n_layer=2", "model.n_embd=32",
            "model.n_head=2", "model.block_size=32",
            f"train.steps={self.a.steps}", "train.global_batch=8",
            "train.warmup_steps=10", "train.eval_every=50",
            "train.eval_batches=2", "train.sample_every=0",
            "train.sample_tokens=8", "train.log_every=100",
            f"train.seed={1000 + i}", "resources.threads_per_rank=1",
            "checkpoint.every=10", "checkpoint.keep_last=2",
            f"checkpoint.dir={self.ckpt}/jobs", "restart.max_restarts=10000",
            f"restart.hang_timeout_s={self.a.hang_s}",
        ] + layout

    def reference(self, i):
        """The job run once without faults: loss by step."""
        world, sets = self.overrides(i)
        out = os.path.join(self.t, f"ref-{i}.jsonl")
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n",
               str(world), self.bin("worker", "ptworker"), "--config",
               "examples/shakespeare-char.yaml", "--log-json", out]
        for s in sets:
            cmd += ["--set", s]
        # Saving changes no loss: the reference saves nothing (and is the
        # faster for it).
        cmd += ["--set", "checkpoint.every=0",
                "--set", f"checkpoint.dir={self.t}/ref-ckpt-{i}"]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   OMPI_MCA_mpi_yield_when_idle="1")
        r = subprocess.run(cmd, cwd=self.a.src, env=env, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise RuntimeError(f"reference run {i} failed: {r.stderr[-2000:]}")
        return {rec["step"]: rec["loss"] for rec in map(json.loads, open(out))
                if rec.get("type") == "step"}

    def defining(self, i):
        """Job i's world and the overrides its losses follow from (not
        where it saves, a folder of this run's own)."""
        world, sets = self.overrides(i)
        return [world, [s for s in sets if not s.startswith("checkpoint.dir=")]]

    def references(self):
        """Every job's run without faults: read from --references when that
        file holds these very jobs (the soak_references test writes it once
        for both variants), else run here."""
        want = [self.defining(i) for i in range(self.a.jobs)]
        path = self.a.references
        if path and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            if [[j["world"], j["overrides"]] for j in saved["jobs"]] != want:
                raise RuntimeError(f"{path} holds other jobs than this run's "
                                   "(other --jobs or --steps?)")
            log(f"references of {self.a.jobs} jobs read from {path}")
            return [{int(s): l for s, l in j["loss"].items()}
                    for j in saved["jobs"]]
        log(f"reference runs of {self.a.jobs} jobs (no faults)")
        return [self.reference(i) for i in range(self.a.jobs)]

    def write_references(self, path):
        jobs = [{"world": w, "overrides": o, "loss": loss}
                for (w, o), loss in zip(map(self.defining, range(self.a.jobs)),
                                        self.references())]
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"jobs": jobs}, f)
        os.replace(tmp, path)
        log(f"references of {self.a.jobs} jobs written to {path}")

    def submit(self, i):
        world, sets = self.overrides(i)
        args = ["submit",
                os.path.join(self.a.src, "examples", "shakespeare-char.yaml")]
        for s in sets:
            args += ["--set", s]
        r = self.ptctl(*args)
        job_id = r.stdout.split()[0]
        self.jobs.append((job_id, i, world))

    # ---- the faults ----------------------------------------------------

    def ranks(self):
        """Live ptworker processes of this ptcoord's attempts (pid list)."""
        return ptworker_pids("PTRAIN_ATTEMPT_UID=",
                             f"PTRAIN_COORDINATOR={self.addr}",
                             running_only=True)

    def fill_disk(self, seconds):
        path = os.path.join(self.ckpt, "filler")
        with open(path, "wb") as f:
            block = b"\0" * (1 << 20)
            try:
                while True:
                    f.write(block)
                    f.flush()
            except OSError:
                pass
        time.sleep(seconds)
        os.remove(path)

    def inject(self, kind):
        """Applies one fault; False when it has no target now."""
        if kind in ("rank_kill", "rank_stop"):
            ranks = self.ranks()
            if not ranks:
                return False
            pid = self.rng.choice(ranks)
            if kind == "rank_kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                self.stopped[pid] = time.time() + self.a.hang_s + 3
            log(f"{kind} pid {pid}")
        elif kind == "coordinator_kill":
            down_from = time.time()
            self.kill_coordinator()
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.start_coordinator()
            self.down.append((down_from, time.time()))
            log("ptcoord killed -9 and restarted")
        elif kind == "preempt":
            # Two slots at high priority: where they are not free, the
            # fewest running jobs that free them are preempted.
            if not self.ranks():
                return False
            _, sets = self.overrides(1)  # the dp=2 layout
            sets = [x for x in sets if not x.startswith(("name=",
                                                         "train.steps="))]
            sets += [f"name=soak-preempt-{len(self.preemptors)}",
                     "train.steps=30", "priority=high"]
            args = ["submit", os.path.join(self.a.src, "examples",
                                           "shakespeare-char.yaml")]
            for x in sets:
                args += ["--set", x]
            job_id = self.ptctl(*args).stdout.split()[0]
            self.preemptors.append(job_id)
            log(f"preempt: {job_id} of high priority submitted")
        elif kind == "disk_full":
            seconds = self.rng.uniform(1.0, 4.0)
            log(f"checkpoint disk full for {seconds:.1f} s")
            self.fill_disk(seconds)
        elif kind in ("daemon_kill", "node_kill"):
            k = self.rng.randint(1, self.a.nodes)
            if kind == "daemon_kill":
                # The daemon alone: its orteds die with it, and its ranks
                # once they lose their orted.
                for p in self.mn("mn_node_pids", str(k)).split():
                    try:
                        if open(f"/proc/{p}/comm").read().strip() == \
                                "ptworkerd":
                            os.kill(int(p), signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(self.rng.uniform(1.0, 3.0))
            # Then the node goes whole (or at once, for node_kill) and comes
            # back with a new daemon that proves its name with its secret.
            self.mn("mn_node_kill", str(k))
            time.sleep(self.rng.uniform(1.0, 3.0))
            self.start_node(k)
            log(f"{kind} node {k}, back")
        self.faults[kind] += 1
        return True

    def resume_stopped(self, everything=False):
        for pid, at in list(self.stopped.items()):
            if everything or time.time() >= at:
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
                del self.stopped[pid]

    # ---- the checks ----------------------------------------------------

    def check(self, refs, started, ui):
        lost = [f"ui: {f}" for f in ui.failures(self.down)[:10]]
        restarts = 0
        preempted = 0
        steps = self.a.steps
        db = sqlite3.connect(os.path.join(self.state, "ptcoord.db"))
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        if integrity != "ok":
            lost.append(f"store: integrity_check says {integrity}")
        for job_id, i, _ in self.jobs:
            got = self.job(job_id)
            job = got["job"]
            attempts = int(job.get("attempts", 0))
            restarts += max(0, attempts - 1)
            why = []
            if job.get("state") != "JOB_STATE_SUCCEEDED":
                why.append(f"ended {job.get('state')}: {job.get('error', '')}")
            if len(got.get("attempts", [])) != attempts:
                why.append(f"{len(got.get('attempts', []))} attempt records "
                           f"for {attempts} attempts")
            if int(job.get("progress", {}).get("step", 0)) != steps:
                why.append(f"progress at step {job.get('progress')}")
            # Every step any attempt trained, against the run without faults.
            finished_in = []
            trained_after = []
            final_seen = False
            for n in range(1, attempts + 1):
                path = os.path.join(self.state, "jobs", job_id,
                                    f"attempt-{n}", "run.jsonl")
                if not os.path.exists(path):
                    continue
                for line in open(path):
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill
                    if rec.get("type") == "step":
                        s = rec["step"]
                        if finished_in:
                            trained_after.append((n, s))
                        if rec["loss"] != refs[i][s]:
                            why.append(f"attempt {n} step {s}: loss "
                                       f"{rec['loss']!r}, without faults "
                                       f"{refs[i][s]!r}")
                        final_seen |= s == steps
                    elif rec.get("type") == "end":
                        finished_in.append(n)
            if not final_seen:
                why.append(f"no attempt logged step {steps}")
            if trained_after:
                why.append(f"trained past its finish: {trained_after[:3]}")
            # ptcoord's own history: nothing started once it had succeeded.
            events = [m for (m,) in db.execute(
                "SELECT message FROM events WHERE job_id=? ORDER BY id",
                (job_id,))]
            done = [k for k, m in enumerate(events)
                    if m.startswith("succeeded on attempt")]
            if len(done) != 1:
                why.append(f"{len(done)} 'succeeded' events")
            elif any(" started" in m and m.startswith("attempt ")
                     for m in events[done[0]:]):
                why.append("an attempt started after it succeeded")
            # Its checkpoints as listed are committed and whole.
            listed = json.loads(self.ptctl("-o", "json", "checkpoints",
                                           job_id).stdout)
            for c in listed.get("checkpoints", []):
                r = subprocess.run(["sha256sum", "--quiet", "-c",
                                    "manifest.sha256"], cwd=c["dir"],
                                   capture_output=True)
                if r.returncode != 0:
                    why.append(f"checkpoint {c['dir']} is not whole")
            if why:
                lost.append(f"{job_id} (soak-{i}): " + "; ".join(why[:4]))
            preempted += int(job.get("requeues", {}).get("preempted", 0))
        for job_id in self.preemptors:
            job = self.job(job_id)["job"]
            if job.get("state") != "JOB_STATE_SUCCEEDED":
                lost.append(f"{job_id} (preempting): ended {job.get('state')}:"
                            f" {job.get('error', '')}")
        wall = time.time() - started
        print(f"SOAK {self.a.variant}: {len(self.jobs)} jobs, "
              f"{sum(self.faults.values())} faults "
              f"({', '.join(f'{k} {v}' for k, v in sorted(self.faults.items()))}), "
              f"{restarts} restarts, {preempted} preemptions, "
              f"{wall:.0f} s wall, {len(lost)} lost")
        print(ui.summary())
        for line in lost:
            print(f"LOST: {line}")
        return not lost

    # ---- the run -------------------------------------------------------

    def run(self):
        started = time.time()
        self.mount_disk()
        kinds = ["rank_kill", "rank_stop", "coordinator_kill", "disk_full",
                 "preempt"]
        if self.a.variant == "nodes":
            kinds += ["daemon_kill", "node_kill"]
            with open(os.path.join(self.t, "join"), "w") as f:
                f.write(f"soak-join-{os.getpid()}\n")
            os.chmod(os.path.join(self.t, "join"), 0o600)
            self.mn("mn_down", check=False)
            self.nodes_up = True
            self.mn("mn_up", str(self.a.nodes))
        refs = self.references()
        self.start_coordinator()
        if self.a.variant == "nodes":
            for k in range(1, self.a.nodes + 1):
                self.start_node(k)
        for i in range(self.a.jobs):
            self.submit(i)
        ui = UiLoad(self)
        ui.start()
        log(f"{self.a.jobs} jobs submitted; {self.a.faults} faults to come "
            "while the web UI is polled and held by a slowloris client")
        injected = 0
        deadline = time.time() + self.a.timeout_s
        while time.time() < deadline:
            self.resume_stopped()
            states = [self.job(j)["job"].get("state")
                      for j in [j for j, _, _ in self.jobs] + self.preemptors]
            final = all(s in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                              "JOB_STATE_CANCELLED") for s in states)
            if final and not self.stopped:
                break
            if injected < self.a.faults and not final:
                time.sleep(self.rng.uniform(0.3, 1.5))
                kind = self.rng.choice(kinds)
                if self.inject(kind):
                    injected += 1
            else:
                time.sleep(0.5)
        self.resume_stopped(everything=True)
        ui.finish()
        if injected < self.a.faults:
            log(f"only {injected} of {self.a.faults} faults: the jobs ended "
                "first (more steps per job would leave room for them)")
        return self.check(refs, started, ui)

    def cleanup(self):
        self.resume_stopped(everything=True)
        if self.coord is not None and self.coord.poll() is None:
            self.kill_coordinator()
        for pid in self.ranks():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        subprocess.run(["pkill", "-9", "-f", f"--state-dir {self.state}"],
                       capture_output=True)
        if self.nodes_up:
            self.mn("mn_down", check=False)
        if self.mounted:
            subprocess.run(["umount", "-l", self.ckpt], capture_output=True)
        shutil.rmtree(self.t, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--variant", choices=["local", "nodes"], default="local")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--faults", type=int, default=12)
    p.add_argument("--steps", type=int, default=2500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--hang-s", type=int, default=5)
    p.add_argument("--disk-mb", type=int, default=64)
    p.add_argument("--timeout-s", type=int, default=600)
    p.add_argument("--long", action="store_true",
                   help="the run by hand: 20 jobs, 100 faults")
    p.add_argument("--references", metavar="FILE",
                   help="the runs without faults, as --write-references "
                        "wrote them (run here when FILE does not exist)")
    p.add_argument("--write-references", metavar="FILE",
                   help="only run the jobs without faults and write FILE")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    a.src = os.path.abspath(a.src)
    if a.long:
        # Nodes run more jobs at once (and a node fault takes seconds):
        # longer jobs leave room for every fault before they end.
        a.jobs, a.faults, a.timeout_s = 20, 100, 7200
        a.steps = 15000 if a.variant == "local" else 40000
    if os.geteuid() != 0:
        print("SKIP: the soak needs root (a tmpfs, namespaces)")
        return SKIP
    if a.write_references:
        a.references = None
        soak = Soak(a)
        try:
            soak.write_references(a.write_references)
        finally:
            shutil.rmtree(soak.t, ignore_errors=True)
        return 0
    # A mount namespace of our own, so that the tmpfs is ours alone (where
    # / is not a mount point, as in a chroot, the tmpfs is unmounted at the
    # end instead).
    if os.environ.get("PTRAIN_SOAK_NS") != "1":
        env = dict(os.environ, PTRAIN_SOAK_NS="1")
        for prop in ("private", "unchanged"):
            r = subprocess.run(["unshare", "--mount", "--propagation", prop,
                                "true"], capture_output=True)
            if r.returncode == 0:
                os.execvpe("unshare", ["unshare", "--mount", "--propagation",
                                       prop, sys.executable, *sys.argv], env)
        print("SKIP: cannot make a mount namespace (unshare --mount)")
        return SKIP
    if a.variant == "nodes":
        r = subprocess.run(["unshare", "--net", "--pid", "--fork", "true"],
                           capture_output=True)
        if shutil.which("ip") is None or r.returncode != 0:
            print("SKIP: cannot create network and PID namespaces here")
            return SKIP
    soak = Soak(a)
    ok = False
    try:
        ok = soak.run()
    finally:
        if not ok:
            for name in ("ptcoord.log", "node1.log"):
                path = os.path.join(soak.t, name)
                if os.path.exists(path):
                    print(f"== {name} (last 30 lines)")
                    print("".join(open(path).readlines()[-30:]))
        soak.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
