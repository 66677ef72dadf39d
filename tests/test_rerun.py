"""What a rerun redoes after an edit: dry runs (`-n --quiet rules`) on the completed smoke run.

The smoke run (conftest's `smoke_run`) lives in a copy of the workflow (Snakefile, workflow/, src/),
so that these tests can edit library code and scripts without touching the repository. The
lambda-grid and decoding cases are in test_workflow.py's smoke test.
"""

import copy
import re
import shutil

import pytest
from toyflow import REPO, plan

# What a change of a model hyperparameter must redo: training, and everything that reads a
# model or what was made from one. Data preparation, subwords and parsing stay.
MODEL_DOWNSTREAM = {"train_baseline", "translate", "score", "score_table", "score_heads", "plot_head_scores",
                    "head_roles", "prune_heads", "train_from_scratch", "ranked_curve", "plot_gate_trajectory",
                    "pruning_report", "snapshot_statistics", "atlas", "all"}
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
    """A second seed: its baseline, its two lambda = 0 controls (one per setting), their
    translations and scores, and the spread table; the main run's results all stand."""
    workdir, config = done
    seeded = copy.deepcopy(config)
    seeded["defaults"]["seeds"] = [1, 2]
    jobs = plan(workdir, seeded)
    assert jobs == {"train_baseline_seed": 1, "prune_control_seed": 2, "translate": 3, "score": 3,
                    "seed_spread": 1, "all": 1}, jobs


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
