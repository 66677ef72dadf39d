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


def refused_pickle(model: str | os.PathLike, error: Exception) -> CheckpointError:
    """What a transformers model whose pytorch_model.bin pickles more than tensors fails with: the
    file, the object, and the safe way forward (safetensors). transformers reads such a file with
    torch's weights-only unpickler, whose own message suggests weights_only=False: running the
    file's code, the one fix never to take for a model from someone else."""
    directory = Path(model).expanduser()
    found = sorted(directory.glob("pytorch_model*.bin")) if directory.is_dir() else []
    weights = ", ".join(map(str, found)) or f"the pytorch_model.bin of {str(model)!r}"
    bin_path = str(found[0]) if len(found) == 1 else "<dir>/pytorch_model.bin"
    out_dir = str(directory) if found else "<dir>"
    wanted = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = wanted.group(1) if wanted else "not plain data"
    convert = (f"import torch; from safetensors.torch import save_file; "
               f"sd = torch.load({bin_path!r}, weights_only=True); "
               f"save_file({{k: v.clone().contiguous() for k, v in sd.items() if isinstance(v, torch.Tensor)}}, "
               f"{out_dir + '/model.safetensors'!r})")
    return CheckpointError(
        f"{weights}: refused, not loaded: the model's weights file holds a pickled Python object ({what}) beside "
        f"its tensors, and loading it would run code from the file (torch's hint to pass weights_only=False does "
        f"exactly that; don't). headcount reads transformers weights as safetensors, or as a pytorch_model.bin "
        f"of plain tensors. Download the model's model.safetensors if its publisher has one (`hf download <hub id> "
        f"--include '*.safetensors' '*.json' '*.model' '*.txt' --local-dir <dir>`), or convert the weights once, in "
        f"an environment you trust with the file: python -c \"{convert}\" (if {what} is plain data, such as a "
        f"numpy scalar, load inside `with torch.serialization.safe_globals([{what}]):`; "
        f"if it is a function, the file carries code: take the weights from elsewhere), or load it there with "
        f"from_pretrained and save it with save_pretrained(<dir>) (transformers 5 writes safetensors; older "
        f"versions: save_pretrained(<dir>, safe_serialization=True)); then remove pytorch_model.bin from <dir>.")


# What torch's weights-only unpickler raises, through transformers' from_pretrained, for a
# pytorch_model.bin that pickles more than tensors: loaders turn it into refused_pickle's message.
PickleRefusal = pickle.UnpicklingError
