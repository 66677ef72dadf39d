"""The registry of pruning methods (issue 38): a ranked method registered in
headcount.pruning.methods, and nothing else, gets its curve per setting from the workflow, its
comparison with every gated run in the pruning table and its curve in Figure 7.

The throwaway method ranks heads by confidence. The workflow runs in a subprocess, so the dry
run registers it with one `register_method` line appended to a copy's methods.py (what a new method
is); the report's tests register it in this process, for the test only (monkeypatch).
"""

import re

import pandas as pd
import pytest
from test_pruning import made_up_report, write_curve_points
from toyflow import copy_workflow, smoke_config, snakemake, write_config

from headcount.pruning.methods import METHODS, PruningMethod, ranked_methods, register_method

THROWAWAY = PruningMethod("by_confidence", "ranked", score="confidence", description="the least confident heads first",
                          label="Confidence")
REGISTRATION = ('\nregister_method(PruningMethod("by_confidence", "ranked", score="confidence", '
                'description="the least confident heads first", label="Confidence"))\n')


@pytest.fixture
def registered(monkeypatch):
    """The throwaway method in the registry, for one test."""
    monkeypatch.setitem(METHODS, THROWAWAY.name, THROWAWAY)
    return THROWAWAY


@pytest.mark.slow
def test_a_registered_ranked_method_gets_a_curve_per_setting_and_feeds_the_report(tmp_path, toy_mirror):
    workdir = copy_workflow(tmp_path / "wf")
    methods = workdir / "src/headcount/pruning/methods.py"
    methods.write_text(methods.read_text() + REGISTRATION)
    config = write_config(workdir / "plan.yaml", smoke_config(toy_mirror))
    result = snakemake("-n", "--cores", "1", "--configfile", config, cwd=workdir, snakefile=workdir / "Snakefile",
                       timeout=180)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    curves = set(re.findall(r"^    wildcards: exp=toy, setting=(\w+), method=(\w+)$", said, re.M))
    assert curves == {(s, m) for s in ("enc", "all") for m in ("michel", "by_confidence")}, said[-3000:]
    report = re.search(r"^rule pruning_report:\n    input: (.*)$", said, re.M)
    assert report, said[-3000:]
    for setting in ("enc", "all"):
        for name in ("by_confidence.tsv", "by_confidence_translations.jsonl", "michel.tsv"):
            assert f"results/toy/prune/{setting}/{name}" in report.group(1)


@pytest.mark.slow
def test_the_report_sets_every_run_against_a_registered_ranked_method(tmp_path, registered):
    from headcount.report.pruning_report import pruning_report
    from headcount.training.evaluate import paired_bootstrap

    report, texts, refs, system = made_up_report(tmp_path)
    michel, _ = write_curve_points(tmp_path, "michel", system)
    confidence, points = write_curve_points(tmp_path, registered.name, system)
    table = pruning_report(ranked=[], ranked_translations=[michel, confidence], **report).set_index("lam")
    pruned, control = table.loc[0.5], table.loc[0.0]
    expected = paired_bootstrap(texts["prune/all/lambda_0.5"], points[1]["translations"], refs)
    assert (pruned["d_by_confidence"], pruned["d_by_confidence_low"], pruned["d_by_confidence_high"]) == pytest.approx(
        (expected["difference"], expected["low"], expected["high"]), abs=0.01)
    assert pruned["by_confidence_heads"] == 18 and control["by_confidence_heads"] == 24
    assert pruned["by_confidence_bleu"] == pytest.approx(50.0 - expected["difference"], abs=0.01)
    assert pd.notna(pruned["d_michel"]) and pd.isna(table.loc[table["setting"] == "baseline", "d_by_confidence"]).all()
    # the columns follow the registry: Michel's first, as before, then the new method's
    columns = list(pd.read_csv(report["out"]["table"], sep="\t").columns)
    assert columns.index("michel_bleu") + 1 == columns.index("d_by_confidence")


def test_the_encoder_table_and_figure_7_show_a_registered_ranked_method(tmp_path, registered, monkeypatch):
    from headcount.report import plots
    from headcount.report.pruning_report import encoder_markdown

    nan = float("nan")
    pruning = pd.DataFrame([
        {"setting": "baseline", "lam": nan, "control": False, "retained_enc_self": 8, "retained_total": 24,
         "bleu": 36.0, "steps": 20, "selection": "last"},
        {"setting": "enc", "lam": 0.5, "control": False, "retained_enc_self": 5, "retained_total": 21, "bleu": 35.0,
         "by_confidence_heads": 6, "by_confidence_bleu": 30.0, "d_by_confidence": 5.0, "d_by_confidence_low": 4.0,
         "d_by_confidence_high": 6.0, "steps": 32, "selection": "last"},
    ])
    markdown = encoder_markdown("toy", pruning, "nrefs:1")
    header, _, baseline, run = [line for line in markdown.splitlines() if line.startswith("|")]
    assert "| Michel ranking (heads) | pruned - Michel | Confidence ranking (heads) | pruned - Confidence |" in header
    assert run.split(" | ")[7:9] == ["30.00 (6)", "+5.00 [+4.00, +6.00], difference"]
    assert len(baseline.split("|")) == len(header.split("|")) == len(run.split("|"))
    assert "Confidence ranking: the baseline with its least important encoder heads masked (lowest confidence " \
           "first; no retraining)" in markdown

    drawn = {}
    monkeypatch.setattr(plots, "save", lambda fig, path: drawn.update(
        {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes}))
    curves = pd.DataFrame([{"setting": "enc", "method": m, "retained_enc_self": n, "retained_total": n + 16,
                            "bleu": b} for m in ("michel", "by_confidence") for n, b in ((8, 36.0), (4, 30.0))])
    plots.bleu_vs_heads(pruning[pruning["setting"] != "baseline"], curves, 36.0, tmp_path / "figure7.png", "toy")
    legend = drawn["encoder self-attention pruned"]
    assert legend[:2] == ["Michel et al. ranking, no retraining", "Confidence ranking, no retraining"]


def test_a_method_name_must_fit_paths_columns_and_the_wildcard():
    for name in ("Michel", "by-confidence", "control", "baseline"):
        with pytest.raises(ValueError, match="name"):
            register_method(PruningMethod(name, "ranked", score="confidence"))
    with pytest.raises(ValueError, match="score column"):
        register_method(PruningMethod("no_score", "ranked"))
    assert ranked_methods() == ["michel"]
