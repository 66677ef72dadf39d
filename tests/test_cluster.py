"""The cluster path: what every rule declares, the profiles, and a toy run on a real Slurm.

The last test needs a running Slurm (one node is enough) and skips, saying why, where there is
none, as in CI. To run it on a Debian or Ubuntu machine (root needed for the daemons only):

    sudo tools/local-slurm.sh up            # installs slurm-wlm and munge, starts a one-node cluster
    .venv/bin/python -m pytest -rs tests/test_cluster.py

docs/cluster.md shows what it prints.
"""

import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yte
from toyflow import REPO, smoke_config, snakemake, write_config

RULES = REPO / "workflow/rules"
# The rules whose jobs train or decode with the model: they must say what they need of a node.
MODEL_RULES = {"train_baseline", "translate", "score_heads", "head_roles", "prune_heads", "train_from_scratch",
               "ranked_curve", "snapshot_statistics", "lm_quality", "reference_nll", "prune_to_target", "head_counts"}


def rule_blocks() -> dict[str, str]:
    """rule name -> the text of its definition, for every rule in workflow/rules/*.smk."""
    blocks = {}
    for path in sorted(RULES.glob("*.smk")):
        for match in re.finditer(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", path.read_text(), flags=re.M):
            blocks[match.group(1)] = match.group(2)
    return blocks


def directive(block: str, name: str) -> bool:
    return re.search(rf"^    {name}:", block, flags=re.M) is not None


def resources(block: str) -> set[str]:
    match = re.search(r"^    resources:\n((?:        .*\n)+)", block, flags=re.M)
    return set(re.findall(r"^        (\w+)=", match.group(1), flags=re.M)) if match else set()


def render_profile(name: str, **env) -> dict:
    """A profile's YAML after YTE, with the given HEADCOUNT_* environment (and no other)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HEADCOUNT_")}
    os.environ.update(env)
    try:
        with open(REPO / f"profiles/{name}/config.yaml") as f:
            return yte.process_yaml(f, require_use_yte=True)
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def test_every_rule_has_a_log_memory_and_runtime():
    blocks = rule_blocks()
    assert MODEL_RULES <= set(blocks), MODEL_RULES - set(blocks)
    assert [name for name, block in blocks.items() if not directive(block, "log")] == []
    assert [name for name, block in blocks.items() if not {"mem_mb", "runtime"} <= resources(block)] == []


def test_jobs_that_train_or_decode_declare_gpu_and_threads():
    blocks = rule_blocks()
    gpu_rules = {name for name, block in blocks.items() if "gpu" in resources(block)}
    assert gpu_rules == MODEL_RULES
    assert [name for name in MODEL_RULES if not directive(blocks[name], "threads")] == []


def test_the_slurm_profile_maps_site_values_and_the_gpu_rules():
    bare = render_profile("slurm")
    assert bare["executor"] == "slurm" and bare["set-resource-scopes"] == {"gpu": "local"}
    assert bare["cores"] == 8
    assert bare["default-resources"] == {"slurm_account": "", "slurm_partition": "", "mem_mb": 2000, "runtime": 60}
    # The GPU rules of the profile are exactly the rules that declare a gpu resource.
    assert set(bare["set-resources"]) == MODEL_RULES
    site = render_profile("slurm", HEADCOUNT_SLURM_ACCOUNT="proj", HEADCOUNT_SLURM_PARTITION="cpu",
                          HEADCOUNT_SLURM_GPU_PARTITION="gpu", HEADCOUNT_SLURM_GPU_MODEL="a100",
                          HEADCOUNT_SLURM_CPUS="16")
    assert site["cores"] == 16
    assert site["default-resources"]["slurm_account"] == "proj"
    assert site["default-resources"]["slurm_partition"] == "cpu"
    assert site["set-resources"]["train_baseline"] == {"slurm_partition": "gpu"}
    cpu_only = render_profile("slurm", HEADCOUNT_SLURM_PARTITION="cpu")
    assert cpu_only["set-resources"]["translate"] == {"slurm_partition": "cpu"}


def test_the_local_profile_caps_gpu_jobs():
    assert render_profile("local")["resources"] == {"gpu": 1}
    assert render_profile("local", HEADCOUNT_GPUS="2", HEADCOUNT_MEM_MB="16000")["resources"] == {
        "gpu": 2, "mem_mb": 16000}


@pytest.mark.parametrize("profile", ["local", "slurm"])
@pytest.mark.slow
def test_the_profiles_plan_the_smoke_run(tmp_path, toy_mirror, profile):
    if profile == "slurm":
        pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm not installed")
    config_path = write_config(tmp_path / "smoke.yaml", smoke_config(toy_mirror))
    result = snakemake("--profile", REPO / "profiles" / profile, "--configfile", config_path, "-n", "--quiet", "rules",
                       cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "train_baseline" in result.stdout and "pruning_report" in result.stdout


def slurm_state() -> str | None:
    """None if a Slurm cluster with an idle node answers here; otherwise why not."""
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (no sbatch on PATH); `sudo tools/local-slurm.sh up` makes a one-node cluster"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
        nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Slurm does not answer: {error}"
    if "is UP" not in ping.stdout:
        said = (ping.stdout + ping.stderr).strip().splitlines()
        return f"no Slurm controller is running (scontrol ping: {said[0] if said else ping.returncode}); " \
               "`sudo tools/local-slurm.sh up` starts the one-node cluster"
    if not re.search(r"idle|mixed", nodes.stdout):
        return f"no Slurm node is idle or mixed (sinfo: {nodes.stdout.split()})"
    return None


@pytest.mark.workflow
def test_a_toy_run_on_slurm(tmp_path, toy_mirror):
    """The smoke experiment, smaller, submitted job by job with sbatch through profiles/slurm."""
    missing = slurm_state()  # here, not at import: `scontrol ping` waits for a controller that is down
    if missing:
        pytest.skip(missing)
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm not installed")
    config = smoke_config(toy_mirror)
    config["defaults"]["heads"].update(ablation=False)
    config["defaults"]["prune"].update(lambdas={"all": [0, 0.5]}, from_scratch={"all": True})
    config["defaults"]["resources"].update(train_runtime_min=30, train_mem_mb=3000)
    config_path = write_config(tmp_path / "smoke.yaml", config)
    partition = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True).stdout.split()[0]
    jobs = os.environ.get("HEADCOUNT_TEST_JOBS", "2")
    cores = os.environ.get("HEADCOUNT_TEST_CORES", "1")
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles/slurm"),
           "--configfile", str(config_path), "--jobs", jobs, "--cores", cores,
           # No slurmdbd on a test cluster: job states from squeue, checked every few seconds.
           "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADCOUNT_SLURM_")}
    env["HEADCOUNT_SLURM_PARTITION"] = partition.rstrip("*")
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1800, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    submitted = dict(re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", output))
    assert len(submitted) >= 30, output[-2000:]
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)

    # Every job ran under Slurm and completed; the training job asked for what its rule declares.
    queue = subprocess.run(["squeue", "--states=all", "--noheader", "--name", run_id, "--format=%i|%T|%k|%C|%m|%l"],
                           capture_output=True, text=True).stdout.splitlines()
    rows = [line.split("|") for line in queue]
    assert len(rows) == len(submitted) and {row[1] for row in rows} == {"COMPLETED"}, queue
    training = [row for row in rows if row[2] == "rule_train_baseline_wildcards_toy"]
    assert len(training) == 1 and training[0][3:] == [cores, "3000M", "30:00"], training

    results = tmp_path / "results/toy"
    scores = pd.read_csv(results / "baseline/scores.tsv", sep="\t")
    assert scores["bleu"].iloc[0] > 20, scores
    assert (results / "prune/pruning.tsv").is_file() and (results / "syntax/table1.md").is_file()
    # Nothing left to do afterwards, by the same profile.
    rerun = subprocess.run(cmd + ["-n"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert "Nothing to be done" in rerun.stdout + rerun.stderr, rerun.stdout[-2000:]


def planned_threads(workdir, config) -> dict[str, set[int]]:
    """rule -> the thread counts of its planned jobs, from a dry run on 2 cores."""
    config_path = write_config(workdir / "threads.yaml", config)
    result = snakemake("--cores", "2", "--configfile", config_path, "-n", cwd=workdir, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    threads: dict[str, set[int]] = {}
    for rule, block in re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n)*)", result.stdout, flags=re.M):
        count = re.search(r"^    threads: (\d+)", block, flags=re.M)  # Snakemake leaves out "threads: 1"
        threads.setdefault(rule, set()).add(int(count.group(1)) if count else 1)
    return threads


@pytest.mark.slow
def test_thread_keys_size_their_own_jobs(tmp_path, toy_mirror):
    config = smoke_config(toy_mirror)
    config["defaults"]["seeds"] = [1, 2]
    every_core = planned_threads(tmp_path, config)
    config["defaults"]["resources"]["train_threads"] = 1
    one_train = planned_threads(tmp_path, config)
    config["defaults"]["resources"].update(train_threads=0, eval_threads=1)
    one_eval = planned_threads(tmp_path, config)
    training = {"train_baseline", "prune_heads", "train_from_scratch", "train_subwords"}  # BPE learning too
    evaluation = {"translate", "score_heads", "head_roles", "ranked_curve"}
    assert training | evaluation <= set(every_core) & set(one_train) & set(one_eval), set(every_core)
    for threads, train, evaluate in ((every_core, 2, 2), (one_train, 1, 2), (one_eval, 2, 1)):
        assert {rule: threads[rule] for rule in training} == dict.fromkeys(training, {train})
        assert {rule: threads[rule] for rule in evaluation} == dict.fromkeys(evaluation, {evaluate})
