#!/usr/bin/env python3
"""Writes the hardware profiles of the GPUs ptrain ships (planner/profiles/).

Each profile is built from the vendor's published peak figures and the
efficiencies stated here (the share of a peak a kernel of a given size
reaches), anchored where they can be on what a lent H200 measured of
ptrain's own kernels (docs/cuda.md); the rest are assumptions, not
measurements. Run it after changing a figure, or with what a lent GPU
measured in place of the stated kernels (docs/planner.md):

  python3 scripts/gpu_profiles.py planner/profiles
  python3 scripts/gpu_profiles.py planner/profiles --measured h200=h200.json
"""
import argparse
import json
import os
import sys

GiB = 1 << 30

# Share of the dense bf16 peak a cuBLAS GEMM of m = n = k = size sustains
# in training (clocks under a full card's power draw, not an isolated
# GEMM's boost): forward; a backward's dinp and dweight GEMMs reach
# BACKWARD_SHARE of it. Hopper's is anchored on the H200 measured
# 2026-11-27 (docs/cuda.md: GPT-2 124M's forward matmuls at m=8192,
# n,k in 768..3072 ran near 57% of the peak, the backward's near 51%).
MATMUL_EFFICIENCY = {
    "ampere": {512: 0.10, 1024: 0.35, 2048: 0.58, 4096: 0.68, 8192: 0.72,
               16384: 0.74},
    "hopper": {512: 0.04, 1024: 0.20, 2048: 0.45, 4096: 0.60, 8192: 0.66,
               16384: 0.68},
}
BACKWARD_SHARE = 0.92
# Causal attention, counting 2·B·T²·C FLOPs forward and 5·B·T²·C backward.
# Heads of up to 64 channels take ptrain's fused kernel
# (kernels/cuda/flash_attention.cu): share of the bf16 peak by T, forward
# and backward. Hopper's at T 1024 is measured (H200, 2026-11-27, GPT-2
# 124M: attention forward 1.20 ms, backward 3.71 ms a step, 13% and 10.5%
# of the peak); Ampere's is the same kernel's rate in TFLOP/s times 0.8
# (stated). Larger heads take cuBLAS with the scores in memory
# (kernels/cuda/attention.cu): costed below from the GEMMs' efficiency and
# the scores' bytes.
FUSED_ATTENTION = {
    "ampere": {512: (0.26, 0.21), 1024: (0.33, 0.27), 2048: (0.38, 0.31),
               4096: (0.41, 0.33), 8192: (0.41, 0.33)},
    "hopper": {512: (0.10, 0.08), 1024: (0.13, 0.105), 2048: (0.15, 0.12),
               4096: (0.16, 0.13), 8192: (0.16, 0.13)},
}
# Share of the memory bandwidth an elementwise kernel reaches.
ELEMENTWISE_EFFICIENCY = 0.8
# AdamW parameters a second, measured on the H200 (2026-11-27: 1.32 ms for
# GPT-2 124M's), scaled to another GPU by its memory bandwidth.
ADAMW_H200 = 124.4e6 / 1.32e-3


def matmul_efficiency(family, size):
    table = sorted(MATMUL_EFFICIENCY[family].items())
    for (a, ea), (b, eb) in zip(table, table[1:]):
        if a <= size <= b:
            return ea + (eb - ea) * (size - a) / (b - a)
    return table[0][1] if size < table[0][0] else table[-1][1]


def cublas_attention(gpu, B, T, C, heads):
    """Forward and backward seconds of attention through cuBLAS with the
    (T, T) scores in memory: q·kᵀ and p·v over the whole square (2·2·B·T²·C
    FLOPs forward, twice that backward) at the rate of one GEMM as large as
    the batch of products, and the scores' passes: fp32 scores written and read, bf16
    probabilities written and read (12 bytes an entry) forward; the
    probabilities and their fp32 gradient read and the scores' gradient
    written (12 bytes) backward."""
    peak = gpu["bf16_peak"]
    # A batched GEMM of B·heads products: as efficient as one of their size.
    eff = matmul_efficiency(gpu["family"], (B * T * T * C) ** (1 / 3))
    bandwidth = gpu["hbm_bytes_per_s"] * ELEMENTWISE_EFFICIENCY
    entries = B * heads * T * T
    forward = 4 * B * T * T * C / (peak * eff) + 12 * entries / bandwidth
    backward = (8 * B * T * T * C / (peak * eff * BACKWARD_SHARE) +
                12 * entries / bandwidth)
    return forward, backward


def link_table(alpha, busbw, between_nodes):
    """A link class's collectives from its all-reduce bus bandwidth: NCCL's
    all-gather and reduce-scatter reach about the same, a send/receive pair
    8% more within a node (2% between nodes), an all-to-all 12% less
    within a node (20% between nodes); alpha, the all-reduce's latency,
    the others' in proportion."""
    inter = between_nodes
    return {"allreduce": (alpha, busbw),
            "allgather": (0.75 * alpha, busbw),
            "reduce_scatter": (0.75 * alpha, busbw),
            "sendrecv": (0.4 * alpha if inter else 0.5 * alpha,
                         busbw * (1.02 if inter else 1.08)),
            "alltoall": (1.5 * alpha, busbw * (0.8 if inter else 0.88))}


# NCCL bus bandwidth within a node (NVLink/NVSwitch) and between nodes (one
# InfiniBand adapter per GPU: 200 Gb/s HDR on DGX A100, 400 Gb/s NDR on
# DGX/HGX H100 and H200), about 90% of the adapter's line rate.
AMPERE_LINKS = {"intra": link_table(10e-6, 230e9, False),
                "inter": link_table(20e-6, 22.5e9, True)}
HOPPER_LINKS = {"intra": link_table(10e-6, 360e9, False),
                "inter": link_table(20e-6, 45e9, True)}

GPUS = {
    "a100": {
        "name": "NVIDIA A100-SXM4-80GB (DGX A100)",
        "family": "ampere",
        "bf16_peak": 312e12, "fp32_peak": 19.5e12,
        "hbm_bytes_per_s": 2039e9,
        "memory_bytes": 80 * GiB,
        **AMPERE_LINKS,
        "source": ("NVIDIA A100 datasheet: 312 TFLOP/s dense bf16, 19.5 "
                   "TFLOP/s fp32, 2039 GB/s HBM2e, 80 GB, NVLink 3 600 GB/s; "
                   "DGX A100: 8x 200 Gb/s HDR InfiniBand per node. "
                   "Efficiencies stated in scripts/gpu_profiles.py "
                   "(assumptions, anchored on an H200's measurements of "
                   "ptrain's kernels)."),
    },
    "h100": {
        "name": "NVIDIA H100 SXM5 80GB (DGX H100)",
        "family": "hopper",
        "bf16_peak": 989e12, "fp32_peak": 67e12,
        "hbm_bytes_per_s": 3350e9,
        "memory_bytes": 80 * GiB,
        **HOPPER_LINKS,
        "source": ("NVIDIA H100 SXM5 datasheet: 989 TFLOP/s dense bf16, "
                   "67 TFLOP/s fp32, 3.35 TB/s HBM3, 80 GB, NVLink 4 900 GB/s; "
                   "DGX H100: 8x 400 Gb/s NDR InfiniBand per node. "
                   "Efficiencies stated in scripts/gpu_profiles.py "
                   "(assumptions, anchored on an H200's measurements of "
                   "ptrain's kernels)."),
    },
    "h200": {
        "name": "NVIDIA H200 SXM 141GB (HGX H200)",
        "family": "hopper",
        "bf16_peak": 989e12, "fp32_peak": 67e12,
        "hbm_bytes_per_s": 4800e9,
        "memory_bytes": 143771 * (1 << 20),
        **HOPPER_LINKS,
        "source": ("NVIDIA H200 datasheet: 989 TFLOP/s dense bf16, 67 "
                   "TFLOP/s fp32, 4.8 TB/s HBM3e, 141 GB (143771 MiB as the "
                   "driver reports), NVLink 4 900 GB/s; 8x 400 Gb/s NDR "
                   "InfiniBand per node. Efficiencies stated in "
                   "scripts/gpu_profiles.py (assumptions, anchored on an "
                   "H200's measurements of ptrain's kernels)."),
    },
}


def profile(gpu):
    family = gpu["family"]
    peak = gpu["bf16_peak"]
    matmul = []
    for size, eff in sorted(MATMUL_EFFICIENCY[family].items()):
        for pass_, share in (("forward", 1.0), ("backward", BACKWARD_SHARE)):
            matmul.append({"precision": "bf16", "pass": pass_, "m": size,
                           "n": size, "k": size,
                           "flops_per_s": round(peak * eff * share, -9)})
    attention = []
    B = 4
    for T, (fwd, bwd) in sorted(FUSED_ATTENTION[family].items()):
        C, heads = 1024, 16  # heads of 64: the fused kernel
        flops = B * T * T * C
        attention.append({"precision": "bf16", "B": B, "T": T, "C": C,
                          "heads": heads,
                          "forward_s": 2 * flops / (peak * fwd),
                          "backward_s": 5 * flops / (peak * bwd)})
        C, heads = 2048, 16  # heads of 128: cuBLAS, the scores in memory
        forward_s, backward_s = cublas_attention(gpu, B, T, C, heads)
        attention.append({"precision": "bf16", "B": B, "T": T, "C": C,
                          "heads": heads, "forward_s": forward_s,
                          "backward_s": backward_s})
    bandwidth = gpu["hbm_bytes_per_s"] * ELEMENTWISE_EFFICIENCY

    def links(table):
        return {name: {"alpha_s": a, "bus_bytes_per_s": b}
                for name, (a, b) in table.items()}

    return {
        "format": "ptrain-profile/1",
        "name": gpu["name"],
        "source": gpu["source"],
        "device": "cuda",
        "memory_bytes": gpu["memory_bytes"],
        "peak_flops_per_s": {"bf16": peak, "fp32": gpu["fp32_peak"]},
        "matmul": matmul,
        "attention": attention,
        "elementwise_bytes_per_s": bandwidth,
        "optimizer_params_per_s":
            ADAMW_H200 * gpu["hbm_bytes_per_s"] / 4800e9,
        "links": {"intra_node": links(gpu["intra"]),
                  "inter_node": links(gpu["inter"])},
    }


def with_measured(stated, measured):
    """The stated profile with what `ptworker profile --device cuda`
    measured on one such GPU in place of the stated kernels: its matmul and
    attention grids, bandwidth, optimizer rate and memory (the datasheet's
    peaks, MFU's denominator, and the links between GPUs and nodes, which
    one GPU cannot measure, stay)."""
    if measured.get("format") != "ptrain-profile/1" or \
            measured.get("device") != "cuda":
        raise SystemExit("a measured profile must be ptrain-profile/1 of a "
                         "cuda device (ptworker profile --device cuda)")
    out = dict(stated)
    for key in ("matmul", "attention", "elementwise_bytes_per_s",
                "optimizer_params_per_s", "memory_bytes"):
        out[key] = measured[key]
    out["source"] = (measured["source"] + "; peaks and links: " +
                     stated["source"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="planner/profiles")
    parser.add_argument("--measured", action="append", default=[],
                        metavar="GPU=FILE",
                        help="a100|h100|h200 = a profile ptworker profile "
                             "--device cuda measured on that GPU")
    args = parser.parse_args()
    measured = {}
    for item in args.measured:
        key, _, path = item.partition("=")
        if key not in GPUS or not path:
            raise SystemExit(f"--measured {item}: expected GPU=FILE with GPU "
                             f"one of {', '.join(GPUS)}")
        with open(path) as f:
            measured[key] = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    for key, gpu in GPUS.items():
        p = profile(gpu)
        if key in measured:
            p = with_measured(p, measured[key])
        with open(os.path.join(args.out, key + ".json"), "w") as f:
            json.dump(p, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
