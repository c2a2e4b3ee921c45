#!/usr/bin/env python3
"""Checks that README.md and docs/*.md are still Markdown a reader can read.

A formatter meant for C++ once reflowed two docs as if they were code: headings
lost their space ("#The CUDA backend"), table separators became "| -- - |",
dates became "2026 - 11 - 26" and paragraphs were indented by dozens of spaces
(so Markdown showed them as code). Outside fenced code blocks this check
refuses, with file and line:

  - a heading without a space after its #s (`#Title`);
  - a table separator row that is not `|---|` cells (`| -- - |`);
  - a table whose rows have a different number of cells from its header;
  - a prose line indented by 8 or more spaces that is not inside a list item.

  tests/docs/markdown_shape.py --src .        # exit 1 with each finding
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

HEADING_NO_SPACE = re.compile(r"^#{1,6}[^#\s!]")
SEPARATOR_CELL = re.compile(r"^\s*:?-{3,}:?\s*$")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def cells(line):
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|"):
        body = body[:-1]
    return re.split(r"(?<!\\)\|", body)  # a \| inside a cell is text


def findings(path, text):
    out = []
    fenced = False
    in_list = False
    table_cols = None
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if not line.strip():
            table_cols = None
            continue
        if LIST_ITEM.match(line):
            in_list = True
        elif not line.startswith(" "):
            in_list = False
        if HEADING_NO_SPACE.match(line):
            out.append(f"{path}:{n}: heading without a space after '#': {line!r}")
        if line.lstrip().startswith("|"):
            row = cells(line)
            if table_cols is None:
                table_cols = len(row)
            elif all(set(c) <= set(" -:") for c in row) and not all(
                    SEPARATOR_CELL.match(c) for c in row):
                out.append(f"{path}:{n}: table separator not '|---|' cells: {line!r}")
            elif len(row) != table_cols:
                out.append(f"{path}:{n}: table row of {len(row)} cells under a "
                           f"header of {table_cols}: {line!r}")
            continue
        table_cols = None
        if line.startswith(" " * 8) and not in_list:
            out.append(f"{path}:{n}: prose indented by 8+ spaces outside a list "
                       f"(Markdown shows it as code): {line!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=".", help="the repository root")
    args = ap.parse_args()
    root = Path(args.src)
    files = subprocess.run(["git", "ls-files", "README.md", "docs/*.md"], cwd=root,
                           capture_output=True, text=True, check=False).stdout.split()
    if not files:  # not a git checkout: the same files by name
        files = ["README.md"] + sorted(
            str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))
    problems = []
    for name in files:
        problems += findings(name, (root / name).read_text(encoding="utf-8"))
    for p in problems:
        print(p)
    print(f"markdown_shape: {len(files)} files, {len(problems)} findings")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
