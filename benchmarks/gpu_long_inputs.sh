#!/usr/bin/env bash
# Long inputs on a lent GPU (issue 62, item 3): peak GPU memory (torch.cuda.max_memory_allocated)
# and time of each analysis stage on ONE document of 512 and 2,048 tokens, a Llama-2-7B-shaped model
# (32 layers, 32 heads, d 4096, 11008 intermediate) with RANDOM weights in bf16, built on the GPU
# (13.5 GB), in one process, the peak reset before each stage (benchmarks/long_inputs.py --in-process).
# LRP is measured on 4 of the 32 layers (its per-layer cost; one chunk of 8 steps at the full prefix).
#
#   bash benchmarks/gpu_long_inputs.sh prepare   # here, with the package registry: wheels into .gpuwhl/
#   bash benchmarks/gpu_long_inputs.sh           # on the GPU machine (no network), ~2-3 min with install
#
# The GPU image has torch (2.11+cu130 on the H200 of 2026-11-26) but not transformers: the pinned
# transformers and its dependencies travel as cp312 wheels in .gpuwhl (carry it), installed with
# --no-index as benchmarks/gpu_demo.sh installs Snakemake's. Dry run on a CPU with a tiny model:
#   PYTHON=.venv/bin/python MODEL=tiny DEVICE=cpu DTYPE=float32 bash benchmarks/gpu_long_inputs.sh
set -u
if [ "${1:-}" = prepare ]; then
  # transformers with every dependency, less numpy (the image has its own); .gpuwhl/ is git-ignored
  .venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any -d .gpuwhl \
    "$(grep -E '^transformers==' constraints.txt)" && rm -f .gpuwhl/numpy-*.whl
  exit
fi
OUT=${OUT:-/tmp/gpu-long-inputs-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! "$PY" -c "import transformers" 2>/dev/null; then
  # into the image's own Python: pip takes from .gpuwhl only what the image lacks (its numpy stays)
  PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install -q --no-index --find-links .gpuwhl --no-compile --no-cache-dir \
    "$(grep -E '^transformers==' constraints.txt)" || exit
fi
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
start=$(date +%s)
timeout "${DEADLINE:-200}" "$PY" benchmarks/long_inputs.py --in-process --model "${MODEL:-llama7b}" \
  --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --lengths "${LENGTHS:-512,2048}" \
  --stage-layers "${STAGE_LAYERS:-lrp=4}" --json "$OUT/long_inputs.json" 2> "$OUT/progress.log" | tee "$OUT/long_inputs.md"
echo "rc=$? wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/machine.txt"
