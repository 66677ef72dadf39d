#!/usr/bin/env bash
# The demo DAG (config/demo.yaml, `make demo`'s targets) end to end on a lent GPU (the device tool):
# does every rule run with `device: auto` on CUDA, and how long does the whole DAG take there.
# The GPU image lacks Snakemake and some of its dependencies: they travel as cp312 wheels in
# .smkwhl (carried; the list is in benchmarks/RESULTS.md, "The demo DAG on a GPU"). CORES jobs at
# once share the one GPU. Under $OUT: the Snakemake log, the stage times, planted vs found, and each
# training's device and precision (from its log). EVAL_THREADS=1 gives each job that runs a trained
# model without training it one thread (resources.eval_threads), so that they share the GPU side by
# side instead of queueing for all the cores. DEADLINE (560 s) keeps the call inside one device
# call's 600 s; the 88-job demo of 2026-11-26 needed 541 s for 83 jobs with every core per job.
set -u
OUT=${OUT:-/tmp/gpu-demo-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .smkwhl/*.whl || exit
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
source benchmarks/gpu_machine.sh
gpu_machine "$OUT/machine.txt" python3 -m snakemake --version
rm -rf results/demo results/demo_seed2
extra=()
if [ -n "${EVAL_THREADS:-}" ]; then
  printf 'defaults:\n  resources: {eval_threads: %s}\n' "$EVAL_THREADS" > /tmp/eval_threads.yaml
  extra=(/tmp/eval_threads.yaml)
fi
start=$(date +%s)
timeout "${DEADLINE:-560}" python3 -m snakemake --configfile config/demo.yaml "${extra[@]}" --cores "${CORES:-16}" \
  --rerun-incomplete -- all results/demo/prune/all/lambda_1/physical/model.pt > "$OUT/snakemake.log" 2>&1
echo "snakemake rc=$? wall_s=$(( $(date +%s) - start ))" | tee -a "$OUT/machine.txt"
tail -3 "$OUT/snakemake.log"
python3 benchmarks/stage_times.py results/demo > "$OUT/stage_times.txt" 2>&1
cp results/demo/control/planted_vs_found.md "$OUT/" 2>/dev/null
grep -rh -E "training on|trained [0-9]+ steps" results/demo*/logs > "$OUT/devices.txt" 2>&1
grep "training on" "$OUT/devices.txt" | cut -c23- | cut -d";" -f1 | sort | uniq -c
