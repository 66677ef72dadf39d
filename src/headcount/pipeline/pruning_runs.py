"""The pruning runs over files (Voita et al. 2019, section 6): fine-tuning with Hard Concrete gates
for one lambda, a ranked method's pruning curve (Michel et al.'s, or any ranked method of
pruning.methods), physical removal. What prune_heads.py, ranked_curve.py and export_pruned.py call."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import torch

from headcount.data.token_corpus import encode_file
from headcount.io import HeadcountError, atomic_path, read_lines, sha256_file, write_json
from headcount.models.checkpoint import load_checkpoint
from headcount.models.device import pick_device
from headcount.models.loading import load_model, open_tokenizer
from headcount.models.seq2seq import heads_per_layer, kind_of
from headcount.pipeline.training_runs import continued_precision, greedy_dev_bleu
from headcount.provenance import provenance
from headcount.pruning.hard_concrete import (
    SELECTIONS,
    fold_gates,
    gate_snapshot,
    gate_table,
    optimizer_state_loader,
    penalty,
    prepare_for_pruning,
)
from headcount.pruning.lagrangian import DEFAULT_CONTROLLER, LagrangianController
from headcount.pruning.methods import (
    PENALTY_SCALES,
    is_control,
    ranked_method,
    setting_types,
    target_heads,
    target_label,
)
from headcount.pruning.ranked import heads_layout, masks_from_table, ranked_masks, retained_counts
from headcount.pruning.removal import (
    attention_flops,
    attention_parameters,
    kv_cache_bytes_per_token,
    remove_pruned_heads,
)
from headcount.settings import PruneRecipe, with_defaults
from headcount.training.decode import translate
from headcount.training.evaluate import score_translations
from headcount.training.loop import Corpus, DevSet, TrainConfig, parameter_groups, train
from headcount.training.schedules import baseline_last_lr, fine_tuning_lr, healing_lr


def prune_heads(
    baseline: str, train_src: str, train_tgt: str, dev_src: str, dev_tgt: str, src_spm: str, tgt_spm: str,
    setting: str, lam: float | None, prune_settings: dict, train_settings: dict, work_dir: str, model_out: str,
    gates_out: str, trajectory_out: str, log=print, lowercase: bool = False, baseline_checkpoint: str | None = None,
    target: dict | None = None,
) -> dict:
    """Fine-tune the converged baseline with lambda * L_C for one setting; write the pruned model
    (gates folded in), the gate table and the gates' trajectory. Resumable from `work_dir`.

    With a `target` (prune.targets: {"heads": N} or {"fraction": f}; lam None) the run prunes to
    that head count by the Lagrangian controller instead (prune_model); on a pretrained model its
    gates then train alone on the frozen weights, without healing, unless prune.gates_only says
    otherwise.

    lambda = 0 is the control: gates pinned open, the rest of the recipe unchanged. The recipe
    (prune_settings, config/README.md): the learning-rate schedule, the baseline's Adam state
    (from `baseline_checkpoint`, its training checkpoint), a last phase of `heal_steps` with the
    gates frozen at their evaluation values, and the checkpoint selection.
    """
    saved_baseline = load_checkpoint(baseline)
    if target is not None and "pretrained" in saved_baseline and "gates_only" not in prune_settings:
        prune_settings = {**prune_settings, "gates_only": True, "heal_steps": 0}
        log("a pretrained model pruned to a target: its gates alone train on the frozen weights, no healing "
            "(prune.gates_only: false trains the weights too)")
    recipe = pruning_recipe(setting, lam, prune_settings, train_settings)
    if recipe["resume_optimizer"] and not (baseline_checkpoint and Path(baseline_checkpoint).is_file()):
        raise HeadcountError(f"config key 'prune.resume_optimizer' is true but the baseline's training checkpoint "
                             f"{baseline_checkpoint} is missing; rerun the baseline's training (it keeps "
                             f"train/checkpoint.pt) or set prune.resume_optimizer: false")
    src_seg, tgt_seg = open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target")
    log("encoding the training and dev data")
    data = Corpus(encode_file(src_seg, train_src), encode_file(tgt_seg, train_tgt))  # compact: token_corpus
    dev_references = read_lines(dev_tgt)
    dev = DevSet(src_seg.encode(read_lines(dev_src)), tgt_seg.encode(dev_references), dev_references)
    model = load_model(baseline)
    # A pretrained model (the import_pretrained rule) has no training run here: its steps are not
    # counted, so a row's steps are those of fine-tuning alone.
    baseline_steps = 0 if "pretrained" in saved_baseline else int(
        saved_baseline.get("summary", {}).get("steps", train_settings["max_steps"]))
    train_settings = continued_precision(train_settings, saved_baseline.get("summary", {}).get("precision"),
                                         "the baseline", log)
    del saved_baseline
    baseline_params = list(model.parameters())  # the baseline optimizer's order, before gates exist
    init_optimizer = None
    if recipe["resume_optimizer"]:
        saved = load_checkpoint(baseline_checkpoint)
        if "optimizer" not in saved:
            raise HeadcountError(f"{baseline_checkpoint} holds no optimizer state; set prune.resume_optimizer: false")
        init_optimizer = optimizer_state_loader(saved["optimizer"], baseline_params, baseline_checkpoint)
    fingerprint = {"baseline": sha256_file(baseline), "setting": setting, "lambda": lam,
                   **({"target": target} if target is not None else {}),
                   "log_alpha_init": prune_settings["log_alpha_init"],
                   "gate_lr_scale": prune_settings["gate_lr_scale"],
                   "train_src": sha256_file(train_src), "train_tgt": sha256_file(train_tgt)}
    record = prune_model(model, data, dev, tgt_seg, setting, lam, prune_settings, train_settings, work_dir,
                         fingerprint, baseline_steps=baseline_steps, init_optimizer=init_optimizer,
                         lowercase=lowercase, log=log, target=target)
    model.save(model_out, {"pruning": {k: v for k, v in record.items() if k not in ("heads", "trajectory")}})
    with atomic_path(trajectory_out) as tmp:
        record.pop("trajectory").to_csv(tmp, index=False)
    write_json(gates_out, record)
    return record


def target_table(gates: list[str]) -> pd.DataFrame:
    """One row per run pruned to a target (their gates.json): the target, the heads kept by
    headcount's rule and the paper's, the error against the target, the expected open count, the
    undecided gates (report.preregistered.GATE_UNDECIDED) and their share, and the multipliers."""
    from headcount.report.preregistered import MAX_UNDECIDED_SHARE
    from headcount.report.pruning_report import undecided_gates

    rows = []
    for path in gates:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        table = pd.DataFrame(record["heads"])
        gated = table[table["gated"].astype(bool)]
        found = undecided_gates(table)
        target, controller = record["target"], record["controller"]
        kept = int((~gated["pruned"].astype(bool)).sum())
        share = found["gates_undecided"] / max(found["gates_gated"], 1)
        rows.append({"setting": record["setting"], "target": target_label(target),
                     "target_heads": controller["target_heads"], "gated": found["gates_gated"], "kept": kept,
                     "kept_paper_rule": int((~gated["pruned_paper"].astype(bool)).sum()),
                     "error": kept - controller["target_heads"], "expected_open": controller["expected_open"],
                     "undecided": found["gates_undecided"], "undecided_share": round(share, 4),
                     "decided": share <= MAX_UNDECIDED_SHARE, "lambda_1": controller["lambda_1"],
                     "lambda_2": controller["lambda_2"], "steps": controller["steps"],
                     "gates_only": record.get("gates_only")})
    return pd.DataFrame(rows)


def pruning_recipe(setting: str, lam: float | None, prune_settings: dict, train_settings: dict) -> dict:
    """The fine-tuning recipe of `prune_settings` (config/README.md), checked: the learning-rate
    schedule, the baseline's Adam state, the healing steps, the checkpoint selection."""
    if lam is not None and not lam >= 0:
        raise HeadcountError(f"pruning lambda {lam} is negative: a negative penalty rewards open gates. "
                             f"Use values >= 0 in prune.lambdas.{setting}")
    scale = prune_settings.get("penalty_scale", PruneRecipe.penalty_scale)
    if scale not in PENALTY_SCALES:
        raise HeadcountError(f"config key 'prune.penalty_scale': {scale!r}; use one of {', '.join(PENALTY_SCALES)}")
    # a key left out has the workflow's default (headcount.settings), as in an experiment's config
    given = with_defaults(PruneRecipe, prune_settings)
    recipe = {"lr_schedule": given["lr_schedule"], "resume_optimizer": bool(given["resume_optimizer"]),
              "heal_steps": int(given["heal_steps"]), "select": given["select"]}
    if recipe["select"] not in SELECTIONS:
        raise HeadcountError(f"config key 'prune.select': {recipe['select']!r}; use one of {', '.join(SELECTIONS)}")
    if recipe["select"] == "best_dev_bleu" and not train_settings["dev_bleu_sentences"]:
        raise HeadcountError("config key 'prune.select' is best_dev_bleu but training.dev_bleu_sentences is 0: "
                             "set training.dev_bleu_sentences > 0 or prune.select: last")
    return recipe


def prune_model(model, data: Corpus, dev: DevSet, tgt_seg, setting: str, lam: float | None, prune_settings: dict,
                train_settings: dict, work_dir: str | Path, fingerprint: dict, baseline_steps: int = 0,
                init_optimizer=None, lowercase: bool = False, log=print, target: dict | None = None) -> dict:
    """Fine-tune `model` (in place) with lambda * L_C for one setting, on encoded `data` and `dev`;
    fold the gates in and return the run's record: its gate table under "heads" (records) and its
    gates' trajectory under "trajectory" (a DataFrame). Checkpoints go to `work_dir`, which makes
    the run resumable; `fingerprint` names what the run depends on, so a changed input starts it
    afresh. prune_heads and headcount.api.prune both call this.

    lambda = 0 is the control: gates pinned open, the rest of the recipe unchanged. The recipe
    (pruning_recipe): the learning-rate schedule, `init_optimizer` (the baseline's Adam state), a
    last phase of `heal_steps` with the gates frozen at their evaluation values, and the checkpoint
    selection. `prune_settings["penalty_scale"]` states L_C (pruning.methods.PENALTY_SCALES;
    default the authors'); `prune_settings["gates_only"]` trains the gates alone on frozen weights.

    `target` ({"heads": N} or {"fraction": f} of the gated heads kept; lam then None): instead of
    the lambda penalty, a Lagrangian controller (pruning.lagrangian, its settings
    `prune_settings["controller"]`) drives the expected number of open gates to the target.
    """
    if (target is None) == (lam is None):
        raise HeadcountError(f"a pruning run has a lambda ({lam}) or a target ({target}): exactly one of them")
    recipe = pruning_recipe(setting, lam, prune_settings, train_settings)
    control = target is None and is_control(lam)
    scale = prune_settings.get("penalty_scale", PruneRecipe.penalty_scale)
    controller_settings = {**DEFAULT_CONTROLLER, **(prune_settings.get("controller") or {})}
    select_best = recipe["select"] == "best_dev_bleu"
    # The penalty is not part of the dev loss, so the training loop's "best dev" would pick the
    # least pruned weights: the loop keeps the last weights, and best_dev_bleu selection happens
    # here, among snapshots with the final head configuration (one per evaluation).
    settings = {**train_settings, **prune_settings["training"], "select": "last", "dev_bleu_sentences": 0,
                "average_snapshots": 1}
    settings["snapshot_interval"] = settings["eval_interval"] if select_best else 0
    cfg = TrainConfig(**{**settings, "adam_betas": tuple(settings["adam_betas"])})
    kind = kind_of(model)
    types = setting_types(setting, kind.name)
    gates_only = kind.gates_only or bool(prune_settings.get("gates_only", False))
    if kind.gates_only and recipe["heal_steps"]:
        raise HeadcountError(f"config key 'prune.heal_steps': {recipe['heal_steps']}, but a {kind.name} model prunes "
                             f"with its gates alone (its loss is the distance to its own unpruned output, which "
                             f"trained weights would move); set prune.heal_steps: 0")
    if gates_only and recipe["heal_steps"]:
        raise HeadcountError(f"config key 'prune.heal_steps': {recipe['heal_steps']}, but prune.gates_only is true: "
                             f"the weights are frozen, so nothing heals; set prune.heal_steps: 0")
    torch.manual_seed(cfg.seed)
    weight_scale = float(prune_settings.get("weight_lr_scale", PruneRecipe.weight_lr_scale))
    gates, groups = prepare_for_pruning(model, setting, prune_settings["log_alpha_init"],
                                        prune_settings["gate_lr_scale"], control=control,
                                        weight_lr_scale=weight_scale, gates_only=gates_only)
    lr_at = fine_tuning_lr(recipe["lr_schedule"], train_settings, cfg.to_dict(), model.d_model, weight_scale)
    controller = None
    if target is not None:
        n_gated = sum(g.log_alpha.numel() for g in gates)
        try:
            heads = target_heads(target, n_gated)
        except ValueError as error:
            raise HeadcountError(f"{error} (setting {setting}); name a count of at most {n_gated} heads in "
                                 f"prune.targets.{setting} or headcount.prune's target") from None
        controller = LagrangianController(gates, heads, cfg.max_steps, lr=float(controller_settings["lr"]),
                                          warmup=float(controller_settings["warmup"]),
                                          settle=float(controller_settings.get("settle", 0.0)))
        model.lagrangian = controller  # its multipliers go into the training loop's checkpoints
        extra_loss = controller
        what = (f"pruning {', '.join(types)} to {heads} of {n_gated} heads ({target}) by a Lagrangian controller "
                f"(multipliers' learning rate {controller.lr:g}, the target reached after "
                f"{controller.warmup_steps} steps" + (f", a pull toward the count's mask over the last "
                                                       f"{controller.settle_steps}" if controller.settle_steps else "")
                + ")")
    else:
        extra_loss = penalty(gates, lam, scale)
        what = ("control (lambda 0, gates pinned open)" if control
                else f"pruning {', '.join(types)} with lambda {lam}, L_C scaled {scale}")
    log(what + f": {len(gates)} gated layers, gate learning rate x{prune_settings['gate_lr_scale']}, recipe {recipe}")
    if kind.gates_only:
        log(f"a {kind.name} model: only the gates train, every weight stays frozen (its loss, {kind.objective}, is "
            f"the distance to the same weights with every gate open); no dropout")
    elif gates_only:
        log("gates only: every weight frozen, the gates alone train (no healing)")
    fingerprint = {**fingerprint, "weight_lr_scale": weight_scale, "recipe": recipe}
    # Keys that a run from before them did not have appear only where they change something, so
    # such a run still resumes.
    if scale != "authors":
        fingerprint["penalty_scale"] = scale
    if gates_only and not kind.gates_only:
        fingerprint["gates_only"] = True
    if controller is not None:
        fingerprint.update(target=target, controller=controller_settings)
    if groups:
        summary = train(model, cfg, data, dev, work_dir, parameters=groups, extra_loss=extra_loss,
                        extra_metrics=gate_snapshot, run_fingerprint=fingerprint, lr_at=lr_at,
                        init_optimizer=init_optimizer, log=log)
    else:  # a gates-only model's control: frozen weights, gates pinned open
        summary = _untrained(work_dir, log)
    if controller is not None:
        del model.lagrangian  # not part of the pruned model
    model.to("cpu")
    table = gate_table(model)
    trajectory = gate_trajectory(Path(work_dir) / "metrics.jsonl")
    candidates = []  # (phase, step, state_dict of the folded model) with the final head configuration
    if select_best:
        candidates += _fine_tuning_candidates(model, table, summary["snapshots"])
    fold_gates(model)
    # the folded model trains what the gated one trained (a gates-only kind: nothing, and it does not heal)
    weights = [] if gates_only else list(groups[0]["params"])
    final_lr = lr_at(cfg.max_steps)
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
                             # the gated steps it follows: a longer gated phase (max_steps raised,
                             # resumed) must heal afresh, not resume the shorter run's finished healing
                             run_fingerprint={**fingerprint, "phase": "heal", "after_step": summary["steps"]},
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
    n_layers, n_heads = heads_layout(model)
    counts = retained_counts(masks_from_table(table, n_layers, n_heads, "pruned"))
    counts_paper = retained_counts(masks_from_table(table, n_layers, n_heads, "pruned_paper"))
    log("retained heads: " + ", ".join(f"{k} {v}" for k, v in counts.items())
        + " (paper's log alpha < 0 rule: " + ", ".join(f"{k} {v}" for k, v in counts_paper.items()) + ")")
    steps = {"baseline": baseline_steps, "fine_tuning": summary["steps"],
             "heal": heal_summary["steps"] if heal_summary else 0}
    steps["total"] = sum(steps.values())
    record = {"setting": setting, "lambda": lam, "control": control, "retained": counts,
              "penalty_scale": None if controller is not None else scale, "gates_only": gates_only,
              "retained_paper_rule": counts_paper, "summary": summary, "heal_summary": heal_summary,
              "recipe": recipe, "steps": steps, "selected": selected,
              "lr": {"baseline_last": baseline_last_lr(train_settings, model.d_model),
                     "fine_tuning_peak": max(lr_at(s) for s in range(1, cfg.max_steps + 1)),
                     "fine_tuning_last": final_lr, "weight_lr_scale": weight_scale},
              "train_config": cfg.to_dict(), "prune_settings": prune_settings,
              "heads": table.to_dict(orient="records"), "provenance": provenance()}
    if controller is not None:
        state = controller.state()
        record["target"] = dict(target)  # as asked; the head count it came to is the controller's
        record["controller"] = state
        kept = sum(counts[t] for t in types)
        log(f"target {state['target_heads']} heads: {kept} kept ({kept - state['target_heads']:+d}), expected open "
            f"{state['expected_open']:.2f}, multipliers {state['lambda_1']:.4g}, {state['lambda_2']:.4g}")
    return {**record, "trajectory": trajectory}


def _untrained(work_dir: str, log) -> dict:
    """The training summary of a run with nothing to train (a gates-only kind's control: the
    baseline itself, its loss 0 at every step), and its empty metrics file (gate_trajectory's)."""
    log("nothing to train (every weight frozen, every gate pinned open): the control is the baseline as it is")
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    (Path(work_dir) / "metrics.jsonl").write_text("", encoding="utf-8")
    return {"steps": 0, "epochs": 0, "selected_step": 0, "best": None, "train_seconds": 0.0,
            "train_seconds_all": 0.0, "train_cpu_seconds_all": 0.0, "attempts": 0, "snapshots": []}


def _fine_tuning_candidates(model, final: pd.DataFrame, snapshots: list[dict]) -> list:
    """The gated run's snapshots whose evaluation gates prune exactly the final heads, folded."""
    import copy

    out = []
    for snap in snapshots:
        gated = copy.deepcopy(model)
        weights = load_checkpoint(snap["path"])["model"]  # a target run's also hold its controller's
        gated.load_state_dict({k: v for k, v in weights.items() if not k.startswith("lagrangian.")})
        if gate_table(gated)["pruned"].tolist() == final["pruned"].tolist():
            out.append(("fine_tuning", snap["step"], fold_gates(gated).state_dict()))
    return out


def _select_by_dev_bleu(model, candidates: list, dev, tgt_seg, n: int, lowercase: bool, log) -> dict:
    """Load into `model` the candidate with the best greedy dev BLEU (the baseline's selection
    rule); the earliest wins a tie."""
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


def ranked_curve(
    baseline: str, head_scores: str, src_spm: str, tgt_spm: str, src_text: str, ref_text: str, setting: str,
    step: float, decoding: dict, lowercase: bool, out_path: str, device: str = "auto", log=print,
    translations_out: str | None = None, method: str = "michel",
) -> pd.DataFrame:
    """A ranked pruning method's curve (pruning.methods; Michel et al. 2019 by default): mask the
    heads of the setting's attention types with the lowest score of the method's column of
    `head_scores`, in steps of `step` (no retraining), and score each pruned model. `translations_out` keeps each
    point's translations (JSON lines: removed_fraction, retained, translations), so the pruning
    report can set a gated run against the ranking with a paired bootstrap interval."""
    model = load_model(baseline)
    dev = pick_device(device)
    model.to(dev).eval()
    scores = pd.read_parquet(head_scores)
    n_layers, n_heads = heads_layout(model)
    src_seg, tgt_seg = open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target")
    src, refs = src_seg.encode(read_lines(src_text)), read_lines(ref_text)
    rows, points = [], []
    score = ranked_method(method).score
    kind = kind_of(model)
    curve = ranked_masks(scores, score, setting_types(setting, kind.name), n_layers, n_heads, step)
    if kind.objective != "translation":  # a language model: the text's perplexity at each point
        from headcount.pipeline.lm_quality import perplexity_curve

        rows, points = perplexity_curve(model, curve, src_seg, read_lines(src_text), setting,
                                        decoding["max_tokens"], log)
        curve = []  # nothing to translate below
    for fraction, masks in curve:
        model.set_head_mask(masks)
        start = time.perf_counter()
        hyps = translate(model, src, beam=decoding["beam"], alpha=decoding["alpha"], max_tokens=decoding["max_tokens"],
                         max_len_a=decoding["max_len_a"], max_len_b=decoding["max_len_b"], device=dev)
        detokenised = tgt_seg.decode(hyps)
        result = score_translations(detokenised, refs, lowercase=lowercase)
        counts = retained_counts(masks)
        points.append({"removed_fraction": fraction, "retained": counts, "translations": detokenised})
        rows.append({"setting": setting, "removed_fraction": fraction,
                     **{f"retained_{k}": v for k, v in counts.items()}, "retained_total": sum(counts.values()),
                     "bleu": result["bleu"], "chrf": result["chrf"], "bleu_signature": result["bleu_signature"]})
        log(f"removed {fraction:.0%} of {setting} heads: {counts} BLEU {result['bleu']:.2f} "
            f"({time.perf_counter() - start:.0f} s)")
    table = pd.DataFrame(rows)
    if translations_out:
        with atomic_path(translations_out) as tmp:
            tmp.write_text("".join(json.dumps(point, ensure_ascii=False) + "\n" for point in points), encoding="utf-8")
    with atomic_path(out_path) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4f")
    return table


def export_pruned(model_path: str, model_out: str, summary_out: str, src_len: int = 20, tgt_len: int = 20,
                  log=print) -> dict:
    """Physical pruning of a pruned model (gates folded into 0/1 head masks): a checkpoint whose
    attention modules compute only their kept heads (pruning.removal.remove_pruned_heads; loading.load_model
    reads it), and a record of the parameters and attention multiply-adds before and after (for one
    pair of `src_len` and `tgt_len` tokens)."""
    model = load_model(model_path).eval()
    before = {"parameters": sum(p.numel() for p in model.parameters()),
              "attention_parameters": attention_parameters(model),
              "attention_flops": attention_flops(model, src_len, tgt_len)}
    # A decoder-only model's generation keeps keys and values per token: what removing heads frees.
    kv_cache = kind_of(model).name == "decoder_only"
    if kv_cache:
        before["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(model)
    remove_pruned_heads(model)
    after = {"parameters": sum(p.numel() for p in model.parameters()),
             "attention_parameters": attention_parameters(model),
             "attention_flops": attention_flops(model, src_len, tgt_len)}
    if kv_cache:
        after["kv_cache_bytes_per_token"] = kv_cache_bytes_per_token(model)
        log(f"KV cache per token (2-byte values): {before['kv_cache_bytes_per_token']} -> "
            f"{after['kv_cache_bytes_per_token']} bytes")
    record = {"pruned": model_path, "heads": {k: [int(n) for n in v] for k, v in heads_per_layer(model).items()},
              "before": before, "after": after, "lengths": {"src": src_len, "tgt": tgt_len},
              "provenance": provenance()}
    model.save(model_out, {"physical_pruning": {k: v for k, v in record.items() if k != "provenance"}})
    write_json(summary_out, record)
    log(f"heads kept per layer {record['heads']}; parameters {before['parameters']} -> {after['parameters']}, "
        f"attention multiply-adds {before['attention_flops']:.3g} -> {after['attention_flops']:.3g}")
    return record

