"""Every way of choosing heads to remove, at the same head counts, against random head sets.

An arm is a way of choosing which heads go: a ranking (remove the lowest-scored first: Michel,
single-head ablation, LRP, confidence), an iterative ranking (Michel et al.'s: rescore the heads
left after each step), a structure (whole attention layers, He et al. 2024; whole key/value groups
of grouped-query attention, the only cut that shrinks the KV cache), a Hard Concrete run to a
target count (pruning.lagrangian), or a random draw (RANDOM_DRAWS of them: the band a method is
held against). Every arm's head sets are scored on the same texts in one Measurement
(analysis.head_access), so each pair of arms has a paired bootstrap interval over the texts.

The verdicts follow report.preregistered (the matched-count rules, fixed before any run was
scored): an arm beats random at a count when its loss lies below the random band's lower edge and
the paired interval against the draw at that edge lies below 0.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from headcount.analysis.head_access import BASELINE, Measurement
from headcount.analysis.importance import HeadKey
from headcount.report import preregistered

RANDOM = "random"  # the family of the random draws, and the prefix of their names


@dataclass
class Arm:
    """One way of choosing heads: removed[count] the heads it removes at each matched count (a
    structure arm removes whole layers or groups, so its own count may differ from the matched
    one: len(removed[count]))."""

    name: str
    family: str  # "method", "structure", "target" or RANDOM
    ranked_on: str  # the score and the text it was computed on, for the table
    removed: dict[int, list[HeadKey]] = field(default_factory=dict)


def counts_removed(total: int, fractions: Sequence[float] = preregistered.MATCHED_FRACTIONS_REMOVED) -> list[int]:
    """The matched counts: each fraction of `total` heads, rounded."""
    return [int(round(f * total)) for f in fractions]


def matched_counts(total: int, setting: str | None = None) -> list[int]:
    """Heads removed at each matched count: the paper's counts (report.preregistered.MATCHED_HEADS,
    heads kept of its 48 encoder or 144 heads) where the setting has the paper's number of heads,
    otherwise the preregistered fractions of `total`."""
    paper_total = {"enc": 48, "all": 144}.get(setting or "")
    if paper_total == total:
        return sorted(total - kept for kept in preregistered.MATCHED_HEADS[setting])
    return counts_removed(total)


def _ascending(scores: Mapping[HeadKey, float]) -> list[HeadKey]:
    """Heads from the lowest score up; ties by key, so the order is reproducible."""
    return sorted(scores, key=lambda key: (float(scores[key]), key))


def ranking_arm(name: str, scores: Mapping[HeadKey, float], counts: Sequence[int], ranked_on: str) -> Arm:
    """Remove the lowest-scored heads first (Michel et al.'s one-shot pruning)."""
    order = _ascending(scores)
    return Arm(name, "method", ranked_on, {k: order[:k] for k in counts})


def iterative_arm(name: str, rescore: Callable[[list[HeadKey]], Mapping[HeadKey, float]], keys: Sequence[HeadKey],
                  counts: Sequence[int], step: int, ranked_on: str, log: Callable[[str], None] = print,
                  first: Mapping[HeadKey, float] | None = None) -> Arm:
    """Michel et al.'s iterative pruning: score the heads left with the removed ones masked
    (`rescore(removed)` -> a score for every head), remove the `step` lowest (never past the next
    matched count), and repeat up to the largest count. `first`: the scores with nothing removed,
    where already computed (the one-shot ranking's)."""
    removed: list[HeadKey] = []
    arm = Arm(name, "method", ranked_on)
    targets = sorted(counts)
    while len(removed) < targets[-1]:
        scores = first if (first is not None and not removed) else rescore(list(removed))
        left = [key for key in _ascending({k: scores[k] for k in keys if k not in removed})]
        upto = min(len(removed) + step, next(k for k in targets if k > len(removed)))
        removed += left[: upto - len(removed)]
        log(f"{name}: {len(removed)} of {targets[-1]} heads removed")
        if len(removed) in targets:
            arm.removed[len(removed)] = list(removed)
    return arm


def random_arms(keys: Sequence[HeadKey], counts: Sequence[int], draws: int = preregistered.RANDOM_DRAWS,
                seed: int = 0) -> list[Arm]:
    """`draws` random orders of the heads; draw d removes the first k of its order at count k, so
    each draw's sets are nested, as a ranking's are."""
    rng = np.random.default_rng(seed)
    keys = sorted(keys)
    arms = []
    for d in range(draws):
        order = [keys[i] for i in rng.permutation(len(keys))]
        arms.append(Arm(f"{RANDOM} {d + 1}", RANDOM, f"seed {seed}", {k: order[:k] for k in counts}))
    return arms


def unit_arm(name: str, units: Mapping[tuple, Sequence[HeadKey]], scores: Mapping[tuple, float],
             counts: Sequence[int], ranked_on: str) -> Arm:
    """Remove whole units (layers, key/value groups) from the lowest score up, as many as come
    nearest each matched count (at least one unit, never all)."""
    order = sorted(units, key=lambda unit: (float(scores[unit]), unit))
    arm = Arm(name, "structure", ranked_on)
    for k in counts:
        taken, best = [], None
        for unit in order[:-1]:
            taken += list(units[unit])
            if best is None or abs(len(taken) - k) < abs(len(best) - k):
                best = list(taken)
        arm.removed[k] = best or []
    return arm


def kv_groups(widths: Mapping[str, Sequence[int]], kv_heads: int | None) -> dict[tuple, list[HeadKey]]:
    """The query heads sharing each key/value head (transformers' grouped-query attention: query
    head h reads key/value head h // (H / kv_heads)) -> {(type, layer, group): heads}; {} where
    every head has its own key and value."""
    groups: dict[tuple, list[HeadKey]] = {}
    for kind, layers in widths.items():
        for layer, n in enumerate(layers):
            if not kv_heads or kv_heads >= n:
                return {}
            size = n // kv_heads
            for h in range(n):
                groups.setdefault((kind, layer, h // size), []).append((kind, layer, h))
    return groups


def kv_bytes_per_token(removed: Sequence[HeadKey], groups: Mapping[tuple, Sequence[HeadKey]], head_dim: int,
                       bytes_per_value: int = 2) -> int | None:
    """The KV cache's bytes per token of the model with `removed` gone: a key and a value of
    `head_dim` per group with any query head left (16-bit values by default)."""
    if not groups:
        return None
    gone = set(removed)
    kept = sum(1 for heads in groups.values() if not set(heads) <= gone)
    return 2 * head_dim * bytes_per_value * kept


# --------------------------------------------------------------------------------------------
# Scoring, resumable


def set_name(arm: Arm, count: int) -> str:
    return f"{arm.name} @ {count}"


def measure_arms(access, texts: Sequence, arms: Sequence[Arm], store: str | Path, *, targets=None,
                 metric=None, sets_per_pass: int = 4, chunk: int = 8, log: Callable[[str], None] = print
                 ) -> Measurement:
    """Every arm's head set at every count, and the model as it is, on `texts`, through
    HeadAccess.measure; each chunk of sets is appended to `store` (a TSV of set, text, sum, units)
    as soon as it is scored, and sets already there are not scored again (a stopped run resumes).
    The heads of each stored set are kept beside it (`store` with suffix .sets.json): a set whose
    name is stored with other heads (an arm defined anew) is scored again, its new rows read."""
    store = Path(store)
    wanted = {BASELINE: []}
    for arm in arms:
        for count, heads in arm.removed.items():
            wanted[set_name(arm, count)] = [access.names.name(key) for key in heads]
    heads_of = store.with_suffix(".sets.json")
    stored = json.loads(heads_of.read_text(encoding="utf-8")) if heads_of.exists() else {}
    done = _read_store(store, len(texts))

    def as_stored(name: str) -> bool:  # a set stored before its heads were recorded is taken as found
        return name in done and sorted(stored.get(name, wanted[name])) == sorted(wanted[name])

    todo = [name for name in wanted if not as_stored(name)]
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text("set\ttext\tsum\tunits\n", encoding="utf-8")
    for start in range(0, len(todo), chunk):
        names = todo[start:start + chunk]
        found = access.measure(list(texts), {n: (wanted[n] or None) for n in names}, targets, metric=metric,
                               sets_per_pass=sets_per_pass)
        with store.open("a", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle, delimiter="\t")
            for n in names:
                row = found.sets.index(n) if n in found.sets else found.sets.index(found.baseline)
                for t in range(len(texts)):
                    writer.writerow([n, t, repr(float(found.sums[row, t])), repr(float(found.units[t]))])
        log(f"scored {min(start + chunk, len(todo))} of {len(todo)} head sets")
        stored.update({n: wanted[n] for n in names})
        heads_of.write_text(json.dumps(stored), encoding="utf-8")  # each chunk: a stopped run keeps its record
    if any(n not in stored for n in wanted):  # the sets taken as found are recorded too
        heads_of.write_text(json.dumps({**stored, **wanted}), encoding="utf-8")
    done = _read_store(store, len(texts))
    names = list(wanted)
    return Measurement(names, {n: wanted[n] for n in names}, np.stack([done[n][0] for n in names]),
                       done[BASELINE][1], baseline=BASELINE)


def _read_store(store: Path, n_texts: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{set: (sums, units)} of the sets the store holds for every text (a set cut off mid-write is
    left out, and scored again)."""
    if not store.exists():
        return {}
    table = pd.read_csv(store, sep="\t")
    out = {}
    for name, rows in table.groupby("set", sort=False):
        rows = rows.drop_duplicates("text", keep="last").sort_values("text")
        if len(rows) == n_texts:
            out[str(name)] = (rows["sum"].to_numpy(float), rows["units"].to_numpy(float))
    return out


def rescored(store: str | Path, n_texts: int) -> pd.DataFrame:
    """Every set the store holds two scorings of (an arm defined anew under the same name, such as
    gates trained again another way): its last scoring against the one before, on the same texts,
    with the paired 95% interval over them (the store's baseline rows are the unpruned model's)."""
    table = pd.read_csv(store, sep="\t")
    rows = []
    for name, group in table.groupby("set", sort=False):
        if len(group) < 2 * n_texts or name == BASELINE:
            continue
        blocks = [group.iloc[i:i + n_texts].sort_values("text") for i in range(0, len(group) - n_texts + 1, n_texts)]
        before, last = blocks[-2], blocks[-1]
        measured = Measurement(["before", "last"], {"before": [], "last": []},
                               np.stack([before["sum"].to_numpy(float), last["sum"].to_numpy(float)]),
                               last["units"].to_numpy(float))
        found = measured.compare("last", "before")
        rows.append({"set": name, "before": measured.value("before"), "last": measured.value("last"),
                     "difference": found["difference"], "low": found["low"], "high": found["high"]})
    return pd.DataFrame(rows, columns=["set", "before", "last", "difference", "low", "high"])


# --------------------------------------------------------------------------------------------
# Verdicts


def verdicts(measured: Measurement, arms: Sequence[Arm], margin: float,
             extra: Callable[[Arm, int], dict] | None = None) -> pd.DataFrame:
    """One row per (matched count, arm): heads removed and kept, the loss, its difference from the
    unpruned model with the paired 95% interval, the random band at that count, and the verdicts
    of report.preregistered: below the band, beats random, no loss (the interval's upper end
    below `margin`), and the paired interval against the next arm above it. Random draws get one
    row each, marked by family."""
    low_pct, high_pct = preregistered.RANDOM_BAND
    rows = []
    counts = sorted({k for arm in arms for k in arm.removed})
    for k in counts:
        present = [a for a in arms if k in a.removed]
        draws = [a for a in present if a.family == RANDOM]
        draw_values = np.array([measured.value(set_name(a, k)) for a in draws])
        band = (np.percentile(draw_values, low_pct), np.median(draw_values),
                np.percentile(draw_values, high_pct)) if len(draws) else (np.nan,) * 3
        # the draw at the band's lower edge: the lowest draw not below that percentile
        edge = next((a for a, v in sorted(zip(draws, draw_values), key=lambda p: p[1]) if v >= band[0]), None)
        others = sorted([a for a in present if a.family != RANDOM], key=lambda a: measured.value(set_name(a, k)))
        for i, arm in enumerate(others + draws):
            name = set_name(arm, k)
            diff = measured.compare(name, BASELINE)
            row = {"count": k, "arm": arm.name, "family": arm.family, "ranked_on": arm.ranked_on,
                   "removed": len(arm.removed[k]), "loss": measured.value(name), "difference": diff["difference"],
                   "low": diff["low"], "high": diff["high"], "random_p5": band[0], "random_median": band[1],
                   "random_p95": band[2], "no_loss": bool(diff["high"] < margin)}
            if arm.family != RANDOM:
                row["below_band"] = bool(row["loss"] < band[0])
                if edge is not None:
                    vs = measured.compare(name, set_name(edge, k))
                    row.update(vs_edge=vs["difference"], vs_edge_low=vs["low"], vs_edge_high=vs["high"])
                    # an arm that removed fewer heads than the draws is not judged against them
                    row["beats_random"] = (bool(row["below_band"] and vs["high"] < 0)
                                           if len(arm.removed[k]) >= k else None)
                if i + 1 < len(others):
                    nxt = others[i + 1]
                    vs = measured.compare(name, set_name(nxt, k))
                    row.update(next_arm=nxt.name, vs_next=vs["difference"], vs_next_low=vs["low"],
                               vs_next_high=vs["high"])
            if extra is not None:
                row.update(extra(arm, k))
            rows.append(row)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, total_heads: int) -> pd.DataFrame:
    """The verdict table without the single draws: one row per (count, method or structure arm),
    and the band as its own row per count."""
    named = table[table["family"] != RANDOM].copy()
    band = (table[table["family"] == RANDOM].groupby("count")
            .agg(removed=("removed", "first"), loss=("loss", "median"), random_p5=("random_p5", "first"),
                 random_p95=("random_p95", "first"), draws=("arm", "size")).reset_index())
    band["arm"], band["family"] = f"{RANDOM} (median of draws)", RANDOM
    out = pd.concat([named, band], ignore_index=True).sort_values(["count", "loss"], kind="stable")
    out.insert(out.columns.get_loc("removed") + 1, "kept", total_heads - out["removed"])
    return out.reset_index(drop=True)


def over_seeds(summaries: Mapping[int, pd.DataFrame]) -> pd.DataFrame:
    """Each arm at each count over the seeds' summaries (`summary`, one per seed, each judged on its
    own baseline): its loss and cost against the unpruned model on every seed and their mean, and
    on how many seeds it beats random and has no loss. `held_*`: the verdict holds on
    preregistered.SEEDS_FOR_A_VERDICT seeds (an arm a seed lacks, as a model without an LRP score,
    counts as not holding there). The random row gives the median draw's loss and the band's edges
    over the seeds."""
    both = pd.concat([table.assign(seed=seed) for seed, table in sorted(summaries.items())], ignore_index=True)
    rows = []
    for (count, arm), group in both.groupby(["count", "arm"], sort=False):
        group = group.sort_values("seed")
        row = {"count": count, "arm": arm, "family": group["family"].iloc[0], "seeds": len(group),
               "removed": "/".join(str(int(r)) for r in group["removed"]), "loss_mean": group["loss"].mean()}
        if row["family"] == RANDOM:
            row.update(random_p5_min=group["random_p5"].min(), random_p95_max=group["random_p95"].max())
        else:
            row.update(difference_mean=group["difference"].mean(), difference_min=group["difference"].min(),
                       difference_max=group["difference"].max(),
                       beats_random_seeds=int(group["beats_random"].eq(True).sum()),  # empty: not judged
                       no_loss_seeds=int(group["no_loss"].eq(True).sum()))
            row["held_beats_random"] = row["beats_random_seeds"] >= preregistered.SEEDS_FOR_A_VERDICT
            row["held_no_loss"] = row["no_loss_seeds"] >= preregistered.SEEDS_FOR_A_VERDICT
        for seed_row in group.itertuples():
            row[f"loss_seed{seed_row.seed}"] = seed_row.loss
            if row["family"] != RANDOM:
                row[f"difference_seed{seed_row.seed}"] = seed_row.difference
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["count", "loss_mean"], kind="stable").reset_index(drop=True)


def markdown(summary: pd.DataFrame, draws: int, unit: str = "nats per token") -> str:
    """The summary as a markdown table: per matched count, every arm with its interval against the
    unpruned model, the random band, and the verdicts."""
    def yes(value) -> str:
        return "" if pd.isna(value) else ("yes" if bool(value) else "no")

    kv = "kv_bytes_per_token" in summary
    head = ("| heads removed | arm | removed | kept | loss | vs unpruned [95%] | random 5-95% | beats random | "
            f"no loss |{' KV bytes/token |' if kv else ''}")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in summary.itertuples():
        band = f"{row.random_p5:.3f}-{row.random_p95:.3f}"
        if row.family == RANDOM:
            interval = f"{int(row.draws)} draws"
        else:
            interval = f"{row.difference:+.3f} [{row.low:+.3f}, {row.high:+.3f}]"
        cells = [str(row.count), row.arm, str(int(row.removed)), str(int(row.kept)), f"{row.loss:.3f}", interval, band,
                 yes(getattr(row, "beats_random", None)), yes(row.no_loss) if row.family != RANDOM else ""]
        if kv:
            cells.append("" if pd.isna(row.kv_bytes_per_token) else str(int(row.kv_bytes_per_token)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\nLoss in {unit}; random: the median of {draws} random head sets; "
                                "beats random and no loss: the rules of report.preregistered.\n")


def plot(table: pd.DataFrame, total_heads: int, baseline: float, path: str | Path, title: str,
         ylabel: str = "loss (nats per token)") -> None:
    """Loss against heads kept: every arm, the random band (5th-95th percentile) and its median."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    draws = table[table["family"] == RANDOM].groupby("count").first().reset_index()
    kept = total_heads - draws["count"]
    ax.fill_between(kept, draws["random_p5"], draws["random_p95"], color="0.85", label="random heads, 5-95%")
    ax.plot(kept, draws["random_median"], color="0.5", ls="--", lw=1, label="random heads, median")
    for arm, rows in table[table["family"] != RANDOM].groupby("arm", sort=False):
        rows = rows.sort_values("removed")
        ax.plot(total_heads - rows["removed"], rows["loss"], marker="o", ms=4, lw=1.2, label=arm)
    ax.axhline(baseline, color="k", lw=0.8, label="unpruned")
    ax.set_xlabel("heads kept")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


__all__ = ["Arm", "counts_removed", "iterative_arm", "kv_bytes_per_token", "kv_groups", "measure_arms", "plot",
           "over_seeds", "random_arms", "ranking_arm", "rescored", "set_name", "summary", "unit_arm", "verdicts"]
