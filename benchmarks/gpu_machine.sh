# Sourced by the benchmarks/gpu_*.sh scripts: gpu_machine FILE [COMMAND...] writes the lent machine's
# GPU, driver, cores and python3's torch to FILE (and the screen), then COMMAND's output if given.
gpu_machine() {
  local file=$1
  shift
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "cores: $(nproc)"
    python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
    if [ $# -gt 0 ]; then "$@"; fi
  } 2>&1 | tee "$file"
}
