"""The pruning report: the pruning table, Table 2 beside the paper's with paired bootstrap
intervals, the paper's findings checked, Figures 7 to 10, and the BLEU spread across seeds.
What pruning_report.py and seed_spread.py call."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from headcount.analysis.roles.registry import NO_ROLE, role_names
from headcount.io import HeadcountError, atomic_path, read_lines
from headcount.models.seq2seq import ATTENTION_TYPES
from headcount.pruning.methods import METHODS, is_control, ranked_method, ranked_methods
from headcount.report.claims import claims_markdown, claims_table, pruning_claims
from headcount.report.preregistered import (
    GATE_BUDGET_CAP,
    GATE_BUDGET_STEP,
    GATE_UNDECIDED,
    MAX_UNDECIDED_SHARE,
)
from headcount.report.seed_statistics import t_interval
from headcount.training.evaluate import BOOTSTRAP_SAMPLES, interval_excludes_zero, paired_bootstrap

# Table 2 of Voita et al. (2019), EN-RU: (retained enc-self/dec-self/dec-enc, BLEU pruned, BLEU from scratch).
PAPER_TABLE2 = {
    "WMT 2.5M": [((48, 48, 48), 29.6, None), ((14, 31, 30), 29.62, 29.47), ((12, 21, 25), 29.36, 28.95),
                 ((8, 13, 15), 29.06, 28.56), ((5, 9, 12), 28.90, 28.41)],
    "OpenSubtitles 6M": [((48, 48, 48), 32.4, None), ((27, 31, 46), 32.24, 32.23), ((13, 17, 31), 32.23, 31.98),
                         ((6, 9, 13), 32.27, 31.84)],
}


def pruning_report(experiment: str, baseline_scores: str, gates: list[str], pruned_scores: list[str],
                   scratch_scores: list[str], ranked: list[str], roles: str, out: dict, log=print,
                   ranked_translations: list[str] = (),
                   references: str | None = None, baseline_translations: str | None = None,
                   pruned_translations: list[str] = (), scratch_translations: list[str] = (),
                   baseline_training: str | None = None, scratch_training: list[str] = (),
                   lowercase: bool = False, control_layers: str | None = None, baseline_nll: str | None = None,
                   pruned_nll: list[str] = (), scratch_nll: list[str] = ()) -> pd.DataFrame:
    """The pruning table, Table 2 beside the paper's, the heads kept per layer (layer_survival),
    the paper's findings checked (claims.py; with the positive control's layer-survival table
    `control_layers`, where given, as evidence for "specialised heads last"), and Figures 7 to 10.

    Every BLEU difference (pruned - baseline, from scratch - baseline, pruned - from scratch,
    pruned - its setting's lambda = 0 control) gets a 95% paired bootstrap interval over the test
    sentences (evaluate.paired_bootstrap), given the translations and references; so does pruned -
    each ranked method's curve (pruning.methods; Michel et al.'s ranking) at the nearest head count
    of the setting's curve, given the curve's translations (`ranked_translations`): columns
    d_<method> (with _low and _high), <method>_heads and <method>_bleu for every registered ranked
    method. `ranked` and `ranked_translations` are the curves' files, .../prune/<setting>/<method>.tsv
    and <method>_translations.jsonl. Each row states its training steps in all and its checkpoint
    selection, for the pruned model and its twin.

    Given each model's per-reference NLL (`baseline_nll`, `pruned_nll`, `scratch_nll`: the
    .../scores/<split>.nll.tsv files), the same differences in mean token NLL with their paired
    intervals (perplexity.paired_bootstrap_nll): columns nll, nll_scratch and dnll_<difference>
    (positive: the first model is worse), far less noisy than BLEU.
    """
    from headcount.report import plots

    baseline = _read_json(baseline_scores)
    scores = {_model_dir(p): _read_json(p) for p in pruned_scores}
    scratch = {str(Path(_model_dir(p)).parent): _read_json(p) for p in scratch_scores}
    scratch_runs = {str(Path(p).parent.parent): _read_json(p) for p in scratch_training}
    refs = read_lines(references) if references else None
    hyps = {_model_dir(p): read_lines(p) for p in pruned_translations}
    scratch_hyps = {str(Path(_model_dir(p)).parent): read_lines(p) for p in scratch_translations}
    baseline_hyps = read_lines(baseline_translations) if baseline_translations else None
    baseline_run = _read_json(baseline_training) if baseline_training else {}
    curve_points = {_curve_of(path, "_translations.jsonl"): [json.loads(line) for line in read_lines(path) if line]
                    for path in ranked_translations}
    role_of = {(r.layer, r.head): r.role for r in pd.read_csv(roles).itertuples()}
    nlls = {_model_dir(p): _read_nll(p) for p in pruned_nll}
    scratch_nlls = {str(Path(_model_dir(p)).parent): _read_nll(p) for p in scratch_nll}
    base_nll = _read_nll(baseline_nll) if baseline_nll else None
    first = _read_json(gates[0]) if gates else None
    n_heads = {kind: sum(1 for h in first["heads"] if h["type"] == kind) for kind in ATTENTION_TYPES} if first else {}
    rows, heads = [], []
    baseline_row = {"experiment": experiment, "setting": "baseline", "lam": float("nan"), "control": False,
                    **{f"retained_{k}": n for k, n in n_heads.items()},
                    "bleu": baseline["bleu"], "chrf": baseline["chrf"],
                    "steps": baseline_run.get("steps", float("nan")),
                    "selection": baseline_run.get("train_config", {}).get("select", "")}
    baseline_row.update(_role_counts([(layer, head) for layer, head in role_of], role_of))
    baseline_row.update(nll_mean("nll", base_nll))
    rows.append(baseline_row)
    records = {str(Path(p).parent): _read_json(p) for p in gates}
    controls = {r["setting"]: folder for folder, r in records.items() if is_control(r["lambda"])}

    def interval(name: str, system: list[str] | None, reference: list[str] | None) -> dict:
        if refs is None or system is None or reference is None:
            return {name: float("nan"), f"{name}_low": float("nan"), f"{name}_high": float("nan")}
        result = paired_bootstrap(system, reference, refs, lowercase=lowercase)
        return {name: result["difference"], f"{name}_low": result["low"], f"{name}_high": result["high"]}

    def nll_interval(name: str, system: pd.DataFrame | None, reference: pd.DataFrame | None) -> dict:
        if system is None or reference is None:
            return {}
        from headcount.training.perplexity import paired_bootstrap_nll  # torch: only where NLL files are given

        result = paired_bootstrap_nll(system["nll"].to_numpy(), reference["nll"].to_numpy(),
                                      reference["tokens"].to_numpy())
        return {f"dnll_{name}": result["difference"], f"dnll_{name}_low": result["low"],
                f"dnll_{name}_high": result["high"]}

    for folder, record in records.items():
        table = pd.DataFrame(record["heads"])
        kept_enc = [(r.layer, r.head) for r in table[(table["type"] == "enc_self") & ~table["pruned"]].itertuples()]
        twin = scratch_runs.get(folder, {})
        steps = record.get("steps") or {"total": baseline_run.get("steps", 0) + record["summary"]["steps"]}
        row = {"experiment": experiment, "setting": record["setting"], "lam": record["lambda"],
               "control": is_control(record["lambda"]), **undecided_gates(table),
               **{f"retained_{k}": v for k, v in record["retained"].items()},
               **{f"retained_paper_rule_{k}": v for k, v in record["retained_paper_rule"].items()},
               "bleu": scores[folder]["bleu"], "chrf": scores[folder]["chrf"],
               "bleu_scratch": scratch[folder]["bleu"] if folder in scratch else float("nan"),
               "chrf_scratch": scratch[folder]["chrf"] if folder in scratch else float("nan"),
               "steps": steps["total"], "selection": record.get("recipe", {}).get("select", "last"),
               # the total's parts: the baseline's steps, gate training's, healing's (gates fixed)
               "steps_parts": " + ".join(str(int(steps[k])) for k in ("baseline", "fine_tuning", "heal") if k in steps),
               "steps_scratch": twin.get("steps", float("nan")),
               "selection_scratch": twin.get("train_config", {}).get("select", ""),
               # the twin's learning rate: "noam", or "pruned" (the pruned model's own schedule)
               "schedule_scratch": twin.get("lr_schedule", "noam") if twin else "",
               **_role_counts(kept_enc, role_of)}
        control = controls.get(record["setting"])
        row.update(interval("d_baseline", hyps.get(folder), baseline_hyps))
        row.update(interval("d_control", hyps.get(folder) if control != folder else None, hyps.get(control)))
        row.update(interval("d_scratch_baseline", scratch_hyps.get(folder), baseline_hyps))
        row.update(interval("d_pruned_scratch", hyps.get(folder), scratch_hyps.get(folder)))
        row.update(nll_mean("nll", nlls.get(folder)) | nll_mean("nll_scratch", scratch_nlls.get(folder)))
        row.update(nll_interval("baseline", nlls.get(folder), base_nll))
        row.update(nll_interval("control", nlls.get(folder) if control != folder else None, nlls.get(control)))
        row.update(nll_interval("pruned_scratch", nlls.get(folder), scratch_nlls.get(folder)))
        for method in ranked_methods():
            point = curve_match(record["setting"], record["retained"],
                                curve_points.get((method, record["setting"]), []))
            row.update(interval(f"d_{method}", hyps.get(folder), point["translations"] if point else None))
            row[f"{method}_heads"] = curve_count(record["setting"], point["retained"]) if point else float("nan")
            row[f"{method}_bleu"] = (row["bleu"] - row[f"d_{method}"] if point and not pd.isna(row[f"d_{method}"])
                                     else float("nan"))
        rows.append(row)
        heads.append(run_heads(record, role_of))
    pruning = pd.DataFrame(rows)
    for column in ("bleu_scratch", "chrf_scratch"):
        if column not in pruning:
            pruning[column] = float("nan")
    pruning["retained_total"] = pruning[[f"retained_{k}" for k in ATTENTION_TYPES]].sum(axis=1)
    pruning["bleu_signature"] = baseline["bleu_signature"]
    pruning = pruning.sort_values(["setting", "lam"], kind="stable")
    with atomic_path(out["table"]) as tmp:
        # ten significant digits: the verdicts recomputed from this table (tools/republish_claims.py)
        # must round as the run's own did, and 4 digits turned -1.6254 into -1.625, printed -1.62
        pruning.to_csv(tmp, sep="\t", index=False, float_format="%.10g")

    table2 = pruning[pruning["setting"].isin(["baseline", "all"])]
    order = (table2["setting"] != "baseline").astype(int) * (2 - table2["control"].astype(bool).astype(int))
    table2 = table2.assign(_order=order).sort_values(["_order", "retained_total"], ascending=[True, False],
                                                      kind="stable").drop(columns="_order")
    with atomic_path(out["table2_csv"]) as tmp:
        table2.reindex(columns=TABLE2_COLUMNS).to_csv(tmp, index=False, float_format="%.2f")
    with atomic_path(out["table2"]) as tmp:
        tmp.write_text(table2_markdown(experiment, table2, baseline["bleu_signature"]), encoding="utf-8")

    curves = (pd.concat([pd.read_csv(p, sep="\t").assign(method=_curve_of(p, ".tsv")[0]) for p in ranked])
              if ranked else pd.DataFrame())
    with atomic_path(out["encoder"]) as tmp:
        tmp.write_text(encoder_markdown(experiment, pruning, baseline["bleu_signature"]), encoding="utf-8")
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
    layers = layer_survival(all_heads)
    with atomic_path(out["layers"]) as tmp:
        layers.to_csv(tmp, sep="\t", index=False)
    control = pd.read_csv(control_layers, sep="\t") if control_layers else None
    claims = pruning_claims(pruning, layers, control)
    with atomic_path(out["claims"]) as tmp:
        tmp.write_text(claims_markdown(experiment, claims), encoding="utf-8")
    with atomic_path(out["claims_table"]) as tmp:  # what the table over seeds reads (claims_over_seeds)
        claims_table(claims).to_csv(tmp, sep="\t", index=False)
    shown = ["setting", "lam", *[f"retained_{k}" for k in ATTENTION_TYPES], "bleu", "d_baseline_low", "d_baseline_high",
             "bleu_scratch", "steps", "steps_scratch"]
    log("\n" + pruning.reindex(columns=shown).to_string(index=False))
    return pruning


def _read_nll(path: str) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t")


def nll_mean(name: str, table: pd.DataFrame | None) -> dict:
    """A model's mean NLL per reference token on the set (nothing without its per-sentence file)."""
    return {} if table is None else {name: float(table["nll"].sum() / max(table["tokens"].sum(), 1))}


def undecided_gates(table: pd.DataFrame) -> dict:
    """How far a run's gates decided: of its gated heads (`gates_gated`), those whose P(open) ended
    strictly inside the undecided band (`gates_undecided`; preregistered.GATE_UNDECIDED). A control's
    gates are pinned open and count as none."""
    if "gated" not in table or "p_open" not in table:  # records from before the gate table had them
        return {"gates_gated": float("nan"), "gates_undecided": float("nan")}
    gated = table[table["gated"].astype(bool)]
    low, high = GATE_UNDECIDED
    undecided = (gated["p_open"] > low) & (gated["p_open"] < high)
    return {"gates_gated": len(gated), "gates_undecided": int(undecided.sum())}


def undecided_share_by_step(trajectory: pd.DataFrame) -> pd.Series:
    """Over a run's gate training (its trajectory.csv: step, type, layer, head, p_closed), the share
    of its gated heads whose P(open) lies strictly inside the undecided band at each logged step."""
    low, high = GATE_UNDECIDED
    p_open = 1 - trajectory["p_closed"]
    return ((p_open > low) & (p_open < high)).groupby(trajectory["step"]).mean()


def gate_budget(trajectories: list[pd.DataFrame], every: int = GATE_BUDGET_STEP,
                cap: int = GATE_BUDGET_CAP) -> int | None:
    """The rerun's gate-training budget (docs/method.md, order of the rerun, step 2): the fewest steps,
    a multiple of `every`, by which every run's undecided share is at or below MAX_UNDECIDED_SHARE
    and stays there, and at most `cap`: a run still undecided at the cap leaves the budget at the cap
    (its verdicts say it has not decided). None if some run is undecided at a last step short of
    the cap: it must train further before the budget can be read."""
    needed = 0
    for trajectory in trajectories:
        share = undecided_share_by_step(trajectory)
        if undecided_at_the_end(share):
            if share.index.max() < cap:
                return None
            needed = cap
            continue
        above = share[share > MAX_UNDECIDED_SHARE]
        first_decided = share.index[share.index > above.index.max()].min() if len(above) else share.index.min()
        needed = max(needed, int(first_decided))
    return min(-(-needed // every) * every, cap)


def undecided_at_the_end(share: pd.Series) -> bool:
    """Whether a run (its undecided_share_by_step) is above MAX_UNDECIDED_SHARE at its last logged step."""
    return bool(len(share)) and share.iloc[-1] > MAX_UNDECIDED_SHARE


def run_heads(record: dict, role_of: dict) -> pd.DataFrame:
    """One pruning run's heads (its gates.json record): type, layer, head, pruned, ..., with its
    setting, lam, retained and the encoder heads' roles (role "" for decoder heads)."""
    table = pd.DataFrame(record["heads"])
    return table.assign(setting=record["setting"], lam=record["lambda"], retained=~table["pruned"].astype(bool),
                        role=[role_of.get((r.layer, r.head), NO_ROLE) if r.type == "enc_self" else ""
                              for r in table.itertuples()])


LAYER_SURVIVAL_COLUMNS = ["setting", "lam", "type", "layer", "role", "heads", "kept"]


def layer_survival(heads: pd.DataFrame) -> pd.DataFrame:
    """Heads and heads kept per run, attention type, layer and (encoder self-attention) role: all
    that the layer and role tests of claims.py read, small enough to publish. `heads` has a row per
    head of every run (setting, lam, type, layer, head, retained, role; role "" for decoder heads,
    which have no roles). Layers are counted from 0, as in gates.json."""
    if heads.empty:
        return pd.DataFrame(columns=LAYER_SURVIVAL_COLUMNS)
    table = heads.assign(role=heads["role"].fillna("") if "role" in heads else "",
                         retained=heads["retained"].astype(bool))
    grouped = table.groupby(["setting", "lam", "type", "layer", "role"], sort=True)["retained"]
    return grouped.agg(heads="size", kept="sum").reset_index()[LAYER_SURVIVAL_COLUMNS]


TABLE2_COLUMNS = ["setting", "lam", "control", *[f"retained_{k}" for k in ATTENTION_TYPES],
                  *[f"retained_paper_rule_{k}" for k in ATTENTION_TYPES], "gates_gated", "gates_undecided", "bleu",
                  "d_baseline",
                  "d_baseline_low", "d_baseline_high", "d_control", "d_control_low", "d_control_high", "bleu_scratch",
                  "d_scratch_baseline", "d_scratch_baseline_low", "d_scratch_baseline_high", "d_pruned_scratch",
                  "d_pruned_scratch_low", "d_pruned_scratch_high", "nll", "dnll_control", "dnll_control_low",
                  "dnll_control_high", "dnll_pruned_scratch", "dnll_pruned_scratch_low", "dnll_pruned_scratch_high",
                  "steps", "selection", "steps_scratch",
                  "selection_scratch"]


def curve_count(setting: str, retained: dict) -> int:
    """The head count a run is matched on against its setting's ranked curve: encoder heads for
    the encoder-only setting, all heads otherwise."""
    return retained["enc_self"] if setting == "enc" else sum(retained.values())


def curve_match(setting: str, retained: dict, points: list[dict]) -> dict | None:
    """The point of a ranked curve whose head count is nearest the run's (the one with more heads
    on a tie), or None for no curve."""
    target = curve_count(setting, retained)
    return min(points, key=lambda p: (abs(curve_count(setting, p["retained"]) - target),
                                      -curve_count(setting, p["retained"])), default=None)


def _curve_of(path: str, suffix: str) -> tuple[str, str]:
    """(method, setting) of a ranked curve's file, .../prune/<setting>/<method><suffix>; the method
    must be a registered ranked one."""
    method = Path(path).name.removesuffix(suffix)
    try:
        ranked_method(method)
    except ValueError as error:
        raise HeadcountError(f"{path}: {error}") from None
    return method, Path(path).parent.name


def _read_json(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _model_dir(path: str) -> str:
    """results/.../{model}/scores/x.json or .../translations/x.txt -> results/.../{model}"""
    return str(Path(path).parent.parent)


def _role_counts(kept: list[tuple[int, int]], role_of: dict) -> dict:
    """role_<role> columns: how many of the kept encoder heads have each role (roles.ROLES)."""
    counts = {f"role_{r}": 0 for r in role_names()}
    for key in kept:
        counts[f"role_{role_of.get(key, NO_ROLE)}"] += 1
    return counts


def describe_difference(diff: float, low: float, high: float, digits: int = 2) -> str:
    """A difference with its interval (BLEU to 2 decimals, NLL in nats to 4); called a difference only
    when the interval excludes 0."""
    if pd.isna(diff):
        return ""
    verdict = "difference" if interval_excludes_zero(low, high) else "no difference shown"
    return f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}], {verdict}"


def _number(value, fmt: str = ".2f") -> str:
    return "" if value is None or pd.isna(value) else format(value, fmt)


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _row_value(r, name):
    return getattr(r, name, float("nan"))


def _lambda_label(r) -> str:
    return "baseline" if r.setting == "baseline" else ("0 (control)" if r.control else f"{r.lam:g}")


def _difference_cell(r, name: str, digits: int = 2) -> str:
    return describe_difference(_row_value(r, name), _row_value(r, f"{name}_low"), _row_value(r, f"{name}_high"),
                               digits)


def encoder_markdown(experiment: str, pruning: pd.DataFrame, signature: str) -> str:
    """The encoder-only runs (decoder frozen) as a markdown table: heads kept by the code's rule
    and by the paper's, BLEU against the baseline, the lambda = 0 control and each ranked method
    (Michel et al.'s ranking) at the nearest head count of its curve, each with its interval."""
    runs = pruning[pruning["setting"] == "enc"].sort_values("lam", kind="stable")
    methods = [METHODS[name] for name in ranked_methods()]
    columns = ["encoder heads kept (paper's log alpha rule)", "lambda", "BLEU", "pruned - baseline",
               "pruned - control", *(c for m in methods for c in (f"{m.label} ranking (heads)", f"pruned - {m.label}")),
               "steps", "selection"]
    lines = [f"### {experiment}: encoder self-attention only", "", _markdown_row(columns),
             "|" + "---|" * len(columns)]
    for r in pruning[pruning["setting"] == "baseline"].itertuples():
        lines.append(_markdown_row([f"{int(r.retained_enc_self)}", "baseline", f"{r.bleu:.2f}", "", "",
                                    *[""] * (2 * len(methods)), _number(r.steps, ".0f"), _text(r.selection)]))
    for r in runs.itertuples():
        paper = _row_value(r, "retained_paper_rule_enc_self")
        kept = f"{int(r.retained_enc_self)}" + (f" ({int(paper)})" if not pd.isna(paper) else "")
        ranked_cells = []
        for m in methods:
            heads = _row_value(r, f"{m.name}_heads")
            point = "" if pd.isna(heads) else f"{_row_value(r, f'{m.name}_bleu'):.2f} ({int(heads)})"
            ranked_cells += [point, _difference_cell(r, f"d_{m.name}")]
        lines.append(_markdown_row([kept, _lambda_label(r), f"{r.bleu:.2f}", _difference_cell(r, "d_baseline"),
                                    _difference_cell(r, "d_control"), *ranked_cells, _number(r.steps, ".0f"),
                                    _text(r.selection)]))
    lines += ["", f"BLEU: sacrebleu, `{signature}`. Differences as in Table 2 (95% paired bootstrap intervals; "
              f"\"difference\" when the interval excludes 0)."
              + "".join(f" {m.label} ranking: the baseline with its least important encoder heads masked "
                        f"({m.reference}; no retraining), at the point of its curve nearest the run's head count "
                        f"(in brackets)." for m in methods)]
    return "\n".join(lines) + "\n"


def _markdown_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table2_markdown(experiment: str, table2: pd.DataFrame, signature: str) -> str:
    bleu, row_value = _number, _row_value

    def steps(value) -> str:
        return _number(value, ".0f")

    lines = [f"### {experiment}", "",
             "| heads (enc-self/dec-self/dec-enc) | paper's rule | undecided gates | lambda | BLEU pruned | "
             "pruned - baseline | pruned - control | pruned - control, NLL | "
             "BLEU from scratch | from scratch - baseline | pruned - from scratch | steps pruned / from scratch | "
             "selection |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table2.itertuples():
        counts = "/".join(str(int(getattr(r, f"retained_{k}"))) for k in ATTENTION_TYPES)
        paper = ("/".join(str(int(row_value(r, f"retained_paper_rule_{k}"))) for k in ATTENTION_TYPES)
                 if r.setting != "baseline" and not pd.isna(row_value(r, f"retained_paper_rule_{ATTENTION_TYPES[0]}"))
                 else "")
        gated, undecided = row_value(r, "gates_gated"), row_value(r, "gates_undecided")
        decided = (f"{int(undecided)} of {int(gated)}" if not pd.isna(gated) and gated else "")
        lam = _lambda_label(r)
        cells = [_difference_cell(r, d) for d in ("d_baseline", "d_control", "d_scratch_baseline", "d_pruned_scratch")]
        parts = row_value(r, "steps_parts")
        budget = steps(r.steps) + (f" ({parts})" if isinstance(parts, str) and "+" in parts else "") + (
            f" / {steps(row_value(r, 'steps_scratch'))}" if not pd.isna(row_value(r, "steps_scratch")) else "")
        selection = str(row_value(r, "selection") or "")
        if isinstance(row_value(r, "selection_scratch"), str) and row_value(r, "selection_scratch"):
            selection += f" / {r.selection_scratch}"
        nll = _difference_cell(r, "dnll_control", digits=4)  # nats per token; positive: worse
        lines.append(f"| {counts} | {paper} | {decided} | {lam} | {bleu(r.bleu)} | {cells[0]} | {cells[1]} | {nll} | "
                     f"{bleu(row_value(r, 'bleu_scratch'))} | {cells[2]} | {cells[3]} | {budget} | {selection} |")
    lines += ["", f"BLEU: sacrebleu, `{signature}`. Differences: BLEU points with a 95% interval from paired "
              f"bootstrap resampling of the test sentences ({BOOTSTRAP_SAMPLES} resamples, sacrebleu's); a "
              f"\"difference\" is one whose interval excludes 0. The control (lambda 0) is the same fine-tuning "
              f"with gates that cannot close: pruned - control is the cost of pruning alone. Steps: training "
              f"steps in all (baseline plus fine-tuning for a pruned model; the same number for its "
              f"from-scratch twin), with a pruned model's parts: baseline + gate training + healing with the "
              f"gates fixed. Selection: which checkpoint each kept (last, or best dev BLEU among those "
              f"with the final heads). Pruned - control, NLL: the difference in mean NLL per reference token (nats; "
              f"positive: the pruned model is worse), paired bootstrap over the same sentences. Heads: kept by "
              f"headcount's rule (the evaluation gate is not 0); paper's rule: log alpha >= 0 (Voita et al.'s). "
              f"Undecided gates: of the gated heads, those whose P(open) "
              f"ended strictly between {GATE_UNDECIDED[0]:g} and {GATE_UNDECIDED[1]:g}; above "
              f"{MAX_UNDECIDED_SHARE:.0%} of them the run's gates have not decided (docs/method.md).",
              "", "### Voita et al. (2019), EN-RU", "",
              "| data | heads (enc-self/dec-self/dec-enc) | BLEU pruned | BLEU from scratch |", "|---|---|---|---|"]
    for data, entries in PAPER_TABLE2.items():
        for i, (counts, pruned, scratch_bleu) in enumerate(entries):
            lines.append(f"| {data if i == 0 else ''} | {'/'.join(map(str, counts))} | {bleu(pruned)} | "
                         f"{bleu(scratch_bleu)} |")
    return "\n".join(lines) + "\n"


def seed_spread(experiment: str, seeds: list[int], settings: list[str], baseline_scores: list[str],
                control_scores: list[str], out_table: str, out_markdown: str, log=print,
                references: str | None = None, baseline_translations: list[str] = (),
                control_translations: list[str] = (), lowercase: bool = False,
                baseline_training: list[str] = (), baseline_nll: list[str] = (),
                control_nll: list[str] = ()) -> pd.DataFrame:
    """BLEU of the baseline and of each setting's lambda = 0 control for every seed, with the mean,
    sample standard deviation, minimum and maximum across seeds; "control - baseline" rows give
    the cost of fine-tuning seed by seed. `control_scores` (and `control_translations`) list, per
    setting, one file per seed. Given the translations and references, each seed's control -
    baseline gets a 95% paired bootstrap interval over the test sentences (evaluate.paired_bootstrap):
    columns seed_{s}_low and seed_{s}_high.

    Given each seed's baseline training record (`baseline_training`), whether its dev loss had reached
    the plateau rule's plateau by its last evaluation (training.convergence; the rows "baseline
    plateau step" and "baseline at plateau"); given each model's per-reference NLL (`baseline_nll`,
    `control_nll` as the translations), control - baseline in mean token NLL with its paired
    interval (rows "control <setting> - baseline, NLL")."""
    if len(baseline_scores) != len(seeds) or len(control_scores) != len(seeds) * len(settings):
        raise HeadcountError(f"seed spread: {len(baseline_scores)} baseline and {len(control_scores)} control "
                             f"scores for seeds {seeds} and settings {settings}; the rule's inputs are wrong")
    with_intervals = references is not None
    if with_intervals and (len(baseline_translations) != len(seeds)
                           or len(control_translations) != len(seeds) * len(settings)):
        raise HeadcountError(f"seed spread: {len(baseline_translations)} baseline and {len(control_translations)} "
                             f"control translations for seeds {seeds} and settings {settings}; the rule's inputs "
                             f"are wrong")
    refs = read_lines(references) if with_intervals else None
    baseline = [_read_json(p)["bleu"] for p in baseline_scores]
    systems, intervals = {"baseline": baseline}, {}
    for i, setting in enumerate(settings):
        part = slice(i * len(seeds), (i + 1) * len(seeds))
        control = [_read_json(p)["bleu"] for p in control_scores[part]]
        systems[f"control {setting}"] = control
        name = f"control {setting} - baseline"
        systems[name] = [c - b for c, b in zip(control, baseline)]
        if with_intervals:
            intervals[name] = [paired_bootstrap(read_lines(c), read_lines(b), refs, lowercase=lowercase)
                               for c, b in zip(control_translations[part], baseline_translations)]
    if baseline_nll and (len(baseline_nll) != len(seeds) or len(control_nll) != len(seeds) * len(settings)):
        raise HeadcountError(f"seed spread: {len(baseline_nll)} baseline and {len(control_nll)} control NLL files "
                             f"for seeds {seeds} and settings {settings}; the rule's inputs are wrong")
    if baseline_nll:
        from headcount.training.perplexity import paired_bootstrap_nll  # torch: only where NLL files are given
    for i, setting in enumerate(settings if baseline_nll else []):
        part = control_nll[i * len(seeds):(i + 1) * len(seeds)]
        name = f"control {setting} - baseline, NLL"
        results = []
        for c, b in zip(part, baseline_nll):
            control_table, base_table = _read_nll(c), _read_nll(b)
            results.append(paired_bootstrap_nll(control_table["nll"].to_numpy(), base_table["nll"].to_numpy(),
                                                base_table["tokens"].to_numpy()))
        systems[name], intervals[name] = [r["difference"] for r in results], results
    if baseline_training:
        from headcount.report.preregistered import PLATEAU_MIN_DELTA, PLATEAU_PATIENCE
        from headcount.training.convergence import plateau_step

        steps = [plateau_step([tuple(e) for e in _read_json(p).get("dev_losses", [])], PLATEAU_PATIENCE,
                              PLATEAU_MIN_DELTA) for p in baseline_training]
        systems["baseline plateau step"] = [float("nan") if s is None else s for s in steps]
        systems["baseline at plateau"] = [float(s is not None) for s in steps]
    rows = []
    for system, values in systems.items():
        series = pd.Series(values, dtype=float)
        bounds = {}
        for s, result in zip(seeds, intervals.get(system, [])):
            bounds |= {f"seed_{s}_low": result["low"], f"seed_{s}_high": result["high"]}
        finite = [v for v in values if not pd.isna(v)]  # a seed without a plateau has no plateau step
        mean, half = t_interval(finite) if finite else (float("nan"), None)
        rows.append({"experiment": experiment, "system": system,
                     **{f"seed_{s}": v for s, v in zip(seeds, values)}, **bounds, "seeds": len(values),
                     "mean": mean, "mean_low": mean - half if half is not None else float("nan"),
                     "mean_high": mean + half if half is not None else float("nan"),
                     "sd": series.std(ddof=1), "min": series.min(), "max": series.max()})
    table = pd.DataFrame(rows)
    with atomic_path(out_table) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4g")
    signature = _read_json(baseline_scores[0]).get("bleu_signature", "")
    lines = [f"### {experiment}: BLEU across {len(seeds)} baseline seeds", "",
             "| system | " + " | ".join(f"seed {s}" for s in seeds) + " | mean [95% t-interval] | sd | min | max |",
             "|---|" + "---|" * (len(seeds) + 4)]
    for r in rows:
        d = _digits(r["system"])
        mean = f"{r['mean']:.{d}f}" + ("" if pd.isna(r["mean_low"]) else
                                       f" [{r['mean_low']:.{d}f}, {r['mean_high']:.{d}f}]")
        cells = [_seed_cell(r, s) for s in seeds] + [mean] + [f"{r[k]:.{d}f}" for k in ("sd", "min", "max")]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    lines += ["", f"BLEU: sacrebleu, `{signature}`. Mean with its 95% Student's t interval over the seeds "
              f"(headcount.report.seed_statistics: training seeds on this one test set); sd: sample standard "
              f"deviation across seeds. Each seed's "
              f"control is fine-tuned from that seed's baseline (the same fine-tuning, gates that cannot close)."
              + (f" Brackets: 95% interval of the seed's control - baseline from paired bootstrap resampling of "
                 f"the test sentences ({BOOTSTRAP_SAMPLES} resamples, sacrebleu's); a \"difference\" is one "
                 f"whose interval excludes 0." if intervals else "")
              + (" NLL rows: mean NLL per reference token (nats; positive: the control is worse), paired "
                 "bootstrap over the same sentences." if baseline_nll else "")
              + (f" Baseline at plateau: whether the seed's dev loss had stopped improving by "
                 f"{PLATEAU_MIN_DELTA} nats over {PLATEAU_PATIENCE} evaluations by its last one (the plateau "
                 f"rule, docs/method.md); its plateau step where it had." if baseline_training else "")]
    with atomic_path(out_markdown) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log("\n" + table.to_string(index=False))
    return table


def _digits(system: str) -> int:
    """Decimals a seed-spread row is shown with: NLL in nats to 4, steps and yes/no whole, BLEU to 2."""
    return 4 if system.endswith("NLL") else 0 if system.startswith("baseline plateau") or system.endswith(
        "at plateau") else 2


def _seed_cell(row: dict, seed: int) -> str:
    value, low, digits = row[f"seed_{seed}"], row.get(f"seed_{seed}_low"), _digits(row["system"])
    if row["system"].endswith("at plateau"):
        return "yes" if value == 1 else "no"
    if low is None or pd.isna(low):
        return "" if pd.isna(value) else f"{value:.{digits}f}"
    return describe_difference(value, low, row[f"seed_{seed}_high"], digits)
