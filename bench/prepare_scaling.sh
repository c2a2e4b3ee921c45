#!/bin/sh
# `ptworker prepare` on one thread against two (the target: two
# cores >= 1.8x one), gpt2, on a corpus of data/tinyshakespeare.txt and the
# repository's tracked sources and docs (about 4 MB, each file a document)
# taken COPIES times over (MODE same: the same text again under other
# names, so past the first copy each thread's word cache knows the words,
# as in the bulk of a large corpus; MODE rotated: letters rotated by 0, 1,
# ... places, new words in every copy, which every thread has to merge
# itself). The two runs alternate ROUNDS times into fresh folders. Prints
# each round's encoding seconds (prepare's summary: chunks encoded and
# shards written, after start-up and the chunk plan) and their ratio, the
# medians, the whole commands' medians, whether the runs wrote the same
# bytes (they must), and what the machine gave two processes that share
# nothing (sha256sum, one against two at once) at the end: on a machine
# others use, the ceiling.
#
#   bench/prepare_scaling.sh [ROUNDS] [COPIES] [same|rotated]
#   (ptworker built in build/, or $PTRAIN_BUILD)
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-5}
copies=${2:-16}
mode=${3:-same}
bin=${PTRAIN_BUILD:-build}/worker/ptworker
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/corpus"
lower=abcdefghijklmnopqrstuvwxyz
upper=ABCDEFGHIJKLMNOPQRSTUVWXYZ
git ls-files '*.cc' '*.h' '*.cpp' '*.cu' '*.md' '*.py' '*.sh' '*.yaml' \
  >"$tmp/files"
echo data/tinyshakespeare.txt >>"$tmp/files"
c=0
while [ "$c" -lt "$copies" ]; do
  to_l=$lower to_u=$upper
  r=$((c % 26))
  # (every 26th copy is the text itself again)
  if [ "$mode" = rotated ] && [ "$r" -gt 0 ]; then
    to_l=$(echo "$lower" | cut -c$((r + 1))-)$(echo "$lower" | cut -c1-"$r")
    to_u=$(echo "$upper" | cut -c$((r + 1))-)$(echo "$upper" | cut -c1-"$r")
  fi
  while read -r f; do
    tr "$lower$upper" "$to_l$to_u" <"$f" >"$tmp/corpus/$c-$(echo "$f" | tr / _)"
  done <"$tmp/files"
  c=$((c + 1))
done
bytes=$(cat "$tmp"/corpus/* | wc -c)
echo "corpus ($mode): $(ls "$tmp/corpus" | wc -l) files, $bytes bytes;" \
  "$(nproc) cores"

# run THREADS ROUND: one preparation; prints "encode_s wall_s".
run() {
  out="$tmp/out$1_$2"
  mkdir "$out"
  start=$(date +%s.%N)
  line=$("$bin" prepare --tokenizer gpt2 --input "$tmp/corpus/*" \
    --out "$out/c" --threads "$1")
  end=$(date +%s.%N)
  enc=$(echo "$line" | sed -n 's/.*, \([0-9.]*\) s, .*/\1/p')
  awk -v e="$enc" -v a="$start" -v b="$end" 'BEGIN {printf "%s %.2f\n", e, b - a}'
}

i=0
while [ "$i" -lt "$rounds" ]; do
  i=$((i + 1))
  set -- $(run 1 "$i") $(run 2 "$i")
  echo "$1 $3 $2 $4" >>"$tmp/rounds"
  awk -v a="$1" -v b="$3" -v i="$i" 'BEGIN {
    printf "round %d: 1 thread %.2f s, 2 threads %.2f s: %.2fx\n", i, a, b, a / b
  }'
done

if cmp -s "$tmp/out1_1/c/c_train_000000.bin" "$tmp/out2_1/c/c_train_000000.bin" &&
  cmp -s "$tmp/out1_1/c/c_prepare.json" "$tmp/out2_1/c/c_prepare.json"; then
  same="identical"
else
  same="DIFFERENT (a bug)"
fi

# Two processes that share nothing, against one: the machine's ceiling now.
cat "$tmp"/corpus/* "$tmp"/corpus/* >"$tmp/big"
sha256sum "$tmp/big" >/dev/null  # read once: from the page cache after
t0=$(date +%s.%N)
sha256sum "$tmp/big" >/dev/null
t1=$(date +%s.%N)
sha256sum "$tmp/big" >/dev/null &
sha256sum "$tmp/big" >/dev/null
wait
t2=$(date +%s.%N)

# median COLUMN: of the rounds' column (1: encode 1 thread, 2: encode 2,
# 3: wall 1, 4: wall 2, 5: the round's encode ratio).
median() {
  awk '{print $0, $1 / $2}' "$tmp/rounds" | sort -n -k"$1" |
    awk -v k="$1" '{v[NR] = $k} END {
      if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2
    }'
}
echo "--- medians of $rounds rounds, $bytes bytes; 1 and 2 threads wrote" \
  "$same shards"
awk -v b="$bytes" -v e1="$(median 1)" -v e2="$(median 2)" \
  -v w1="$(median 3)" -v w2="$(median 4)" -v r="$(median 5)" \
  -v a="$t0" -v m="$t1" -v z="$t2" 'BEGIN {
  printf "1 thread:  encode %.2f s (%.1f MB/s), whole command %.2f s\n", e1, b / 1e6 / e1, w1
  printf "2 threads: encode %.2f s (%.1f MB/s), whole command %.2f s\n", e2, b / 1e6 / e2, w2
  printf "speed-up: encode %.2fx (median of the rounds: %.2fx), whole command %.2fx; target >= 1.8x\n", e1 / e2, r, w1 / w2
  printf "this machine at the end: two sha256sum at once did %.2fx the work of one\n", 2 * (m - a) / (z - m)
}'
