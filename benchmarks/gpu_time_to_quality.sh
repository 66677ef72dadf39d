#!/usr/bin/env bash
# Issue 41's variant screen on a lent GPU (the device tool): the headcount variants of
# time_to_quality.py, seeds 1-3, seed by seed, JOBS runs at once on the one GPU, then report and the
# CUDA-CPU agreement of one trained model. Needs results/multi30k_en_de/{data,subwords} carried and
# benchmarks/ttq_settings.json (time_to_quality.py settings --settings benchmarks/ttq_settings.json);
# the GPU image's python3 has torch, sentencepiece and sacrebleu. Results under $OUT (scores, logs,
# summaries; no weights). PLAN (arm:variant:seed ...) replaces the variant screen; fairseq's arm needs
# fairseq-fixed and the packages the image lacks as cp312 wheels in .whl (carried), which become a
# stand-in environment whose bin/ runs fairseq's command-line tools with the image's python3.
set -u
OUT=${OUT:-/tmp/ttq-gpu-out}
RUNS=${RUNS:-/tmp/ttq-gpu}
mkdir -p "$OUT" "$RUNS"
export PYTHONPATH=src PYTHONUNBUFFERED=1
source benchmarks/gpu_machine.sh
gpu_machine "$OUT/machine.txt"
fairseq_venv=()
if ls .whl/fairseq*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH=src:/tmp/site
  mkdir -p /tmp/fairseq-env/bin
  printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/fairseq-env/bin/python
  for tool in train preprocess; do printf '#!/bin/sh\nexec python3 -m fairseq_cli.%s "$@"\n' $tool > /tmp/fairseq-env/bin/fairseq-$tool; done
  chmod +x /tmp/fairseq-env/bin/*
  fairseq_venv=(--fairseq-venv /tmp/fairseq-env)
fi
# fairseq's differences first, three seeds; then the two beyond fairseq, if the deadline allows
plan="${PLAN:-}"
[ -z "$plan" ] && for variants in "${VARIANTS:-default qkv_gain ffn_init fairseq_init fp32}" "${EXTRA:-lr_x2 warmup_400}"; do
  for seed in 1 2 3; do
    for variant in $variants; do plan="$plan headcount:$variant:$seed"; done
  done
done
python3 benchmarks/time_to_quality.py queue $plan --jobs "${JOBS:-8}" --device cuda "${fairseq_venv[@]}" \
  --settings benchmarks/ttq_settings.json --runs "$RUNS" --deadline "${DEADLINE:-420}" 2>&1 | tee "$OUT/queue.log"
python3 benchmarks/time_to_quality.py report --runs "$RUNS" > "$OUT/report.md" 2>&1
[ -z "${PLAN:-}" ] && snapshot=$(ls "$RUNS"/headcount/seed_1/work/snapshots/step_*.pt 2>/dev/null | sort -V | tail -1)
[ -n "${snapshot:-}" ] && timeout 120 python3 benchmarks/cuda_agreement.py "$snapshot" --out "$OUT/cuda_agreement.json" 2>&1 | tail -3
tar czf "$OUT/runs.tgz" -C "$RUNS" --exclude='*.pt' . && ls -la "$OUT"
