#!/usr/bin/env python3
"""The model of bench/gpu_throughput in PyTorch on the same GPU: GPT-2 at
T = 1024, AdamW (fused) with norm clipping, at PyTorch's best settings —
fp32 with TF32 off (ptrain's fp32 compute), and bf16 autocast with
scaled_dot_product_attention (flash), eager and torch.compile'd.

    python3 bench/pytorch_gpt_cuda.py [--model 124m|350m] [--batch 8] [--steps 10]
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, C, NH, flash):
        super().__init__()
        self.NH, self.flash = NH, flash
        self.ln_1 = torch.nn.LayerNorm(C)
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.attn_proj = torch.nn.Linear(C, C)
        self.ln_2 = torch.nn.LayerNorm(C)
        self.c_fc = torch.nn.Linear(C, 4 * C)
        self.mlp_proj = torch.nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, L, NH, C, T, V, flash):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.wpe = torch.nn.Embedding(T, C)
        self.h = torch.nn.ModuleList(Block(C, NH, flash) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(C)
        # GPT-2's initialisation, as ptrain's: N(0, 0.02) matrices and
        # embeddings, zero biases, unit LayerNorm weights.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                torch.nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_token(L, C, T, V):
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C  # without wpe, as ptrain counts
    return 6 * n + 12 * L * C * T


def run(label, L, NH, C, B, V, steps, bf16, compiled, peak):
    T = 1024
    torch.manual_seed(0)
    model = Gpt(L, NH, C, T, V, flash=bf16).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / steps
    flops = flops_per_token(L, C, T, V) * B * T
    print(f"pytorch {torch.__version__} {label:<22} B{B} T{T}: {secs * 1e3:7.1f} ms/step "
          f"{B * T / secs:9.0f} tok/s {flops / secs / 1e12:6.1f} TFLOP/s  "
          f"MFU {100 * flops / secs / (peak * 1e12):5.1f}% of {peak:.0f}  loss {loss.item():.3f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="124m", choices=["124m", "350m"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    L, NH, C = (24, 16, 1024) if a.model == "350m" else (12, 12, 768)
    V = 50304
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    run(f"fp32 GPT-2 {a.model}", L, NH, C, a.batch, V, a.steps, False, False, a.peak_tflops)
    run(f"bf16 GPT-2 {a.model}", L, NH, C, a.batch, V, a.steps, True, False, a.peak_tflops)
    if not a.no_compile:
        run(f"bf16 compiled {a.model}", L, NH, C, a.batch, V, a.steps, True, True, a.peak_tflops)


if __name__ == "__main__":
    main()
