#!/usr/bin/env bash
# Issue 61, item 6, on a lent GPU machine, in one call: the powered design's training jobs on the GPU
# (benchmarks/gpu_powered.py: 1, 4 and 8 of the default's trainings at once, real Multi30k data, fp32
# and bf16) on cores 2-15, and beside it, on cores 0-1, the CPU default's step on the host's AMX
# cores (benchmarks/amx_host.sh). Carry results/multi30k_en_de/data and results/multi30k_en_de/subwords,
# and write the settings first, here: .venv/bin/python benchmarks/time_to_quality.py settings
# --settings gpu_settings.json (the GPU image has torch, sentencepiece and sacrebleu, not the
# workflow's packages). Under $OUT: gpu_powered.md, its log, machine.txt, and amx/ (amx_host.sh's).
set -u
OUT=${OUT:-/tmp/gpu-powered-out}
mkdir -p "$OUT/amx"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
source benchmarks/gpu_machine.sh
gpu_machine "$OUT/machine.txt"
OUT=$OUT/amx LIMIT=${AMX_LIMIT:-420} bash benchmarks/amx_host.sh > "$OUT/amx/run.log" 2>&1 &
amx=$!
start=$(date +%s)
timeout "${LIMIT:-480}" taskset -c 2-$(( $(nproc) - 1 )) python3 benchmarks/gpu_powered.py sweep \
  --settings "${SETTINGS:-gpu_settings.json}" --plan ${PLAN:-1:auto 1:fp32 4:auto 4:fp32 8:best} \
  --steps "${STEPS:-600}" --eval-every "${EVAL_EVERY:-300}" --deadline "${DEADLINE:-380}" \
  --out "$OUT/gpu_powered.md" > "$OUT/gpu_powered.log" 2>&1
echo "gpu_powered rc=$? wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/machine.txt"
tail -3 /tmp/gpu-powered/J1_*/seed_1/job.log > "$OUT/job_tail.log" 2>&1
wait $amx
cat "$OUT/gpu_powered.log" "$OUT/amx/machine.txt" "$OUT/amx/amx_host.jsonl" 2>&1 | cut -c1-600
