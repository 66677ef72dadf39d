#!/usr/bin/env bash
# Issue 60's target on an AMX CPU, for a session whose only AMX machine is a lent GPU machine's host
# (Sapphire Rapids or later): the default experiment's training step on 2 of its cores, as this
# project's own 2-core AMX machines would run it, nothing on the GPU. Parts of benchmarks/run.py:
#   matmul                    the fp32 and bf16 matrix-product peaks (AMX: bf16 ~6x fp32)
#   train_experiment          tokens/s of the default's model (fast masks, relu_dropout 0), auto precision
#   train_profile_experiment  where its step goes (matrix products' share, bernoulli_, copies)
#   train_fast_step           the step before issue 60 against now, alternating
#   train_masks               torch's dropout masks against the fast ones (the figure used torch's)
# Nothing to install (the image's python3 has torch); under $OUT: amx_host.jsonl, machine.txt, the log.
# Each part is a process of its own on cores 0-1 (taskset, 2 threads); LIMIT (default 420 s) bounds the whole.
set -u
OUT=${OUT:-/tmp/amx-host-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2 CUDA_VISIBLE_DEVICES=""
PY=${PY:-python3}
{ lscpu | grep -E 'Model name|^CPU\(s\)'
  echo "flags: $(grep -o -w -E 'amx_bf16|amx_tile|avx512_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  $PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
start=$(date +%s)
for part in matmul train_experiment train_profile_experiment train_fast_step train_masks; do
  left=$(( ${LIMIT:-420} - ($(date +%s) - start) ))
  [ "$left" -gt 20 ] || { echo "skipped $part: time" | tee -a "$OUT/machine.txt"; continue; }
  echo "== $part" >> "$OUT/amx_host.log"
  timeout "$left" taskset -c 0,1 $PY benchmarks/run.py --part "$part" --steps "${STEPS:-12}" \
    >> "$OUT/amx_host.log" 2>&1
  rc=$?
  tail -1 "$OUT/amx_host.log" | grep '^{' | $PY -c "import json, sys; r = json.load(sys.stdin); r['part'] = '$part'; print(json.dumps(r))" 2>/dev/null \
    >> "$OUT/amx_host.jsonl" || echo "$part failed (rc $rc)" | tee -a "$OUT/machine.txt"
done
echo "wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/machine.txt"
cat "$OUT/amx_host.jsonl"
