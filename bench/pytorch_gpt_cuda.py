#!/usr/bin/env python3
"""The model of bench/gpu_throughput in PyTorch on the same GPU: GPT-2 at
T = 1024, AdamW (fused) with norm clipping, at PyTorch's best settings —
fp32 with TF32 off (ptrain's fp32 compute), and bf16 autocast with
scaled_dot_product_attention (flash), eager and torch.compile'd. With
--arch llama, gpu_throughput --arch llama's Llama instead (RMSNorm, RoPE
with theta 500000, grouped-query attention, SwiGLU, untied head; the
formulas of bench/pytorch_llama.py), at the same settings.

    python3 bench/pytorch_gpt_cuda.py [--arch gpt|llama] [--model 124m|350m]
                                      [--batch 8] [--steps 10] [--device cuda]

--device cpu runs it on the CPU (a check that it runs, not a figure).
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F

# PyTorch 2.5 on: SDPA takes fewer key/value heads than query heads
# (enable_gqa) and its flash kernel reads each for its group.
SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)


def attention(q, k, v, flash):
    """Causal attention of q (B,NH,T,hs) over k, v (B,KVH,T,hs), KVH | NH."""
    groups = q.shape[1] // k.shape[1]
    if flash and groups > 1 and SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    if groups > 1:
        # Without enable_gqa each key/value head is repeated for its group:
        # the products are the same, the repeated copies cost memory and time.
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    if flash:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


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
        y = attention(q, k, v, self.flash)
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


def rms_norm(x, w, eps=1e-5):
    if hasattr(F, "rms_norm"):  # PyTorch 2.4 on
        return F.rms_norm(x, w.shape, w, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, cos, sin):
    """RoPE on x (B,NH,T,hs): channel i turns with channel i + hs/2."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LlamaBlock(torch.nn.Module):
    def __init__(self, C, NH, KVH, H, flash):
        super().__init__()
        self.NH, self.KVH, self.flash = NH, KVH, flash
        hs = C // NH
        self.ln_1 = torch.nn.Parameter(torch.ones(C))
        self.qkv = torch.nn.Linear(C, C + 2 * KVH * hs, bias=False)
        self.attn_proj = torch.nn.Linear(C, C, bias=False)
        self.ln_2 = torch.nn.Parameter(torch.ones(C))
        self.gate_up = torch.nn.Linear(C, 2 * H, bias=False)  # [gate; up], as ptrain's
        self.mlp_proj = torch.nn.Linear(H, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        hs = C // self.NH
        K = self.KVH * hs
        q, k, v = self.qkv(rms_norm(x, self.ln_1)).split([C, K, K], dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k, v = (t.view(B, T, self.KVH, hs).transpose(1, 2) for t in (k, v))
        y = attention(rotate(q, cos, sin), rotate(k, cos, sin), v, self.flash)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        gate, up = self.gate_up(rms_norm(x, self.ln_2)).chunk(2, dim=-1)
        return x + self.mlp_proj(F.silu(gate) * up)


class Llama(torch.nn.Module):
    def __init__(self, L, NH, KVH, C, H, T, V, flash, theta=500000.0):
        super().__init__()
        self.wte = torch.nn.Embedding(V, C)
        self.h = torch.nn.ModuleList(LlamaBlock(C, NH, KVH, H, flash) for _ in range(L))
        self.ln_f = torch.nn.Parameter(torch.ones(C))
        self.lm_head = torch.nn.Linear(C, V, bias=False)  # untied head
        hs = C // NH
        inv = 1.0 / theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)
        angle = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx)
        for b in self.h:
            x = b(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(rms_norm(x, self.ln_f))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def llama_flops_per_token(L, NH, KVH, C, H, T, V):
    """As ptrain counts a Llama's: the head once, each weight's 6 FLOPs a
    token, and every query head's scores and mix."""
    K = KVH * (C // NH)
    n = V * C + L * (2 * C * C + 2 * K * C + 3 * H * C + 2 * C) + C
    return 6 * n + 12 * L * C * T


# Shapes by --model: GPT-2's (layers, heads, width), and gpu_throughput
# --arch llama's key/value heads and MLP hidden width beside them.
SHAPES = {"124m": (12, 12, 768), "350m": (24, 16, 1024)}
LLAMA = {"124m": (4, 2048), "350m": (4, 2816)}


def build(arch, model, T, V, flash):
    """The model and its FLOPs per token."""
    L, NH, C = SHAPES[model]
    if arch == "llama":
        KVH, H = LLAMA[model]
        return (Llama(L, NH, KVH, C, H, T, V, flash),
                llama_flops_per_token(L, NH, KVH, C, H, T, V))
    return Gpt(L, NH, C, T, V, flash), flops_per_token(L, C, T, V)


def run(label, arch, model_name, B, V, steps, bf16, compiled, peak, device="cuda", T=1024):
    torch.manual_seed(0)
    model, per_token = build(arch, model_name, T, V, flash=bf16)
    model = model.to(device)
    cuda = device == "cuda"
    # fused=True is the CUDA kernel (the CPU takes the default).
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, **({"fused": True} if cuda else {}))
    fwd = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (B, T), device=device)
    tgt = torch.randint(0, V, (B, T), device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync()
    secs = (time.perf_counter() - t0) / steps
    flops = per_token * B * T
    print(f"pytorch {torch.__version__} {label:<22} B{B} T{T}: {secs * 1e3:7.1f} ms/step "
          f"{B * T / secs:9.0f} tok/s {flops / secs / 1e12:6.1f} TFLOP/s  "
          f"MFU {100 * flops / secs / (peak * 1e12):5.1f}% of {peak:.0f}  loss {loss.item():.3f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--model", default="124m", choices=["124m", "350m"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args()
    V = 50304
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # GPT-2's lines name it "GPT-2" and its compiled one by size alone, as
    # bench/gpu_targets.sh reads them; the Llama's name "Llama" in each.
    name = "GPT-2 " if a.arch == "gpt" else "Llama "
    compiled = "" if a.arch == "gpt" else "Llama "
    args = (a.arch, a.model, a.batch, V, a.steps)
    run(f"fp32 {name}{a.model}", *args, False, False, a.peak_tflops, a.device)
    run(f"bf16 {name}{a.model}", *args, True, False, a.peak_tflops, a.device)
    if not a.no_compile:
        run(f"bf16 compiled {compiled}{a.model}", *args, True, True, a.peak_tflops, a.device)


if __name__ == "__main__":
    main()
