"""What a rerun redoes after an edit: dry runs (`-n --quiet rules`) on one completed toy run.

The workflow (Snakefile, workflow/, src/) is copied into a temporary directory first, so that the
tests can edit library code and scripts without touching the repository. The lambda-grid and
decoding cases are in test_workflow.py's smoke test.
"""

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_toy_mirror
from test_workflow import REPO, smoke_config, write_config

# What a change of a model hyperparameter must redo: training, and everything that reads a
# model or what was made from one. Data preparation, subwords and parsing stay.
MODEL_DOWNSTREAM = {"train_baseline", "translate", "score", "score_table", "score_heads", "plot_head_scores",
                    "head_roles", "prune_heads", "train_from_scratch", "michel_curve", "plot_gate_trajectory",
                    "pruning_report", "all"}
UPSTREAM = {"fetch_source", "prepare_training_data", "prepare_evaluation_data", "train_subwords",
            "parse_analysis_sentences"}


def rerun_config(mirror: Path) -> dict:
    """The smoke config, cheaper: few training steps, one lambda per setting, no ablation. What
    reruns depends on the jobs and their settings, not on how good the toy model is."""
    config = smoke_config(mirror)
    config["defaults"]["training"].update(max_steps=40, warmup_steps=10, eval_interval=20, checkpoint_interval=20,
                                          log_interval=10, dev_bleu_sentences=10)
    config["defaults"]["heads"].update(ablation=False)
    config["defaults"]["prune"].update(lambdas={"enc": [0.5], "all": [0.5]}, from_scratch={"all": True})
    config["defaults"]["prune"]["training"].update(max_steps=10, warmup_steps=5, eval_interval=10,
                                                   checkpoint_interval=10, log_interval=5)
    return config


def copy_workflow(dest: Path) -> Path:
    """The files that define the workflow, copied with their mtimes."""
    dest.mkdir(parents=True)
    shutil.copy2(REPO / "Snakefile", dest / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("workflow", "src", "config", "envs"):
        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    return dest


def snakemake(workdir: Path, *args, timeout=120):
    """The copied workflow, run in its own directory."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(workdir / "Snakefile"), *map(str, args)]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def plan(workdir: Path, config: dict, *extra) -> dict[str, int]:
    """The jobs a run would do now: rule -> count, from the dry run's job table."""
    config_path = write_config(workdir / "plan.yaml", config)
    result = snakemake(workdir, "-n", "--cores", "1", "--quiet", "rules", "--configfile", config_path, *extra)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    jobs = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit() and fields[0] != "total":
            jobs[fields[0]] = int(fields[1])
    print(f"plan with {' '.join(map(str, extra)) or 'no options'}: {jobs}")
    return jobs


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A copy of the workflow with a completed toy run in it, and the run's config."""
    root = tmp_path_factory.mktemp("rerun")
    workdir = copy_workflow(root / "wf")
    config = rerun_config(make_toy_mirror(root))
    config_path = write_config(workdir / "run.yaml", config)
    cores = os.environ.get("HEADCOUNT_TEST_CORES", "2")
    result = snakemake(workdir, "--cores", cores, "--configfile", config_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert plan(workdir, config) == {}, "a completed run has nothing left to do"
    return workdir, config


@pytest.mark.workflow
def test_a_model_hyperparameter_reruns_training_and_everything_downstream(done):
    workdir, config = done
    changed = copy.deepcopy(config)
    changed["defaults"]["model"]["d_ff"] = 48
    jobs = plan(workdir, changed)
    assert set(jobs) == MODEL_DOWNSTREAM, jobs
    assert jobs["train_baseline"] == 1 and jobs["prune_heads"] == 2 and jobs["train_from_scratch"] == 1
    assert not set(jobs) & UPSTREAM


@pytest.mark.workflow
def test_figure_code_reruns_only_its_figures(done):
    """No config key is read by figure rules alone (plot_head_scores has no params), so the
    figure-only edit is one to the figure script: Snakemake's code trigger sees scripts."""
    workdir, config = done
    script = workdir / "workflow/scripts/plot_head_scores.py"
    original = script.read_text()
    try:
        script.write_text(original + "# a figure tweak\n")
        jobs = plan(workdir, config)
    finally:
        script.write_text(original)
        shutil.copystat(REPO / "workflow/scripts/plot_head_scores.py", script)
    # 3 scores (no ablation) x 3 attention types, and the target rule.
    assert jobs == {"plot_head_scores": 9, "all": 1}, jobs


@pytest.mark.workflow
@pytest.mark.xfail(strict=True, reason="library code under src/headcount is no job input: Snakemake's code trigger "
                   "covers a rule's own script only. Until the rules declare it, rerun with -R <rule> "
                   "(docs/cluster.md, 'Rerun semantics')")
def test_library_code_used_by_a_job_is_detected(done):
    workdir, config = done
    library = workdir / "src/headcount/plots.py"
    original = library.read_text()
    try:
        library.write_text(original.replace("def head_heatmap(", "def head_heatmap(  # changed\n", 1))
        jobs = plan(workdir, config)
    finally:
        library.write_text(original)
        shutil.copystat(REPO / "src/headcount/plots.py", library)
    assert jobs.get("plot_head_scores") == 9 and "train_baseline" not in jobs, jobs


@pytest.mark.workflow
def test_forcing_a_rule_reruns_it_and_its_dependents_only(done):
    """The documented remedy after a library edit: -R names the rules whose code changed."""
    workdir, config = done
    jobs = plan(workdir, config, "-R", "plot_gate_trajectory")
    assert jobs == {"plot_gate_trajectory": 2, "pruning_report": 1, "all": 1}, jobs


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
