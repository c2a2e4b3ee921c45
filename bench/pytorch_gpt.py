#!/usr/bin/python3
"""The models of bench/engine_throughput in PyTorch (Debian's python3-torch),
same architecture, same batch, fp32, AdamW: tokens per second for comparison.

    /usr/bin/python3 bench/pytorch_gpt.py [--threads 2] [--interop 1]
                                          [--config S|M|both] [--steps 20]

--threads sets PyTorch's intra-op threads, --interop its inter-op threads.
Which is fastest depends on the machine: bench/compare_pytorch.py runs
each beside ptrain and compares with the best.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from make_gpt_reference import gpt_forward  # noqa: E402


def params_for(L, C, T, V, gen):
    p = {"wte": torch.randn(V, C, generator=gen) * 0.02,
         "wpe": torch.randn(T, C, generator=gen) * 0.02}
    for l in range(L):
        h = f"h.{l}."
        p[h + "ln_1.weight"] = torch.ones(C)
        p[h + "ln_1.bias"] = torch.zeros(C)
        p[h + "attn.c_attn.weight"] = torch.randn(3 * C, C, generator=gen) * 0.02
        p[h + "attn.c_attn.bias"] = torch.zeros(3 * C)
        p[h + "attn.c_proj.weight"] = torch.randn(C, C, generator=gen) * 0.02
        p[h + "attn.c_proj.bias"] = torch.zeros(C)
        p[h + "ln_2.weight"] = torch.ones(C)
        p[h + "ln_2.bias"] = torch.zeros(C)
        p[h + "mlp.c_fc.weight"] = torch.randn(4 * C, C, generator=gen) * 0.02
        p[h + "mlp.c_fc.bias"] = torch.zeros(4 * C)
        p[h + "mlp.c_proj.weight"] = torch.randn(C, 4 * C, generator=gen) * 0.02
        p[h + "mlp.c_proj.bias"] = torch.zeros(C)
    p["ln_f.weight"] = torch.ones(C)
    p["ln_f.bias"] = torch.zeros(C)
    return {k: v.requires_grad_() for k, v in p.items()}


def run(name, L, NH, C, T, B, V, steps, warmup):
    gen = torch.Generator().manual_seed(0)
    p = params_for(L, C, T, V, gen)
    opt = torch.optim.AdamW(p.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    times = []
    for s in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = gpt_forward(p, idx, tgt, L, NH)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
        opt.step()
        if s >= warmup:
            times.append(time.perf_counter() - t0)
    mean = sum(times) / len(times)
    print(f"pytorch {torch.__version__} config {name} (L{L} H{NH} C{C} T{T} B{B}): "
          f"{mean * 1e3:.1f} ms/step, {B * T / mean:.0f} tok/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--interop", type=int, default=0,
                    help="inter-op threads (0: PyTorch's default)")
    ap.add_argument("--config", choices=["S", "M", "both"], default="both")
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.interop > 0:
        torch.set_num_interop_threads(args.interop)
    print(f"threads {torch.get_num_threads()}, "
          f"inter-op {torch.get_num_interop_threads()}")
    if args.config in ("S", "both"):
        run("S", 4, 4, 128, 64, 16, 65, args.steps or 40, 5)
    if args.config in ("M", "both"):
        run("M", 6, 6, 384, 256, 8, 65, args.steps or 6, 2)


if __name__ == "__main__":
    main()
