"""Checkpoint files: the one place every model family and the training loop write and read them.

A checkpoint is a dict saved with torch.save, written atomically; it is read back with torch's
weights-only unpickler. What a model's checkpoint holds is the family's business (seq2seq.py:
`save`); a training checkpoint adds the optimizer, the step and the random state (training.loop).
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import torch

from headcount.io import CheckpointError, atomic_path


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


# Beyond tensors, numbers, strings and containers, the one type headcount's files hold: the torch
# version in a model's provenance (a str subclass; constructing one runs no other code).
CHECKPOINT_TYPES = [torch.torch_version.TorchVersion]


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """What a checkpoint or model file holds. Read with torch's weights-only unpickler: tensors,
    numbers, strings and containers (and CHECKPOINT_TYPES) are all that headcount writes, and a file
    that holds anything else (a pickled object, whose loading would run code the file names) is
    refused unread."""
    state = read_weights_only(path, CHECKPOINT_TYPES, "headcount's checkpoints hold only tensors, numbers, "
                              "strings and containers, so this file was not written by headcount or was altered. "
                              "Delete it, or replace it with one from a source you trust.", map_location)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a headcount checkpoint (no 'model' entry); delete it")
    return state


def read_weights_only(path: str | os.PathLike, allowed: list, refusal: str, map_location="cpu"):
    """torch.load with the weights-only unpickler, `allowed` the only classes and objects beyond
    plain data (torch.serialization.safe_globals' list: a class, or (stand-in, "module.Name")). A
    file that pickles anything else is refused, naming it and saying `refusal`; a damaged one is a
    CheckpointError too. The one torch.load of the library (other readers, such as the fairseq one,
    pass their own allow-list)."""
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only load failed" not in str(error).lower():
            raise _unreadable(path, error) from None
        wanted = re.search(r"GLOBAL ([\w.]+)", str(error))
        raise CheckpointError(f"{path}: refused, not loaded: it holds a pickled Python object "
                              f"({wanted.group(1) if wanted else 'not plain data'}), and loading it would run code "
                              f"from the file. {refusal}") from None
    except Exception as error:  # a truncated or corrupted file: torch raises several kinds
        raise _unreadable(path, error) from None


def _unreadable(path, error: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: cannot be read as a checkpoint ({type(error).__name__}: {error}). "
                           f"Delete it to start that stage again.")


def state_step(path: Path) -> int | None:
    try:
        return int(load_checkpoint(path)["step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None
