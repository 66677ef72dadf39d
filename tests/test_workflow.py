"""The workflow itself: lint, dry runs, config errors, and an end-to-end run on a toy corpus."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from toyflow import CORES, REPO, SHARED_DATA, kill_when, plan, shipped_config, smoke_config, snakemake, write_config

from headcount.io import read_lines, sha256_file
from headcount.training.evaluate import corpus_bleu


@pytest.mark.slow
def test_lint_is_clean():
    result = snakemake("--lint", "--cores", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


def _requirements(specs) -> dict[str, str]:
    """{normalised name: version constraint} of requirement strings such as 'torch==2.13.0'."""
    import re

    out = {}
    for spec in specs:
        name, constraint = re.match(r"^([A-Za-z0-9_.-]+)\s*(.*)$", spec.strip()).groups()
        out[re.sub(r"[-_.]+", "-", name).lower()] = constraint.replace(" ", "")
    return out


def test_the_conda_environment_has_every_dependency_of_the_package():
    """--software-deployment-method conda runs every job in envs/headcount.yaml: it must hold what
    pyproject.toml's dependencies hold (the jobs import them), with the same constraints."""
    import yaml

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package = _requirements(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    env = yaml.safe_load((REPO / "envs/headcount.yaml").read_text())["dependencies"]
    pip = next(d["pip"] for d in env if isinstance(d, dict))
    conda = _requirements([d for d in env if isinstance(d, str) and d.split("=")[0] not in ("python", "pip")])
    conda.update(_requirements(pip))
    missing = {name: constraint for name, constraint in package.items() if name not in conda}
    assert not missing, f"envs/headcount.yaml lacks {missing}"
    differ = {name: (package[name], conda[name]) for name in package if conda[name] != package[name]}
    assert not differ, f"constraints differ (pyproject, conda env): {differ}"


@pytest.mark.slow
def test_dry_run_of_the_default_config_lists_the_whole_baseline():
    env = {"HEADCOUNT_MIRROR": str(SHARED_DATA)} if SHARED_DATA.is_dir() else {}
    # --forceall: the plan from scratch, whatever results/ already holds on this machine.
    result = snakemake("-n", "--forceall", "--cores", "2", "--quiet", "rules", env=env)
    assert result.returncode == 0, result.stderr
    for rule in ("fetch_source", "prepare_training_data", "train_subwords", "train_baseline", "translate",
                 "score", "score_table", "all"):
        assert rule in result.stdout, rule


@pytest.mark.slow
def test_paper_experiments_resolve_in_a_dry_run(tmp_path):
    config = shipped_config()
    config["run"] = ["wmt_en_ru", "wmt_en_de", "wmt_en_fr", "opensubtitles_en_ru", "multi30k_en_fr"]
    config["mirror"] = None
    config_path = write_config(tmp_path / "c.yaml", config)
    result = snakemake("-n", "--cores", "2", "--quiet", "rules", "--configfile", config_path,
                       cwd=tmp_path, env={"HEADCOUNT_MIRROR": ""})
    assert result.returncode == 0, result.stderr
    assert "train_baseline" in result.stdout


@pytest.mark.slow
def test_a_bad_config_fails_before_any_job_naming_the_key(tmp_path):
    config = shipped_config()
    config["defaults"]["training"]["max_steps"] = -5
    config["defaults"]["training"]["colour"] = "blue"
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "bad.yaml", config), cwd=tmp_path)
    assert result.returncode != 0
    assert "'defaults.training.max_steps': -5 is less than the minimum of 1" in result.stdout + result.stderr
    assert "'colour' was unexpected" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_missing_mirror_file_is_reported_before_any_job(tmp_path, toy_mirror):
    (toy_mirror / "toy/val.de.gz").unlink()
    config_path = write_config(tmp_path / "smoke.yaml", smoke_config(toy_mirror))
    result = snakemake("-n", "--cores", "1", "--configfile", config_path, cwd=tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "lacks 1 file(s)" in output and "toy/val.de.gz (published at https://example.org/toy/val.de.gz)" in output


@pytest.mark.workflow
def test_smoke_run_end_to_end(smoke_run):
    """Fetch from a mirror, clean, BPE, train, translate, score: the real rules on a toy corpus."""
    assert smoke_run.result.returncode == 0, smoke_run.result.stderr[-3000:]
    tmp_path, config = smoke_run.workdir, smoke_run.config
    results = tmp_path / "results/toy"
    table = pd.read_csv(results / "baseline/scores.tsv", sep="\t")
    assert list(table["split"]) == ["test_2016_flickr"]
    scores = json.loads((results / "baseline/scores/test_2016_flickr.json").read_text())
    assert scores["bleu_signature"].startswith("nrefs:1") and scores["sentences"] == 40
    assert scores["provenance"]["torch"]
    # The toy language is a word-for-word lexicon with a local reordering: a working model
    # learns much of it in 200 steps; a broken pipeline (misaligned data, bad decoding) scores ~0.
    assert scores["bleu"] > 20, scores
    training = json.loads((results / "baseline/training.json").read_text())
    assert training["steps"] == 200 and training["model_config"]["n_heads"] == 4
    stats = json.loads((results / "data/train.stats.json").read_text())
    assert stats["pairs"] == 600
    for log in ("train_baseline", "baseline/translate_test_2016_flickr", "prepare_training_data",
                "prune/enc/lambda_2/prune_heads", "prune/all/lambda_0.5/train_from_scratch"):
        assert (results / f"logs/{log}.log").read_text().rstrip().endswith("done")
    hyps = (results / "baseline/translations/test_2016_flickr.txt").read_text().splitlines()
    assert len(hyps) == 40

    # Head scores: one row per head of each attention type, LRP shares summing to 1 per layer.
    heads = pd.read_parquet(results / "heads/scores.parquet")
    assert len(heads) == 3 * 2 * 4
    assert set(heads.columns) >= {"confidence", "lrp", "michel", "delta_loss", "delta_bleu"}
    for _, layer in heads.groupby(["type", "layer"]):
        assert layer["lrp"].sum() == pytest.approx(1.0, abs=1e-6)
    assert heads.loc[heads["type"] == "enc_self", "delta_bleu"].notna().all()
    correlations = pd.read_csv(results / "heads/correlations.tsv", sep="\t")
    assert set(correlations["score"]) == {"confidence", "lrp", "michel"}
    # One job draws every heatmap: 4 scores x 3 attention types, and ablation's BLEU for encoder heads.
    heatmaps = sorted(path.name for path in (results / "heads/figures/heatmaps").glob("*.png"))
    assert heatmaps == sorted([f"{score}.{kind}.png" for score in ("confidence", "lrp", "michel", "delta_loss")
                               for kind in ("enc_self", "dec_self", "dec_enc")] + ["delta_bleu.enc_self.png"])
    for name in heatmaps:
        assert (results / "heads/figures/heatmaps" / name).read_bytes()[:4] == b"\x89PNG"

    # Head roles on the toy treebank: every encoder head gets a role; Table 1 has amod both ways.
    roles = pd.read_csv(results / "syntax/roles.csv")
    assert len(roles) == 2 * 4 and set(roles["role"]) <= {"positional", "syntactic", "rare", "none"}
    table1 = pd.read_csv(results / "syntax/table1.csv")
    amod = table1[table1["relation"] == "amod"]
    assert set(amod["name"]) == {"noun->adj", "adj->noun"} and (amod["n"] > 0).all()
    # An adjective always precedes its noun here, so the positional baseline is perfect for amod.
    assert (amod["baseline_accuracy"] == 100).all()
    assert "| amod |" in (results / "syntax/table1.md").read_text()
    for name in ("function_map.png", "relative_positions.png"):
        assert (results / f"syntax/{name}").read_bytes()[:4] == b"\x89PNG"

    # Every job records what produced its outputs: settings, checksums, versions, commit.
    record = json.loads((results / "provenance/prune/enc/lambda_2/prune_heads.json").read_text())
    assert record["params"]["lam"] == 2.0 and record["params"]["training"]["seed"] == 1
    assert record["software"]["torch"] and "headcount_commit" in record["software"]
    model = str(Path("results/toy/prune/enc/lambda_2/model.pt"))
    assert record["outputs"][model]["sha256"] == sha256_file(tmp_path / model)
    for log in (results / "logs").rglob("*.log"):
        if "download" not in log.name:
            assert (results / "provenance" / log.relative_to(results / "logs")).with_suffix(".json").exists(), log

    # Pruning: the baseline row, one row per lambda (0: the control, every head kept), the
    # from-scratch twin of the all-types run with the pruned model's budget, intervals throughout.
    pruning = pd.read_csv(results / "prune/pruning.tsv", sep="\t")
    assert sorted(zip(pruning["setting"], pruning["lam"].fillna(-1))) == [
        ("all", 0), ("all", 0.5), ("baseline", -1), ("enc", 0), ("enc", 2.0)]
    enc = pruning[pruning["setting"] == "enc"].set_index("lam")
    assert (enc["retained_dec_self"] == 8).all() and (enc["retained_dec_enc"] == 8).all()  # decoder not gated
    assert enc.loc[2.0, "retained_enc_self"] <= enc.loc[0, "retained_enc_self"] == 8
    controls = pruning[pruning["control"]]
    assert len(controls) == 2 and (controls["retained_total"] == 24).all()
    pruned = pruning[(pruning["setting"] == "all") & ~pruning["control"]].iloc[0]
    assert pd.notna(pruned["bleu_scratch"]) and pruned["steps"] == pruned["steps_scratch"] == 200 + 40 + 10
    assert pruned["d_baseline_low"] <= pruned["d_baseline"] <= pruned["d_baseline_high"]
    assert pd.notna(pruned["d_pruned_scratch_low"]) and pd.notna(pruned["d_control_high"])
    scratch_run = json.loads((results / "prune/all/lambda_0.5/scratch/training.json").read_text())
    assert scratch_run["train_config"]["max_steps"] == 250 and scratch_run["train_config"]["select"] == "last"
    assert (pruning[[c for c in pruning if c.startswith("role_")]].sum(axis=1)
            == pruning["retained_enc_self"]).all()
    michel = pd.read_csv(results / "prune/enc/michel.tsv", sep="\t")
    assert list(michel["retained_enc_self"]) == [8, 6, 4, 2]  # 25% steps of 8 heads
    points = [json.loads(line) for line in read_lines(results / "prune/enc/michel_translations.jsonl")]
    references = read_lines(results / "data/test_2016_flickr.tgt.txt")
    assert [p["retained"]["enc_self"] for p in points] == [8, 6, 4, 2]
    assert [corpus_bleu(p["translations"], references) for p in points] == pytest.approx(list(michel["bleu"]), abs=0.01)
    # every gated run is set against Michel's ranking, with an interval; the baseline is not
    assert list(pruning["d_michel_low"].notna()) == list(pruning["setting"] != "baseline")
    assert "Voita et al. (2019)" in (results / "prune/table2.md").read_text()
    assert "the paper's pruning findings" in (results / "prune/claims.md").read_text()
    for name in ("figure7_bleu_vs_heads", "figure8_functions", "figure9_types", "figure10_decoder_layers"):
        assert (results / f"prune/figures/{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert (results / "prune/all/lambda_0.5/gates.gif").read_bytes()[:6] == b"GIF89a"

    # Snapshots of the baseline only (not of pruning or from-scratch runs), and their statistics.
    snapshots = pd.read_csv(results / "heads/snapshots.csv")
    assert snapshots["step"].tolist() == [100, 200] and snapshots["dev_bleu_from"].eq("metrics").all()
    assert (results / "heads/figures/specialisation.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(results.glob("prune/**/snapshots")), list(results.glob("prune/**/snapshots"))

    # Nothing left to do on a rerun; a new lambda adds its own jobs and reruns nothing else.
    assert plan(tmp_path, config) == {}
    grid = copy.deepcopy(config)
    grid["defaults"]["prune"]["lambdas"]["enc"].append(0.5)
    jobs = plan(tmp_path, grid)
    assert jobs.get("prune_heads") == 1 and jobs.get("translate") == 1, jobs
    assert "train_baseline" not in jobs and "train_from_scratch" not in jobs and "ranked_curve" not in jobs

    # A changed decoding setting reruns translation and scoring only.
    changed = copy.deepcopy(config)
    changed["defaults"]["decoding"]["beam"] = 2
    jobs = plan(tmp_path, changed)
    assert "translate" in jobs and "score" in jobs, jobs
    assert not {"train_baseline", "train_subwords", "prune_heads", "train_from_scratch"} & set(jobs), jobs


@pytest.mark.workflow
def test_head_counts_at_matched_counts_on_the_smoke_run(smoke_run):
    """rule head_counts on the smoke run's baseline: every arm at the matched counts, the random
    draws, the L0 runs' errors; a set's loss equals the model's own forward with those heads'
    0/1 mask set (not the per-head hook the arms are scored through). The L0 runs take the
    controller's settings from prune.controller (here settling over the last half)."""
    import copy

    import torch
    import torch.nn.functional as F

    from headcount.analysis.head_access import BASELINE
    from headcount.data.batching import objective_tensors
    from headcount.models.loading import load_model, open_tokenizer
    from headcount.pipeline.head_counts import masked_heads
    from headcount.pruning import matched_counts as mc
    from headcount.report import preregistered

    workdir, config = smoke_run.workdir, copy.deepcopy(smoke_run.config)
    config["defaults"]["prune"]["controller"] = {"settle": 0.5}
    outs = [f"results/toy/head_counts/{setting}/head_counts.tsv" for setting in ("enc", "all")]
    run = snakemake(*outs, "--cores", CORES, "--configfile", write_config(workdir / "head_counts.yaml", config),
                    cwd=workdir, snakefile=workdir / "Snakefile")
    assert run.returncode == 0, run.stderr[-3000:]
    results = workdir / "results/toy/head_counts"
    for setting in ("enc", "all"):
        assert json.loads((results / setting / "fingerprint.json").read_text())["controller"] == {"settle": 0.5}
        log = (workdir / f"results/toy/logs/head_counts/{setting}.log").read_text()
        assert "a pull toward the count's mask over the last" in log
    for setting, total, types in (("enc", 8, {"enc_self"}), ("all", 24, {"enc_self", "dec_self", "dec_enc"})):
        table = pd.read_csv(results / setting / "head_counts.tsv", sep="\t")
        counts = mc.matched_counts(total, setting)
        assert sorted(table["count"].unique()) == counts == mc.counts_removed(total)
        named = set(table.loc[table["family"] != mc.RANDOM, "arm"])
        assert {"confidence", "single-head ablation", "LRP", "Michel one-shot", "Michel iterative", "whole layers",
                "L0 to target"} <= named
        assert (table["family"] == mc.RANDOM).sum() == preregistered.RANDOM_DRAWS * len(counts)
        arms = json.loads((results / setting / "arms.json").read_text())
        assert {key[0] for arm in arms for heads in arm["removed"].values() for key in heads} == types
        targets = pd.read_csv(results / setting / "targets.tsv", sep="\t")
        assert list(targets["target_kept"]) == [total - k for k in counts]
        assert (results / setting / "head_counts.png").read_bytes()[:4] == b"\x89PNG"

    # the loss of one set, by hand: the 0/1 head mask and the model's teacher-forced forward
    arm = next(a for a in arms if a["name"] == "single-head ablation")
    removed = [tuple(key) for key in arm["removed"]["12"]]
    model = load_model(workdir / "results/toy/baseline/model.pt").eval()
    src_tok = open_tokenizer(workdir / "results/toy/subwords/src.model", "source")
    tgt_tok = open_tokenizer(workdir / "results/toy/subwords/tgt.model", "target")
    src = read_lines(workdir / "results/toy/data/test_2016_flickr.src.txt")
    tgt = read_lines(workdir / "results/toy/data/test_2016_flickr.tgt.txt")
    scored = pd.read_csv(results / "all/scored.tsv", sep="\t")
    for name, heads in ((BASELINE, []), ("single-head ablation @ 12", removed)):
        rows = scored[scored["set"] == name].sort_values("text")
        assert len(rows) == len(src), name
        with masked_heads(model, heads), torch.no_grad():
            for i in (0, 7, len(src) - 1):
                s_in, t_in, t_out = objective_tensors("translation", src_tok.encode([src[i]]), tgt_tok.encode([tgt[i]]),
                                                     model.special)
                logits, _ = model(s_in, t_in)
                nll = F.cross_entropy(logits.transpose(1, 2), t_out, reduction="sum", ignore_index=model.special.pad)
                assert float(rows["sum"].iloc[i]) == pytest.approx(float(nll), rel=1e-5), (name, i)


@pytest.mark.workflow
def test_sigterm_sigint_and_sigkill_end_the_run_and_the_rerun_resumes_to_the_same_weights(tmp_path, smoke_run):
    """The baseline trains in a copy of the finished smoke run, interrupted three ways, each resumed
    as README says, and ends with the uninterrupted run's weights bit for bit:
    - SIGTERM (a wall-time limit, scancel), then SIGINT (Ctrl-C), to the Snakemake process alone while
      the baseline trains (a training that would run for hours): the signal reaches the job, which
      checkpoints the step it reached and ends with a one-line error and no traceback, and Snakemake
      exits within seconds without leaving its lock (without passing the signal on, it waited for the job);
    - SIGKILL to the whole workflow (no signal handler runs): after --unlock, the job resumes from its
      last periodic checkpoint.
    Equal weights give equal outputs downstream; the pruning and from-scratch jobs' own kill-and-resume
    is tests/test_pruning.py's. Plain jobs: the signals must reach the job's own process."""
    import os
    import shutil
    import signal
    import time

    import psutil
    import torch

    from headcount.models.checkpoint import load_checkpoint

    assert smoke_run.result.returncode == 0, "the smoke run failed; see test_smoke_run_end_to_end"
    workdir = tmp_path / "wf"
    shutil.copytree(smoke_run.workdir, workdir, symlinks=True)  # data and subwords done, with their metadata
    shutil.rmtree(workdir / "results/toy/baseline")
    config = copy.deepcopy(smoke_run.config)
    config["defaults"]["training"]["max_steps"] = 100_000  # a resumable change: the weights up to a step stay
    long_run, config_path = write_config(workdir / "long.yaml", config), workdir / "smoke.yaml"
    write_config(config_path, smoke_run.config)
    train_dir = workdir / "results/toy/baseline/train"
    log_path = workdir / "results/toy/logs/train_baseline.log"

    def command(config_file):
        return [sys.executable, "-m", "snakemake", "-s", str(workdir / "Snakefile"), "results/toy/baseline/model.pt",
                "--cores", CORES, "--rerun-incomplete", "--configfile", str(config_file)]

    def last_step() -> int:
        metrics = train_dir / "metrics.jsonl"
        text = metrics.read_text() if metrics.exists() else ""
        return max((json.loads(line)["step"] for line in text.splitlines() if line.endswith("}")), default=0)

    reached = 0
    for signum in (signal.SIGTERM, signal.SIGINT):
        output = workdir / f"snakemake_{signum.name}.txt"  # for the failure message
        with open(output, "w") as sink:
            process = subprocess.Popen(command(long_run), cwd=workdir, stdout=sink, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.time() + 300
        while last_step() < reached + 20 and process.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, "snakemake ended before the signal"
        jobs = psutil.Process(process.pid).children(recursive=True)
        sent = time.time()
        process.send_signal(signum)
        try:
            returncode = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"snakemake still running 60 s after {signum.name}; its output:\n{output.read_text()[-3000:]}"
                        f"\njob log:\n{log_path.read_text()[-1500:]}")
        print(f"{signum.name}: snakemake exited after {time.time() - sent:.1f} s")
        assert returncode != 0
        assert not any(job.is_running() and job.status() != psutil.STATUS_ZOMBIE for job in jobs)
        assert not list((workdir / ".snakemake/locks").glob("*")), "the lock stayed behind"
        log = log_path.read_text()
        assert f"{signum.name} received: checkpoint written at step" in log
        # the job's one-line error, and the checkpoint holds the step it names (not the last interval's)
        stopped = re.findall(rf"ERROR: training stopped by {signum.name} at step (\d+) of 100000; the checkpoint "
                             rf"\S+checkpoint.pt holds that step. Run the workflow again", log)
        assert len(stopped) == 1 and "Traceback" not in log, log[-2000:]
        step = load_checkpoint(train_dir / "checkpoint.pt")["step"]
        assert step == int(stopped[0]) and reached + 20 <= step < 100  # before the first evaluation
        reached = step

    # SIGKILL to the whole workflow once the run (the README's command) has gone past its first evaluation.
    process = subprocess.Popen(command(config_path), cwd=workdir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    kill_when(process, lambda: last_step() >= 100, timeout=300)
    assert f"resuming from results/toy/baseline/train/checkpoint.pt at step {reached}" in log_path.read_text()
    assert not (workdir / "results/toy/baseline/model.pt").exists()
    killed_at = load_checkpoint(train_dir / "checkpoint.pt")["step"]
    assert reached < killed_at < 200
    unlock = subprocess.run(command(config_path) + ["--unlock"], cwd=workdir, capture_output=True, text=True)
    assert unlock.returncode == 0, unlock.stderr

    result = subprocess.run(command(config_path), cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert f"resuming from results/toy/baseline/train/checkpoint.pt at step {killed_at}" in log_path.read_text()
    resumed = load_checkpoint(workdir / "results/toy/baseline/model.pt")["model"]
    clean = load_checkpoint(smoke_run.results / "baseline/model.pt")["model"]
    assert resumed.keys() == clean.keys()
    for name, tensor in clean.items():
        assert torch.equal(tensor, resumed[name]), name
