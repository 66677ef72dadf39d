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


def single_head_ablation(access: HeadAccess, texts: Sequence, metric=None) -> pd.DataFrame:
    """Each head zeroed alone: its loss minus the model's, on `texts` (type, layer, head, delta_loss)."""
    table = access.heads
    sets = {name: [name] for name in table["name"]}
    found = access.measure(list(texts), sets, metric=metric)
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


def build_arms(access: HeadAccess, train_texts: Sequence, out: Path, *, published: pd.DataFrame | None = None,
               published_on: str = "", trained_on: str = "training text", draws: int = preregistered.RANDOM_DRAWS,
               seed: int = 0, iterative_step: float | None = 0.1, kv_heads: int | None = None,
               log: Callable[[str], None] = print) -> tuple[list[mc.Arm], dict]:
    """Every arm but the Hard Concrete ones, at the matched counts. The rankings and the iterative
    arm are kept under `out` as they are made (read back when they exist, so a rerun scores the same
    sets). iterative_step: the share of heads Michel's iterative pruning removes between rescorings
    (None: rescore only at each matched count, the cheaper schedule for a large model)."""
    model = access.model
    keys = [(r.type, int(r.layer), int(r.head)) for r in access.heads.itertuples()]
    counts = mc.counts_removed(len(keys))
    batches = encode_texts(model, access.src_tokenizer, access.tgt_tokenizer, list(train_texts), None,
                           access.max_tokens, access.device).batches
    log("scores on the training text: confidence")
    scores = cached_table(out / "scores_confidence.tsv", lambda: head_confidence(model, batches))
    arms = [mc.ranking_arm("confidence", _keyed(scores, "confidence"), counts, f"confidence, {trained_on}")]
    log("single-head ablation on the training text" if published is None or "delta_loss" not in published
        else "single-head ablation: the published table")
    if published is not None and "delta_loss" in published:
        ablation, ablation_on = published, published_on
    else:
        ablation = cached_table(out / "scores_ablation.tsv", lambda: single_head_ablation(access, train_texts))
        ablation_on = trained_on
    ablation_scores = _keyed(ablation, "delta_loss")
    arms.append(mc.ranking_arm("single-head ablation", ablation_scores, counts, f"delta loss, {ablation_on}"))
    if published is not None and "lrp" in published and published["lrp"].notna().all():
        arms.append(mc.ranking_arm("LRP", _keyed(published, "lrp"), counts, f"LRP relevance, {published_on}"))
    if kind_of(model).objective not in MICHEL_UNDEFINED:
        log("Michel importance on the training text, one-shot")
        michel = cached_table(out / "scores_michel.tsv", lambda: michel_importance(model, batches))
        arms.append(mc.ranking_arm("Michel one-shot", _keyed(michel, "michel"), counts, f"Michel, {trained_on}"))

        def rescore(removed):
            with masked_heads(model, removed):
                return _keyed(michel_importance(model, batches), "michel")

        step = max(1, round(iterative_step * len(keys))) if iterative_step else len(keys)
        every = (f"every {round(100 * iterative_step)}% of heads" if iterative_step
                 else "at each matched count")
        arms.append(_cached_arm(out / "arm_michel_iterative.json", lambda: mc.iterative_arm(
            "Michel iterative", rescore, keys, counts, step, f"Michel, rescored {every}, {trained_on}", log=log,
            first=_keyed(michel, "michel"))))
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


def target_arm(prune_run: Callable[[int], pd.DataFrame], counts: Sequence[int], total: int, out: Path,
               log: Callable[[str], None] = print) -> tuple[mc.Arm, pd.DataFrame]:
    """Hard Concrete gates trained to each matched count (`prune_run(kept)` -> the gates table of
    api.Pruning: type, layer, head, p_open, pruned), kept in out/gates_target_{kept}.tsv; the arm
    removes the heads whose gates closed, and the table says how near each run came (its error
    against the target, and its undecided share)."""
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
        pruned = gates[gates["pruned"].astype(bool)]
        arm.removed[k] = [(r.type, int(r.layer), int(r.head)) for r in pruned.itertuples()]
        undecided = int(((gates["p_open"] > low) & (gates["p_open"] < high)).sum())
        rows.append({"target_kept": kept, "kept": total - len(pruned), "error": total - len(pruned) - kept,
                     "undecided": undecided, "undecided_share": undecided / len(gates)})
    return arm, pd.DataFrame(rows)


def save_arms(arms: Sequence[mc.Arm], path: Path) -> None:
    path.write_text(json.dumps([_arm_json(a) for a in arms], indent=0), encoding="utf-8")
