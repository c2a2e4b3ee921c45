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
# Prints, for each, the whole command's seconds (the fastest of ROUNDS,
# default 3); MB of document text a second (the same text in each) and
# its ratio to text's; MB of input a second, as the corpus ships before
# compression (the .txt, or the JSON lines with their other fields: what
# each form's reader goes through) and its ratio to text's; the peak
# resident memory (ru_maxrss); and whether all four wrote the same shards
# (they must: the same documents, end of text between them, give the same
# tokens; the .txt holds the blank lines too, so only the JSON forms are
# held to the bytes).
#
#   bench/prepare_corpus.sh [INPUT_MB] [THREADS] [ROUNDS]
#   (ptworker built in build/, or $PTRAIN_BUILD; TMPDIR holds the corpus,
#   its decoded copy and the shards: about 4 × INPUT_MB)
set -eu
cd "$(dirname "$0")/.."
mb=${1:-200}
threads=${2:-$(nproc)}
rounds=${3:-3}
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

# Each form ROUNDS times, the forms taking turns (the machine's drift falls
# on all alike); its fastest round counts.
python3 - "$bin" "$tmp" "$threads" "$text_mb" "$rounds" <<'PY'
import filecmp, os, shutil, subprocess, sys, time
bin, tmp, threads, text_mb, rounds = sys.argv[1:6]
text_mb, rounds = float(text_mb), int(rounds)
forms = [("text", "c.txt"), ("jsonl", "c.jsonl"), ("zst", "c.jsonl.zst"),
         ("gz", "c.jsonl.gz")]
input_mb = {"c.txt": os.path.getsize(f"{tmp}/c.txt") / 1e6}
for _, f in forms[1:]:
    input_mb[f] = os.path.getsize(f"{tmp}/c.jsonl") / 1e6
best, peak = {}, {}
for _ in range(rounds):
    for name, f in forms:
        shutil.rmtree(f"{tmp}/{name}", ignore_errors=True)
        os.mkdir(f"{tmp}/{name}")
        start = time.monotonic()
        p = subprocess.Popen([bin, "prepare", "--tokenizer", "gpt2", "--input",
                              f"{tmp}/{f}", "--out", f"{tmp}/{name}/out",
                              "--threads", threads, "--val-fraction", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        err = p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.monotonic() - start
        if status != 0:
            sys.exit(f"{name}: exit status {status}: {err}")
        best[name] = min(best.get(name, seconds), seconds)
        peak[name] = max(peak.get(name, 0), usage.ru_maxrss / 1024)
print(f"{'form':6} {'seconds':>8} {'text MB/s':>10} {'x text':>7} "
      f"{'input MB/s':>11} {'x text':>7} {'peak MiB':>9}")
base = input_base = None
for name, f in forms:
    t = best[name]
    rate, in_rate = text_mb / t, input_mb[f] / t
    base = base or rate
    input_base = input_base or in_rate
    print(f"{name:6} {t:8.2f} {rate:10.2f} {rate / base:7.2f} "
          f"{in_rate:11.2f} {in_rate / input_base:7.2f} {peak[name]:9.0f}")
shards = [b for b in sorted(os.listdir(f"{tmp}/jsonl/out"))
          if b.startswith("out_train_")]
same = all(filecmp.cmp(f"{tmp}/jsonl/out/{b}", f"{tmp}/{name}/out/{b}",
                       shallow=False)
           for name in ("zst", "gz") for b in shards)
print(f"the JSON forms wrote the same shards: {'yes' if same else 'no'}")
PY
