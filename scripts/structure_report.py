#!/usr/bin/env python3
"""Prints the structure figures the code is held to (docs/design.md,
"Structure"), over the sources of worker/, coordinator/, ptctl/, common/ and
kernels/ (tests, benchmarks, fuzz targets and generated code left out):

- functions over --max-function lines; a CUDA kernel (`__global__`, in a
  .cu/.cuh) may be longer with `// long: REASON` in the lines directly above
  it, and is then listed apart with its reason (elsewhere such a reason does
  not count);
- files over --max-file lines, the 15 largest units (a .h with its
  .cc/.cpp/.cu of the same stem and folder) and any over --max-unit lines;
- the Trainer: lines of worker/engine/**/trainer.h, trainer.cc and
  trainer_run.cc, and the data members (`name_`) of class Trainer;
- #includes from one process folder into a sibling's (processes share code
  only through common/, kernels/ and proto/), and from worker/ into kernels/
  other than kernels/ops.h, kernels/backends.h and kernels/common/math.h;
- reads of the spec's parallel section (`.parallel()`, `->parallel()`,
  `mutable_parallel()`) outside the spec parser and ParallelDims;
- include cycles between folders and between files.

    scripts/structure_report.py [--max-function 100] [--max-file 900]
        [--max-unit 1500] [--max-trainer-lines 600] [--max-trainer-fields 25]

Exit 1 when anything is over a limit or a rule is broken, else 0. Needs
Universal Ctags (Debian's universal-ctags) for function extents.
"""
import argparse
import collections
import fnmatch
import functools
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPS = ["worker", "coordinator", "ptctl", "common", "kernels", "planner"]
# The folders of the processes (ptworker + ptworkerd/ptrsh, ptcoord, ptctl)
# and what they may include besides themselves.
PROCESS_DIRS = ["worker/engine", "worker/daemon", "worker", "coordinator",
                "ptctl"]
# planner/ (the layout planner) is shared by ptctl, ptcoord and ptworker.
SHARED_DIRS = ["common", "kernels", "proto", "planner"]
HEADERS = (".h", ".cuh")
BODIES = (".cc", ".cpp", ".cu")
EXTS = HEADERS + BODIES
CUDA_EXTS = (".cu", ".cuh")
SKIP_DIRS = {"tests", "test", "bench", "fuzz", "build", "generated"}
GENERATED = re.compile(r"\.pb\.(h|cc)$")
# worker/ (ptworker: its main and the units beside it) builds on the engine;
# the planner costs a layout with the engine's own layout code (RankBuild,
# the memory estimate, the schedules, the model's tensor table: the
# ptrain_layout and ptrain_model libraries), so that its memory is the job's.
ALLOWED = {"worker": {"worker/engine"}, "planner": {"worker/engine"}}
# What worker/ may include from kernels/: the interface and its factory,
# and the per-element formulas both backends share (no backend's code).
WORKER_KERNEL_HEADERS = {"kernels/ops.h", "kernels/backends.h",
                         "kernels/common/math.h"}
# Who may read the job spec's parallel section: the parser (with the
# mesh's table, common/mesh.*) and ParallelDims.
PARALLEL_SCOPE = ["worker", "coordinator", "ptctl", "kernels", "common"]
SPEC_PARSER = ["common/spec*.cc", "common/spec*.h", "common/mesh.cc",
               "common/mesh.h"]
PARALLEL_DIMS = ("parallel_dims.h", "parallel_dims.cc")
PARALLEL_READ = re.compile(r"(?:\.|->)parallel\(\)|\bmutable_parallel\(\)")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
LONG_REASON = re.compile(r"^\s*//\s*long:\s*(\S.*?)\s*$")
FIELD = re.compile(r"\w_\s*(?:=[^;]*|\{[^;]*\})?;$")
TRAINER_FILES = ("trainer.h", "trainer.cc", "trainer_run.cc")


# ----------------------------------------------------------------- sources

def sources():
    for top in TOPS:
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            for f in sorted(files):
                if f.endswith(EXTS) and not GENERATED.search(f):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


@functools.lru_cache(maxsize=None)
def lines_of(path):
    with open(os.path.join(ROOT, path), errors="replace") as fh:
        return [line.rstrip("\n") for line in fh]


def strip_comments(line, in_block):
    """`line` without its comments (string literals kept), and whether a
    /* comment is still open at its end."""
    code, i, quote = [], 0, None
    while i < len(line):
        c, two = line[i], line[i:i + 2]
        if in_block:
            in_block = two != "*/"
            i += 1 if in_block else 2
        elif quote:
            step = 2 if c == "\\" else 1
            code.append(line[i:i + step])
            quote = None if c == quote else quote
            i += step
        elif two == "//":
            break
        elif two == "/*":
            in_block, i = True, i + 2
        else:
            quote = c if c in "\"'" else None
            code.append(c)
            i += 1
    return "".join(code), in_block


@functools.lru_cache(maxsize=None)
def code_lines_of(path):
    """The file's lines with comments blanked."""
    out, in_block = [], False
    for line in lines_of(path):
        code, in_block = strip_comments(line, in_block)
        out.append(code)
    return out


def folder(path):
    """The process or shared folder a path belongs to."""
    d = os.path.dirname(path)
    for p in sorted(PROCESS_DIRS + SHARED_DIRS, key=len, reverse=True):
        if d == p or d.startswith(p + "/"):
            return p
    return d


def under(path, top):
    return path.startswith(top.rstrip("/") + "/")


@functools.lru_cache(maxsize=None)
def includes(path):
    """(line number, included path) of each quoted #include."""
    found = []
    for no, line in enumerate(lines_of(path), 1):
        m = INCLUDE.match(line)
        if m:
            found.append((no, m.group(1)))
    return found


def resolve(target):
    """The root-relative file an include names; None for generated code
    (ptrain/v1/) and headers that are not the project's."""
    if target.startswith("ptrain/v1/"):
        return None
    return target if os.path.isfile(os.path.join(ROOT, target)) else None


def print_list(title, items):
    print(f"{title}: {len(items)}")
    for item in items:
        print(f"  {item}")
    return len(items)


# --------------------------------------------------------------- functions

def ctags_functions(paths):
    """(name, path, first line, last line) of each function definition."""
    out = subprocess.run(
        ["ctags", "--fields=+ne", "-x", "--_xformat=%N\t%F\t%n\t%e",
         "--c++-kinds=f", "--kinds-C=f", "--language-force=C++",
         "-D", "__launch_bounds__(...)=", *paths],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
            yield parts[0], parts[1], int(parts[2]), int(parts[3])


def is_kernel(path, start):
    """Whether the function at line `start` of `path` is a CUDA kernel
    (`__global__` on its first lines)."""
    head = lines_of(path)[max(0, start - 3):start + 1]
    return path.endswith(CUDA_EXTS) and any("__global__" in l for l in head)


def long_reason(path, start):
    """The `// long:` reason in the comment and declaration lines directly
    above line `start` (up to 8, to the first blank line), if any."""
    above = lines_of(path)[max(0, start - 9):start - 1]
    for line in reversed(above):
        if not line.strip():
            break
        m = LONG_REASON.match(line)
        if m:
            return m.group(1)
    return None


def check_functions(files, limit):
    over, kept = [], []
    for name, path, start, end in ctags_functions(files):
        n = end - start + 1
        if n <= limit:
            continue
        entry = f"{n:5d}  {name}  {path}:{start}"
        reason = long_reason(path, start)
        if reason and is_kernel(path, start):
            kept.append((n, f"{entry}  long: {reason}"))
        elif reason:
            over.append((n, f"{entry}  (its `// long:` does not count: "
                            "reasons are for CUDA kernels only)"))
        else:
            over.append((n, entry))
    where = ", ".join(TOPS)
    bad = print_list(f"functions over {limit} lines in {where}",
                     [e for _, e in sorted(over, reverse=True)])
    print_list(f"functions over {limit} lines kept, with their reason",
               [e for _, e in sorted(kept, reverse=True)])
    return bad


# ----------------------------------------------------------- files, units

def check_files(files, limit):
    big = sorted(((len(lines_of(f)), f) for f in files), reverse=True)
    return print_list(f"files over {limit} lines",
                      [f"{n:5d}  {f}" for n, f in big if n > limit])


def units(files):
    """(lines, stem path, extensions) of each unit: a .h and the
    .cc/.cpp/.cu of the same stem in its folder (or either alone)."""
    by_stem = collections.defaultdict(list)
    for f in files:
        stem, ext = os.path.splitext(f)
        by_stem[stem].append(ext)
    order = {e: i for i, e in enumerate(EXTS)}
    for stem, exts in by_stem.items():
        exts.sort(key=order.get)
        yield sum(len(lines_of(stem + e)) for e in exts), stem, exts


def check_units(files, limit, shown=15):
    ranked = sorted(units(files), reverse=True)
    over = sum(1 for n, _, _ in ranked if n > limit)
    print(f"largest units (a .h with its .cc/.cpp/.cu), over {limit} lines:"
          f" {over}")
    for n, stem, exts in ranked[:max(shown, over)]:
        mark = "  over" if n > limit else ""
        print(f"  {n:5d}  {stem} ({' '.join(exts)}){mark}")
    return over


def class_fields(path, name):
    """Lines of class `name`'s body (at its own depth) that declare a data
    member whose name ends with an underscore."""
    code = code_lines_of(path)
    head = re.compile(rf"^\s*class\s+{name}\b[^;]*$")
    start = next((i for i, l in enumerate(code) if head.match(l)), None)
    if start is None:
        return 0
    count, depth, opened = 0, 0, False
    for line in code[start:]:
        if opened and depth == 1 and FIELD.search(line.rstrip()):
            count += 1
        depth += line.count("{") - line.count("}")
        opened = opened or "{" in line
        if opened and depth == 0:
            break
    return count


def check_trainer(files, max_lines, max_fields):
    found = [f for f in files if under(f, "worker/engine")
             and os.path.basename(f) in TRAINER_FILES]
    n = sum(len(lines_of(f)) for f in found)
    fields = sum(class_fields(f, "Trainer") for f in found
                 if f.endswith("/trainer.h"))
    print(f"trainer: {n} lines (.h and .cc), {fields} fields  "
          f"(limits {max_lines} lines, {max_fields} fields)")
    for f in found:
        print(f"  {len(lines_of(f)):5d}  {f}")
    return int(n > max_lines) + int(fields > max_fields)


# -------------------------------------------------------------- includes

def check_process_includes(files):
    crossings = []
    for f in files:
        src = folder(f)
        if src not in PROCESS_DIRS:
            # Shared code includes only shared code (and what ALLOWED
            # names).
            allowed = set(SHARED_DIRS) | ALLOWED.get(src, set())
        else:
            allowed = {src} | set(SHARED_DIRS) | ALLOWED.get(src, set())
        for no, target in includes(f):
            if resolve(target) and folder(target) not in allowed:
                crossings.append(f"{f}:{no} -> {target}")
    return print_list("includes across process folders", crossings)


def check_backend_includes(files):
    found = [f"{f}:{no} -> {target}"
             for f in files if under(f, "worker")
             for no, target in includes(f)
             if under(target, "kernels")
             and target not in WORKER_KERNEL_HEADERS]
    return print_list("includes of backend internals from worker/", found)


def may_read_parallel(path):
    """The spec parser (common/spec*, common/mesh*) and ParallelDims."""
    if any(fnmatch.fnmatch(path, p) for p in SPEC_PARSER):
        return True
    return (under(path, "worker/engine")
            and os.path.basename(path) in PARALLEL_DIMS)


def check_parallel_reads(files):
    found = []
    for f in files:
        if not any(under(f, top) for top in PARALLEL_SCOPE):
            continue
        if may_read_parallel(f):
            continue
        for no, line in enumerate(code_lines_of(f), 1):
            if PARALLEL_READ.search(line):
                found.append(f"{f}:{no}  {lines_of(f)[no - 1].strip()}")
    return print_list("reads of parallel.* outside the parser and "
                      "ParallelDims", found)


# ---------------------------------------------------------------- cycles

def strongly_connected(graph):
    """Tarjan's strongly connected components of {node: set(nodes)}."""
    index, low, stack, on_stack, sccs = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while not scc or scc[-1] != node:
                        scc.append(stack.pop())
                        on_stack.discard(scc[-1])
                    sccs.append(sorted(scc))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sccs


def own_header(src, header):
    """A .cc/.cpp/.cu including the .h of its own unit."""
    return (src.endswith(BODIES) and header.endswith(HEADERS)
            and os.path.splitext(src)[0] == os.path.splitext(header)[0])


def include_edges(files):
    """(file, line, included file) of each include of a project file."""
    for f in files:
        for no, target in includes(f):
            path = resolve(target)
            if path:
                yield f, no, path


def cycles(graph):
    return [scc for scc in strongly_connected(graph)
            if len(scc) > 1 or scc[0] in graph.get(scc[0], ())]


def check_folder_cycles(files):
    graph, example = collections.defaultdict(set), {}
    for f, no, path in include_edges(files):
        a, b = os.path.dirname(f), os.path.dirname(path)
        if a != b:
            graph[a].add(b)
            example.setdefault((a, b), f"{f}:{no} -> {path}")
    found = [scc for scc in cycles(graph) if len(scc) > 1]
    print(f"include cycles between folders: {len(found)}")
    for scc in found:
        print(f"  {' <-> '.join(scc)}")
        for a in scc:
            for b in scc:
                if (a, b) in example:
                    print(f"    {a} -> {b}: {example[(a, b)]}")
    return len(found)


def check_file_cycles(files):
    graph = collections.defaultdict(set)
    for f, _, path in include_edges(files):
        if not own_header(f, path):
            graph[f].add(path)
    return print_list("include cycles between files",
                      [" <-> ".join(scc) for scc in cycles(graph)])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--max-file", type=int, default=900)
    ap.add_argument("--max-unit", type=int, default=1500)
    ap.add_argument("--max-trainer-lines", type=int, default=600)
    ap.add_argument("--max-trainer-fields", type=int, default=25)
    a = ap.parse_args()
    files = list(sources())
    bad = check_functions(files, a.max_function)
    bad += check_files(files, a.max_file)
    bad += check_units(files, a.max_unit)
    bad += check_trainer(files, a.max_trainer_lines, a.max_trainer_fields)
    bad += check_process_includes(files)
    bad += check_backend_includes(files)
    bad += check_parallel_reads(files)
    bad += check_folder_cycles(files)
    bad += check_file_cycles(files)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
