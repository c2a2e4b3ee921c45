#!/usr/bin/python3
"""PyTorch reference for ptrain's GPT: reads the weights, batch and
hyperparameters ptrain wrote (gpt_reference_dump), builds the same GPT-2 in
PyTorch, and writes logits, loss, every parameter gradient and the losses of
ten AdamW steps for tests/worker/engine/model_reference_test.cc.

Runs with Debian's python3-torch: /usr/bin/python3 make_gpt_reference.py IN OUT
The record format (both files): magic b"PTREF1\\0\\0", then records of
int32 name length, name, int32 dtype (0 float32, 1 int32), int32 ndim,
int64 dims, raw little-endian data.
"""
import argparse
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = b"PTREF1\0\0"


def read_records(path):
    out = {}
    with open(path, "rb") as f:
        if f.read(8) != MAGIC:
            sys.exit(f"{path}: not a ptrain reference file")
        while True:
            head = f.read(4)
            if not head:
                break
            (n,) = struct.unpack("<i", head)
            name = f.read(n).decode()
            dtype, ndim = struct.unpack("<ii", f.read(8))
            dims = struct.unpack(f"<{ndim}q", f.read(8 * ndim))
            np_dtype = np.float32 if dtype == 0 else np.int32
            count = int(np.prod(dims)) if ndim else 1
            data = np.frombuffer(f.read(4 * count), dtype=np_dtype).reshape(dims)
            out[name] = data
    return out


def write_records(path, records):
    with open(path, "wb") as f:
        f.write(MAGIC)
        for name, arr in records:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)))
            f.write(raw)
            f.write(struct.pack("<ii", 0, arr.ndim))
            f.write(struct.pack(f"<{arr.ndim}q", *arr.shape))
            f.write(arr.tobytes())


def gpt_forward(p, idx, targets, L, NH):
    B, T = idx.shape
    C = p["wte"].shape[1]
    hs = C // NH
    x = p["wte"][idx] + p["wpe"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = f"h.{l}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        qkv = a @ p[h + "attn.c_attn.weight"].T + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"].T + p[h + "attn.c_proj.bias"]
        a = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        a = a @ p[h + "mlp.c_fc.weight"].T + p[h + "mlp.c_fc.bias"]
        a = F.gelu(a, approximate="tanh")
        x = x + a @ p[h + "mlp.c_proj.weight"].T + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte"].T
    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
    return logits, loss


def learning_rate(step, lr, min_lr, warmup, steps):
    # Same schedule as worker/engine/parallel/optimizer.cc LearningRate().
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = steps - warmup
    if decay_steps <= 1:
        return lr
    ratio = min((step - warmup) / (decay_steps - 1), 1.0)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(1)

    rec = read_records(args.inp)
    L, NH, C, block, V, B, T = (int(v) for v in rec.pop("config"))
    lr, min_lr, warmup, steps, wd, clip, b1, b2, eps = (
        float(v) for v in rec.pop("hyper"))
    idx = torch.from_numpy(rec.pop("inputs").astype(np.int64))
    tgt = torch.from_numpy(rec.pop("targets").astype(np.int64))
    names = list(rec.keys())  # parameters, in ptrain's layout order
    p = {n: torch.tensor(rec[n], dtype=dtype, requires_grad=True) for n in names}

    logits, loss = gpt_forward(p, idx, tgt, L, NH)
    loss.backward()
    out = [("logits", logits.detach().numpy()),
           ("loss", np.array([loss.item()]))]
    # copy: the optimizer loop below zeroes and refills .grad in place
    out += [("grad." + n, p[n].grad.numpy().copy()) for n in names]

    decay = [p[n] for n in names if p[n].dim() == 2]
    no_decay = [p[n] for n in names if p[n].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(b1, b2), eps=eps)
    losses = []
    for step in range(int(steps)):
        opt.zero_grad()
        _, loss = gpt_forward(p, idx, tgt, L, NH)
        loss.backward()
        losses.append(loss.item())
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, lr, min_lr, int(warmup), int(steps))
        opt.step()
    out.append(("losses", np.array(losses)))
    write_records(args.out, out)
    print(f"wrote {args.out}: loss {out[1][1][0]:.6f}, "
          f"{len(names)} gradients, {len(losses)} step losses")


if __name__ == "__main__":
    main()
