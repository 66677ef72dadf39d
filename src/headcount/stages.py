"""The workflow's stages as plain functions over files: what the Snakemake scripts call.

Each stage reads its inputs, runs the library, and writes its outputs atomically, with the
settings and software versions that produced them recorded beside the result.
"""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

import torch

from . import __version__
from .decode import translate
from .evaluate import corpus_bleu, score_translations
from .io import atomic_path, read_lines, write_json, write_lines
from .model import ModelConfig, Transformer
from .subwords import Segmenter
from .train import Corpus, DevSet, TrainConfig, load_model, pick_device, save_checkpoint, train


def provenance() -> dict:
    """Software versions and the headcount commit, recorded with every result."""
    import sacrebleu

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"headcount": __version__, "headcount_commit": commit, "torch": torch.__version__,
            "sacrebleu": sacrebleu.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def train_translation_model(
    train_src: str, train_tgt: str, dev_src: str, dev_tgt: str, src_spm: str, tgt_spm: str,
    model_settings: dict, train_settings: dict, lowercase: bool, work_dir: str, model_out: str,
    summary_out: str, log=print,
) -> dict:
    """Train a Transformer on subword-encoded text; resumable from `work_dir/checkpoint.pt`."""
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    log("encoding the training and dev data")
    data = Corpus(src_seg.encode(read_lines(train_src)), tgt_seg.encode(read_lines(train_tgt)))
    dev_references = read_lines(dev_tgt)
    dev = DevSet(src_seg.encode(read_lines(dev_src)), tgt_seg.encode(dev_references), dev_references)
    model_cfg = ModelConfig(src_vocab=len(src_seg), tgt_vocab=len(tgt_seg), **model_settings)
    cfg = TrainConfig(**{**train_settings, "adam_betas": tuple(train_settings["adam_betas"])})
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg)

    def dev_bleu(model: Transformer, dev: DevSet) -> float:
        n = cfg.dev_bleu_sentences
        device = next(model.parameters()).device
        hyps = translate(model, dev.src[:n], beam=1, max_tokens=8000, device=device)
        return corpus_bleu(tgt_seg.decode(hyps), dev.references[:n], lowercase=lowercase)

    summary = train(model, cfg, data, dev, work_dir, dev_bleu=dev_bleu if cfg.dev_bleu_sentences else None,
                    run_fingerprint={"src_spm": _file_id(src_spm), "tgt_spm": _file_id(tgt_spm),
                                     "train": _file_id(train_src)}, log=log)
    model.to("cpu")
    save_checkpoint(model_out, {"model": model.state_dict(), "model_config": model_cfg.to_dict(),
                                "train_config": cfg.to_dict(), "summary": summary, "provenance": provenance()})
    summary = {**summary, "model_config": model_cfg.to_dict(), "train_config": cfg.to_dict(),
               "parameters": sum(p.numel() for p in model.parameters()), "provenance": provenance()}
    write_json(summary_out, summary)
    return summary


def _file_id(path: str) -> dict:
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def translate_file(
    model_path: str, src_spm: str, tgt_spm: str, src_text: str, out_path: str, decoding: dict,
    device: str = "auto", log=print,
) -> None:
    model = load_model(model_path)
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    src_ids = src_seg.encode(read_lines(src_text))
    dev = pick_device(device)
    start = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            log(f"translated batch {done}/{total}")

    hyps = translate(model, src_ids, beam=decoding["beam"], alpha=decoding["alpha"],
                     max_tokens=decoding["max_tokens"], max_len_a=decoding["max_len_a"],
                     max_len_b=decoding["max_len_b"], device=dev, progress=progress)
    seconds = time.perf_counter() - start
    log(f"{len(hyps)} sentences in {seconds:.1f} s ({len(hyps) / seconds:.1f} sentences/s) on {dev}")
    write_lines(out_path, tgt_seg.decode(hyps))


def score_file(hyp_path: str, ref_path: str, lowercase: bool, out_path: str, extra: dict | None = None) -> dict:
    scores = score_translations(read_lines(hyp_path), read_lines(ref_path), lowercase=lowercase)
    scores = {**scores, **(extra or {}), "provenance": provenance()}
    write_json(out_path, scores)
    return scores


def score_heads(
    model_path: str, src_spm: str, tgt_spm: str, analysis_src: str, analysis_tgt: str, translations: str,
    max_sentences: int, lrp_rule: str, ablation: bool, ablation_bleu_sentences: int, max_tokens: int,
    lowercase: bool, out_table: str, out_csv: str, out_correlations: str, out_conservation: str, log=print,
):
    """Every head's confidence, LRP relevance, Michel importance and ablation impact (issue 3).

    Confidence, Michel importance and ablation read the reference translations of the analysis
    set; LRP teacher-forces the model's own beam translations of it ("generation steps").
    """
    import pandas as pd

    from .importance import dev_batches, head_scores, rank_correlations

    model = load_model(model_path).eval()
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    src = src_seg.encode(read_lines(analysis_src)[:max_sentences])
    references = read_lines(analysis_tgt)[:max_sentences]
    hyps = read_lines(translations)[:max_sentences]
    batches = dev_batches(src, tgt_seg.encode(references), max_tokens)
    translation_batches = dev_batches(src, tgt_seg.encode(hyps), max_tokens)
    bleu_src, bleu_refs = src[:ablation_bleu_sentences], references[:ablation_bleu_sentences]

    def bleu_fn(m) -> float:  # greedy, for speed: the change from removing one head is what counts
        return corpus_bleu(tgt_seg.decode(translate(m, bleu_src, beam=1, max_tokens=max_tokens)), bleu_refs,
                           lowercase=lowercase)

    start = time.perf_counter()
    log(f"scoring heads on {len(src)} sentences (LRP rule {lrp_rule}, ablation {ablation})")
    table = head_scores(model, batches, translation_batches, bleu_fn if ablation_bleu_sentences else None,
                        lrp_rule=lrp_rule, ablation=ablation, log=log)
    log(f"head scores in {time.perf_counter() - start:.0f} s")
    correlations = rank_correlations(table) if ablation else pd.DataFrame()
    conservation = table.attrs.get("lrp_conservation", pd.DataFrame())
    table.attrs = {}
    with atomic_path(out_table) as tmp:
        table.to_parquet(tmp, index=False)
    with atomic_path(out_csv) as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    with atomic_path(out_correlations) as tmp:
        correlations.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    with atomic_path(out_conservation) as tmp:
        conservation.to_csv(tmp, sep="\t", index=False, float_format="%.3g")
    if len(correlations):
        overall = correlations[correlations["layer"] == "all"]
        log("Spearman with ablation impact (delta dev loss), all layers:\n" + overall.to_string(index=False))
    return table
