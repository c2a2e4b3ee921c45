#!/bin/sh
# `ptworker prepare` on a corpus as large corpora ship, against the same
# documents as plain text: MB of INPUT_MB of JSON lines (documents: the
# paragraphs of data/tinyshakespeare.txt, each record with an id and a
# source beside its "text", letters rotated by one more place each pass
# through the play so that words keep coming that the encoder has not
# seen), prepared as
#   text   the documents in one .txt file, a blank line between them
#   jsonl  the .jsonl file
#   zst    the .jsonl file compressed with zstd (-3)
#   gz     the .jsonl file compressed with gzip (-6)
# Prints, for each, the whole command's seconds, MB of document text a
# second (the same text in each) and its ratio to text's, and the peak
# resident memory (ru_maxrss), and whether all four wrote the same shards
# (they must: the same documents, end of text between them, give the same
# tokens; the .txt holds the blank lines too, so only the JSON forms are
# held to the bytes).
#
#   bench/prepare_corpus.sh [INPUT_MB] [THREADS]
#   (ptworker built in build/, or $PTRAIN_BUILD; TMPDIR holds the corpus,
#   its decoded copy and the shards: about 4 × INPUT_MB)
set -eu
cd "$(dirname "$0")/.."
mb=${1:-200}
threads=${2:-$(nproc)}
bin=$(realpath "${PTRAIN_BUILD:-build}/worker/ptworker")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$mb" "$tmp" <<'PY'
import json, sys
mb, tmp = int(sys.argv[1]), sys.argv[2]
play = open("data/tinyshakespeare.txt", encoding="utf-8").read()
paras = [p for p in play.split("\n\n") if p.strip()]
lower, upper = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
limit = mb * 1_000_000
size, n, rot = 0, 0, 0
with open(f"{tmp}/c.jsonl", "w", encoding="utf-8") as j, \
     open(f"{tmp}/c.txt", "w", encoding="utf-8") as t:
    while size < limit:
        r = rot % 26
        table = str.maketrans(lower + upper,
                              lower[r:] + lower[:r] + upper[r:] + upper[:r])
        for p in paras:
            text = p.translate(table)
            line = json.dumps({"id": n, "source": "shakespeare", "text": text},
                              ensure_ascii=False) + "\n"
            j.write(line)
            t.write(text + "\n\n")
            size += len(line.encode())
            n += 1
            if size >= limit:
                break
        rot += 1
print(f"corpus: {n} documents, {size / 1e6:.0f} MB of JSON lines")
PY
zstd -q -3 -k "$tmp/c.jsonl" -o "$tmp/c.jsonl.zst"
gzip -6 -k "$tmp/c.jsonl"
text_mb=$(python3 -c "
import json,sys
print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1], encoding='utf-8')) / 1e6)" "$tmp/c.jsonl")
echo "document text: $text_mb MB; .jsonl.zst $(($(stat -c %s "$tmp/c.jsonl.zst") / 1000000)) MB," \
  ".jsonl.gz $(($(stat -c %s "$tmp/c.jsonl.gz") / 1000000)) MB; $threads threads, $(nproc) cores"

# measure NAME INPUT: one preparation; prints "NAME seconds MB/s peak_MiB".
measure() {
  python3 - "$bin" "$1" "$2" "$tmp" "$threads" "$text_mb" <<'PY'
import resource, subprocess, sys, time
bin, name, inp, tmp, threads, text_mb = sys.argv[1:7]
start = time.monotonic()
r = subprocess.run([bin, "prepare", "--tokenizer", "gpt2", "--input", inp,
                    "--out", f"{tmp}/{name}/out", "--threads", threads,
                    "--val-fraction", "0"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
seconds = time.monotonic() - start
if r.returncode != 0:
    sys.exit(f"{name}: exit {r.returncode}: {r.stderr}")
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(f"{name} {seconds:.2f} {float(text_mb) / seconds:.2f} {peak:.0f}")
PY
}

printf '%-6s %9s %9s %8s %10s\n' form seconds "MB/s" "x text" "peak MiB"
base=""
for form in text:c.txt jsonl:c.jsonl zst:c.jsonl.zst gz:c.jsonl.gz; do
  name=${form%%:*}
  mkdir "$tmp/$name"
  set -- $(measure "$name" "$tmp/${form#*:}")
  [ -n "$base" ] || base=$3
  printf '%-6s %9s %9s %8.2f %10s\n' "$1" "$2" "$3" "$(awk "BEGIN{print $3 / $base}")" "$4"
done
same=yes
for name in zst gz; do
  for f in "$tmp/jsonl/out"/out_train_*.bin; do
    cmp -s "$f" "$tmp/$name/out/$(basename "$f")" || same=no
  done
done
echo "the JSON forms wrote the same shards: $same"
