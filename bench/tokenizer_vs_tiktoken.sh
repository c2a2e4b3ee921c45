#!/usr/bin/env bash
# GPT-2 encoding speed side by side: ptrain's encoder
# (build/bench/tokenizer_throughput) and the tiktoken npm package (Rust in
# WASM under node, encode_ordinary: bench/gpt2_reference/tiktoken_speed.js)
# on the same corpus, one after the other, both pinned to the same core.
# Each warms up, then the best of REPEATS runs counts. Prints one table:
# MB/s (1e6 bytes), tokens/s and the ratio to tiktoken. Never fails on time.
# Needs node, npm (the package is fetched once), python3, taskset and a
# build with -DPT_BUILD_BENCH=ON.
#
#   bench/tokenizer_vs_tiktoken.sh [CORPUS [REPEATS]]
#     CORPUS: default tests/common/gpt2/make_corpus.py's (>= 1 MB, mixed)
#     REPEATS: default 5
#     $PTRAIN_BENCH_CORE: the core both run on (default 0)
#     $PTRAIN_BUILD_DIR: the build (default build/)
#     $PTRAIN_GPT2_REF_DIR: scratch folder (default ${TMPDIR:-/tmp}/ptrain-gpt2-ref)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${PTRAIN_BUILD_DIR:-build}
scratch=${PTRAIN_GPT2_REF_DIR:-${TMPDIR:-/tmp}/ptrain-gpt2-ref}
core=${PTRAIN_BENCH_CORE:-0}
repeats=${2:-5}
mkdir -p "$scratch"
tiktoken=$(bench/gpt2_reference/fetch.sh "$scratch" tiktoken@1.0.22)
corpus=${1:-$scratch/corpus.txt}
if (($# == 0)); then python3 tests/common/gpt2/make_corpus.py "$corpus"; fi

rows=$scratch/speed.tsv
taskset -c "$core" "$build/bench/tokenizer_throughput" --corpus "$corpus" \
  --repeats "$repeats" --tsv >"$rows"
taskset -c "$core" node bench/gpt2_reference/tiktoken_speed.js "$tiktoken" \
  "$corpus" "$repeats" >>"$rows"

python3 - "$rows" "$corpus" "$core" "$repeats" "$(basename "$tiktoken")" <<'EOF'
import sys

path, corpus, core, repeats, tiktoken = sys.argv[1:]
rows = [line.rstrip("\n").split("\t") for line in open(path) if line.strip()]
rows = [(name, int(size), int(count), float(s)) for name, size, count, s in rows]
peer = next(r for r in rows if r[0].startswith("tiktoken"))
print(f"GPT-2 encoding of {corpus} ({rows[0][1]} bytes), one thread on core "
      f"{core}, best of {repeats} after warm-up; peer {tiktoken}")
print(f"  {'':28} {'tokens':>9} {'best s':>9} {'MB/s':>8} {'M tokens/s':>11} "
      f"{'vs tiktoken':>12}")
for name, size, count, s in rows:
    # The pre-tokenizer alone counts words, and has no peer figure.
    split = "split" in name
    ratio = "" if split else f"{peer[3] / s:11.2f}x"
    print(f"  {name:28} {count:9d} {s:9.4f} {size / s / 1e6:8.1f} "
          f"{count / s / 1e6:11.2f} {ratio:>12}{'  (words)' if split else ''}")
EOF
