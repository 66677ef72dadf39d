#!/usr/bin/env bash
# make demo's targets with resources.eval_threads 0 (every core) and 1, back to back on this
# machine: the whole DAG's wall time and the first result's (planted_vs_found.md). Run it on idle
# cores (pause other work), from the repository root, after `make setup`. Removes results/demo*.
set -u
printf 'defaults:\n  resources: {eval_threads: %s}\n' 0 > /tmp/demo_eval0.yaml
printf 'defaults:\n  resources: {eval_threads: %s}\n' 1 > /tmp/demo_eval1.yaml
lscpu | grep -m1 "Model name"; echo "bf16: $(grep -c avx512_bf16 /proc/cpuinfo) cores, cores: $(nproc)"
for threads in ${ORDER:-0 1}; do
  rm -rf results/demo results/demo_seed2
  start=$(date +%s.%N)
  .venv/bin/snakemake --configfile config/demo.yaml "/tmp/demo_eval$threads.yaml" --cores "${DEMO_CORES:-2}" \
    --rerun-incomplete --prioritize results/demo/control/planted_vs_found.md results/demo/syntax/table1.md \
    -- all results/demo/prune/all/lambda_1/physical/model.pt > "/tmp/demo_eval$threads.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  first=$(stat -c %Y results/demo/control/planted_vs_found.md 2>/dev/null || echo "$end")
  echo "eval_threads=$threads rc=$rc wall_s=$(echo "$end - $start" | bc)" \
    "first_result_s=$(echo "$first - $start" | bc) jobs=$(grep -c 'Finished jobid' "/tmp/demo_eval$threads.log")"
done
