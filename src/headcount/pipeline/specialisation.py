"""The specialisation stage: statistics of the baseline's snapshots over training, as a CSV and a
figure (analysis.specialisation computes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from headcount.analysis.specialisation import snapshot_statistics
from headcount.data.subwords import Segmenter
from headcount.io import HeadcountError, atomic_path, read_lines
from headcount.models.device import pick_device
from headcount.report.plots import specialisation_figure
from headcount.training.decode import translate
from headcount.training.evaluate import corpus_bleu


def specialisation_over_training(
    training_summary: str, src_spm: str, tgt_spm: str, analysis_src: str, analysis_tgt: str, dev_src: str,
    dev_tgt: str, max_sentences: int, dev_bleu_sentences: int, lrp_rule: str, max_tokens: int, lowercase: bool,
    out_csv: str, out_figure: str, title: str = "", device: str = "auto", log=print,
) -> pd.DataFrame:
    """The workflow's stage: every snapshot listed in the baseline's training summary -> CSV, figure.

    training.json lists the snapshots; training's metrics.jsonl sits beside their folder
    (`<work_dir>/snapshots/` and `<work_dir>/metrics.jsonl`, training.loop.train's layout).
    """
    summary = json.loads(Path(training_summary).read_text(encoding="utf-8"))
    snapshots = summary.get("snapshots") or []
    if not snapshots:
        raise HeadcountError(f"{training_summary}: the baseline was trained without snapshots; set "
                             f"training.snapshot_interval > 0 in the experiment's config and rerun train_baseline")
    metrics_path = Path(snapshots[0]["path"]).parent.parent / "metrics.jsonl"
    dev = pick_device(device)
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    analysis = src_seg.encode(read_lines(analysis_src)[:max_sentences])
    references = tgt_seg.encode(read_lines(analysis_tgt)[:max_sentences])
    n_dev = dev_bleu_sentences or None  # 0: training evaluated no dev BLEU; compute it on the whole set
    dev_ids, dev_refs = src_seg.encode(read_lines(dev_src)[:n_dev]), read_lines(dev_tgt)[:n_dev]

    def greedy(model, src_ids):  # training's dev BLEU decodes with these settings
        return translate(model, src_ids, beam=1, max_tokens=8000, device=dev)

    def dev_bleu(model) -> float:
        return corpus_bleu(tgt_seg.decode(greedy(model, dev_ids)), dev_refs, lowercase=lowercase)

    log(f"{len(snapshots)} snapshots; statistics on {len(analysis)} analysis sentences on {dev} "
        f"(LRP rule {lrp_rule}); dev BLEU from {metrics_path} where training evaluated it")
    table = snapshot_statistics(snapshots, analysis, references, greedy, dev_bleu, metrics_path, lrp_rule,
                                max_tokens, dev, log)
    with atomic_path(out_csv) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    specialisation_figure(table, out_figure, title or "head specialisation over training")
    return table
