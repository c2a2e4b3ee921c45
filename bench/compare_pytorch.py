#!/usr/bin/python3
"""ptrain against PyTorch on configs S and M (CPU, fp32, AdamW), each at
every thread setting, side by side in one run: rounds interleave the runs
(ptrain with 1 and 2 OpenMP threads, PyTorch with 1 and 2 intra-op threads
and one inter-op thread), so that a noisy neighbour hits both alike. Prints
tokens/s of every run, min and median per setting, and the ratio of each
side's best median: the comparison is with PyTorch at its best setting on
this machine, not at its default.

    /usr/bin/python3 bench/compare_pytorch.py [--rounds 3] [--config S|M|both]
        [--ptrain build/bench/engine_throughput] [--steps N]

Run from the project root after `scripts/setup.sh --tests`.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOKS = re.compile(r"config (\w+) .*?([0-9.]+) tok/s")


def tokens_per_s(cmd, env, config):
    """Runs one benchmark process; its tokens/s for `config`."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    for line in out.stdout.splitlines():
        m = TOKS.search(line)
        if m and m.group(1) == config:
            return float(m.group(2))
    sys.exit(f"no tok/s for config {config} in:\n{out.stdout}")


def settings(args):
    """(side, label, command, extra environment) per setting."""
    s = []
    for threads in (1, 2):
        s.append(("ptrain", f"{threads} OpenMP thread(s)",
                  [args.ptrain, "--precision", "fp32"],
                  {"OMP_NUM_THREADS": str(threads)}))
    for threads in (1, 2):
        s.append(("pytorch", f"{threads} intra-op, 1 inter-op",
                  ["/usr/bin/python3", os.path.join(HERE, "pytorch_gpt.py"),
                   "--threads", str(threads), "--interop", "1"],
                  {"OMP_NUM_THREADS": str(threads)}))
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", choices=["S", "M", "both"], default="both")
    ap.add_argument("--ptrain", default="build/bench/engine_throughput")
    ap.add_argument("--steps", type=int, default=0,
                    help="measured steps per run (0: each benchmark's own)")
    args = ap.parse_args()
    if not os.path.exists(args.ptrain):
        sys.exit(f"{args.ptrain} not found: build it (scripts/setup.sh --tests)")
    configs = ["S", "M"] if args.config == "both" else [args.config]
    runs = settings(args)
    for config in configs:
        results = {i: [] for i in range(len(runs))}
        for r in range(args.rounds):
            # Each round starts one setting later: no setting always runs
            # first (or right after the heaviest).
            order = [(r + k) % len(runs) for k in range(len(runs))]
            for i in order:
                side, label, cmd, extra = runs[i]
                env = dict(os.environ, **extra)
                full = cmd + ["--config", config]
                if args.steps:
                    full += ["--steps", str(args.steps)]
                tps = tokens_per_s(full, env, config)
                results[i].append(tps)
                print(f"  round {r + 1} config {config} {side:7s} {label:22s}"
                      f" {tps:9.0f} tok/s", flush=True)
        print(f"config {config}: tok/s over {args.rounds} round(s)")
        best = {}
        for i, (side, label, _, _) in enumerate(runs):
            med = statistics.median(results[i])
            print(f"  {side:7s} {label:22s} min {min(results[i]):9.0f}"
                  f"  median {med:9.0f}")
            if side not in best or med > best[side][0]:
                best[side] = (med, label)
        (pt, pt_label), (tb, tb_label) = best["ptrain"], best["pytorch"]
        print(f"  ptrain best ({pt_label}) / PyTorch best ({tb_label}): "
              f"{pt / tb:.2f}x", flush=True)


if __name__ == "__main__":
    main()
