#!/usr/bin/python3
"""A Llama in PyTorch from the published formulas (RMSNorm, rotary positions
with Llama 3's frequency scaling, grouped-query attention, SwiGLU), the
reference ptrain's arch llama is checked against; with --experts, Mixtral's
Mixture-of-Experts MLP (a softmax router, the top 2 experts' scores
normalised to sum 1, SwiGLU experts), the reference of model.moe; with
--qwen3, Qwen3's attention (heads of head_dim 16 apart from the width, each
query and key head RMS-normalised before rotary positions) and, with
--experts, Qwen3-MoE's layout (experts in every second block, the others
dense; the router `mlp.gate`, experts' gate_proj, up_proj and down_proj).

    /usr/bin/python3 bench/pytorch_llama.py OUT_DIR [--rope-scaling] [--experts E] [--qwen3]

writes a Hugging Face model folder of random weights (config.json,
model.safetensors) of a 4-layer model (n_head 8, n_kv_head 2, untied head,
rope_theta 500000; with --rope-scaling, Llama 3's scaling) and
OUT_DIR/reference.bin: a batch, the AdamW hyperparameters, and the losses of
21 passes over that batch with 20 AdamW steps between them, computed here in
float64. tests/worker/engine/llama_reference_test.cc loads the folder through
model.init_from's reader (hf:DIR), trains the same way in fp32 and compares.
Nothing is downloaded. The record format is tests/reference/make_gpt_reference.py's.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from make_gpt_reference import learning_rate, write_records  # noqa: E402

L, NH, KVH, C, H, V, B, T = 4, 8, 2, 64, 160, 97, 4, 16
THETA = 500000.0
HYPER = dict(lr=3e-3, min_lr=3e-4, warmup=2, steps=20, wd=0.1, clip=1.0,
             b1=0.9, b2=0.95, eps=1e-8)
NORM_EPS = 1e-5
TOP_K, EXPERT_H = 2, 48  # with --experts: experts a token, their width
QWEN3_HD, SPARSE_STEP = 16, 2  # with --qwen3: head_dim, decoder_sparse_step


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def inv_freq(hs, scaling):
    """RoPE's frequencies in float32 steps, with Llama 3's scaling."""
    inv = 1.0 / (torch.tensor(THETA, dtype=torch.float32) **
                 (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
    if not scaling:
        return inv
    factor, low, high, ctx = (scaling[k] for k in (
        "factor", "low_freq_factor", "high_freq_factor",
        "original_max_position_embeddings"))
    wavelen = 2 * math.pi / inv
    smooth = (ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > ctx / low, inv / factor, inv)
    between = (wavelen <= ctx / low) & (wavelen >= ctx / high)
    return torch.where(between, blended, out)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * w


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def moe_names(h, qwen3):
    """The router's name, and each expert's gate, up and down projections':
    Mixtral's or Qwen3-MoE's."""
    if qwen3:
        return (h + "mlp.gate.weight",
                lambda e: [h + f"mlp.experts.{e}.{n}_proj.weight"
                           for n in ("gate", "up", "down")])
    return (h + "block_sparse_moe.gate.weight",
            lambda e: [h + f"block_sparse_moe.experts.{e}.{n}.weight"
                       for n in ("w1", "w3", "w2")])


def moe_mlp(p, h, a, experts, qwen3):
    """The sparse MLP (Mixtral's, Qwen3-MoE's with norm_topk_prob): each
    token's top 2 experts by softmax score, their outputs weighted by the two
    scores over their sum."""
    gate, expert = moe_names(h, qwen3)
    probs = (a @ p[gate].T).softmax(dim=-1)
    top, chosen = probs.topk(TOP_K, dim=-1)
    weights = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(a)
    for e in range(experts):
        w1, w3, w2 = expert(e)
        w = (weights * (chosen == e)).sum(dim=-1, keepdim=True)
        y = F.silu(a @ p[w1].T) * (a @ p[w3].T)
        out = out + w * (y @ p[w2].T)
    return out


def sparse(l, experts, qwen3):
    """Block l's MLP has experts: every block (Mixtral), every SPARSE_STEP-th
    (Qwen3-MoE's decoder_sparse_step: blocks 1, 3, ...)."""
    return experts and (not qwen3 or (l + 1) % SPARSE_STEP == 0)


def llama_forward(p, idx, targets, freqs, experts, qwen3):
    hs = QWEN3_HD if qwen3 else C // NH
    x = p["model.embed_tokens.weight"][idx]
    angle = torch.arange(T, dtype=torch.float32)[:, None] * freqs[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = f"model.layers.{l}."
        a = rms_norm(x, p[h + "input_layernorm.weight"])
        q = (a @ p[h + "self_attn.q_proj.weight"].T).view(B, T, NH, hs)
        k = (a @ p[h + "self_attn.k_proj.weight"].T).view(B, T, KVH, hs)
        if qwen3:
            q = rms_norm(q, p[h + "self_attn.q_norm.weight"])
            k = rms_norm(k, p[h + "self_attn.k_norm.weight"])
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = (a @ p[h + "self_attn.v_proj.weight"].T).view(B, T, KVH, hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(NH // KVH, dim=1)
        v = v.repeat_interleave(NH // KVH, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + y @ p[h + "self_attn.o_proj.weight"].T
        a = rms_norm(x, p[h + "post_attention_layernorm.weight"])
        if sparse(l, experts, qwen3):
            x = x + moe_mlp(p, h, a, experts, qwen3)
            continue
        g = F.silu(a @ p[h + "mlp.gate_proj.weight"].T) * (a @ p[h + "mlp.up_proj.weight"].T)
        x = x + g @ p[h + "mlp.down_proj.weight"].T
    logits = rms_norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
    return F.cross_entropy(logits.view(-1, V), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rope-scaling", action="store_true")
    ap.add_argument("--experts", type=int, default=0)
    ap.add_argument("--qwen3", action="store_true")
    args = ap.parse_args()
    experts, qwen3 = args.experts, args.qwen3
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    scaling = ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
               if args.rope_scaling else None)
    gen = torch.Generator().manual_seed(61)
    hs = QWEN3_HD if qwen3 else C // NH
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,),
              "lm_head.weight": (V, C)}
    for l in range(L):
        h = f"model.layers.{l}."
        shapes.update({
            h + "input_layernorm.weight": (C,),
            h + "self_attn.q_proj.weight": (NH * hs, C),
            h + "self_attn.k_proj.weight": (KVH * hs, C),
            h + "self_attn.v_proj.weight": (KVH * hs, C),
            h + "self_attn.o_proj.weight": (C, NH * hs),
            h + "post_attention_layernorm.weight": (C,)})
        if qwen3:
            shapes.update({h + "self_attn.q_norm.weight": (hs,),
                           h + "self_attn.k_norm.weight": (hs,)})
        if not sparse(l, experts, qwen3):
            shapes.update({h + "mlp.gate_proj.weight": (H, C),
                           h + "mlp.up_proj.weight": (H, C),
                           h + "mlp.down_proj.weight": (C, H)})
            continue
        gate, expert = moe_names(h, qwen3)
        shapes[gate] = (experts, C)
        for e in range(experts):
            w1, w3, w2 = expert(e)
            shapes.update({w1: (EXPERT_H, C), w3: (EXPERT_H, C),
                           w2: (C, EXPERT_H)})
    weights = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norms: around one
            weights[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:
            weights[name] = 0.1 * torch.randn(shape, generator=gen)
    write_safetensors(os.path.join(args.out, "model.safetensors"),
                      {n: w.numpy() for n, w in weights.items()})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": C, "intermediate_size": H, "num_hidden_layers": L,
              "num_attention_heads": NH, "num_key_value_heads": KVH,
              "max_position_embeddings": T, "vocab_size": V,
              "rms_norm_eps": NORM_EPS, "rope_theta": THETA,
              "rope_scaling": scaling, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float32"}
    if qwen3:
        config.update({"architectures": ["Qwen3ForCausalLM"],
                       "model_type": "qwen3", "head_dim": hs,
                       "attention_bias": False, "use_sliding_window": False,
                       "sliding_window": None, "max_window_layers": L})
    if qwen3 and experts:
        config.update({"architectures": ["Qwen3MoeForCausalLM"],
                       "model_type": "qwen3_moe",
                       "moe_intermediate_size": EXPERT_H,
                       "num_experts": experts, "num_experts_per_tok": TOP_K,
                       "norm_topk_prob": True,
                       "decoder_sparse_step": SPARSE_STEP,
                       "mlp_only_layers": [], "router_aux_loss_coef": 0.0})
    elif experts:
        config.update({"architectures": ["MixtralForCausalLM"],
                       "model_type": "mixtral", "intermediate_size": EXPERT_H,
                       "num_local_experts": experts,
                       "num_experts_per_tok": TOP_K,
                       "router_aux_loss_coef": 0.0, "sliding_window": None})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    idx = torch.randint(0, V, (B, T), generator=gen)
    tgt = torch.randint(0, V, (B, T), generator=gen)
    p = {n: w.to(torch.float64).requires_grad_(True) for n, w in weights.items()}
    freqs = inv_freq(hs, scaling).to(torch.float64)
    hp = HYPER
    decay = [w for w in p.values() if w.dim() == 2]
    no_decay = [w for w in p.values() if w.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["wd"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["b1"], hp["b2"]), eps=hp["eps"])
    losses = []
    for step in range(hp["steps"] + 1):
        opt.zero_grad()
        loss = llama_forward(p, idx, tgt, freqs, experts, qwen3)
        losses.append(loss.item())
        if step == hp["steps"]:
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), hp["clip"])
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, hp["lr"], hp["min_lr"], hp["warmup"],
                                    hp["steps"])
        opt.step()
    hyper = [hp[k] for k in ("lr", "min_lr", "warmup", "steps", "wd", "clip",
                             "b1", "b2", "eps")]
    write_records(os.path.join(args.out, "reference.bin"), [
        ("config", np.array([L, NH, KVH, C,
                             EXPERT_H if experts and not qwen3 else H, V, B,
                             T], dtype=np.float32)),
        ("hyper", np.array(hyper)),
        ("inputs", idx.numpy().astype(np.float32)),
        ("targets", tgt.numpy().astype(np.float32)),
        ("losses", np.array(losses))])
    print(f"wrote {args.out}: losses {losses[0]:.6f} -> {losses[-1]:.6f}"
          f"{' (rope scaling)' if scaling else ''}"
          f"{f' ({experts} experts)' if experts else ''}"
          f"{' (qwen3)' if qwen3 else ''}")


if __name__ == "__main__":
    main()
