#!/usr/bin/env python3
"""The published numbers of an older commit beside a new run's, as markdown tables: what a
republication puts in docs/results.md when a fix moved a published number.

    .venv/bin/python tools/compare_published.py --old HEAD --results results/multi30k_en_de \
        --control results/control

The old tables are read from git (docs/tables/ at --old), the new ones from the run's folders: the
main run's (--results, which also holds the tables made from every seed, "seeds") and the positive
control's (--control).
Each table is joined on its key columns; a row only one side has shows "-" on the other, and each
number gets its change (new - old). A table missing on either side is named and skipped.
The pruning findings' verdicts come last, old (docs/tables/pruning_claims.md) beside new
(prune/claims.tsv), matched on the paper's finding; then the control's, new only where none was
published.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# name -> (file under docs/tables/, which run, file in that run's results folder, key columns, value columns)
TABLES = {
    "baseline": ("baseline_scores.tsv", "main", "baseline/scores.tsv", ["split"], ["bleu", "chrf"]),
    "pruning": ("pruning.tsv", "main", "prune/pruning.tsv", ["setting", "lam"],
                ["retained_enc_self", "retained_dec_self", "retained_dec_enc", "bleu", "bleu_scratch"]),
    "correlations": ("head_correlations.tsv", "main", "heads/correlations.tsv", ["type", "layer", "score"],
                     ["spearman"]),
    "seeds": ("seed_spread.tsv", "seeds", "seeds/spread.tsv", ["experiment", "system"],
              ["seed_1", "seed_2", "seed_3", "mean", "sd"]),
    "control, planted functions": ("control_planted_vs_found.csv", "control", "control/planted_vs_found.csv",
                                   ["function", "layer", "head"], ["rate", "closes_at_all", "closes_at_enc"]),
    "control, heads kept by layer": ("control_layer_survival.tsv", "control", "prune/layer_survival.tsv",
                                     ["setting", "lam", "type", "layer", "role"], ["heads", "kept"]),
}

# the pruning findings' verdicts: name -> (claims table under docs/tables/, which run); the control's
# were first published as a file on 2026-11-26, so against an older commit its old column reads "-"
VERDICTS = {"verdicts": ("pruning_claims.md", "main"), "control verdicts": ("control_pruning_claims.md", "control")}


def read_table(text_or_path) -> pd.DataFrame:
    """A published table, comma- or tab-separated by its name (a path) or its header (text)."""
    if isinstance(text_or_path, Path):
        return pd.read_csv(text_or_path, sep="," if text_or_path.suffix == ".csv" else "\t")
    header = text_or_path.split("\n", 1)[0]
    return pd.read_csv(io.StringIO(text_or_path), sep="\t" if "\t" in header else ",")


def old_table(rev: str, name: str, repo: Path = REPO) -> pd.DataFrame | None:
    """docs/tables/<name> as committed at `rev`, or None where that commit has no such file."""
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:docs/tables/{name}"], capture_output=True,
                           text=True)
    return read_table(shown.stdout) if shown.returncode == 0 else None


def old_verdicts(rev: str, name: str = "pruning_claims.md", repo: Path = REPO) -> dict[str, str] | None:
    """finding -> verdict of a claims table (claims_markdown's layout) as committed at `rev`: the bold
    part of each row's last cell; None where that commit has no such file."""
    shown = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:docs/tables/{name}"], capture_output=True,
                           text=True)
    if shown.returncode:
        return None
    verdicts = {}
    for line in shown.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[-1].startswith("**"):
            verdicts[cells[0]] = cells[-1].split("**")[1]
    return verdicts


def compare_verdicts(old: dict[str, str], new: pd.DataFrame) -> str:
    """A markdown table: each finding (the paper's words) with its verdict before and after and the
    new basis; a finding only one side has shows "-" on the other."""
    lines = ["| finding | verdict old | verdict new | basis new |", "|---|---|---|---|"]
    new_rows = {row.paper: row for row in new.itertuples()}
    for finding in list(old) + [f for f in new_rows if f not in old]:
        row = new_rows.get(finding)
        basis = "-" if row is None or pd.isna(row.basis) else row.basis
        lines.append(f"| {finding} | {old.get(finding, '-')} | {'-' if row is None else row.verdict} | {basis} |")
    return "\n".join(lines)


def _cell(value) -> str:
    if pd.isna(value):
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def compare(old: pd.DataFrame, new: pd.DataFrame, keys: list[str], values: list[str]) -> str:
    """A markdown table: the keys, then old, new and new - old for each value column both have."""
    values = [v for v in values if v in old.columns and v in new.columns]
    both = pd.merge(old[keys + values], new[keys + values], on=keys, how="outer", suffixes=(" old", " new"))
    both = both.sort_values(keys, kind="stable")
    header = keys + [f"{v} {side}" for v in values for side in ("old", "new", "change")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in both.iterrows():
        cells = [_cell(row[k]) for k in keys]
        for v in values:
            a, b = row[f"{v} old"], row[f"{v} new"]
            change = "-" if pd.isna(a) or pd.isna(b) else f"{b - a:+.2f}"
            cells += [_cell(a), _cell(b), change]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", default="HEAD", help="the commit whose docs/tables/ holds the old numbers")
    parser.add_argument("--results", type=Path, default=REPO / "results" / "multi30k_en_de")
    parser.add_argument("--control", type=Path, default=REPO / "results" / "control")
    args = parser.parse_args(argv)
    runs = {"main": args.results, "seeds": args.results, "control": args.control}
    for title, (published, run, produced, keys, values) in TABLES.items():
        old, path = old_table(args.old, published), runs[run] / produced
        if old is None or not path.is_file():
            print(f"{title}: skipped ({'no docs/tables/' + published + ' at ' + args.old if old is None else path} "
                  f"missing)\n")
            continue
        print(f"### {title} ({published} at {args.old} against {path})\n")
        print(compare(old, read_table(path), keys, values) + "\n")
    for title, (published, run) in VERDICTS.items():
        old, path = old_verdicts(args.old, published), runs[run] / "prune" / "claims.tsv"
        if not path.is_file():
            print(f"{title}: skipped ({path} missing)\n")
            continue
        print(f"### {title} ({published} at {args.old}" + (", not published there" if old is None else "")
              + f", against {path})\n")
        print(compare_verdicts(old or {}, pd.read_csv(path, sep="\t")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
