"""The pruning stages over files: fine-tuning with Hard Concrete gates for one lambda, Michel et
al.'s pruning curve, and the tables and figures that gather them (Voita et al. 2019, section 6)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch

from .decode import translate
from .evaluate import score_translations
from .io import HeadcountError, atomic_path, read_lines, sha256_file, write_json
from .pruning import (
    fold_gates,
    gate_snapshot,
    gate_table,
    masks_from_table,
    michel_masks,
    penalty,
    prepare_for_pruning,
    retained_counts,
    setting_types,
)
from .stages import provenance
from .subwords import Segmenter
from .train import Corpus, DevSet, TrainConfig, load_model, pick_device, save_checkpoint, train


def prune_heads(
    baseline: str, train_src: str, train_tgt: str, dev_src: str, dev_tgt: str, src_spm: str, tgt_spm: str,
    setting: str, lam: float, prune_settings: dict, train_settings: dict, work_dir: str, model_out: str,
    gates_out: str, trajectory_out: str, log=print,
) -> dict:
    """Fine-tune the converged baseline with lambda * L_C for one setting; write the pruned model
    (gates folded in), the gate table and the gates' trajectory. Resumable from `work_dir`."""
    if not lam >= 0:
        raise HeadcountError(f"pruning lambda {lam} is negative: a negative penalty rewards open gates. "
                             f"Use values >= 0 in prune.lambdas.{setting}")
    types = setting_types(setting)
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    log("encoding the training and dev data")
    data = Corpus(src_seg.encode(read_lines(train_src)), tgt_seg.encode(read_lines(train_tgt)))
    dev = DevSet(src_seg.encode(read_lines(dev_src)), tgt_seg.encode(read_lines(dev_tgt)))
    # The penalty is not part of the dev loss, so "best dev" would pick the least pruned weights:
    # the pruned model is always the last one.
    settings = {**train_settings, **prune_settings["training"], "select": "last", "dev_bleu_sentences": 0,
                "snapshot_interval": 0}
    cfg = TrainConfig(**{**settings, "adam_betas": tuple(settings["adam_betas"])})
    model = load_model(baseline)
    torch.manual_seed(cfg.seed)
    gates, groups = prepare_for_pruning(model, setting, prune_settings["log_alpha_init"],
                                        prune_settings["gate_lr_scale"])
    log(f"pruning {', '.join(types)} with lambda {lam}: {len(gates)} gated layers, "
        f"gate learning rate x{prune_settings['gate_lr_scale']}")
    fingerprint = {"baseline": sha256_file(baseline), "setting": setting, "lambda": lam,
                   "log_alpha_init": prune_settings["log_alpha_init"],
                   "gate_lr_scale": prune_settings["gate_lr_scale"],
                   "train_src": sha256_file(train_src), "train_tgt": sha256_file(train_tgt)}
    summary = train(model, cfg, data, dev, work_dir, parameters=groups, extra_loss=penalty(gates, lam),
                    extra_metrics=gate_snapshot, run_fingerprint=fingerprint, log=log)
    model.to("cpu")
    table = gate_table(model)
    trajectory = gate_trajectory(Path(work_dir) / "metrics.jsonl")
    fold_gates(model)
    n_layers = {kind: len(mods) for kind, mods in model.attention_modules().items()}
    counts = retained_counts(masks_from_table(table, n_layers, model.cfg.n_heads, "pruned"))
    counts_paper = retained_counts(masks_from_table(table, n_layers, model.cfg.n_heads, "pruned_paper"))
    log("retained heads: " + ", ".join(f"{k} {v}" for k, v in counts.items())
        + " (paper's log alpha < 0 rule: " + ", ".join(f"{k} {v}" for k, v in counts_paper.items()) + ")")
    record = {"setting": setting, "lambda": lam, "retained": counts, "retained_paper_rule": counts_paper,
              "summary": summary, "train_config": cfg.to_dict(), "prune_settings": prune_settings,
              "heads": table.to_dict(orient="records"), "provenance": provenance()}
    save_checkpoint(model_out, {"model": model.state_dict(), "model_config": model.cfg.to_dict(),
                                "pruning": {k: v for k, v in record.items() if k != "heads"}})
    with atomic_path(trajectory_out) as tmp:
        trajectory.to_csv(tmp, index=False)
    write_json(gates_out, record)
    return record


def gate_trajectory(metrics_path: Path) -> pd.DataFrame:
    """P(gate closed) per head over the training steps, from the run's metric records."""
    rows = []
    for line in metrics_path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for kind, layers in record.get("p_closed", {}).items():
            for layer, heads in enumerate(layers):
                rows += [(record["step"], kind, layer, head, p) for head, p in enumerate(heads)]
    return pd.DataFrame(rows, columns=["step", "type", "layer", "head", "p_closed"])


def michel_curve(
    baseline: str, head_scores: str, src_spm: str, tgt_spm: str, src_text: str, ref_text: str, setting: str,
    step: float, decoding: dict, lowercase: bool, out_path: str, device: str = "auto", log=print,
) -> pd.DataFrame:
    """Michel et al. (2019): mask the least important heads of the setting's attention types in
    steps of `step` (no retraining) and score each pruned model."""
    model = load_model(baseline)
    dev = pick_device(device)
    model.to(dev).eval()
    scores = pd.read_parquet(head_scores)
    n_layers = {kind: len(mods) for kind, mods in model.attention_modules().items()}
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    src, refs = src_seg.encode(read_lines(src_text)), read_lines(ref_text)
    rows = []
    for fraction, masks in michel_masks(scores, setting_types(setting), n_layers, model.cfg.n_heads, step):
        model.set_head_mask(masks)
        start = time.perf_counter()
        hyps = translate(model, src, beam=decoding["beam"], alpha=decoding["alpha"], max_tokens=decoding["max_tokens"],
                         max_len_a=decoding["max_len_a"], max_len_b=decoding["max_len_b"], device=dev)
        result = score_translations(tgt_seg.decode(hyps), refs, lowercase=lowercase)
        counts = retained_counts(masks)
        rows.append({"setting": setting, "removed_fraction": fraction,
                     **{f"retained_{k}": v for k, v in counts.items()}, "retained_total": sum(counts.values()),
                     "bleu": result["bleu"], "chrf": result["chrf"], "bleu_signature": result["bleu_signature"]})
        log(f"removed {fraction:.0%} of {setting} heads: {counts} BLEU {result['bleu']:.2f} "
            f"({time.perf_counter() - start:.0f} s)")
    table = pd.DataFrame(rows)
    with atomic_path(out_path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    return table


# Table 2 of Voita et al. (2019), EN-RU: (retained enc-self/dec-self/dec-enc, BLEU pruned, BLEU from scratch).
PAPER_TABLE2 = {
    "WMT 2.5M": [((48, 48, 48), 29.6, None), ((14, 31, 30), 29.62, 29.47), ((12, 21, 25), 29.36, 28.95),
                 ((8, 13, 15), 29.06, 28.56), ((5, 9, 12), 28.90, 28.41)],
    "OpenSubtitles 6M": [((48, 48, 48), 32.4, None), ((27, 31, 46), 32.24, 32.23), ((13, 17, 31), 32.23, 31.98),
                         ((6, 9, 13), 32.27, 31.84)],
}
TYPES = ("enc_self", "dec_self", "dec_enc")


def pruning_report(experiment: str, baseline_scores: str, gates: list[str], pruned_scores: list[str],
                   scratch_scores: list[str], michel: list[str], roles: str, out: dict, log=print) -> pd.DataFrame:
    """The pruning table, Table 2 beside the paper's, and Figures 7 to 10."""
    from . import plots

    baseline = json.loads(Path(baseline_scores).read_text(encoding="utf-8"))
    scores = {str(Path(p).parent.parent): json.loads(Path(p).read_text(encoding="utf-8")) for p in pruned_scores}
    scratch = {str(Path(p).parent.parent.parent): json.loads(Path(p).read_text(encoding="utf-8"))
               for p in scratch_scores}
    role_of = {(r.layer, r.head): r.role for r in pd.read_csv(roles).itertuples()}
    first = json.loads(Path(gates[0]).read_text(encoding="utf-8")) if gates else None
    n_heads = {kind: sum(1 for h in first["heads"] if h["type"] == kind) for kind in TYPES} if first else {}
    rows, heads = [], []
    baseline_row = {"experiment": experiment, "setting": "baseline", "lam": float("nan"),
                    **{f"retained_{k}": n for k, n in n_heads.items()},
                    "bleu": baseline["bleu"], "chrf": baseline["chrf"]}
    baseline_row.update(_role_counts([(layer, head) for layer, head in role_of], role_of))
    rows.append(baseline_row)
    for path in gates:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        folder = str(Path(path).parent)
        table = pd.DataFrame(record["heads"])
        kept_enc = [(r.layer, r.head) for r in table[(table["type"] == "enc_self") & ~table["pruned"]].itertuples()]
        row = {"experiment": experiment, "setting": record["setting"], "lam": record["lambda"],
               **{f"retained_{k}": v for k, v in record["retained"].items()},
               **{f"retained_paper_rule_{k}": v for k, v in record["retained_paper_rule"].items()},
               "bleu": scores[folder]["bleu"], "chrf": scores[folder]["chrf"],
               "bleu_scratch": scratch[folder]["bleu"] if folder in scratch else float("nan"),
               "chrf_scratch": scratch[folder]["chrf"] if folder in scratch else float("nan"),
               "steps": record["summary"]["steps"], **_role_counts(kept_enc, role_of)}
        rows.append(row)
        heads.append(table.assign(setting=record["setting"], lam=record["lambda"], retained=~table["pruned"]))
    pruning = pd.DataFrame(rows)
    for column in ("bleu_scratch", "chrf_scratch"):
        if column not in pruning:
            pruning[column] = float("nan")
    pruning["retained_total"] = pruning[[f"retained_{k}" for k in TYPES]].sum(axis=1)
    pruning["bleu_signature"] = baseline["bleu_signature"]
    pruning = pruning.sort_values(["setting", "lam"], kind="stable")
    with atomic_path(out["table"]) as tmp:
        pruning.to_csv(tmp, sep="\t", index=False, float_format="%.4g")

    table2 = pruning[pruning["setting"].isin(["baseline", "all"])].sort_values("retained_total", ascending=False)
    with atomic_path(out["table2_csv"]) as tmp:
        table2[["setting", "lam", *[f"retained_{k}" for k in TYPES], "bleu", "bleu_scratch"]].to_csv(
            tmp, index=False, float_format="%.2f")
    with atomic_path(out["table2"]) as tmp:
        tmp.write_text(table2_markdown(experiment, table2, baseline["bleu_signature"]), encoding="utf-8")

    curves = pd.concat([pd.read_csv(p, sep="\t") for p in michel]) if michel else pd.DataFrame()
    plots.bleu_vs_heads(pruning[pruning["setting"] != "baseline"], curves, baseline["bleu"], out["figure7"],
                        f"{experiment}: BLEU ({baseline.get('split', '')}) against retained heads")
    enc_runs = pruning[pruning["setting"].isin(["baseline", "enc"])]
    plots.retained_functions(enc_runs if (enc_runs["setting"] == "enc").any() else pruning, out["figure8"],
                             f"{experiment}: functions of the retained encoder heads")
    plots.retained_by_type(pruning, out["figure9"],
                           f"{experiment}: retained heads by attention type (all types pruned)")
    all_heads = pd.concat(heads) if heads else pd.DataFrame(columns=["setting", "type", "lam", "layer", "retained"])
    plots.decoder_heads_per_layer(all_heads[all_heads["setting"] == "all"], out["figure10"],
                                  f"{experiment}: retained decoder heads per layer (all types pruned)")
    shown = ["setting", "lam", *[f"retained_{k}" for k in TYPES], "bleu", "bleu_scratch"]
    log("\n" + pruning.reindex(columns=shown).to_string(index=False))
    return pruning


def _role_counts(kept: list[tuple[int, int]], role_of: dict) -> dict:
    counts = {f"role_{r}": 0 for r in ("positional", "syntactic", "rare", "none")}
    for key in kept:
        counts[f"role_{role_of.get(key, 'none')}"] += 1
    return counts


def table2_markdown(experiment: str, table2: pd.DataFrame, signature: str) -> str:
    def bleu(value) -> str:
        return "" if value is None or pd.isna(value) else f"{value:.2f}"

    lines = [f"### {experiment}", "",
             "| heads (enc-self/dec-self/dec-enc) | lambda | BLEU pruned | BLEU from scratch |", "|---|---|---|---|"]
    for r in table2.itertuples():
        counts = "/".join(str(int(getattr(r, f"retained_{k}"))) for k in TYPES)
        lam = "baseline" if r.setting == "baseline" else f"{r.lam:g}"
        lines.append(f"| {counts} | {lam} | {bleu(r.bleu)} | {bleu(getattr(r, 'bleu_scratch', None))} |")
    lines += ["", f"BLEU: sacrebleu, `{signature}`.", "", "### Voita et al. (2019), EN-RU", "",
              "| data | heads (enc-self/dec-self/dec-enc) | BLEU pruned | BLEU from scratch |", "|---|---|---|---|"]
    for data, entries in PAPER_TABLE2.items():
        for i, (counts, pruned, scratch_bleu) in enumerate(entries):
            lines.append(f"| {data if i == 0 else ''} | {'/'.join(map(str, counts))} | {bleu(pruned)} | "
                         f"{bleu(scratch_bleu)} |")
    return "\n".join(lines) + "\n"
