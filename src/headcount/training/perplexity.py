"""A language model's quality: per-sentence NLL, perplexity, and paired bootstrap intervals of
NLL differences (the language-model counterpart of evaluate.py's BLEU and its intervals).

A causal LM's NLL is that of every text token given BOS and the tokens before it; a masked LM's
that of the fixed, seeded masking (data.batching.masked_positions, seed 0), so two models, or a
model before and after pruning, are scored on the same masked tokens. A sentence encoder's "NLL"
is its embedding distance to the unpruned model (models.sentence_embedding), one unit per sentence:
the intervals below then compare mean distances.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from headcount.data.batching import make_batches, objective_tensors
from headcount.models.sentence_embedding import SENTENCE_EMBEDDING, embedding_distance
from headcount.models.seq2seq import Seq2SeqWithHeads, kind_of
from headcount.training.evaluate import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, bootstrap_indices, bootstrap_interval


@torch.no_grad()
def sentence_nll(model: Seq2SeqWithHeads, src_ids: list[list[int]], tgt_ids: list[list[int]],
                 max_tokens: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Each sentence's summed NLL (nats) and its number of scored tokens, in the input's order.
    A language model's text is on both sides (data.batching.objective_tensors)."""
    model.eval()
    objective = kind_of(model).objective
    device = next(model.parameters()).device
    nll, tokens = np.zeros(len(tgt_ids)), np.zeros(len(tgt_ids), dtype=np.int64)
    for batch in make_batches([len(s) + 1 for s in src_ids], [len(t) + 1 for t in tgt_ids], max_tokens, seed=0):
        src, tgt_in, tgt_out = (x.to(device) for x in objective_tensors(
            objective, [src_ids[i] for i in batch], [tgt_ids[i] for i in batch], model.special))
        if objective == SENTENCE_EMBEDDING:  # one scored unit per sentence
            nll[batch], tokens[batch] = embedding_distance(model, src).cpu().numpy(), 1
            continue
        logits, _ = model(src, tgt_in)  # (B, T, V), aligned with tgt_out
        real = tgt_out.ne(model.special.pad)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 autocast: score in fp32
        per_token = F.cross_entropy(logits.transpose(1, 2), tgt_out, reduction="none")  # (B, T)
        nll[batch] = (per_token * real).sum(dim=1).double().cpu().numpy()
        tokens[batch] = real.sum(dim=1).cpu().numpy()
    return nll, tokens


def perplexity(nll: np.ndarray, tokens: np.ndarray) -> float:
    """exp of the mean per-token NLL over the set."""
    return math.exp(float(np.sum(nll)) / max(int(np.sum(tokens)), 1))


def paired_bootstrap_nll(nll: np.ndarray, reference_nll: np.ndarray, tokens: np.ndarray,
                         n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Mean per-token NLL of a system minus a reference system's on the same sentences (positive:
    the system is worse), with a 95% interval from paired bootstrap resampling over sentences:
    the same resampling as evaluate.paired_bootstrap (numpy's default_rng(seed), the 25th lowest
    and highest of 1000) applied to NLL instead of BLEU. The perplexity ratio is exp(difference)."""
    nll, reference_nll, tokens = (np.asarray(x, dtype=float) for x in (nll, reference_nll, tokens))
    if not len(nll) == len(reference_nll) == len(tokens):
        raise ValueError(f"paired bootstrap over {len(nll)} and {len(reference_nll)} sentences with "
                         f"{len(tokens)} token counts: both systems must score the same sentences")
    difference = (nll.sum() - reference_nll.sum()) / tokens.sum()
    index = bootstrap_indices(len(tokens), n_samples, seed)
    diffs = (nll[index].sum(axis=1) - reference_nll[index].sum(axis=1)) / tokens[index].sum(axis=1)
    low, high = bootstrap_interval(diffs)
    # Two-sided: how often a resample's centred difference is at least as large as the one observed.
    p_value = (np.sum(np.abs(diffs - diffs.mean()) >= abs(difference)) + 1) / (n_samples + 1)
    return {"difference": float(difference), "low": low, "high": high,
            "p_value": float(p_value), "perplexity": perplexity(nll, tokens),
            "reference_perplexity": perplexity(reference_nll, tokens), "samples": n_samples, "seed": seed}
