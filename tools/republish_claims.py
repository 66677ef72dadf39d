#!/usr/bin/env python3
"""Apply the verdict rules of headcount.report.claims to the published tables and republish the
claims table: for a change of rules without a rerun. Reads docs/tables/pruning.tsv,
layer_survival.tsv and the positive control's control_layer_survival.tsv; writes
docs/tables/pruning_claims.md and the copies of it that docs/results.md and README.md show between
markers (tools/publish_results.py's splice).

    .venv/bin/python tools/republish_claims.py            # write
    .venv/bin/python tools/republish_claims.py --check    # exit 1 if the published table differs

A full run writes the same table itself (results/<exp>/prune/claims.md), and
tools/publish_results.py copies it.
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

from headcount.io import atomic_path
from headcount.report.claims import claims_markdown, pruning_claims

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("publish_results", Path(__file__).with_name("publish_results.py"))
publish_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(publish_results)


def claims_from_tables(tables: Path) -> str:
    """The claims table the rules give on the published tables."""
    pruning = pd.read_csv(tables / "pruning.tsv", sep="\t")
    # pruning.tsv keeps 4 significant digits, so 1.1549 reads back as 1.155 and prints as 1.16;
    # table2.csv holds the run's own two decimals of the same differences, as Table 2 shows them.
    table2 = pd.read_csv(tables / "table2.csv")
    for row in table2.itertuples(index=False):
        same = (pruning["setting"] == row.setting) & ((pruning["lam"] == row.lam)
                                                     | (pruning["lam"].isna() & pd.isna(row.lam)))
        for column in (c for c in table2.columns if c.startswith("d_")):
            pruning.loc[same, column] = getattr(row, column)
    layers = pd.read_csv(tables / "layer_survival.tsv", sep="\t")
    control_path = tables / "control_layer_survival.tsv"
    control = pd.read_csv(control_path, sep="\t") if control_path.is_file() else None
    experiment = str(pruning["experiment"].iloc[0])
    return claims_markdown(experiment, pruning_claims(pruning, layers, control))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=REPO / "docs")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    name = "tables/pruning_claims.md"
    text = claims_from_tables(args.docs / "tables")
    if args.check:
        same = (args.docs / name).read_text() == text
        print(f"{name}: {'as the rules give' if same else 'differs from what the rules give'}")
        return 0 if same else 1
    with atomic_path(args.docs / name) as tmp:
        tmp.write_text(text, encoding="utf-8")
    for page in publish_results.PAGES:
        path = args.docs.parent / page
        if path.is_file():
            old = path.read_text()
            new = publish_results.splice(page, old, {name: text} | _other_tables(args.docs, old, name))
            if new != old:
                with atomic_path(path) as tmp:
                    tmp.write_text(new)
                print(f"updated {page}")
    print(f"wrote {args.docs / name}")
    return 0


def _other_tables(docs: Path, page_text: str, skip: str) -> dict[str, str]:
    """The page's other marked tables as published, so that splicing leaves them as they are."""
    names = {line.strip()[len("<!-- published "):-len(" -->")] for line in page_text.splitlines()
             if line.strip().startswith("<!-- published ")}
    return {n: (docs / n).read_text() for n in names if n != skip and (docs / n).is_file()}


if __name__ == "__main__":
    sys.exit(main())
