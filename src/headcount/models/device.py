"""Where a model runs: the device, and the precision of its matrix products."""

from __future__ import annotations

import torch

from headcount.io import HeadcountError


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise HeadcountError("training.device is 'cuda' but no CUDA device is visible; use 'auto' or 'cpu'")
    return torch.device(name)


def cpu_has_bf16() -> bool:
    """bf16 matrix products pay on CPUs with AVX512-BF16 or AMX (measured: 1.58x a training step
    on AVX512-BF16, benchmarks/RESULTS.md)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    return torch.bfloat16 if cpu_has_bf16() else None


def precision_name(autocast_dtype: torch.dtype | None) -> str:
    """The `precision` setting that picks this autocast dtype on any machine."""
    return "bf16" if autocast_dtype == torch.bfloat16 else "fp32"


def inherited_precision(setting: str, began: str | None) -> str:
    """`auto` resolves once for a chain of runs: a run that continues another (a resumed run its
    checkpoint, a pruning run its baseline, a from-scratch twin its pruned model) takes the precision
    that one trained in, whatever this machine would choose. An explicit setting stays as it is."""
    return began if setting == "auto" and began in ("fp32", "bf16") else setting
