"""What a rerun redoes after an edit: dry runs (`-n --quiet rules`) on the completed smoke run.

The smoke run (conftest's `smoke_run`) lives in a copy of the workflow (Snakefile, workflow/, src/),
so that these tests can edit library code and scripts without touching the repository. The
lambda-grid and decoding cases are in test_workflow.py's smoke test.
"""

import copy
import json
import re
import shutil

import pandas as pd
import pytest
from toyflow import CORES, REPO, plan, snakemake, write_config

# What a change of a model hyperparameter must redo: training, and everything that reads a
# model or what was made from one. Data preparation, subwords and parsing stay.
MODEL_DOWNSTREAM = {"train_baseline", "translate", "score", "score_table", "score_heads", "plot_head_scores",
                    "head_roles", "prune_heads", "train_from_scratch", "ranked_curve", "plot_gate_trajectory",
                    "pruning_report", "snapshot_statistics", "atlas", "reference_nll", "all"}
UPSTREAM = {"fetch_source", "prepare_training_data", "prepare_evaluation_data", "train_subwords",
            "fit_training_data", "parse_analysis_sentences"}


@pytest.fixture(scope="module")
def done(smoke_run):
    """The copied workflow with the completed smoke run in it, and the run's config."""
    assert smoke_run.result.returncode == 0, "the smoke run failed; see test_smoke_run_end_to_end"
    assert plan(smoke_run.workdir, smoke_run.config) == {}, "a completed run has nothing left to do"
    return smoke_run.workdir, smoke_run.config


@pytest.mark.workflow
def test_a_model_hyperparameter_reruns_training_and_everything_downstream(done):
    workdir, config = done
    changed = copy.deepcopy(config)
    changed["defaults"]["model"]["d_ff"] = 48
    jobs = plan(workdir, changed)
    assert set(jobs) == MODEL_DOWNSTREAM, jobs
    assert jobs["train_baseline"] == 1 and jobs["prune_heads"] == 4 and jobs["train_from_scratch"] == 1
    assert not set(jobs) & UPSTREAM


@pytest.mark.workflow
def test_figure_code_reruns_only_its_figures(done):
    """No config key is read by figure rules alone (plot_head_scores's figure list comes from the
    heads settings, which score_heads reads too), so the figure-only edit is one to the figure
    script: Snakemake's code trigger sees scripts."""
    workdir, config = done
    script = workdir / "workflow/scripts/plot_head_scores.py"
    original = script.read_text()
    try:
        script.write_text(original + "# a figure tweak\n")
        jobs = plan(workdir, config)
    finally:
        script.write_text(original)
        shutil.copystat(REPO / "workflow/scripts/plot_head_scores.py", script)
    # One job draws the 13 heatmaps; then the target rule.
    assert jobs == {"plot_head_scores": 1, "all": 1}, jobs


@pytest.mark.workflow
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="library code under src/headcount is no job input: Snakemake's code trigger "
                   "covers a rule's own script only. Until the rules declare it, rerun with -R <rule> "
                   "(docs/cluster.md, 'Rerun semantics')")
def test_library_code_used_by_a_job_is_detected(done):
    workdir, config = done
    library = workdir / "src/headcount/report/plots.py"
    original = library.read_text()
    try:
        library.write_text(original.replace("def head_heatmap(", "def head_heatmap(  # changed\n", 1))
        jobs = plan(workdir, config)
    finally:
        library.write_text(original)
        shutil.copystat(REPO / "src/headcount/report/plots.py", library)
    assert jobs.get("plot_head_scores") == 1 and "train_baseline" not in jobs, jobs


@pytest.mark.workflow
def test_forcing_a_rule_reruns_it_and_its_dependents_only(done):
    """The documented remedy after a library edit: -R names the rules whose code changed."""
    workdir, config = done
    jobs = plan(workdir, config, "-R", "plot_gate_trajectory")
    assert jobs == {"plot_gate_trajectory": 4, "pruning_report": 1, "atlas": 1, "all": 1}, jobs  # atlas: pruning.tsv


@pytest.mark.workflow
def test_adding_a_seed_adds_its_jobs_and_reruns_nothing_else(done):
    """A second seed is an experiment of its own (toy_seed2): the main run's data, subwords and
    parses copied, its baseline, its two lambda = 0 controls (one per setting, no seed_lambdas),
    their translations, scores and reference NLL, its heads, roles, ranked curves and pruning report,
    then the spread table, the claims over seeds (and at matched head counts) and the heads over
    seeds; the main run's results all stand."""
    workdir, config = done
    seeded = copy.deepcopy(config)
    seeded["defaults"]["seeds"] = [1, 2]
    jobs = plan(workdir, seeded)
    assert jobs == {"seed_shared_file": 10, "train_baseline": 1, "prune_heads": 2, "plot_gate_trajectory": 2,
                    "translate": 4, "score": 3, "score_table": 1, "score_heads": 1, "plot_head_scores": 1,
                    "head_roles": 1, "ranked_curve": 2, "pruning_report": 1, "seed_spread": 1,
                    "claims_over_seeds": 1, "plot_runs_over_seeds": 1, "heads_over_seeds": 1,
                    "reference_nll": 3, "matched_over_seeds": 1, "all": 1}, jobs
    # the train_baseline and pruning_report above are the seed's: the main run's have nothing to do
    # ("--cores" ends --configfile's list of files, so that the targets read as targets)
    assert plan(workdir, seeded, "--cores", "1", "results/toy/baseline/model.pt", "results/toy/prune/pruning.tsv") == {}


@pytest.mark.workflow
def test_a_second_seed_runs_on_the_main_runs_data_with_its_own_seed(done, tmp_path):
    """Run, not planned, in a copy of the finished smoke run: the seed's experiment has the main
    run's data and subword models byte for byte, trains with seed 2, and the tables over seeds
    hold both."""
    workdir = tmp_path / "wf"
    shutil.copytree(done[0], workdir, symlinks=True)  # mtimes kept: the main run stays complete
    seeded = copy.deepcopy(done[1])
    seeded["defaults"]["seeds"] = [1, 2]
    result = snakemake("--cores", CORES, "--configfile", write_config(workdir / "seeded.yaml", seeded),
                       cwd=workdir, snakefile=workdir / "Snakefile", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    main, seed = workdir / "results/toy", workdir / "results/toy_seed2"
    for name in ("data/train.src.txt", "data/dev.tgt.txt", "subwords/src.model", "subwords/tgt.model"):
        assert (seed / name).read_bytes() == (main / name).read_bytes(), name
    assert json.loads((seed / "baseline/training.json").read_text())["train_config"]["seed"] == 2
    spread = pd.read_csv(main / "seeds/spread.tsv", sep="\t")
    assert {"seed_1", "seed_2"} <= set(spread.columns), spread.columns
    claims = (main / "seeds/claims.md").read_text()
    assert "| seed 1 | seed 2 | over seeds |" in claims
    findings = [line for line in claims.splitlines() if line.startswith("| ") and "of 2 seeds" in line]
    assert len(findings) == len(pd.read_csv(main / "prune/claims.tsv", sep="\t")), claims
    # the runs under the verdicts: the toy's seed 2 runs the controls alone, so none besides them
    assert "No lambda besides the lambda = 0 controls ran on every seed" in claims, claims
    assert (main / "seeds/runs_over_seeds.png").read_bytes().startswith(b"\x89PNG")  # the figure says so too
    # the heads over seeds: each seed's own roles and its own BLEU, in the order of `seeds`
    heads = pd.read_csv(main / "seeds/heads.tsv", sep="\t").set_index("experiment")
    assert list(heads.index) == ["toy", "toy_seed2"], heads
    for name, folder in (("toy", main), ("toy_seed2", seed)):
        roles = pd.read_csv(folder / "syntax/roles.csv")
        assert heads.loc[name, "role_none"] == (roles["role"] == "none").sum(), name
        bleu = pd.read_csv(folder / "baseline/scores.tsv", sep="\t").set_index("split")["bleu"]
        assert heads.loc[name, [c for c in heads.columns if c.startswith("bleu_")]].tolist() == pytest.approx(
            bleu.tolist(), abs=0.01), name
    assert "| | toy | toy_seed2 |" in (main / "seeds/heads.md").read_text()


def test_scripts_take_settings_from_params_not_the_config():
    """A script that read snakemake.config would escape the params trigger: an edit of what it
    reads would rerun nothing."""
    offenders = [
        f"{path.name}:{number}"
        for path in sorted((REPO / "workflow/scripts").glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"\bsnakemake\s*\.\s*config\b|getattr\(\s*snakemake\s*,\s*['\"]config", line)
    ]
    assert not offenders, offenders
