#!/usr/bin/env bash
# clang-format (the repository's .clang-format: Google style) on the C++ and
# CUDA sources that differ from BASE (default: HEAD) or are new, in place.
# Only sources: clang-format reads any other file (Markdown, YAML, Python) as
# C++ and mangles it.
#
#   scripts/format.sh            # what the working tree changed
#   scripts/format.sh main~3     # ... since main~3
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-HEAD}"
mapfile -t files < <({
  git diff --name-only --diff-filter=d "$base" --
  git ls-files --others --exclude-standard
} | grep -E '\.(cc|cpp|h|cu|cuh)$' | sort -u)
if ((${#files[@]} == 0)); then
  echo "format.sh: no C++ or CUDA source changed since $base"
  exit 0
fi
clang-format -i "${files[@]}"
printf 'formatted %s\n' "${files[@]}"
