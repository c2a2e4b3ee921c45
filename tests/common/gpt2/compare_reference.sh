#!/usr/bin/env bash
# Checks ptrain's GPT-2 ids against the reference encoders' on a mixed
# corpus of at least 1 MB: make_corpus.py writes it, ptrain's
# encoder (build/bench/tokenizer_throughput --ids-out) and reference.js with
# each of the tiktoken and gpt-3-encoder npm packages (fetched by
# bench/gpt2_reference/fetch.sh) encode it. Prints, for each reference,
# "identical" or the first id that differs with its position in the text
# and the text around it; exits non-zero on any difference. Not part of
# ctest: it needs the npm registry. Needs node, npm, python3 and a build
# with -DPT_BUILD_BENCH=ON.
#
#   tests/common/gpt2/compare_reference.sh [CORPUS]
#     CORPUS: a UTF-8 text file instead of make_corpus.py's
#     $PTRAIN_BUILD_DIR: the build (default build/)
#     $PTRAIN_GPT2_REF_DIR: scratch folder, packages kept (default
#     ${TMPDIR:-/tmp}/ptrain-gpt2-ref)
set -euo pipefail
cd "$(dirname "$0")/../../.."
build=${PTRAIN_BUILD_DIR:-build}
scratch=${PTRAIN_GPT2_REF_DIR:-${TMPDIR:-/tmp}/ptrain-gpt2-ref}
mkdir -p "$scratch"
mapfile -t pkgs < <(bench/gpt2_reference/fetch.sh "$scratch")
corpus=${1:-$scratch/corpus.txt}
if (($# == 0)); then python3 tests/common/gpt2/make_corpus.py "$corpus"; fi

"$build/bench/tokenizer_throughput" --corpus "$corpus" --ids-out "$scratch/ids-ptrain.json"
names=()
for pkg in "${pkgs[@]}"; do
  name=$(basename "$pkg")
  start=$SECONDS
  node tests/common/gpt2/reference.js "${name%@*}" "$pkg" "$corpus" >"$scratch/ids-$name.json"
  echo "$name: encoded in $((SECONDS - start)) s"
  names+=("$name")
done

python3 - "$corpus" "$scratch" "${names[@]}" <<'EOF'
import json
import pathlib
import sys

corpus, scratch, names = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
text = corpus.read_bytes()
# Each id's bytes, from the vocabulary's stand-ins for bytes.
printable = [b for b in range(256)
             if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
stand_in = {b: b for b in printable}
for b in range(256):
    if b not in stand_in:
        stand_in[b] = 256 + len(stand_in) - len(printable)
byte_of = {chr(c): b for b, c in stand_in.items()}
encoder = json.loads(pathlib.Path("data/tokenizers/gpt2/encoder.json").read_text(encoding="utf-8"))
token_bytes = {i: bytes(byte_of[c] for c in t) for t, i in encoder.items()}

ours = json.loads((scratch / "ids-ptrain.json").read_text())
print(f"corpus {corpus}: {len(text)} bytes; ptrain: {len(ours)} ids")
failed = False
for name in names:
    theirs = json.loads((scratch / f"ids-{name}.json").read_text())
    if theirs == ours:
        print(f"  {name}: {len(theirs)} ids, identical")
        continue
    failed = True
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b),
             min(len(ours), len(theirs)))
    at = sum(len(token_bytes[t]) for t in ours[:i])
    print(f"  {name}: {len(theirs)} ids, DIFFERENT from id {i} "
          f"(byte {at} of the text)")
    print(f"    ptrain: {ours[i:i + 8]}")
    print(f"    {name}: {theirs[i:i + 8]}")
    print(f"    text there: {text[max(0, at - 40):at + 40]!r}")
sys.exit(1 if failed else 0)
EOF
