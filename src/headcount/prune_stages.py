"""The pruning stages over files: fine-tuning with Hard Concrete gates for one lambda, Michel et
al.'s pruning curve, and the tables and figures that gather them (Voita et al. 2019, section 6)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch

from .decode import translate
from .evaluate import BOOTSTRAP_SAMPLES, interval_excludes_zero, paired_bootstrap, score_translations
from .io import HeadcountError, atomic_path, read_lines, sha256_file, write_json
from .pruning import (
    SELECTIONS,
    baseline_last_lr,
    fine_tuning_lr,
    fold_gates,
    gate_snapshot,
    gate_table,
    healing_lr,
    is_control,
    masks_from_table,
    michel_masks,
    optimizer_state_loader,
    penalty,
    prepare_for_pruning,
    retained_counts,
    setting_types,
)
from .stages import provenance
from .subwords import Segmenter
from .train import (
    Corpus,
    DevSet,
    TrainConfig,
    load_checkpoint,
    load_model,
    noam_lr,
    parameter_groups,
    pick_device,
    save_checkpoint,
    train,
)


def prune_heads(
    baseline: str, train_src: str, train_tgt: str, dev_src: str, dev_tgt: str, src_spm: str, tgt_spm: str,
    setting: str, lam: float, prune_settings: dict, train_settings: dict, work_dir: str, model_out: str,
    gates_out: str, trajectory_out: str, log=print, lowercase: bool = False, baseline_checkpoint: str | None = None,
) -> dict:
    """Fine-tune the converged baseline with lambda * L_C for one setting; write the pruned model
    (gates folded in), the gate table and the gates' trajectory. Resumable from `work_dir`.

    lambda = 0 is the control: gates pinned open, the rest of the recipe unchanged. The recipe
    (prune_settings, config/README.md): the learning-rate schedule, the baseline's Adam state
    (from `baseline_checkpoint`, its training checkpoint), a last phase of `heal_steps` with the
    gates frozen at their evaluation values, and the checkpoint selection.
    """
    if not lam >= 0:
        raise HeadcountError(f"pruning lambda {lam} is negative: a negative penalty rewards open gates. "
                             f"Use values >= 0 in prune.lambdas.{setting}")
    recipe = {"lr_schedule": prune_settings.get("lr_schedule", "noam"),
              "resume_optimizer": bool(prune_settings.get("resume_optimizer", False)),
              "heal_steps": int(prune_settings.get("heal_steps", 0)), "select": prune_settings.get("select", "last")}
    if recipe["select"] not in SELECTIONS:
        raise HeadcountError(f"config key 'prune.select': {recipe['select']!r}; use one of {', '.join(SELECTIONS)}")
    if recipe["select"] == "best_dev_bleu" and not train_settings["dev_bleu_sentences"]:
        raise HeadcountError("config key 'prune.select' is best_dev_bleu but training.dev_bleu_sentences is 0: "
                             "set training.dev_bleu_sentences > 0 or prune.select: last")
    if recipe["resume_optimizer"] and not (baseline_checkpoint and Path(baseline_checkpoint).is_file()):
        raise HeadcountError(f"config key 'prune.resume_optimizer' is true but the baseline's training checkpoint "
                             f"{baseline_checkpoint} is missing; rerun the baseline's training (it keeps "
                             f"train/checkpoint.pt) or set prune.resume_optimizer: false")
    control = is_control(lam)
    types = setting_types(setting)
    src_seg, tgt_seg = Segmenter(src_spm), Segmenter(tgt_spm)
    log("encoding the training and dev data")
    data = Corpus(src_seg.encode(read_lines(train_src)), tgt_seg.encode(read_lines(train_tgt)))
    dev_references = read_lines(dev_tgt)
    dev = DevSet(src_seg.encode(read_lines(dev_src)), tgt_seg.encode(dev_references), dev_references)
    select_best = recipe["select"] == "best_dev_bleu"
    # The penalty is not part of the dev loss, so the training loop's "best dev" would pick the
    # least pruned weights: the loop keeps the last weights, and best_dev_bleu selection happens
    # here, among snapshots with the final head configuration (one per evaluation).
    settings = {**train_settings, **prune_settings["training"], "select": "last", "dev_bleu_sentences": 0}
    settings["snapshot_interval"] = settings["eval_interval"] if select_best else 0
    cfg = TrainConfig(**{**settings, "adam_betas": tuple(settings["adam_betas"])})
    model = load_model(baseline)
    baseline_steps = int(load_checkpoint(baseline).get("summary", {}).get("steps", train_settings["max_steps"]))
    baseline_params = list(model.parameters())  # the baseline optimizer's order, before gates exist
    torch.manual_seed(cfg.seed)
    gates, groups = prepare_for_pruning(model, setting, prune_settings["log_alpha_init"],
                                        prune_settings["gate_lr_scale"], control=control)
    lr_at = fine_tuning_lr(recipe["lr_schedule"], train_settings, model.cfg.d_model)
    init_optimizer = None
    if recipe["resume_optimizer"]:
        saved = load_checkpoint(baseline_checkpoint)
        if "optimizer" not in saved:
            raise HeadcountError(f"{baseline_checkpoint} holds no optimizer state; set prune.resume_optimizer: false")
        init_optimizer = optimizer_state_loader(saved["optimizer"], baseline_params, baseline_checkpoint)
    log(("control (lambda 0, gates pinned open)" if control else f"pruning {', '.join(types)} with lambda {lam}")
        + f": {len(gates)} gated layers, gate learning rate x{prune_settings['gate_lr_scale']}, recipe {recipe}")
    fingerprint = {"baseline": sha256_file(baseline), "setting": setting, "lambda": lam,
                   "log_alpha_init": prune_settings["log_alpha_init"],
                   "gate_lr_scale": prune_settings["gate_lr_scale"],
                   "train_src": sha256_file(train_src), "train_tgt": sha256_file(train_tgt)}
    if recipe != {"lr_schedule": "noam", "resume_optimizer": False, "heal_steps": 0, "select": "last"}:
        fingerprint["recipe"] = recipe  # the authors' recipe keeps the fingerprint its checkpoints have
    summary = train(model, cfg, data, dev, work_dir, parameters=groups, extra_loss=penalty(gates, lam),
                    extra_metrics=gate_snapshot, run_fingerprint=fingerprint, lr_at=lr_at,
                    init_optimizer=init_optimizer, log=log)
    model.to("cpu")
    table = gate_table(model)
    trajectory = gate_trajectory(Path(work_dir) / "metrics.jsonl")
    candidates = []  # (phase, step, state_dict of the folded model) with the final head configuration
    if select_best:
        candidates += _fine_tuning_candidates(model, table, summary["snapshots"])
    fold_gates(model)
    weights = list(groups[0]["params"])  # the folded model trains what the gated one trained
    final_lr = lr_at(cfg.max_steps) if lr_at else noam_lr(cfg.max_steps, model.cfg.d_model, cfg.warmup_steps,
                                                          cfg.lr_scale)
    heal_summary = None
    if recipe["heal_steps"]:
        heal_cfg = TrainConfig(**{**cfg.to_dict(), "max_steps": recipe["heal_steps"], "seed": cfg.seed + 1,
                                  "checkpoint_interval": min(cfg.checkpoint_interval, recipe["heal_steps"])})
        phase_one = load_checkpoint(Path(work_dir) / "checkpoint.pt")
        trained_before = [p for g in parameter_groups(groups) for p in g["params"]]
        for p in model.parameters():  # fold_gates unfroze everything; the encoder-only setting keeps its decoder
            p.requires_grad_(any(p is w for w in weights))
        log(f"healing: {recipe['heal_steps']} steps with the gates frozen at their evaluation values, learning "
            f"rate decaying linearly from {final_lr:.2e}")
        heal_summary = train(model, heal_cfg, data, dev, Path(work_dir) / "heal", parameters=weights,
                             run_fingerprint={**fingerprint, "phase": "heal"},
                             lr_at=healing_lr(final_lr, recipe["heal_steps"]),
                             init_optimizer=optimizer_state_loader(phase_one["optimizer"], trained_before,
                                                                   str(Path(work_dir) / "checkpoint.pt")),
                             log=log)
        model.to("cpu")
        if select_best:
            candidates += [("heal", snap["step"], load_checkpoint(snap["path"])["model"])
                           for snap in heal_summary["snapshots"]]
    selected = {"phase": "heal" if heal_summary else "fine_tuning",
                "step": heal_summary["steps"] if heal_summary else summary["steps"], "dev_bleu": None}
    if candidates:
        selected = _select_by_dev_bleu(model, candidates, dev, tgt_seg, train_settings["dev_bleu_sentences"],
                                       lowercase, log)
    n_layers = {kind: len(mods) for kind, mods in model.attention_modules().items()}
    counts = retained_counts(masks_from_table(table, n_layers, model.cfg.n_heads, "pruned"))
    counts_paper = retained_counts(masks_from_table(table, n_layers, model.cfg.n_heads, "pruned_paper"))
    log("retained heads: " + ", ".join(f"{k} {v}" for k, v in counts.items())
        + " (paper's log alpha < 0 rule: " + ", ".join(f"{k} {v}" for k, v in counts_paper.items()) + ")")
    steps = {"baseline": baseline_steps, "fine_tuning": summary["steps"],
             "heal": heal_summary["steps"] if heal_summary else 0}
    steps["total"] = sum(steps.values())
    record = {"setting": setting, "lambda": lam, "control": control, "retained": counts,
              "retained_paper_rule": counts_paper, "summary": summary, "heal_summary": heal_summary,
              "recipe": recipe, "steps": steps, "selected": selected,
              "lr": {"baseline_last": baseline_last_lr(train_settings, model.cfg.d_model),
                     "fine_tuning_peak": max(lr_at(s) if lr_at else noam_lr(s, model.cfg.d_model, cfg.warmup_steps,
                                                                            cfg.lr_scale)
                                             for s in range(1, cfg.max_steps + 1)),
                     "fine_tuning_last": final_lr},
              "train_config": cfg.to_dict(), "prune_settings": prune_settings,
              "heads": table.to_dict(orient="records"), "provenance": provenance()}
    save_checkpoint(model_out, {"model": model.state_dict(), "model_config": model.cfg.to_dict(),
                                "pruning": {k: v for k, v in record.items() if k != "heads"}})
    with atomic_path(trajectory_out) as tmp:
        trajectory.to_csv(tmp, index=False)
    write_json(gates_out, record)
    return record


def _fine_tuning_candidates(model, final: pd.DataFrame, snapshots: list[dict]) -> list:
    """The gated run's snapshots whose evaluation gates prune exactly the final heads, folded."""
    import copy

    out = []
    for snap in snapshots:
        gated = copy.deepcopy(model)
        gated.load_state_dict(load_checkpoint(snap["path"])["model"])
        if gate_table(gated)["pruned"].tolist() == final["pruned"].tolist():
            out.append(("fine_tuning", snap["step"], fold_gates(gated).state_dict()))
    return out


def _select_by_dev_bleu(model, candidates: list, dev, tgt_seg, n: int, lowercase: bool, log) -> dict:
    """Load into `model` the candidate with the best greedy dev BLEU (the baseline's selection
    rule); the earliest wins a tie."""
    from .stages import greedy_dev_bleu

    best, scored = None, []
    for phase, step, state in candidates:
        model.load_state_dict(state)
        bleu = greedy_dev_bleu(model.eval(), dev, tgt_seg, n, lowercase)
        log(f"candidate {phase} step {step}: dev BLEU {bleu:.2f}")
        scored.append({"phase": phase, "step": step, "dev_bleu": bleu})
        if best is None or bleu > best["dev_bleu"]:
            best = {"phase": phase, "step": step, "dev_bleu": bleu, "state": state}
    model.load_state_dict(best.pop("state"))
    log(f"selected {best['phase']} step {best['step']} (dev BLEU {best['dev_bleu']:.2f}) among {len(candidates)} "
        f"checkpoints with the final heads")
    return {**best, "candidates": scored}


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
                   scratch_scores: list[str], michel: list[str], roles: str, out: dict, log=print,
                   references: str | None = None, baseline_translations: str | None = None,
                   pruned_translations: list[str] = (), scratch_translations: list[str] = (),
                   baseline_training: str | None = None, scratch_training: list[str] = (),
                   lowercase: bool = False) -> pd.DataFrame:
    """The pruning table, Table 2 beside the paper's, and Figures 7 to 10.

    Every BLEU difference (pruned - baseline, from scratch - baseline, pruned - from scratch,
    pruned - its setting's lambda = 0 control) gets a 95% paired bootstrap interval over the test
    sentences (evaluate.paired_bootstrap), given the translations and references. Each row states
    its training steps in all and its checkpoint selection, for the pruned model and its twin.
    """
    from . import plots

    baseline = _read_json(baseline_scores)
    scores = {_model_dir(p): _read_json(p) for p in pruned_scores}
    scratch = {str(Path(_model_dir(p)).parent): _read_json(p) for p in scratch_scores}
    scratch_runs = {str(Path(p).parent.parent): _read_json(p) for p in scratch_training}
    refs = read_lines(references) if references else None
    hyps = {_model_dir(p): read_lines(p) for p in pruned_translations}
    scratch_hyps = {str(Path(_model_dir(p)).parent): read_lines(p) for p in scratch_translations}
    baseline_hyps = read_lines(baseline_translations) if baseline_translations else None
    baseline_run = _read_json(baseline_training) if baseline_training else {}
    role_of = {(r.layer, r.head): r.role for r in pd.read_csv(roles).itertuples()}
    first = _read_json(gates[0]) if gates else None
    n_heads = {kind: sum(1 for h in first["heads"] if h["type"] == kind) for kind in TYPES} if first else {}
    rows, heads = [], []
    baseline_row = {"experiment": experiment, "setting": "baseline", "lam": float("nan"), "control": False,
                    **{f"retained_{k}": n for k, n in n_heads.items()},
                    "bleu": baseline["bleu"], "chrf": baseline["chrf"],
                    "steps": baseline_run.get("steps", float("nan")),
                    "selection": baseline_run.get("train_config", {}).get("select", "")}
    baseline_row.update(_role_counts([(layer, head) for layer, head in role_of], role_of))
    rows.append(baseline_row)
    records = {str(Path(p).parent): _read_json(p) for p in gates}
    controls = {r["setting"]: folder for folder, r in records.items() if is_control(r["lambda"])}

    def interval(name: str, system: list[str] | None, reference: list[str] | None) -> dict:
        if refs is None or system is None or reference is None:
            return {name: float("nan"), f"{name}_low": float("nan"), f"{name}_high": float("nan")}
        result = paired_bootstrap(system, reference, refs, lowercase=lowercase)
        return {name: result["difference"], f"{name}_low": result["low"], f"{name}_high": result["high"]}

    for folder, record in records.items():
        table = pd.DataFrame(record["heads"])
        kept_enc = [(r.layer, r.head) for r in table[(table["type"] == "enc_self") & ~table["pruned"]].itertuples()]
        twin = scratch_runs.get(folder, {})
        steps = record.get("steps") or {"total": baseline_run.get("steps", 0) + record["summary"]["steps"]}
        row = {"experiment": experiment, "setting": record["setting"], "lam": record["lambda"],
               "control": is_control(record["lambda"]),
               **{f"retained_{k}": v for k, v in record["retained"].items()},
               **{f"retained_paper_rule_{k}": v for k, v in record["retained_paper_rule"].items()},
               "bleu": scores[folder]["bleu"], "chrf": scores[folder]["chrf"],
               "bleu_scratch": scratch[folder]["bleu"] if folder in scratch else float("nan"),
               "chrf_scratch": scratch[folder]["chrf"] if folder in scratch else float("nan"),
               "steps": steps["total"], "selection": record.get("recipe", {}).get("select", "last"),
               "steps_scratch": twin.get("steps", float("nan")),
               "selection_scratch": twin.get("train_config", {}).get("select", ""),
               **_role_counts(kept_enc, role_of)}
        control = controls.get(record["setting"])
        row.update(interval("d_baseline", hyps.get(folder), baseline_hyps))
        row.update(interval("d_control", hyps.get(folder) if control != folder else None, hyps.get(control)))
        row.update(interval("d_scratch_baseline", scratch_hyps.get(folder), baseline_hyps))
        row.update(interval("d_pruned_scratch", hyps.get(folder), scratch_hyps.get(folder)))
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

    table2 = pruning[pruning["setting"].isin(["baseline", "all"])]
    order = (table2["setting"] != "baseline").astype(int) * (2 - table2["control"].astype(bool).astype(int))
    table2 = table2.assign(_order=order).sort_values(["_order", "retained_total"], ascending=[True, False],
                                                      kind="stable").drop(columns="_order")
    with atomic_path(out["table2_csv"]) as tmp:
        table2.reindex(columns=TABLE2_COLUMNS).to_csv(tmp, index=False, float_format="%.2f")
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
    shown = ["setting", "lam", *[f"retained_{k}" for k in TYPES], "bleu", "d_baseline_low", "d_baseline_high",
             "bleu_scratch", "steps", "steps_scratch"]
    log("\n" + pruning.reindex(columns=shown).to_string(index=False))
    return pruning


TABLE2_COLUMNS = ["setting", "lam", "control", *[f"retained_{k}" for k in TYPES], "bleu", "d_baseline",
                  "d_baseline_low", "d_baseline_high", "d_control", "d_control_low", "d_control_high", "bleu_scratch",
                  "d_scratch_baseline", "d_scratch_baseline_low", "d_scratch_baseline_high", "d_pruned_scratch",
                  "d_pruned_scratch_low", "d_pruned_scratch_high", "steps", "selection", "steps_scratch",
                  "selection_scratch"]


def _read_json(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _model_dir(path: str) -> str:
    """results/.../{model}/scores/x.json or .../translations/x.txt -> results/.../{model}"""
    return str(Path(path).parent.parent)


def _role_counts(kept: list[tuple[int, int]], role_of: dict) -> dict:
    counts = {f"role_{r}": 0 for r in ("positional", "syntactic", "rare", "none")}
    for key in kept:
        counts[f"role_{role_of.get(key, 'none')}"] += 1
    return counts


def describe_difference(diff: float, low: float, high: float) -> str:
    """A BLEU difference with its interval; called a difference only when the interval excludes 0."""
    if pd.isna(diff):
        return ""
    verdict = "difference" if interval_excludes_zero(low, high) else "no difference shown"
    return f"{diff:+.2f} [{low:+.2f}, {high:+.2f}], {verdict}"


def table2_markdown(experiment: str, table2: pd.DataFrame, signature: str) -> str:
    def bleu(value) -> str:
        return "" if value is None or pd.isna(value) else f"{value:.2f}"

    def steps(value) -> str:
        return "" if value is None or pd.isna(value) else f"{int(value)}"

    def row_value(r, name):
        return getattr(r, name, float("nan"))

    lines = [f"### {experiment}", "",
             "| heads (enc-self/dec-self/dec-enc) | lambda | BLEU pruned | pruned - baseline | pruned - control | "
             "BLEU from scratch | from scratch - baseline | pruned - from scratch | steps pruned / from scratch | "
             "selection |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table2.itertuples():
        counts = "/".join(str(int(getattr(r, f"retained_{k}"))) for k in TYPES)
        lam = "baseline" if r.setting == "baseline" else ("0 (control)" if r.control else f"{r.lam:g}")
        cells = [describe_difference(row_value(r, d), row_value(r, f"{d}_low"), row_value(r, f"{d}_high"))
                 for d in ("d_baseline", "d_control", "d_scratch_baseline", "d_pruned_scratch")]
        budget = steps(r.steps) + (f" / {steps(row_value(r, 'steps_scratch'))}"
                                   if not pd.isna(row_value(r, "steps_scratch")) else "")
        selection = str(row_value(r, "selection") or "")
        if isinstance(row_value(r, "selection_scratch"), str) and row_value(r, "selection_scratch"):
            selection += f" / {r.selection_scratch}"
        lines.append(f"| {counts} | {lam} | {bleu(r.bleu)} | {cells[0]} | {cells[1]} | "
                     f"{bleu(row_value(r, 'bleu_scratch'))} | {cells[2]} | {cells[3]} | {budget} | {selection} |")
    lines += ["", f"BLEU: sacrebleu, `{signature}`. Differences: BLEU points with a 95% interval from paired "
              f"bootstrap resampling of the test sentences ({BOOTSTRAP_SAMPLES} resamples, sacrebleu's); a "
              f"\"difference\" is one whose interval excludes 0. The control (lambda 0) is the same fine-tuning "
              f"with gates that cannot close: pruned - control is the cost of pruning alone. Steps: training "
              f"steps in all (baseline plus fine-tuning for a pruned model; the same number for its "
              f"from-scratch twin). Selection: which checkpoint each kept (last, or best dev BLEU among those "
              f"with the final heads).",
              "", "### Voita et al. (2019), EN-RU", "",
              "| data | heads (enc-self/dec-self/dec-enc) | BLEU pruned | BLEU from scratch |", "|---|---|---|---|"]
    for data, entries in PAPER_TABLE2.items():
        for i, (counts, pruned, scratch_bleu) in enumerate(entries):
            lines.append(f"| {data if i == 0 else ''} | {'/'.join(map(str, counts))} | {bleu(pruned)} | "
                         f"{bleu(scratch_bleu)} |")
    return "\n".join(lines) + "\n"


def seed_spread(experiment: str, seeds: list[int], settings: list[str], baseline_scores: list[str],
                control_scores: list[str], out_table: str, out_markdown: str, log=print) -> pd.DataFrame:
    """BLEU of the baseline and of each setting's lambda = 0 control for every seed, with the mean,
    sample standard deviation, minimum and maximum across seeds; "control - baseline" rows give
    the cost of fine-tuning seed by seed. `control_scores` lists, per setting, one file per seed."""
    if len(baseline_scores) != len(seeds) or len(control_scores) != len(seeds) * len(settings):
        raise HeadcountError(f"seed spread: {len(baseline_scores)} baseline and {len(control_scores)} control "
                             f"scores for seeds {seeds} and settings {settings}; the rule's inputs are wrong")
    baseline = [_read_json(p)["bleu"] for p in baseline_scores]
    systems = {"baseline": baseline}
    for i, setting in enumerate(settings):
        control = [_read_json(p)["bleu"] for p in control_scores[i * len(seeds):(i + 1) * len(seeds)]]
        systems[f"control {setting}"] = control
        systems[f"control {setting} - baseline"] = [c - b for c, b in zip(control, baseline)]
    rows = []
    for system, values in systems.items():
        series = pd.Series(values, dtype=float)
        rows.append({"experiment": experiment, "system": system,
                     **{f"seed_{s}": v for s, v in zip(seeds, values)}, "seeds": len(values),
                     "mean": series.mean(), "sd": series.std(ddof=1), "min": series.min(), "max": series.max()})
    table = pd.DataFrame(rows)
    with atomic_path(out_table) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4g")
    signature = _read_json(baseline_scores[0]).get("bleu_signature", "")
    lines = [f"### {experiment}: BLEU across {len(seeds)} baseline seeds", "",
             "| system | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | sd | min | max |",
             "|---|" + "---|" * (len(seeds) + 4)]
    for r in rows:
        cells = [f"{r[f'seed_{s}']:.2f}" for s in seeds] + [f"{r[k]:.2f}" for k in ("mean", "sd", "min", "max")]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    lines += ["", f"BLEU: sacrebleu, `{signature}`. sd: sample standard deviation across seeds. Each seed's "
              f"control is fine-tuned from that seed's baseline (the same fine-tuning, gates that cannot close)."]
    with atomic_path(out_markdown) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log("\n" + table.to_string(index=False))
    return table
