"""Translating a file with a trained model: what translate.py calls."""

from __future__ import annotations

import time

from headcount.io import read_lines, write_lines
from headcount.models.device import pick_device
from headcount.models.loading import load_model, open_tokenizer
from headcount.progress import Progress
from headcount.training.decode import translate


def translate_file(
    model_path: str, src_spm: str, tgt_spm: str, src_text: str, out_path: str, decoding: dict,
    device: str = "auto", log=print,
) -> None:
    model = load_model(model_path)
    src_seg, tgt_seg = open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target")
    src_ids = src_seg.encode(read_lines(src_text))
    dev = pick_device(device)
    start = time.perf_counter()
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = Progress(total, "translating", log, unit="batch")
        bar.update(done - bar.n)

    hyps = translate(model, src_ids, beam=decoding["beam"], alpha=decoding["alpha"],
                     max_tokens=decoding["max_tokens"], max_len_a=decoding["max_len_a"],
                     max_len_b=decoding["max_len_b"], device=dev, progress=progress)
    seconds = time.perf_counter() - start
    log(f"{len(hyps)} sentences in {seconds:.1f} s ({len(hyps) / seconds:.1f} sentences/s) on {dev}")
    write_lines(out_path, tgt_seg.decode(hyps))


def reference_nll_file(model_path: str, src_spm: str, tgt_spm: str, src_text: str, tgt_text: str, out_path: str,
                       max_tokens: int, device: str = "auto", log=print) -> dict:
    """Each reference's NLL under a translation model given its source (nats summed over the
    reference's subwords and the end of sentence, no label smoothing) and its token count, one row
    a sentence (lm_quality.NLL_COLUMNS): what the pruning report's paired NLL intervals read, far
    less noisy than BLEU's (docs/method.md, "The powered design: rules fixed before it ran")."""
    import numpy as np
    import pandas as pd

    from headcount.io import atomic_path
    from headcount.pipeline.lm_quality import NLL_COLUMNS
    from headcount.training.perplexity import sentence_nll

    dev = pick_device(device)
    model = load_model(model_path).to(dev).eval()
    src_ids = open_tokenizer(src_spm, "source").encode(read_lines(src_text))
    tgt_ids = open_tokenizer(tgt_spm, "target").encode(read_lines(tgt_text))
    nll, tokens = sentence_nll(model, src_ids, tgt_ids, max_tokens=max_tokens)
    with atomic_path(out_path) as tmp:
        pd.DataFrame(dict(zip(NLL_COLUMNS, (range(len(nll)), nll, tokens)))).to_csv(
            tmp, sep="\t", index=False, float_format="%.6f")
    mean = float(np.sum(nll)) / max(int(np.sum(tokens)), 1)
    log(f"{len(nll)} references, {int(np.sum(tokens))} tokens: NLL {mean:.4f} nats/token on {dev}")
    return {"sentences": len(nll), "nll": mean}
