#!/usr/bin/env bash
# Issue 60, item 3: the default model's training step on a lent GPU, eager against fixed shapes
# replayed as CUDA graphs (torch.compile's cudagraphs backend, and inductor with reduce-overhead),
# in fp32 and under bf16 autocast: steps/s and tokens/s (benchmarks/gpu_training.py). Nothing to
# install: the GPU image's python3 has torch (and sentencepiece, which headcount imports); the
# working tree alone travels, no data (the batches are synthetic). DEADLINE (200 s) is when no
# further variant starts; the whole call stays under 4 minutes. Under $OUT: gpu_training.json and
# .md, machine.txt and the log.
set -u
OUT=${OUT:-/tmp/gpu-training-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
source benchmarks/gpu_machine.sh
gpu_machine "$OUT/machine.txt"
start=$(date +%s)
timeout "${LIMIT:-225}" python3 benchmarks/gpu_training.py --deadline "${DEADLINE:-200}" --steps "${STEPS:-40}" \
  --out "$OUT/gpu_training.json" > "$OUT/gpu_training.log" 2>&1
echo "rc=$? wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/machine.txt"
grep -v '^{' "$OUT/gpu_training.log" | tail -20
