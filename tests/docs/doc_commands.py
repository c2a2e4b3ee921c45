#!/usr/bin/env python3
"""Runs the ```sh commands of README.md and docs/*.md as written, from the repository root.

Not a test of what they compute (the unit, mpi and integration tests do that): it proves
that what a reader copies from the docs runs -- paths, flags, examples -- and says, for
every command it does not run here, why.

  tests/docs/doc_commands.py --build build --src .          # run them
  tests/docs/doc_commands.py --src . --list                 # what would run, what is skipped

Trainings run until they log their first step (at most 45 s), then get SIGINT and must
stop as ptworker documents it (exit 3; under mpirun, the ranks stop with 3 and mpirun
exits 1). ptctl commands run against one ptcoord started
from the README's own ptcoord command (free ports and a temporary state dir substituted),
their job placeholders (job-0001, JOB) replaced by the job this run submitted. Benchmarks
that take minutes run with --help instead, and every flag the doc gives them must be in
that help. A command whose comment says it fails (`# fails`, `# refused`, `# exits 2`)
must fail so. Skipped commands still name real scripts and, for ptrain's binaries, only
flags their --help lists. Exit 1 when a command did not do what its doc says; else 0.
"""

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Benchmarks that finish in a few seconds as written (timed on the 2-core CI machine);
# every other one takes 15 s to minutes and runs with --help instead.
SHORT_BENCHMARKS = {"attention_bench": "about 5 s"}

TRAIN_HARD_LIMIT_S = 45  # a training that has logged no step gets SIGINT by then
STOP_GRACE_S = 40        # from SIGINT to exit (8 ranks save their checkpoint)
RUN_LIMIT_S = 90         # any command that is not stopped on purpose
FOLLOW_S = 3             # `watch`, `logs -f`, `tail -f`: followed this long

ROOT_PROGRAMS = {"sudo", "apt", "apt-get", "dpkg", "systemctl", "useradd", "usermod",
                 "chown", "install", "journalctl", "modprobe"}
SLURM_PROGRAMS = {"sbatch", "srun", "squeue", "scancel", "scontrol", "salloc"}
PT_BINARIES = {"ptcoord": "coordinator/ptcoord", "ptctl": "ptctl/ptctl",
               "ptworkerd": "worker/ptworkerd", "ptworker": "worker/ptworker",
               "ptrsh": "worker/ptrsh"}
PTCTL_SUBCOMMANDS = {"submit", "get", "list", "logs", "cancel", "pause", "resume", "delete", "watch",
                     "checkpoints", "nodes", "drain", "uncordon", "forget-node"}
NODE_SUBCOMMANDS = {"drain", "uncordon", "forget-node"}
# A job named in a doc: the first job of a fresh ptcoord, or a placeholder.
JOB_PLACEHOLDER = re.compile(r"\b(job-\d{4}|JOB[-_]ID|JOB)\b")
# Words that stand for something the reader fills in.
PLACEHOLDER = re.compile(r"^(NODE|DIR|FILE|HOST:PORT|CIDR|N|PATH|TOKEN|ROUNDS)$")
OPERATORS = {"|", "||", "&&", ";", "&", "(", ")", "|&", ";;"}
REDIRECTS = {">", ">>", "<", ">|", "&>", ">&", "2>", "2>>"}


# ---------------------------------------------------------------- extraction


@dataclasses.dataclass
class Command:
    file: str     # relative to the repository
    line: int     # first line of the command
    text: str     # continuation lines joined, comments dropped
    comment: str  # the comments on its lines, for what the doc says of it

    @property
    def where(self):
        return f"{self.file}:{self.line}"

    @property
    def short(self):
        s = " ".join(self.text.split())
        return s if len(s) <= 110 else s[:107] + "..."


def split_comment(line, quote):
    """Returns (code, comment, quote open at the end) of one line, given the quote open at
    its start: a `#` starts a comment only outside quotes, at the start of a word."""
    code = []
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            if c == "'":
                quote = None
        elif c == "\\" and i + 1 < len(line):
            code.append(c)
            i += 1
            c = line[i]
        elif quote == '"':
            if c == '"':
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (not code or code[-1].isspace() or code[-1] in ";&|("):
            return "".join(code), line[i + 1:].strip(), quote
        code.append(c)
        i += 1
    return "".join(code), "", quote


def extract(src, rel):
    commands = []
    lines = (src / rel).read_text(encoding="utf-8").splitlines()
    in_block = False
    buf, comments, start, quote = [], [], 0, None

    def flush():
        text = "".join(buf).strip()
        if text:
            commands.append(Command(rel, start, text, " | ".join(comments)))

    for n, raw in enumerate(lines, 1):
        if not in_block:
            in_block = re.match(r"^\s*```(sh|bash)\s*$", raw) is not None
            continue
        if quote is None and raw.strip().startswith("```"):
            flush()
            in_block, buf, comments = False, [], []
            continue
        code, comment, quote = split_comment(raw, quote)
        if not buf:
            start = n
        if comment:
            comments.append(comment)
        if quote is not None:  # a quoted string goes on (python3 -c '...')
            buf.append(code + "\n")
            continue
        stripped = code.rstrip()
        if stripped.endswith("\\"):
            buf.append(stripped[:-1] + " ")
            continue
        buf.append(code)
        flush()
        buf, comments = [], []
    return commands


def doc_files(src):
    files = ["README.md"] + sorted(str(p.relative_to(src)) for p in (src / "docs").glob("*.md"))
    return [f for f in files if (src / f).is_file()]


# ---------------------------------------------------------------- what a command is


@dataclasses.dataclass
class Segment:
    words: list       # assignments and redirections taken out
    assigns: list
    writes: list      # targets of > and >>
    program: str      # the program that does the work (under mpirun, python3: the one it starts)
    launcher: str     # "mpirun", "python3" or ""


def segments(text):
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return []
    segs, cur = [], []
    for t in tokens + [";"]:
        if t in OPERATORS:
            if cur:
                segs.append(cur)
            cur = []
        else:
            cur.append(t)
    out = []
    for toks in segs:
        words, assigns, writes = [], [], []
        i = 0
        while i < len(toks):
            t = toks[i]
            if t in REDIRECTS:
                if t.startswith(">") or t.startswith("2>") or t == "&>":
                    if i + 1 < len(toks):
                        writes.append(toks[i + 1])
                i += 2
                continue
            if not words and re.match(r"^[A-Za-z_]\w*=", t):
                assigns.append(t)
            else:
                words.append(t)
            i += 1
        program, launcher = (words[0] if words else ""), ""
        if Path(program).name in ("mpirun", "mpiexec"):
            launcher = "mpirun"
            program = next((w for w in words[1:] if "/" in w and not w.startswith("-")), "")
        elif Path(program).name.startswith("python"):
            launcher = "python3"
            program = next((w for w in words[1:] if not w.startswith("-")), "")
        out.append(Segment(words, assigns, writes, program, launcher))
    return out


@dataclasses.dataclass
class Plan:
    kind: str         # skip, export, server, ptctl, coordinated, train, ptworker, bench, shell
    reason: str = ""  # why skipped
    check: list = dataclasses.field(default_factory=list)  # (binary, subcommand, flags) of a skipped command
    exists: list = dataclasses.field(default_factory=list)  # paths a skipped command needs


def doc_flags(seg, after_program=True):
    words = seg.words
    if after_program and seg.program in words:
        words = words[words.index(seg.program) + 1:]
    flags = []
    for w in words:
        w = w.strip("[]…")
        if w.startswith("--") and "=" not in w and len(w) > 2:
            flags.append(w)
    return flags


def pt_name(program):
    """ptctl, build/ptctl/ptctl -> ptctl; anything else -> None."""
    name = Path(program).name
    if name in PT_BINARIES and (program == name or program.endswith(PT_BINARIES[name])):
        return name
    return None


def ptctl_subcommand(seg):
    return next((w for w in seg.words[1:] if w in PTCTL_SUBCOMMANDS), "")


def flag_checks(segs):
    checks = []
    for seg in segs:
        name = pt_name(seg.program)
        if name:
            sub = ptctl_subcommand(seg) if name == "ptctl" else ""
            if name == "ptcoord" and seg.words[1:3] == ["users", "add"]:
                sub = "users add"
            checks.append((name, sub, doc_flags(seg)))
    return checks


def optional_parts(text, programs):
    """A synopsis's [--flag X] in a command that names a program by its path: the reader who
    pastes it passes "[--flag" as an argument."""
    unquoted = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"", "", text)
    return any("/" in p for p in programs) and re.search(r"(?<![\w$])\[-{0,2}[A-Za-z]", unquoted)


def classify(cmd):
    segs = segments(cmd.text)
    if not segs:
        return Plan("skip", "not shell (unbalanced quotes)"), segs
    programs = [s.program for s in segs]
    firsts = [s.words[0] if s.words else "" for s in segs]
    words = [w for s in segs for w in s.words + s.writes]
    checks = flag_checks(segs)
    text, comment = cmd.text, cmd.comment

    def skip(reason, exists=()):
        return Plan("skip", reason, checks, list(exists)), segs

    if optional_parts(text, programs):
        return Plan("optional", "[optional] parts in a command a reader runs by its path: as "
                    "written they are arguments (put them in the comment)", checks), segs
    if set(firsts) & ROOT_PROGRAMS or any(w.startswith("/etc/") for w in words):
        used = sorted(set(firsts) & ROOT_PROGRAMS) or ["writes /etc"]
        return skip(f"needs root and changes the system ({', '.join(used)}): an operator's set-up")
    scripts = [p for p in programs if re.match(r"^(\./)?scripts/.*\.sh$", p)]
    if scripts:
        return skip("set-up and CI scripts (setup installs packages as root; demo and test take "
                    "minutes; CI runs them on a fresh machine)", scripts)
    if ("device=cuda" in text or "device: cuda" in text or "nvidia-smi" in firsts
            or any("gpu" in Path(p).name or "cuda" in Path(p).name for p in programs)
            or "(GPU)" in comment):
        return skip("needs an NVIDIA GPU")
    if set(firsts) & SLURM_PROGRAMS or "--launcher slurm" in text or cmd.file == "docs/slurm.md":
        return skip("needs a Slurm cluster (sbatch, slurmd on the nodes)")
    if ("ssh" in firsts or "10.0.0." in text or "/shared/" in text
            or "ptworkerd" in [Path(p).name for p in programs] or cmd.file == "docs/multinode.md"):
        return skip("needs the multinode cluster (other machines on one network, a shared "
                    "filesystem, ptworkerd on each)")
    node = [s for s in segs if pt_name(s.program) == "ptctl" and ptctl_subcommand(s) in NODE_SUBCOMMANDS]
    if node:
        return skip(f"`ptctl {ptctl_subcommand(node[0])}` needs a node that registered "
                    "(ptworkerd on a cluster); `ptctl nodes` runs instead")
    bench_scripts = [p for p in programs if re.match(r"^(\./)?bench/.*\.sh$", p)]
    if bench_scripts:
        return skip("benchmark script: minutes as written and no --help", bench_scripts)
    bare = [p for p in programs if p in PT_BINARIES]
    if bare:
        return skip(f"a synopsis, not a command: bare `{bare[0]}` (the build puts nothing on "
                    "PATH); its flags are checked against --help")
    holders = [w for w in words if PLACEHOLDER.match(w)]
    if holders:
        return skip(f"placeholder {holders[0]} to fill in")

    if firsts[0] == "export":
        return Plan("export"), segs
    if any(pt_name(p) == "ptcoord" for p in programs):
        if text.rstrip().endswith("&"):
            return Plan("server"), segs
        return skip("ptcoord in the foreground serves until stopped; a backgrounded one (`&`) runs")
    if any(pt_name(p) == "ptctl" for p in programs):
        return Plan("ptctl"), segs
    if JOB_PLACEHOLDER.search(text):
        return Plan("coordinated"), segs
    worker = [s for s in segs if pt_name(s.program) == "ptworker"]
    if worker:
        sub = worker[0].words[worker[0].words.index(worker[0].program) + 1:][:1]
        return Plan("ptworker" if sub and not sub[0].startswith("-") else "train"), segs
    if any(p.startswith(("build/bench/", "bench/", "./bench/")) for p in programs):
        return Plan("bench"), segs
    return Plan("shell"), segs


def expected_failure(comment):
    """What the doc says a command does when it is meant to fail: an exit code, "nonzero",
    or None for a command meant to succeed."""
    m = re.search(r"\b(?:fails|is refused|refused|exits)\b\D{0,20}?(\d+)", comment)
    if m:
        return int(m.group(1))
    if re.search(r"\b(fails|is refused|refused)\b", comment):
        return "nonzero"
    return None


# ---------------------------------------------------------------- running


def describe_rc(rc):
    if rc is None:
        return "none"
    if rc < 0:
        try:
            return f"{rc} ({signal.Signals(-rc).name})"
        except ValueError:
            return str(rc)
    return str(rc)


def config_checkpoint_dir(src, config):
    """checkpoint.dir of a job spec, read the simple way our examples write it."""
    try:
        text = (src / config).read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r"^checkpoint:\s*\{[^}]*\bdir:\s*([^,}\s]+)", text, re.M)
    if m:
        return m.group(1)
    m = re.search(r"^checkpoint:\s*\n((?:[ \t]+.*\n)*)", text, re.M)
    if m:
        d = re.search(r"^\s+dir:\s*(\S+)", m.group(1), re.M)
        if d:
            return d.group(1)
    return None


def word_after(words, flag):
    for i, w in enumerate(words):
        if w == flag and i + 1 < len(words):
            return words[i + 1]
        if w.startswith(flag + "="):
            return w[len(flag) + 1:]
    return None


def set_value(words, key):
    value = None
    for i, w in enumerate(words):
        if w == "--set" and i + 1 < len(words) and words[i + 1].startswith(key + "="):
            value = words[i + 1][len(key) + 1:]
    return value


class Cleanup:
    """What the commands wrote into the repository, removed afterwards: new entries of a
    folder (checkpoint dirs), files named by a command (restored when they were there)."""

    def __init__(self, src):
        self.src = src.resolve()
        self.dirs = {}   # path -> (group, children before, or None if absent)
        self.files = {}  # path -> (group, bytes before, or None if absent)

    def inside(self, path):
        p = (self.src / path).resolve() if not Path(path).is_absolute() else Path(path).resolve()
        return p if p != self.src and self.src in p.parents else None

    def track_dir(self, path, group, pattern="*"):
        """New entries of folder `path` matching `pattern` go; the folder itself (and the
        folders made for it) when it was not there."""
        p = self.inside(path)
        if p is None or p in self.dirs:
            return
        top = p  # the highest folder that is not there yet is what to remove
        while not top.parent.exists() and top.parent != self.src:
            top = top.parent
        before = set(os.listdir(p)) if p.is_dir() else None
        self.dirs[p] = (group, before, top, pattern)

    def track_file(self, path, group):
        p = self.inside(path)
        if p is None or p in self.files:
            return
        self.files[p] = (group, p.read_bytes() if p.is_file() else None)

    def clean(self, group=None):
        removed = []
        for p, (g, before, top, pattern) in list(self.dirs.items()):
            if group is not None and g != group:
                continue
            del self.dirs[p]
            if before is None:
                target = top if top.exists() else p
                if target.exists():
                    shutil.rmtree(target, ignore_errors=True)
                    removed.append(str(target.relative_to(self.src)))
            elif p.is_dir():
                for name in sorted(n for n in set(os.listdir(p)) - before
                                   if fnmatch.fnmatch(n, pattern)):
                    shutil.rmtree(p / name, ignore_errors=True)
                    removed.append(str((p / name).relative_to(self.src)))
        for p, (g, data) in list(self.files.items()):
            if group is not None and g != group:
                continue
            del self.files[p]
            if data is None:
                if p.exists():
                    p.unlink()
                    removed.append(str(p.relative_to(self.src)))
            else:
                p.write_bytes(data)
        return removed


@dataclasses.dataclass
class Outcome:
    rc: int = None
    out: str = ""
    err: str = ""
    seconds: float = 0.0
    interrupted_at: float = None
    killed: bool = False


class Runner:
    def __init__(self, args):
        self.src = Path(args.src).resolve()
        self.build = Path(args.build).resolve() if args.build else self.src / "build"
        self.tmp = Path(tempfile.mkdtemp(prefix="doc_commands."))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PTCTL_")}
        self.cleanup = Cleanup(self.src)
        self.rows = []          # (status, cmd, detail)
        self.failures = []
        self.running = None     # the Popen of the command in flight
        self.coord = None       # ptcoord's Popen
        self.state = None       # its state dir
        self.address = None
        self.coord_from = None  # where its command came from
        self.jobs = []          # jobs this run submitted
        self.job = None         # the job placeholders stand for
        self.doc_state_dirs = set()
        self.n = 0
        self.started_wall = time.time()

    # -- processes

    def launch(self, text, env=None):
        out = open(self.tmp / f"out.{self.n}", "w+b")
        err = open(self.tmp / f"err.{self.n}", "w+b")
        self.n += 1
        p = subprocess.Popen(["bash", "-o", "pipefail", "-c", text], cwd=self.src,
                             env=env or self.env, stdout=out, stderr=err,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        return p, out, err

    @staticmethod
    def read(f):
        f.flush()
        with open(f.name, "rb") as r:
            return r.read().decode("utf-8", "replace")

    def run(self, text, limit=RUN_LIMIT_S, stop=None, env=None):
        """Runs text under bash in its own process group. stop(output, seconds) says when
        to send SIGINT; so does `limit` passing. Then the command has STOP_GRACE_S to end."""
        p, out, err = self.launch(text, env)
        self.running = p
        o = Outcome()
        start = time.monotonic()
        try:
            while True:
                rc = p.poll()
                if rc is not None:
                    o.rc = rc
                    break
                el = time.monotonic() - start
                if o.interrupted_at is None:
                    if el >= limit or (stop and stop(self.read(out) + self.read(err), el)):
                        os.killpg(p.pid, signal.SIGINT)
                        o.interrupted_at = el
                elif el - o.interrupted_at > STOP_GRACE_S:
                    os.killpg(p.pid, signal.SIGKILL)
                    o.rc, o.killed = p.wait(), True
                    break
                time.sleep(0.2)
        finally:
            self.running = None
        o.seconds = time.monotonic() - start
        o.out, o.err = self.read(out), self.read(err)
        out.close()
        err.close()
        return o

    # -- reporting

    def record(self, cmd, ok, rc_text, seconds, detail, outcome=None):
        status = "RAN" if ok else "FAILED"
        line = f"{status:7} {cmd.where:28} {cmd.short} -> {rc_text} [{seconds:.1f} s]"
        if detail:
            line += f"  ({detail})"
        print(line, flush=True)
        self.rows.append((status, cmd, rc_text, detail))
        if not ok:
            self.failures.append((cmd, detail))
            if outcome is not None:
                tail = (outcome.out + outcome.err).strip().splitlines()[-15:]
                for t in tail:
                    print(f"        | {t}")

    def skipped(self, cmd, reason):
        print(f"SKIPPED {cmd.where:28} {cmd.short}: {reason}", flush=True)
        self.rows.append(("SKIPPED", cmd, "", reason))

    def substitute_build(self, text):
        if self.build == self.src / "build":
            return text
        return re.sub(r"(?<![\w/.-])build/", f"{self.build}/", text)

    # -- checks on what is not run

    def help_text(self, name, sub):
        binary = self.build / PT_BINARIES[name]
        texts = []
        for argv in ([str(binary), "--help"], [str(binary), *sub.split(), "--help"] if sub else None):
            if argv:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                texts.append(r.stdout + r.stderr)
        return "\n".join(texts)

    def check_skipped(self, cmd, plan):
        """A skipped command still names real files and real flags."""
        problems = []
        for path in plan.exists:
            p = self.src / path
            if not p.is_file() or not os.access(p, os.X_OK):
                problems.append(f"{path} is not an executable file")
        for name, sub, flags in plan.check:
            if not (self.build / PT_BINARIES[name]).exists():
                continue
            text = self.help_text(name, sub)
            missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", text)]
            if missing:
                problems.append(f"`{name}{' ' + sub if sub else ''} --help` has no "
                                f"{', '.join(missing)}")
        if problems:
            self.record(cmd, False, "not run", 0.0, plan.reason + "; but " + "; ".join(problems))
        else:
            self.skipped(cmd, plan.reason)

    # -- the kinds of command

    def stopped_as_asked(self, o, mpirun):
        """ptworker's stop on SIGINT: exit 3; mpirun turns its SIGINT into SIGTERM for the
        ranks, which stop the same way, and then exits 1."""
        if o.interrupted_at is None or o.killed:
            return False
        if o.rc == 3:
            return True
        return mpirun and o.rc == 1 and "stopping as asked" in o.out + o.err

    def error_lines(self, o, prefix):
        pat = re.compile(r"^(\[\d+,\d+\]<std\w+>:)?" + re.escape(prefix), re.M)
        return [l for l in (o.out + o.err).splitlines() if pat.match(l)]

    def track_outputs(self, segs, group):
        for s in segs:
            for w in s.writes:
                self.cleanup.track_file(w, group)
            log = word_after(s.words, "--log-json")
            if log:
                self.cleanup.track_file(log, group)

    def run_train(self, cmd, segs, expect):
        seg = next(s for s in segs if pt_name(s.program) == "ptworker")
        ckdir = set_value(seg.words, "checkpoint.dir")
        config = word_after(seg.words, "--config")
        if ckdir is None and config:
            ckdir = config_checkpoint_dir(self.src, config)
        if ckdir:
            # A standalone run writes step-N folders; what else is there (a job's UID/
            # folder) is not its own.
            self.cleanup.track_dir(ckdir, cmd.file, "step-*")
        self.track_outputs(segs, "end")

        def stop(output, el):
            # A logged step: the job trains (and is past the start, where a
            # signal ends a rank at once rather than after a checkpoint).
            # `limit` sends SIGINT to one that logs none.
            return re.search(r"step\s+\d+/\d+", output) is not None

        o = self.run(self.substitute_build(cmd.text), limit=TRAIN_HARD_LIMIT_S, stop=stop)
        mpirun = seg.launcher == "mpirun"
        errors = self.error_lines(o, "ptworker: error")
        steps = [int(s) for s in re.findall(r"step\s+(\d+)", o.out + o.err)]
        if expect is not None:
            ok = o.rc == expect if expect != "nonzero" else o.rc not in (0, None)
            self.record(cmd, ok, describe_rc(o.rc), o.seconds,
                        f"the doc says it fails ({expect})" if ok else f"the doc says {expect}", o)
            return
        if errors:
            self.record(cmd, False, describe_rc(o.rc), o.seconds, errors[0], o)
        elif o.rc == 0:
            self.record(cmd, True, "0", o.seconds, "finished")
        elif self.stopped_as_asked(o, mpirun):
            how = "mpirun exits 1 when its ranks stop with 3" if mpirun and o.rc == 1 else "stopped as asked"
            self.record(cmd, True, describe_rc(o.rc), o.seconds,
                        f"SIGINT after {o.interrupted_at:.1f} s; {how} at step {max(steps, default=0)}")
        elif o.interrupted_at is not None:
            self.record(cmd, False, describe_rc(o.rc), o.seconds,
                        "did not stop as asked on SIGINT (exit 3, or mpirun's 1 with every rank "
                        f"saying 'stopping as asked'){'; killed' if o.killed else ''}", o)
        else:
            self.record(cmd, False, describe_rc(o.rc), o.seconds, "training failed", o)

    def run_ptworker_tool(self, cmd, segs, expect):
        seg = next(s for s in segs if pt_name(s.program) == "ptworker")
        text, note = cmd.text, ""
        ck = word_after(seg.words, "--checkpoint")
        if ck and not (self.src / ck).exists():
            # The doc names what a full run leaves (step-00002000 after 2000 steps, a minute or
            # two); the runs here were stopped early, so the newest step they saved stands in.
            parent = (self.src / ck).parent
            saved = sorted(parent.glob("step-*")) if parent.is_dir() else []
            saved = [p for p in saved if p.is_dir() and not p.name.endswith(".tmp")
                     and p.stat().st_mtime >= self.started_wall]
            if not saved:
                self.record(cmd, False, "not run", 0.0,
                            f"{ck} does not exist and no run here saved a checkpoint in {parent.relative_to(self.src)}")
                return
            new = str(saved[-1].relative_to(self.src))
            text = text.replace(ck, new)
            note = f"{ck} -> {new}, saved by the stopped run above; "
        self.track_outputs(segs, "end")
        o = self.run(self.substitute_build(text))
        errors = self.error_lines(o, "ptworker: error")
        if expect is not None:
            ok = o.rc == expect if expect != "nonzero" else o.rc not in (0, None)
            self.record(cmd, ok, describe_rc(o.rc), o.seconds, note + f"the doc says it fails ({expect})", o)
        elif o.rc == 0 and not errors and o.out.strip():
            self.record(cmd, True, "0", o.seconds, note + f"{len(o.out)} bytes of output")
        else:
            self.record(cmd, False, describe_rc(o.rc), o.seconds,
                        note + (errors[0] if errors else "failed or printed nothing"), o)

    def run_bench(self, cmd, segs, expect):
        seg = next(s for s in segs if s.program.startswith(("build/bench/", "bench/", "./bench/")))
        name = Path(seg.program).name
        if seg.program.startswith("build/") and not (self.build / "bench").is_dir():
            self.skipped(cmd, "the benchmarks are not built here (-DPT_BUILD_BENCH=ON)")
            return
        if name in SHORT_BENCHMARKS:
            o = self.run(self.substitute_build(cmd.text))
            ok = o.rc == 0
            self.record(cmd, ok, describe_rc(o.rc), o.seconds,
                        f"as written ({SHORT_BENCHMARKS[name]})" if ok else "benchmark failed", o)
            return
        # As written it takes minutes: the same launch (mpirun and its flags included) with
        # --help, and every flag the doc passes must be one the benchmark lists.
        flags = doc_flags(seg)
        idx = cmd.text.find(seg.program)
        text = cmd.text[:idx + len(seg.program)] + " --help"
        o = self.run(self.substitute_build(text))
        helptext = o.out + o.err
        missing = [f for f in flags if not re.search(re.escape(f) + r"(?![\w-])", helptext)]
        ok = o.rc == 0 and "usage" in helptext.lower() and not missing
        detail = f"ran `{' '.join(text.split())}` instead: minutes as written"
        if flags and not missing:
            detail += f"; {', '.join(flags)} listed"
        if missing:
            detail += f"; --help lists no {', '.join(missing)}"
        elif not ok:
            detail += "; no usage with exit 0"
        self.record(cmd, ok, describe_rc(o.rc), o.seconds, detail, o)

    def run_shell(self, cmd, segs, expect):
        self.track_outputs(segs, "end")
        o = self.run(self.substitute_build(cmd.text))
        if expect is not None:
            ok = o.rc == expect if expect != "nonzero" else o.rc not in (0, None)
        else:
            ok = o.rc == 0
        self.record(cmd, ok, describe_rc(o.rc), o.seconds, "" if ok else "failed", o)

    # -- ptcoord and ptctl

    def start_coordinator(self, cmd=None, segs=None):
        """One ptcoord for the whole run: the doc's own command when there is one, on a free
        port and a temporary state dir, else ptcoord with a generated token."""
        self.state = self.tmp / "state"
        if segs:
            seg = next(s for s in segs if pt_name(s.program) == "ptcoord")
            words, subs = list(seg.words), []
            if "--ui-listen" in words:  # a free port for the web UI too
                i = words.index("--ui-listen") + 1
                subs.append(f"--ui-listen {words[i]} -> 127.0.0.1:0")
                words[i] = "127.0.0.1:0"
            for flag, value in (("--listen", "127.0.0.1:0"), ("--state-dir", str(self.state))):
                if flag in words:
                    i = words.index(flag) + 1
                    subs.append(f"{flag} {words[i]} -> {value}")
                    words[i] = value
                else:
                    words += [flag, value]
                    subs.append(f"added {flag} {value}")
            words[0] = self.substitute_build(words[0])
            env = dict(self.env, **dict(a.split("=", 1) for a in seg.assigns))
            self.coord_from = cmd.where
        else:
            words = [str(self.build / PT_BINARIES["ptcoord"]), "--listen", "127.0.0.1:0",
                     "--state-dir", str(self.state), "--local-slots", "2"]
            env, subs = self.env, []
            self.coord_from = "the test's own (no doc command starts ptcoord before ptctl)"
        log = open(self.tmp / "ptcoord.log", "w+b")
        start = time.monotonic()
        self.coord = subprocess.Popen(words, cwd=self.src, env=env, stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        while time.monotonic() - start < 60:
            if (self.state / "address").is_file():
                self.address = (self.state / "address").read_text().strip()
                if self.address:
                    break
            if self.coord.poll() is not None:
                break
            time.sleep(0.1)
        seconds = time.monotonic() - start
        self.env["PTCTL_SERVER"] = self.address or ""
        if self.address and "PTCTL_TOKEN" not in self.env and (self.state / "user-token").is_file():
            self.env["PTCTL_TOKEN"] = (self.state / "user-token").read_text().strip()
        if cmd is None:
            print(f"(ptcoord for this run: {' '.join(words)} -> {self.address})", flush=True)
            return self.address is not None
        if self.address:
            self.record(cmd, True, f"serving on {self.address}", seconds, "; ".join(subs))
        else:
            out = Outcome(rc=self.coord.poll(), out=self.read(log))
            self.record(cmd, False, describe_rc(out.rc), seconds, "ptcoord did not start", out)
        return self.address is not None

    def stop_coordinator(self):
        if self.coord is None:
            return
        for job in self.jobs:  # stopping ptcoord leaves its jobs running: cancel them first
            self.ptctl(["cancel", job])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                self.job_state(j) not in ("JOB_STATE_CANCELLED", "JOB_STATE_SUCCEEDED",
                                          "JOB_STATE_FAILED", None) for j in self.jobs):
            time.sleep(0.5)
        self.coord.terminate()
        try:
            self.coord.wait(20)
        except subprocess.TimeoutExpired:
            self.coord.kill()
            self.coord.wait()
        self.coord = None

    def ptctl(self, argv):
        r = subprocess.run([str(self.build / PT_BINARIES["ptctl"])] + argv, cwd=self.src,
                           env=self.env, capture_output=True, text=True, timeout=60)
        return r

    def job_json(self, job):
        r = self.ptctl(["-o", "json", "get", job])
        try:
            return json.loads(r.stdout)["job"] if r.returncode == 0 else None
        except (ValueError, KeyError):
            return None

    def job_state(self, job):
        j = self.job_json(job)
        return j.get("state") if j else None

    def adopt_job(self, job):
        self.job = job
        if job not in self.jobs:
            self.jobs.append(job)
        j = self.job_json(job) or {}
        ck = (j.get("spec") or {}).get("checkpoint", {}).get("dir", "")
        if ck and j.get("uid") and Path(ck).name == j["uid"]:
            self.cleanup.track_dir(ck, "coordinator")

    def coordinated_text(self, cmd):
        text, subs = cmd.text, []
        if JOB_PLACEHOLDER.search(text) and self.job:
            for m in sorted(set(JOB_PLACEHOLDER.findall(text))):
                if m != self.job:
                    subs.append(f"{m} -> {self.job}")
            text = JOB_PLACEHOLDER.sub(self.job, text)
        for d in sorted(self.doc_state_dirs, key=len, reverse=True):
            if d in text:
                text = text.replace(d, str(self.state))
                subs.append(f"{d} -> the state dir")
        return self.substitute_build(text), subs

    def run_ptctl(self, cmd, segs, expect):
        seg = next((s for s in segs if pt_name(s.program) == "ptctl"), None)
        sub = ptctl_subcommand(seg) if seg else ""
        follow = sub == "watch" or "--watch" in (seg.words if seg else []) or \
            any(w in ("-f", "--follow") for s in segs for w in s.words)
        if (seg is None or sub != "submit") and JOB_PLACEHOLDER.search(cmd.text) and not self.job:
            # No doc command submitted one yet: a job for the placeholders to name.
            r = self.ptctl(["submit", "examples/shakespeare-char.yaml"])
            m = re.search(r"\b(job-\d+)\b", r.stdout)
            if not m:
                self.record(cmd, False, "not run", 0.0, f"could not submit a job: {r.stderr.strip()}")
                return
            print(f"(submitted {m.group(1)} for the commands that name a job)")
            self.adopt_job(m.group(1))
        text, subs = self.coordinated_text(cmd)
        waited = ""
        if sub == "resume" and self.job:
            # A pause takes effect at the end of the step; resume wants PAUSED, as a reader
            # who checks `ptctl get` first sees it.
            start = time.monotonic()
            while time.monotonic() - start < 60 and self.job_state(self.job) != "JOB_STATE_PAUSED":
                time.sleep(0.5)
            waited = f"waited {time.monotonic() - start:.1f} s for PAUSED"
        if sub == "delete" and self.job:
            # Only an ended job is deleted: the cancel before it takes a moment.
            start = time.monotonic()
            while time.monotonic() - start < 60 and self.job_state(self.job) not in (
                    "JOB_STATE_CANCELLED", "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED"):
                time.sleep(0.5)
            waited = f"waited {time.monotonic() - start:.1f} s for the job to end"

        if sub == "submit" and follow:
            def stop(output, el):  # the job trains: the progress line has passed step 0
                return re.search(r"\]\s+[1-9]\d*/\d+", output) is not None or el >= 30
            o = self.run(text, limit=30, stop=stop)
        elif follow:
            o = self.run(text, limit=FOLLOW_S)
        else:
            o = self.run(text)
        if sub == "submit":
            m = re.search(r"\b(job-\d+)\b", o.out + o.err)
            if m:
                self.adopt_job(m.group(1))
                subs.append(f"submitted {m.group(1)}")
        if sub == "cancel":
            subs.insert(0, "run after the other commands that need the job going")
        if sub == "delete":
            subs.insert(0, "run after the cancel")
        detail = "; ".join(x for x in [waited] + subs if x)
        errors = self.error_lines(o, "ptctl: error")
        if expect is not None:
            ok = o.rc == expect if expect != "nonzero" else o.rc not in (0, None)
            self.record(cmd, ok, describe_rc(o.rc), o.seconds, detail, o)
        elif o.rc == 0 and not errors:
            self.record(cmd, True, "0", o.seconds, detail)
        elif follow and o.interrupted_at is not None and not o.killed and not errors and (
                o.rc == 130 and (sub not in ("watch", "submit") or "keeps running" in o.err)
                or o.rc == -signal.SIGINT):
            what = "Ctrl-C: the job keeps running" if o.rc == 130 else "followed until SIGINT"
            self.record(cmd, True, describe_rc(o.rc), o.seconds,
                        "; ".join(x for x in (detail, f"SIGINT after {o.interrupted_at:.1f} s, {what}") if x))
        else:
            self.record(cmd, False, describe_rc(o.rc), o.seconds,
                        "; ".join(x for x in (detail, errors[0] if errors else "") if x), o)

    def run_coordinated(self, cmd, segs, expect):
        """A command that reads what ptcoord keeps (tail -f STATE/jobs/job-0001/...)."""
        if not self.job:
            self.skipped(cmd, "names a job, and no job was submitted")
            return
        text, subs = self.coordinated_text(cmd)
        follow = any(w in ("-f", "--follow", "-F") for s in segs for w in s.words)
        o = self.run(text, limit=FOLLOW_S if follow else RUN_LIMIT_S)
        if o.rc == 0 or (follow and o.interrupted_at is not None and not o.killed
                         and o.rc in (130, -signal.SIGINT) and o.out.strip()):
            self.record(cmd, True, describe_rc(o.rc), o.seconds,
                        "; ".join(subs + ([f"followed {FOLLOW_S} s"] if follow else [])))
        else:
            self.record(cmd, False, describe_rc(o.rc), o.seconds, "; ".join(subs), o)

    def run_export(self, cmd, segs):
        subs = []
        for w in segs[0].words[1:]:
            if "=" not in w:
                continue
            k, v = w.split("=", 1)
            if k == "PTCTL_SERVER" and self.address:
                subs.append(f"PTCTL_SERVER={v} -> {self.address}")
                v = self.address
            self.env[k] = v
        self.record(cmd, True, "0", 0.0, "; ".join(subs) or "set for the commands after it")

    # -- the run

    def main(self, commands, only):
        self.started_wall = time.time()
        plans = [(c,) + classify(c) for c in commands]
        for c, plan, segs in plans:
            for s in segs:
                if pt_name(s.program) == "ptcoord":
                    d = word_after(s.words, "--state-dir")
                    if d:
                        self.doc_state_dirs.add(d)
        # The commands that need ptcoord run together, from the first of them on, so that
        # the job they share trains only meanwhile; `ptctl cancel` goes last (pause and
        # resume come after it in the README's list and want a job that is still going),
        # and `ptctl delete` after it (it wants an ended job).
        coordinated = [i for i, (c, p, s) in enumerate(plans) if p.kind in ("ptctl", "coordinated")]

        def runs(i, sub):
            return any(pt_name(s.program) == "ptctl" and ptctl_subcommand(s) == sub
                       for s in plans[i][2])
        cancels = [i for i in coordinated if runs(i, "cancel")]
        deletes = [i for i in coordinated if runs(i, "delete")]
        others = [i for i in range(len(plans)) if i not in coordinated]
        phase = [i for i in coordinated if i not in cancels + deletes] + cancels + deletes
        cut = len([i for i in others if coordinated and i < coordinated[0]])
        order = others[:cut] + phase + others[cut:]
        last_coordinated = cut + len(phase) - 1 if phase else -1
        current_file = None
        start = time.monotonic()
        for pos, i in enumerate(order):
            cmd, plan, segs = plans[i]
            if current_file is not None and cmd.file != current_file and self.coord is None:
                # The checkpoints of one page's runs go before the next page's runs save
                # into the same folders (not while a job trains into one of them).
                removed = self.cleanup.clean(current_file)
                if removed:
                    print(f"(removed what {current_file}'s runs wrote: {', '.join(removed)})")
            current_file = cmd.file
            if only and only not in (cmd.where, cmd.file):
                continue
            expect = expected_failure(cmd.comment)
            if plan.kind == "optional":
                self.record(cmd, False, "not run", 0.0, plan.reason)
            elif plan.kind == "skip":
                self.check_skipped(cmd, plan)
            elif plan.kind == "export":
                self.run_export(cmd, segs)
            elif plan.kind == "server":
                if self.coord is None:
                    self.start_coordinator(cmd, segs)
                else:
                    self.skipped(cmd, f"a ptcoord already serves this run ({self.coord_from})")
            elif plan.kind in ("ptctl", "coordinated"):
                if self.coord is None and not self.start_coordinator():
                    self.record(cmd, False, "not run", 0.0, "ptcoord did not start")
                elif plan.kind == "ptctl":
                    self.run_ptctl(cmd, segs, expect)
                else:
                    self.run_coordinated(cmd, segs, expect)
            elif plan.kind == "train":
                self.run_train(cmd, segs, expect)
            elif plan.kind == "ptworker":
                self.run_ptworker_tool(cmd, segs, expect)
            elif plan.kind == "bench":
                self.run_bench(cmd, segs, expect)
            else:
                self.run_shell(cmd, segs, expect)
            if pos == last_coordinated:
                self.stop_coordinator()
                removed = self.cleanup.clean("coordinator")
                if removed:
                    print(f"(ptcoord stopped; removed its jobs' checkpoints: {', '.join(removed)})")
        return time.monotonic() - start

    def finish(self):
        if self.running is not None and self.running.poll() is None:
            os.killpg(self.running.pid, signal.SIGKILL)
        try:
            self.stop_coordinator()
        finally:
            removed = self.cleanup.clean()
            shutil.rmtree(self.tmp, ignore_errors=True)
        return removed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=".", help="the repository (README.md, docs/)")
    ap.add_argument("--build", default=None, help="its build folder (default SRC/build)")
    ap.add_argument("--list", action="store_true", help="print what would run and what is skipped")
    ap.add_argument("--only", default="", help="only the commands of FILE, or the one at FILE:LINE")
    args = ap.parse_args()
    src = Path(args.src).resolve()
    commands = [c for f in doc_files(src) for c in extract(src, f)]
    if args.list:
        for c in commands:
            plan, _ = classify(c)
            print(f"{plan.kind:11} {c.where:28} {c.short}" + (f": {plan.reason}" if plan.reason else ""))
        return 0

    runner = Runner(args)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    print(f"{len(commands)} commands in the ```sh blocks of {', '.join(doc_files(src))}", flush=True)
    try:
        seconds = runner.main(commands, args.only)
    finally:
        removed = runner.finish()
    if removed:
        print(f"removed what the commands wrote: {', '.join(removed)}")
    ran = sum(1 for r in runner.rows if r[0] in ("RAN", "FAILED"))
    skipped = sum(1 for r in runner.rows if r[0] == "SKIPPED")
    print(f"\n{ran} ran, {skipped} skipped, {len(runner.failures)} failed, in {seconds:.0f} s")
    for cmd, detail in runner.failures:
        print(f"FAILED {cmd.where}: {cmd.short}: {detail}")
    return 1 if runner.failures else 0


if __name__ == "__main__":
    sys.exit(main())
