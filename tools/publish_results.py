#!/usr/bin/env python3
"""Copy a finished run's tables and figures into docs/, the files docs/results.md and the README
show, so a republished run is the run's own files and none is left from an older one.

    .venv/bin/python tools/publish_results.py                      # results/multi30k_en_de, results/control
    .venv/bin/python tools/publish_results.py --dry-run            # what would change

Every source must exist before anything is copied: a run that has not finished (a missing table,
a pruning grid still training) publishes nothing and the message lists what is missing. Writing
docs/results.md itself stays a person's work: the numbers need reading, not copying.
"""

import argparse
import filecmp
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# docs/ path -> (which run, path inside that run's results folder)
PUBLISHED = {
    "tables/baseline_scores.tsv": ("main", "baseline/scores.tsv"),
    "tables/head_scores.csv": ("main", "heads/scores.csv"),
    "tables/head_correlations.tsv": ("main", "heads/correlations.tsv"),
    "tables/lrp_conservation.tsv": ("main", "heads/lrp_conservation.tsv"),
    "tables/snapshots.csv": ("main", "heads/snapshots.csv"),
    "tables/head_roles.csv": ("main", "syntax/roles.csv"),
    "tables/table1.md": ("main", "syntax/table1.md"),
    "tables/pruning.tsv": ("main", "prune/pruning.tsv"),
    "tables/table2.md": ("main", "prune/table2.md"),
    "tables/table2.csv": ("main", "prune/table2.csv"),
    "tables/pruning_claims.md": ("main", "prune/claims.md"),
    "tables/michel.enc.tsv": ("main", "prune/enc/michel.tsv"),
    "tables/michel.all.tsv": ("main", "prune/all/michel.tsv"),
    "tables/seed_spread.tsv": ("main", "seeds/spread.tsv"),
    "tables/seed_spread.md": ("main", "seeds/spread.md"),
    "tables/control_head_roles.csv": ("control", "syntax/roles.csv"),
    "tables/control_table1.md": ("control", "syntax/table1.md"),
    "tables/control_planted_vs_found.csv": ("control", "control/planted_vs_found.csv"),
    "tables/control_planted_vs_found.md": ("control", "control/planted_vs_found.md"),
    "figures/confidence.enc_self.png": ("main", "heads/figures/heatmaps/confidence.enc_self.png"),
    "figures/lrp.enc_self.png": ("main", "heads/figures/heatmaps/lrp.enc_self.png"),
    "figures/delta_loss.enc_self.png": ("main", "heads/figures/heatmaps/delta_loss.enc_self.png"),
    "figures/specialisation.png": ("main", "heads/figures/specialisation.png"),
    "figures/function_map.png": ("main", "syntax/function_map.png"),
    "figures/relative_positions.png": ("main", "syntax/relative_positions.png"),
    "figures/figure7_bleu_vs_heads.png": ("main", "prune/figures/figure7_bleu_vs_heads.png"),
    "figures/figure8_functions.png": ("main", "prune/figures/figure8_functions.png"),
    "figures/figure9_types.png": ("main", "prune/figures/figure9_types.png"),
    "figures/figure10_decoder_layers.png": ("main", "prune/figures/figure10_decoder_layers.png"),
    "figures/gates.all.lambda_0.3.png": ("main", "prune/all/lambda_0.3/gates.png"),
}


def plan(runs: dict[str, Path], docs: Path) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """(source, destination) pairs, and the sources that are missing."""
    pairs = [(runs[run] / inside, docs / published) for published, (run, inside) in PUBLISHED.items()]
    return pairs, [source for source, _ in pairs if not source.is_file()]


def publish(runs: dict[str, Path], docs: Path, dry_run: bool = False, log=print) -> int:
    """Copy every file of PUBLISHED, or nothing when a source is missing; returns an exit status."""
    pairs, missing = plan(runs, docs)
    if missing:
        log(f"publish_results: {len(missing)} of {len(pairs)} files are missing, nothing was copied "
            f"(finish the run first: snakemake --cores N --rerun-incomplete):")
        for source in missing:
            log(f"  {source}")
        return 2
    changed = 0
    for source, destination in pairs:
        if destination.is_file() and filecmp.cmp(source, destination, shallow=False):
            continue
        changed += 1
        log(f"{'would copy' if dry_run else 'copied'} {source} -> {destination}")
        if not dry_run:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
    log(f"{changed} of {len(pairs)} published files {'would change' if dry_run else 'changed'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=REPO / "results" / "multi30k_en_de",
                        help="the default experiment's results folder")
    parser.add_argument("--control", type=Path, default=REPO / "results" / "control",
                        help="the positive control's results folder")
    parser.add_argument("--docs", type=Path, default=REPO / "docs")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    return publish({"main": args.results, "control": args.control}, args.docs, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
