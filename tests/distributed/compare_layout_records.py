#!/usr/bin/env python3
"""Compares two layout-equivalence records bit for bit.

Each record is what `layout_equivalence_test` appends to the file named by
PTRAIN_LAYOUT_RECORD: one line per row (and per reference run) with the
row's name, device, a digest of the final weights' bits and every step's
loss as a hex float. A restructuring that claims "behaviour unchanged"
records the rows at its starting commit and at its end and runs

    compare_layout_records.py BEFORE AFTER

which prints each row that differs and the count of identical rows, and
exits 1 unless every row of BEFORE is in AFTER with the same bits.
"""
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) < 4:
                sys.exit(f"{path}:{n}: not a record line: {line.strip()!r}")
            rows[(parts[0], parts[1])] = (parts[2], parts[3:])
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: compare_layout_records.py BEFORE AFTER")
    before, after = load(sys.argv[1]), load(sys.argv[2])
    same = 0
    for key, (digest, losses) in sorted(before.items()):
        name = f"{key[0]} ({key[1]})"
        if key not in after:
            print(f"MISSING  {name}")
            continue
        digest2, losses2 = after[key]
        if (digest, losses) == (digest2, losses2):
            same += 1
            continue
        steps = [i for i, (a, b) in enumerate(zip(losses, losses2)) if a != b]
        first = steps[0] if steps else None
        print(f"DIFFERS  {name}: weights {'same' if digest == digest2 else 'differ'}"
              + (f", losses from step {first} ({float.fromhex(losses[first])!r} vs "
                 f"{float.fromhex(losses2[first])!r})" if first is not None
                 else "" if len(losses) == len(losses2) else ", step counts differ"))
    extra = sorted(set(after) - set(before))
    for key in extra:
        print(f"NEW      {key[0]} ({key[1]})")
    print(f"{same} of {len(before)} rows bit-identical")
    return 0 if same == len(before) else 1


if __name__ == "__main__":
    sys.exit(main())
