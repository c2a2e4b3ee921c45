#!/usr/bin/env python3
"""Prints the structure figures the code is held to (docs/design.md,
"Structure"): functions over --max-function lines in the process folders,
source files over --max-file lines, and #includes from one process folder
into a sibling's (processes share code only through common/, kernels/ and
proto/). Tests, benchmarks, fuzz targets and generated code are left out.

    scripts/structure_report.py [--max-function 100] [--max-file 900]

Exit 1 when anything is over a limit or crosses folders. Needs Universal
Ctags (Debian's universal-ctags) for function extents.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folders of the processes (ptworker + ptworkerd/ptrsh, ptcoord, ptctl)
# and what they may include besides themselves.
PROCESS_DIRS = ["worker/engine", "worker/daemon", "worker", "coordinator",
                "ptctl"]
SHARED_DIRS = ["common", "kernels", "proto"]
SOURCE_DIRS = PROCESS_DIRS + SHARED_DIRS
EXTS = (".cc", ".h", ".cpp", ".cu")
# worker/ (ptworker: its main and the units beside it) builds on the engine.
ALLOWED = {"worker": {"worker/engine"}}


def sources():
    for top in ["worker", "coordinator", "ptctl", "common", "kernels"]:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def folder(path):
    d = os.path.dirname(path)
    for p in sorted(PROCESS_DIRS + SHARED_DIRS, key=len, reverse=True):
        if d == p or d.startswith(p + "/"):
            return p
    return d


def long_functions(paths, limit):
    out = subprocess.run(
        ["ctags", "--fields=+ne", "-x", "--_xformat=%N\t%F\t%n\t%e",
         "--c++-kinds=f", "--kinds-C=f", "--language-force=C++", *paths],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        name, path, start, end = parts[0], parts[1], int(parts[2]), int(parts[3])
        n = end - start + 1
        if n > limit:
            found.append((n, f"{path}:{start}", name))
    return sorted(found, reverse=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--max-file", type=int, default=900)
    a = ap.parse_args()
    files = list(sources())
    bad = 0
    process_files = [f for f in files if folder(f) in PROCESS_DIRS]
    funcs = long_functions(process_files, a.max_function)
    print(f"functions over {a.max_function} lines in "
          f"{', '.join(sorted(set(PROCESS_DIRS)))}: {len(funcs)}")
    for n, where, name in funcs:
        print(f"  {n:5d}  {name}  {where}")
    bad += len(funcs)
    big = []
    for f in files:
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            n = sum(1 for _ in fh)
        if n > a.max_file:
            big.append((n, f))
    print(f"files over {a.max_file} lines: {len(big)}")
    for n, f in sorted(big, reverse=True):
        print(f"  {n:5d}  {f}")
    bad += len(big)
    include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
    crossings = []
    for f in files:
        src = folder(f)
        if src not in PROCESS_DIRS:
            # Shared code includes only shared code.
            allowed = set(SHARED_DIRS)
        else:
            allowed = {src} | set(SHARED_DIRS) | ALLOWED.get(src, set())
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            for no, line in enumerate(fh, 1):
                m = include.match(line)
                if not m:
                    continue
                target = m.group(1)
                if target.startswith("ptrain/v1/"):
                    continue  # generated from proto/
                if not os.path.exists(os.path.join(ROOT, target)):
                    continue  # a library's header
                dst = folder(target)
                if dst not in allowed:
                    crossings.append(f"{f}:{no} -> {target}")
    print(f"includes across process folders: {len(crossings)}")
    for c in crossings:
        print(f"  {c}")
    bad += len(crossings)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
