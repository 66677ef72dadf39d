"""How many heads can go: every arm of pruning.matched_counts on one model, scored on held-out
text at the matched counts of report.preregistered, with its random band; resumable (every
ranking, arm and scored set is kept under `out` as soon as it exists).

The rankings are computed here on the training text (confidence, Michel one-shot and iterative,
single-head ablation) or read from a published score table (`published`, columns type, layer,
head and the measure), which says what text they came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from headcount.analysis.head_access import HeadAccess, encode_texts
from headcount.analysis.importance import MICHEL_UNDEFINED, head_confidence, michel_importance
from headcount.models.seq2seq import kind_of
from headcount.pruning import matched_counts as mc
from headcount.report import preregistered


def _keyed(table: pd.DataFrame, column: str) -> dict:
    return {(r.type, int(r.layer), int(r.head)): float(getattr(r, column)) for r in table.itertuples()}


def cached_table(path: Path, make: Callable[[], pd.DataFrame]) -> pd.DataFrame:
    """The table at `path`, made by `make` and written whole (through a .part file) the first time."""
    if path.exists():
        return pd.read_csv(path, sep="\t")
    table = make()
    tmp = path.with_suffix(".part")
    table.to_csv(tmp, sep="\t", index=False)
    tmp.replace(path)
    return table


def single_head_ablation(access: HeadAccess, texts: Sequence, metric=None, targets=None) -> pd.DataFrame:
    """Each head zeroed alone: its loss minus the model's, on `texts` (type, layer, head, delta_loss)."""
    table = access.heads
    sets = {name: [name] for name in table["name"]}
    found = access.measure(list(texts), sets, None if targets is None else list(targets), metric=metric)
    base = found.value(found.baseline)
    table["delta_loss"] = [found.value(name) - base for name in table["name"]]
    return table[["type", "layer", "head", "delta_loss"]]


@contextmanager
def masked_heads(model, removed: Sequence[tuple]) -> Iterator[None]:
    """`removed` heads zeroed through the model's head mask while the context is open."""
    before = {kind: mask.clone() for kind, mask in model.head_mask().items()}
    masks = {kind: mask.clone() for kind, mask in before.items()}
    for kind, layer, head in removed:
        masks[kind][layer, head] = 0.0
    model.set_head_mask(masks)
    try:
        yield
    finally:
        model.set_head_mask(before)


def _has(published: pd.DataFrame | None, column: str) -> bool:
    return published is not None and column in published and bool(published[column].notna().all())


def build_arms(access: HeadAccess, train_texts: Sequence, out: Path, *, published: pd.DataFrame | None = None,
               published_on: str = "", trained_on: str = "training text", draws: int = preregistered.RANDOM_DRAWS,
               seed: int = 0, iterative_step: float | None = 0.1, kv_heads: int | None = None,
               train_targets: Sequence | None = None, types: Sequence[str] | None = None,
               counts: Sequence[int] | None = None, log: Callable[[str], None] = print
               ) -> tuple[list[mc.Arm], dict]:
    """Every arm but the Hard Concrete ones, at the matched counts. The rankings and the iterative
    arm are kept under `out` as they are made (read back when they exist, so a rerun scores the same
    sets). A ranking the published table holds (confidence, delta_loss, lrp, michel) is read from
    it; the others are computed on `train_texts` (an encoder-decoder's with `train_targets`).
    iterative_step: the share of heads Michel's iterative pruning removes between rescorings (None:
    rescore only at each matched count, the cheaper schedule for a large model). types: the
    attention types whose heads may go (a pruning setting's; default every head). counts: heads
    removed (default the preregistered fractions of those heads)."""
    model = access.model
    keys = [(r.type, int(r.layer), int(r.head)) for r in access.heads.itertuples()
            if types is None or r.type in types]
    counts = list(counts) if counts is not None else mc.counts_removed(len(keys))
    targets = None if train_targets is None else list(train_targets)
    batches = encode_texts(model, access.src_tokenizer, access.tgt_tokenizer, list(train_texts), targets,
                           access.max_tokens, access.device).batches

    def ranking(name: str, column: str, make: Callable[[], pd.DataFrame], what: str) -> tuple[dict, str]:
        """The scores of `column` for the heads in play, from the published table or made here."""
        if _has(published, column):
            log(f"{name}: the published table")
            table, on = published, published_on
        else:
            log(f"{name} on the training text")
            table, on = cached_table(out / f"scores_{column}.tsv", make), trained_on
        scores = _keyed(table, column)
        return {k: scores[k] for k in keys}, f"{what}, {on}"

    confidence, on = ranking("confidence", "confidence", lambda: head_confidence(model, batches), "confidence")
    arms = [mc.ranking_arm("confidence", confidence, counts, on)]
    ablation_scores, ablation_on = ranking("single-head ablation", "delta_loss",
                                           lambda: single_head_ablation(access, train_texts, targets=targets),
                                           "delta loss")
    arms.append(mc.ranking_arm("single-head ablation", ablation_scores, counts, ablation_on))
    if _has(published, "lrp"):
        lrp = _keyed(published, "lrp")
        arms.append(mc.ranking_arm("LRP", {k: lrp[k] for k in keys}, counts, f"LRP relevance, {published_on}"))
    if kind_of(model).objective not in MICHEL_UNDEFINED:
        michel, on = ranking("Michel importance, one-shot", "michel", lambda: michel_importance(model, batches),
                             "Michel")
        arms.append(mc.ranking_arm("Michel one-shot", michel, counts, on))

        def rescore(removed):
            with masked_heads(model, removed):
                scores = _keyed(michel_importance(model, batches), "michel")
                return {k: scores[k] for k in keys}

        step = max(1, round(iterative_step * len(keys))) if iterative_step else len(keys)
        every = (f"every {round(100 * iterative_step)}% of heads" if iterative_step
                 else "at each matched count")
        arms.append(_cached_arm(out / "arm_michel_iterative.json", lambda: mc.iterative_arm(
            "Michel iterative", rescore, keys, counts, step, f"Michel, rescored {every}, {trained_on}", log=log,
            first=michel)))
    # structures, in the order of their heads' summed single-head ablation effects
    layers = {}
    for kind, layer, head in keys:
        layers.setdefault((kind, layer), []).append((kind, layer, head))
    summed = {unit: sum(ablation_scores[k] for k in heads) for unit, heads in layers.items()}
    arms.append(mc.unit_arm("whole layers", layers, summed, counts, f"summed delta loss, {ablation_on}"))
    groups = mc.kv_groups(access.names.widths, kv_heads)
    if groups:
        summed = {unit: sum(ablation_scores[k] for k in heads) for unit, heads in groups.items()}
        arms.append(mc.unit_arm("whole KV groups", groups, summed, counts, f"summed delta loss, {ablation_on}"))
    arms += mc.random_arms(keys, counts, draws, seed)
    return arms, groups


def _arm_json(arm: mc.Arm) -> dict:
    return {"name": arm.name, "family": arm.family, "ranked_on": arm.ranked_on,
            "removed": {str(k): [list(key) for key in v] for k, v in arm.removed.items()}}


def _arm_from_json(data: dict) -> mc.Arm:
    return mc.Arm(data["name"], data["family"], data["ranked_on"],
                  {int(k): [(t, int(la), int(h)) for t, la, h in v] for k, v in data["removed"].items()})


def _cached_arm(path: Path, make: Callable[[], mc.Arm]) -> mc.Arm:
    if path.exists():
        return _arm_from_json(json.loads(path.read_text(encoding="utf-8")))
    arm = make()
    path.write_text(json.dumps(_arm_json(arm)), encoding="utf-8")
    return arm


# The gates' own rate in an L0 run on frozen weights. prune's default gate rate (10 x the baseline's
# last rate) is tuned for fine-tuning, where the weights adapt too; on frozen weights it left 15% of
# the positive control's gates undecided after 500 steps and missed the target by 1-2 heads, where
# 0.1 a step decided every gate and met the target exactly (benchmarks/RESULTS.md).
GATES_ONLY_RATE = 0.1


def gates_only_recipe(baseline_training: dict, d_model: int, steps: int, rate: float = GATES_ONLY_RATE,
                      controller: dict | None = None) -> dict:
    """api.prune's recipe for an L0 run on frozen weights: the gates move at `rate` a step (the
    constant schedule holds the baseline's last rate, so gate_lr_scale is rate over it), one
    evaluation at the end, no warm-up; `controller` (prune.controller: lr, warmup, settle) where
    set, else the controller's defaults."""
    from headcount.training.schedules import baseline_last_lr

    return {"gate_lr_scale": rate / baseline_last_lr(baseline_training, d_model),
            "training": {"eval_interval": steps, "warmup_steps": 1},
            **({"controller": dict(controller)} if controller else {})}


def l0_arm_arguments(kept: int, texts: Sequence[str], targets: Sequence[str], *, setting: str, steps: int,
                     baseline_training: dict, d_model: int, work_dir: str | Path, controller: dict | None = None,
                     dev: tuple[Sequence[str], Sequence[str]] | None = None) -> dict:
    """api.prune's keyword arguments for the L0 arm's run on an encoder-decoder baseline (this layer
    does not call the API itself): its gates alone trained on the frozen weights to `kept` heads of
    `setting` (gates_only_recipe, with the baseline's seed and batch size), on `texts` -> `targets`;
    `dev` (by default the first two pairs of `texts`) is only evaluated at the end."""
    dev_src, dev_tgt = dev or (texts[:2], targets[:2])
    return {"train_texts": list(texts), "target": kept, "train_targets": list(targets), "setting": setting,
            "steps": steps, "gates_only": True, "dev_texts": list(dev_src), "dev_targets": list(dev_tgt),
            "training": {"max_tokens": baseline_training["max_tokens"], "seed": baseline_training["seed"]},
            "recipe": gates_only_recipe(baseline_training, d_model, steps, controller=controller),
            "work_dir": work_dir}


def target_arm(prune_run: Callable[[int], pd.DataFrame], counts: Sequence[int], total: int, out: Path,
               log: Callable[[str], None] = print) -> tuple[mc.Arm, pd.DataFrame]:
    """Hard Concrete gates trained to each matched count (`prune_run(kept)` -> the gates table of
    api.Pruning: type, layer, head, log_alpha, p_open, pruned, gated), kept in
    out/gates_target_{kept}.tsv. The arm removes exactly the count: the gated heads of lowest log
    alpha (CoFi's deterministic mask zeroes the lowest gates, as many as its expected number of
    closed ones; here the count, the expectation the controller steers to), so the L0 arm is held
    against random sets of the same size as every other arm. The
    table says how near the run itself came: the heads its own rule keeps (evaluation gate above 0),
    that count's error against the target, the expected count the controller steered (sum of
    P(open)), and the undecided share."""
    arm, rows = mc.Arm("L0 to target", "target", "Hard Concrete gates, Lagrangian controller"), []
    low, high = preregistered.GATE_UNDECIDED
    for k in counts:
        kept = total - k
        path = out / f"gates_target_{kept}.tsv"
        if path.exists():
            gates = pd.read_csv(path, sep="\t")
        else:
            log(f"L0 to a target of {kept} heads kept")
            gates = prune_run(kept)
            gates.to_csv(path, sep="\t", index=False)
        gated = gates[gates["gated"].astype(bool)] if "gated" in gates else gates  # the heads in play
        lowest = gated.sort_values("log_alpha", kind="stable").head(k)
        arm.removed[k] = [(r.type, int(r.layer), int(r.head)) for r in lowest.itertuples()]
        by_rule = int(gated["pruned"].astype(bool).sum())
        undecided = int(((gated["p_open"] > low) & (gated["p_open"] < high)).sum())
        expected = float(gated["p_open"].sum()) + total - len(gated)
        rows.append({"target_kept": kept, "kept": total - by_rule, "error": total - by_rule - kept,
                     "expected_kept": round(expected, 2), "undecided": undecided,
                     "undecided_share": undecided / len(gated), "arm_kept": total - len(arm.removed[k])})
    return arm, pd.DataFrame(rows)


def save_arms(arms: Sequence[mc.Arm], path: Path) -> None:
    path.write_text(json.dumps([_arm_json(a) for a in arms], indent=0), encoding="utf-8")


def digest(value) -> str:
    """The sha256 of a JSON-able value (texts, settings): what a fingerprint keeps of it."""
    import hashlib

    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()


def start_afresh_unless(out: Path, fingerprint: dict, log: Callable[[str], None] = print) -> None:
    """Keep what `out` holds from an earlier run only if that run had the same `fingerprint` (its
    inputs' checksums and settings, JSON); otherwise empty `out`: a resumed run must not mix sets,
    rankings or gates made from other inputs into its tables."""
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    path = out / "fingerprint.json"
    wanted = json.dumps(fingerprint, sort_keys=True, default=str)
    if path.exists() and path.read_text(encoding="utf-8") == wanted:
        log(f"resuming from {out}")
        return
    stale = [p for p in out.iterdir() if p != path]
    if stale:
        log(f"{out} holds a run of other inputs or settings: starting afresh")
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    path.write_text(wanted, encoding="utf-8")


def score_arms(access: HeadAccess, arms: Sequence[mc.Arm], held_out: Sequence, out: Path, *, total: int,
               margin: float, unit: str, title: str, targets: Sequence | None = None, extra=None,
               draws: int = preregistered.RANDOM_DRAWS, chunk: int = 8, sets_per_pass: int = 4,
               log: Callable[[str], None] = print) -> pd.DataFrame:
    """Every arm's sets scored on the held-out texts (resumable: out/scored.tsv), then the verdicts
    (head_counts.tsv), the summary (head_counts_summary.tsv, head_counts.md) and the figure
    (head_counts.png) under `out`; returns the summary. total: the heads in play; margin: the
    preregistered "no loss" margin in the metric's unit; sets_per_pass: copies of a batch in one
    forward pass (HeadAccess.measure)."""
    save_arms(arms, out / "arms.json")
    measured = mc.measure_arms(access, list(held_out), arms, out / "scored.tsv",
                               targets=None if targets is None else list(targets), chunk=chunk,
                               sets_per_pass=sets_per_pass, log=log)
    table = mc.verdicts(measured, arms, margin, extra)
    table.to_csv(out / "head_counts.tsv", sep="\t", index=False)
    summary = mc.summary(table, total)
    summary.to_csv(out / "head_counts_summary.tsv", sep="\t", index=False)
    (out / "head_counts.md").write_text(mc.markdown(summary, draws, unit), encoding="utf-8")
    mc.plot(table, total, measured.value(measured.baseline), out / "head_counts.png", title,
            "cosine distance to the unpruned embedding" if unit.startswith("cosine") else f"loss ({unit})")
    log(f"wrote {out / 'head_counts_summary.tsv'}")
    return summary


def translation_head_counts(baseline: str | Path, src_spm: str | Path, tgt_spm: str | Path,
                            rank_src: Sequence[str], rank_tgt: Sequence[str], eval_src: Sequence[str],
                            eval_tgt: Sequence[str], head_scores: pd.DataFrame, setting: str, out: str | Path, *,
                            scores_on: str, draws: int = preregistered.RANDOM_DRAWS, seed: int = 0,
                            iterative_step: float | None = 0.1,
                            prune_run: Callable[..., pd.DataFrame] | None = None, max_tokens: int = 2000,
                            device: str = "cpu", fingerprint: dict | None = None,
                            log: Callable[[str], None] = print) -> pd.DataFrame:
    """The matched-count arms on an encoder-decoder baseline, for one pruning setting's heads: the
    published rankings (`head_scores`, computed on `scores_on`), Michel iterative rescored on the
    ranking pairs, whole layers, random draws and, given `prune_run(model, tokenizers, kept, work_dir)`
    -> a gates table (api.Pruning.gates), Hard Concrete gates trained to each count; scored
    by the references' loss (nats per token) on the evaluation pairs, with the paper's matched
    counts (pruning.matched_counts.matched_counts). Resumable: `out` keeps every stage, and is
    emptied first where it holds a run with another `fingerprint` (start_afresh_unless)."""
    import torch

    from headcount.io import sha256_file
    from headcount.models.loading import load_model, open_tokenizer
    from headcount.pruning.methods import setting_types

    out = Path(out)
    start_afresh_unless(out, {"baseline": sha256_file(baseline), "src_spm": sha256_file(src_spm),
                              "tgt_spm": sha256_file(tgt_spm), "scores": int(pd.util.hash_pandas_object(
                                  head_scores, index=False).sum()), "rank": digest([rank_src, rank_tgt]),
                              "eval": digest([eval_src, eval_tgt]), "setting": setting, "draws": draws,
                              "seed": seed, "iterative_step": iterative_step, "max_tokens": max_tokens,
                              **(fingerprint or {})}, log)
    model = load_model(baseline).eval()
    src_tok, tgt_tok = open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target")
    access = HeadAccess(model, src_tok, tgt_tok, torch.device(device), max_tokens=max_tokens)
    types = setting_types(setting, kind_of(model).name)
    total = int(access.heads["type"].isin(types).sum())
    counts = mc.matched_counts(total, setting)
    arms, _ = build_arms(access, rank_src, out, published=head_scores, published_on=scores_on,
                         trained_on=f"{len(rank_src)} ranking pairs", draws=draws, seed=seed,
                         iterative_step=iterative_step, train_targets=rank_tgt, types=types, counts=counts,
                         log=log)
    if prune_run is not None:
        def run(kept):
            return prune_run(model, (src_tok, tgt_tok), kept, out / f"l0_{kept}")

        arm, targets = target_arm(run, counts, total, out, log=log)
        arms.insert(0, arm)
        targets.to_csv(out / "targets.tsv", sep="\t", index=False)
    return score_arms(access, arms, eval_src, out, total=total, margin=preregistered.NO_LOSS_NATS,
                      unit="nats per token", targets=eval_tgt, draws=draws,
                      title=f"{setting} heads: {len(eval_src)} held-out pairs, {draws} random draws", log=log)
