"""A sentence encoder's output and loss: the pooled sentence embedding and its cosine distance to
the unpruned model's (the `sentence_embedding` objective of seq2seq.MODEL_KINDS).

A sentence-transformers model (all-MiniLM-L6-v2, say) is a transformers encoder followed by the
modules its `modules.json` lists: a Pooling module (`1_Pooling/config.json`: mean over the real
tokens, [CLS], or max) and, often, Normalize (L2). It has no vocabulary output, so headcount scores
its heads through what it does have: the loss of a sentence is

    1 - cos(e, e_ref),

e the pooled embedding of the model as it is (head masks, Hard Concrete gates, ablation's row
masks), e_ref that of the same weights with every head open and no gates (under no_grad). It is
0 for the unpruned model and grows as heads that shape the embedding go. It is one number per
sentence, so the paired bootstrap intervals over sentences of NLL (training.perplexity) read it
with one "token" per sentence.

Computed as ||e/|e| - e_ref/|e_ref|||^2 / 2, which equals 1 - cos but keeps its precision near 0,
where 1 - cos loses it to cancellation (one head's effect can be 1e-6), and is exactly 0 for
identical embeddings.

Shapes: B batch, S source length, D hidden size.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from headcount.io import HeadcountError
from headcount.models.seq2seq import SENTENCE_EMBEDDING  # the objective whose loss this is (re-exported)

# sentence-transformers' Pooling config keys, by the pooling headcount computes for them.
POOLING_KEYS = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens"}
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
POOLING_MODULE = "sentence_transformers.models.Pooling"


class PoolingUnsupported(HeadcountError):
    """A sentence encoder declares a pooling headcount does not compute."""


@dataclass(frozen=True)
class Pooling:
    """How a sentence encoder turns its last hidden states into one vector per sentence."""

    mode: str = "mean"  # one of POOLING_KEYS
    normalize: bool = False  # L2-normalise the pooled vector (sentence-transformers' Normalize module)
    declared_by: str = ""  # the file that says so; empty: sentence-transformers' default (mean, no Normalize)


def read_pooling(directory: str | os.PathLike) -> Pooling:
    """The pooling a sentence-transformers directory declares (modules.json, its Pooling module's
    config.json); a directory without modules.json pools by the mean over real tokens, as
    sentence-transformers does for a plain transformers model."""
    directory = Path(directory)
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return Pooling()
    modules = _json(modules_file)
    types = [m.get("type", "") for m in modules] if isinstance(modules, list) else []
    pooling = [m for m in modules if m.get("type") == POOLING_MODULE] if types else []
    if not pooling:
        return Pooling(normalize=NORMALIZE_MODULE in types, declared_by=str(modules_file))
    config_file = directory / pooling[0].get("path", "1_Pooling") / "config.json"
    settings = _json(config_file)
    chosen = [mode for mode, key in POOLING_KEYS.items() if settings.get(key)]
    others = sorted(k for k, v in settings.items() if k.startswith("pooling_mode_") and v
                    and k not in POOLING_KEYS.values())
    if len(chosen) != 1 or others:
        raise PoolingUnsupported(
            f"{config_file}: pooling {', '.join(chosen + others) or 'none'}; headcount computes exactly one of "
            f"{', '.join(POOLING_KEYS.values())} (set one of them true and the others false, or analyse the "
            f"model as a masked LM without objective: sentence_embedding)")
    return Pooling(chosen[0], NORMALIZE_MODULE in types, str(config_file))


def write_pooling(directory: str | os.PathLike, pooling: Pooling, dimension: int) -> None:
    """sentence-transformers' files for `pooling` (read_pooling's inverse): modules.json listing the
    transformers model in `directory` itself, its Pooling module (1_Pooling/config.json) and, where
    the pooled vector is normalised, Normalize; so sentence-transformers pools an exported encoder
    as headcount did."""
    directory = Path(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_MODULE}]
    if pooling.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": NORMALIZE_MODULE})
        (directory / "2_Normalize").mkdir(parents=True, exist_ok=True)
    (directory / "1_Pooling").mkdir(parents=True, exist_ok=True)
    settings = {"word_embedding_dimension": int(dimension),
                **{key: mode == pooling.mode for mode, key in POOLING_KEYS.items()},
                "pooling_mode_mean_sqrt_len_tokens": False}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    (directory / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PoolingUnsupported(f"{path}: not a readable JSON file ({error}); a sentence-transformers model lists "
                                 f"its modules in modules.json and its pooling in 1_Pooling/config.json") from None


def pool(hidden: Tensor, real: Tensor, pooling: Pooling) -> Tensor:
    """hidden (B, S, D), real (B, S) True at real tokens ([CLS] and [SEP] included, as the
    tokenizer's attention mask has them) -> (B, D), in float32 at least."""
    hidden = hidden.to(torch.promote_types(hidden.dtype, torch.float32))
    if pooling.mode == "cls":
        pooled = hidden[:, 0]
    elif pooling.mode == "max":
        pooled = hidden.masked_fill(~real[..., None], -1e9).amax(dim=1)  # sentence-transformers' fill value
    else:
        weights = real[..., None].to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1) if pooling.normalize else pooled


def cosine_distance(embedding: Tensor, reference: Tensor) -> Tensor:
    """(B, D), (B, D) -> (B,) 1 - cos, as half the squared distance of the unit vectors, in float64."""
    a = torch.nn.functional.normalize(embedding.double(), dim=-1)
    b = torch.nn.functional.normalize(reference.double(), dim=-1)
    return 0.5 * (a - b).pow(2).sum(dim=-1)


def embedding_distance(model, src: Tensor) -> Tensor:
    """Each sentence's loss (B,) under a sentence encoder (hf_sentence.HFSentenceEncoder): the
    distance of its pooled embedding to the unpruned model's. The reference pass comes first and
    outside autograd, so hooks on the heads (Michel's, ablation's row masks) see the model's pass."""
    reference = model.reference_embedding(src)  # (B, D), every head open, no gates, no hooks
    return cosine_distance(model.sentence_embedding(src), reference)


__all__ = ["POOLING_KEYS", "Pooling", "PoolingUnsupported", "SENTENCE_EMBEDDING", "cosine_distance",
           "embedding_distance", "pool", "read_pooling", "write_pooling"]
