#!/usr/bin/env bash
# The GPU targets of docs/cuda.md, measured side by side in one run on one
# GPU, then printed as one table with the ratios:
#   - GPT-2 124M, B8 T1024: ptrain's bf16 Trainer step against PyTorch's
#     eager bf16 and torch.compile steps (bench/pytorch_gpt_cuda.py);
#   - GPT-2 350M, B8 T1024: the same, and ptrain's MFU;
#   - a 124M-class Llama, B8 T1024 (gpu_throughput --arch llama: 12 layers
#     of 768, 4 key/value heads of 12, SwiGLU of 2048, RoPE, untied head):
#     the same against PyTorch's Llama (pytorch_gpt_cuda.py --arch llama);
#   - CUDA graphs: the small model (6 layers of 384, T256, B64) and 124M,
#     launched op by op and with train.cuda_graphs=on;
#   - ZeRO-Offload: 124M with the optimizer on the GPU and offloaded.
#
#   bench/gpu_targets.sh [BUILD_DIR] [--peak-tflops X] [--no-torch]
#
# BUILD_DIR defaults to build; --peak-tflops is the MFU denominator (default
# 989, the bf16 dense peak of an H100 SXM and of an H200); --no-torch leaves
# out PyTorch (its rows then say so). Each tool's own output is printed as
# it runs. Exits 1 without a CUDA device, 2 on a bad argument.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
peak=989
torch=1
while (($#)); do
  case $1 in
    --peak-tflops)
      [[ ${2:-} =~ ^[0-9]+([.][0-9]+)?$ ]] ||
        { echo "gpu_targets: --peak-tflops needs a number of TFLOP/s" >&2; exit 2; }
      peak=$2
      shift 2
      ;;
    --no-torch) torch=0; shift ;;
    -*) echo "gpu_targets: unknown option '$1'" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
bench=$build/bench/gpu_throughput
[[ -x $bench ]] || { echo "gpu_targets: $bench is not built (scripts/setup.sh --tests)" >&2; exit 2; }
if ! "$bench" --model 124m --batch 1 --steps 1 >/dev/null 2>&1; then
  echo "gpu_targets: no CUDA device is present (no GPU, or no driver)" >&2
  exit 1
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# run NAME COMMAND...: shows its output and keeps it as NAME for the table.
run() {
  local name=$1
  shift
  echo "\$ $*"
  "$@" 2>&1 | tee "$logs/$name" || echo "($name exited with an error: its rows say -)"
}
# first NAME LINE-PATTERN: run NAME's first line matching the pattern
# (none when the run was refused or left out).
first() { grep -E -- "$2" "$logs/$1" 2>/dev/null | head -n 1 || true; }
# ms NAME LINE-PATTERN: that line's ms/step ("" when there is no line).
ms() { first "$1" "$2" | sed -n 's/.*: *\([0-9.]*\) ms\/step.*/\1/p'; }
# mfu NAME LINE-PATTERN: that line's MFU in percent.
mfu() { first "$1" "$2" | sed -n 's/.*MFU *\([0-9.]*\)%.*/\1/p'; }
# ratio A B: A / B to two places, "-" when either is missing.
ratio() {
  if [[ -n $1 && -n $2 ]]; then
    python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.2f}x')" "$1" "$2"
  else
    echo "-"
  fi
}

p=(--peak-tflops "$peak")
run step124 "$bench" --trainer --model 124m --batch 8 "${p[@]}"
run step350 "$bench" --trainer --model 350m --batch 8 "${p[@]}"
run llama124 "$bench" --trainer --arch llama --model 124m --batch 8 "${p[@]}"
if ((torch)); then
  run torch124 python3 bench/pytorch_gpt_cuda.py --model 124m --batch 8 "${p[@]}"
  run torch350 python3 bench/pytorch_gpt_cuda.py --model 350m --batch 8 "${p[@]}"
  run torch_llama124 python3 bench/pytorch_gpt_cuda.py --arch llama --model 124m --batch 8 "${p[@]}"
fi
run graphs_small "$bench" --trainer --cuda-graphs --model small --seq 256 --batch 64 "${p[@]}"
run graphs124 "$bench" --trainer --cuda-graphs --model 124m --batch 8 "${p[@]}"
run offload124 "$bench" --trainer --offload --model 124m --batch 8 "${p[@]}"

# What each tool prints: ptrain's Trainer lines name the precision, then
# " graphs" or " offload", then the model ("GPT-2" or "Llama"); PyTorch's
# name eager bf16 ("bf16 GPT-2", "bf16 Llama") or "bf16 compiled" (GPT-2)
# and "bf16 compiled Llama". The side-by-side runs (graphs, offload) are
# compared within themselves.
ours="^ptrain trainer bf16 GPT-2"
llama="^ptrain trainer bf16 Llama"
echo
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || echo unknown)"
printf '%-44s %10s %10s %8s  %s\n' "target" "ptrain ms" "peer ms" "speed" "goal"
# row LABEL RUN PATTERN PEER-RUN PEER-PATTERN GOAL: ptrain's step (the
# line of RUN matching PATTERN) beside the peer's, and their ratio.
row() {
  local mine peer
  mine=$(ms "$2" "$3")
  peer=$(ms "$4" "$5")
  printf '%-44s %10s %10s %8s  %s\n' "$1" "${mine:--}" "${peer:--}" \
    "$(ratio "$peer" "$mine")" "$6"
}
row "124M bf16 step vs torch.compile" step124 "$ours 124m" \
  torch124 "^pytorch .* bf16 compiled 124m" ">= 1.00x (stretch 1.15x)"
row "124M bf16 step vs PyTorch eager" step124 "$ours 124m" \
  torch124 "^pytorch .* bf16 GPT-2 124m" ""
row "350M bf16 step vs torch.compile" step350 "$ours 350m" \
  torch350 "^pytorch .* bf16 compiled 350m" ""
row "350M bf16 step vs PyTorch eager" step350 "$ours 350m" \
  torch350 "^pytorch .* bf16 GPT-2 350m" ""
row "124M Llama bf16 step vs torch.compile" llama124 "$llama 124m" \
  torch_llama124 "^pytorch .* bf16 compiled Llama 124m" ">= 1.00x"
row "124M Llama bf16 step vs PyTorch eager" llama124 "$llama 124m" \
  torch_llama124 "^pytorch .* bf16 Llama 124m" ""
row "small (L6 C384 T256 B64) graphs vs op by op" \
  graphs_small "^ptrain trainer bf16 graphs GPT-2 small" \
  graphs_small "$ours small" ">= 1.30x"
row "124M B8 graphs vs op by op" \
  graphs124 "^ptrain trainer bf16 graphs GPT-2 124m" \
  graphs124 "$ours 124m" ">= 1.00x"
row "124M B8 offloaded optimizer vs on the GPU" \
  offload124 "^ptrain trainer bf16 offload GPT-2 124m" \
  offload124 "$ours 124m" ">= 0.67x (within 1.5x)"
echo "MFU of $peak TFLOP/s: 124M $(mfu step124 "$ours 124m")% (goal >= 37%)," \
  "350M $(mfu step350 "$ours 350m")% (goal >= 45%)," \
  "124M Llama $(mfu llama124 "$llama 124m")%"
echo "(speed: the peer's ms over ptrain's; above 1 ptrain's step is the faster)"
