"""The findings over seeds at matched head counts, from files: what matched_over_seeds.py calls
(report.matched_heads holds the statistics)."""

from __future__ import annotations

import json
from functools import cache

import pandas as pd

from headcount.io import atomic_path, read_lines
from headcount.report.matched_heads import (
    RunEvidence,
    bleu_difference,
    bleu_statistics,
    gate_checks,
    matched_markdown,
    matched_rows,
    nll_difference,
)
from headcount.report.pruning_report import undecided_gates


def heads_kept(record: dict, rule: str = "retained") -> int:
    """A run's count in its setting: encoder self-attention heads (enc) or all heads (all), by
    headcount's counting rule (`retained`) or the paper's (`retained_paper_rule`)."""
    retained = record[rule]
    return int(retained["enc_self"]) if record["setting"] == "enc" else int(sum(retained.values()))


def write_matched_over_seeds(experiment: str, runs: list[dict], references: str, out_markdown: str, out_table: str,
                             lowercase: bool = False, log=print, spread: str | None = None) -> pd.DataFrame:
    """`runs`: workflow/rules/common.smk's matched_runs (seed, setting, lam, gates, and the
    translations and NLL files of the pruned model, its control and its twin). `spread`: the seeds'
    spread table (seed_spread), for the control's check of each seed's baseline."""
    refs = read_lines(references)

    @cache
    def stats(path: str):
        hyps = read_lines(path)
        return bleu_statistics(hyps, refs, lowercase)

    @cache
    def nll(path: str) -> pd.DataFrame:
        return pd.read_csv(path, sep="\t")

    evidence = []
    for run in runs:
        with open(run["gates"], encoding="utf-8") as f:
            record = json.load(f)
        values = {}
        for difference in ("control", "scratch"):
            if difference in run:
                values[(difference, "bleu")] = bleu_difference(stats(run["pruned"]["hyps"]),
                                                               stats(run[difference]["hyps"]))
                values[(difference, "nll")] = nll_difference(nll(run["pruned"]["nll"]), nll(run[difference]["nll"]))
        gate_counts = undecided_gates(pd.DataFrame(record.get("heads", [])))
        counted = not pd.isna(gate_counts["gates_gated"])
        evidence.append(RunEvidence(run["seed"], run["setting"], run["lam"], heads_kept(record), values,
                                    paper_heads=(heads_kept(record, "retained_paper_rule")
                                                 if "retained_paper_rule" in record else None),
                                    undecided=int(gate_counts["gates_undecided"]) if counted else None,
                                    gated=int(gate_counts["gates_gated"]) if counted else None))
        log(f"seed {run['seed']}, {run['setting']} lambda {run['lam']:g}: {heads_kept(record)} heads kept")
    rows = matched_rows(evidence, len(refs))
    gates = gate_checks(evidence, len(refs))
    # the table: every row by headcount's count, and by the paper's where the two differ
    table = pd.concat([rows.assign(counting="headcount"),
                       *([gates.paper_rows.assign(counting="paper")] if gates.paper_rows is not None else [])],
                      ignore_index=True)
    with atomic_path(out_table) as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.10g")
    text = matched_markdown(experiment, rows, len(refs), pd.read_csv(spread, sep="\t") if spread else None, gates)
    with atomic_path(out_markdown) as tmp:
        tmp.write_text(text, encoding="utf-8")
    log(text)
    return table
