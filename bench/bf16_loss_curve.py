#!/usr/bin/env python3
"""bf16 against fp32: the same job trained twice, the loss curves side by side.

Runs `ptworker` on one job spec with train.precision=fp32 and then bf16
(same seed, same batches, same initial weights: only the numerics differ)
and prints, at every evaluation step, the validation loss of each and the
mean training loss over the steps since the previous evaluation, with the
relative difference of bf16 from fp32 beside the tolerance (1% by default).
Exits 1 when a difference is over it, 2 on bad arguments or a failed run.

  bench/bf16_loss_curve.py --ptworker build/worker/ptworker \\
      --config examples/shakespeare-char.yaml --steps 1000 --every 100

On a GPU add --device cuda (and a larger model through --set, e.g.
model.n_layer=12 model.n_head=12 model.n_embd=768 model.block_size=1024 for
GPT-2 124M on a token file). On the CPU, bf16 needs AVX512_BF16.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(args, precision, folder):
    log = os.path.join(folder, precision + ".jsonl")
    cmd = [args.ptworker, "--config", args.config, "--log-json", log,
           "--log-level", "warn"]
    sets = [f"train.precision={precision}",
            f"train.steps={args.steps}",
            f"train.eval_every={args.every}",
            "train.sample_tokens=0",
            "train.log_every=100",
            f"checkpoint.dir={os.path.join(folder, precision)}",
            "checkpoint.every=0",
            f"resources.device={args.device}"] + args.set
    for s in sets:
        cmd += ["--set", s]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        sys.exit(f"bf16_loss_curve: the {precision} run failed "
                 f"(exit {done.returncode})")
    steps, evals = {}, {}
    with open(log) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "step":
                steps[rec["step"]] = rec["loss"]
            elif rec.get("type") == "eval":
                evals[rec["step"]] = rec["val_loss"]
    return steps, evals


def window_mean(steps, lo, hi):
    vals = [steps[s] for s in range(lo + 1, hi + 1) if s in steps]
    return sum(vals) / len(vals) if vals else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ptworker", default="build/worker/ptworker")
    p.add_argument("--config", default="examples/shakespeare-char.yaml")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=100,
                   help="evaluation interval (the table's rows)")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="largest relative difference of bf16 from fp32")
    p.add_argument("--set", action="append", default=[],
                   help="another spec override (repeatable)")
    args = p.parse_args()
    if args.steps < 1 or args.every < 1 or args.every > args.steps:
        p.error("--steps and --every must be positive, --every <= --steps")

    with tempfile.TemporaryDirectory(prefix="bf16_loss_curve_") as folder:
        fp32_steps, fp32_evals = run(args, "fp32", folder)
        bf16_steps, bf16_evals = run(args, "bf16", folder)

    print(f"\n{'step':>6} {'val fp32':>9} {'val bf16':>9} {'rel':>8}   "
          f"{'train fp32':>10} {'train bf16':>10} {'rel':>8}")
    worst = 0.0
    prev = 0
    for step in sorted(fp32_evals):
        if step not in bf16_evals:
            continue
        v32, v16 = fp32_evals[step], bf16_evals[step]
        t32 = window_mean(fp32_steps, prev, step)
        t16 = window_mean(bf16_steps, prev, step)
        rv = abs(v16 - v32) / abs(v32)
        rt = abs(t16 - t32) / abs(t32)
        worst = max(worst, rv, rt)
        print(f"{step:>6} {v32:>9.4f} {v16:>9.4f} {rv:>8.2%}   "
              f"{t32:>10.4f} {t16:>10.4f} {rt:>8.2%}")
        prev = step
    ok = worst <= args.tolerance
    print(f"\nlargest relative difference {worst:.2%} "
          f"(tolerance {args.tolerance:.0%}): {'within' if ok else 'OVER'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
