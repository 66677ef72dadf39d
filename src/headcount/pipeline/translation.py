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
