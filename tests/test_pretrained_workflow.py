"""The workflow on a pretrained model (`pretrained:`, issue 21): a tiny randomly initialised
MarianMT written as an opus-mt directory (tiny_seq2seq.write_tiny_marian), every stage after the
import run to the end offline, and the config errors a pretrained experiment can hit."""

import json

import pandas as pd
import pytest
from conftest import make_toy_mirror, toy_corpus
from toyflow import run_to, shipped_config, smoke_config, snakemake, write_config

pytest.importorskip("transformers")


def pretrained_config(mirror, model_dir) -> dict:
    """The smoke config's toy data, with the experiment analysing `model_dir` instead of training:
    one pruning setting (its control and one lambda), a few fine-tuning steps, no from-scratch twin."""
    config = smoke_config(mirror)
    config["defaults"]["training"].update(snapshot_interval=0)
    # Fewer jobs (each starts torch and transformers): no ablation heatmaps, and the analysis set is
    # the test set, whose baseline translation is made anyway.
    config["defaults"]["heads"].update(ablation=False)
    config["defaults"]["prune"].update(
        # Snakemake merges this config into config/config.yaml's: a setting is left out with [] / false.
        # No baseline schedule to read: a pretrained model takes the authors' recipe.
        lambdas={"enc": [0, 2.0], "all": []}, from_scratch={"all": False}, michel_step=0.5, lr_schedule="noam",
        heal_steps=0,
        training={"max_steps": 6, "warmup_steps": 2, "lr_scale": 0.3, "log_interval": 2, "eval_interval": 6,
                  "checkpoint_interval": 6})
    config["experiments"]["toy"].update(pretrained=str(model_dir), analysis={"set": "test_2016_flickr"})
    return config


def run_every_stage(tmp_path, config: dict):
    """What is particular to a pretrained model: the import, translation and scores through its
    tokenizer, head scores, roles, one pruning run and its physical export. The reports that only
    read these files (score table, Michel curve, pruning table, plots) are the same code for every
    family and run in the smoke test; leaving them and the lambda = 0 run out halves this test.
    -> the experiment's results directory."""
    return run_to(tmp_path, config, "enc", "pretrained")


@pytest.mark.workflow
def test_a_pretrained_marian_model_runs_through_every_stage(tmp_path):
    from headcount.testing.tiny_seq2seq import write_tiny_marian

    mirror = make_toy_mirror(tmp_path)
    src, tgt = toy_corpus(600, seed=1)
    model_dir = write_tiny_marian(tmp_path / "opus-mt-toy", src, tgt)
    results = run_every_stage(tmp_path, pretrained_config(mirror, model_dir))

    # No subwords and no training: the model and its own tokenizer were imported.
    assert not (results / "subwords").exists() and not (results / "baseline/train").exists()
    assert (results / "logs/import_pretrained.log").read_text().rstrip().endswith("done")
    record = json.loads((results / "baseline/training.json").read_text())
    assert record["family"] == "marian" and record["pretrained"] == str(model_dir)
    assert (results / "pretrained/tokenizer/source.spm").exists()

    # Translation and scores through the model's tokenizer.
    hyps = (results / "baseline/translations/test_2016_flickr.txt").read_text().splitlines()
    assert len(hyps) == 40
    scores = json.loads((results / "baseline/scores/test_2016_flickr.json").read_text())
    assert scores["sentences"] == 40 and scores["bleu_signature"].startswith("nrefs:1")

    # Head scores for every head of every attention type (2 layers x 4 heads each), LRP per layer.
    heads = pd.read_parquet(results / "heads/scores.parquet")
    assert len(heads) == 3 * 2 * 4
    for _, layer in heads.groupby(["type", "layer"]):
        assert layer["lrp"].sum() == pytest.approx(1.0, abs=1e-6)
    roles = pd.read_csv(results / "syntax/roles.csv")
    assert len(roles) == 2 * 4

    # Pruning: gates on the Marian encoder attention only; steps are fine-tuning steps only.
    gates = json.loads((results / "prune/enc/lambda_2/gates.json").read_text())
    assert gates["steps"]["baseline"] == 0 and gates["steps"]["fine_tuning"] == 6
    retained = gates["retained"]
    assert retained["dec_self"] == 8 and retained["dec_enc"] == 8 and 0 <= retained["enc_self"] <= 8
    assert sum(head["pruned"] for head in gates["heads"]) == 8 - retained["enc_self"]

    # Physical pruning: the pruned Marian model without its closed heads, fewer parameters if any closed.
    from headcount.models.loading import load_model

    export = json.loads((results / "prune/enc/lambda_2/physical/summary.json").read_text())
    kept = export["heads"]["enc_self"]
    assert sum(kept) == retained["enc_self"] and export["heads"]["dec_self"] == [4, 4]
    assert (export["after"]["parameters"] < export["before"]["parameters"]) == (sum(kept) < 8)
    physical = load_model(results / "prune/enc/lambda_2/physical/model.pt")
    assert type(physical).__name__ == "HFSeq2Seq"
    assert [m.n_heads for m in physical.attention_modules()["enc_self"]] == kept


@pytest.mark.slow
def test_a_missing_pretrained_directory_is_a_config_error_naming_the_key(tmp_path):
    config = smoke_config(make_toy_mirror(tmp_path))
    config["defaults"]["training"].update(snapshot_interval=0)
    config["defaults"]["prune"].update(from_scratch={"all": False})
    config["experiments"]["toy"]["pretrained"] = str(tmp_path / "no-such-model")
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"config key 'experiments.toy.pretrained': directory '{tmp_path / 'no-such-model'}' does not exist" in output
    assert "hf download" in output
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_what_a_pretrained_experiment_cannot_have_is_a_config_error_with_the_fix(tmp_path):
    config = smoke_config(make_toy_mirror(tmp_path))
    config["experiments"]["toy"]["pretrained"] = "Helsinki-NLP/opus-mt-en-de"  # a hub id: not checked offline
    config["defaults"]["prune"].update(lr_schedule="constant", resume_optimizer=True)
    config["defaults"]["seeds"] = [1, 2]
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for expected in ("'experiments.toy.prune.from_scratch.all': a pretrained experiment skips",
                     "set prune.from_scratch: {all: false}",
                     "'experiments.toy.prune.lr_schedule': constant reads the baseline's training", "use noam",
                     "'experiments.toy.prune.resume_optimizer'", "'experiments.toy.training.snapshot_interval'",
                     "'experiments.toy.seeds'", "set seeds: [1]"):
        assert expected in output, expected
    # With those settings fixed, the hub id plans: the import, no subwords, no baseline training.
    config["defaults"]["prune"].update(lr_schedule="noam", resume_optimizer=False, from_scratch={"all": False})
    config["defaults"]["seeds"] = [1]
    config["defaults"]["training"].update(snapshot_interval=0)
    result = snakemake("-n", "--cores", "1", "--quiet", "rules", "--configfile",
                       write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "import_pretrained" in result.stdout and "prune_heads" in result.stdout
    for absent in ("train_subwords", "train_baseline", "train_from_scratch", "snapshot_statistics"):
        assert absent not in result.stdout, absent


@pytest.mark.slow
def test_the_shipped_pretrained_experiments_plan_in_a_dry_run(tmp_path):
    """opus-mt (MarianMT) and fairseq's WMT19 model (FSMT): hub ids, planned without a network."""
    config = shipped_config()
    config["run"] = ["opus_mt_en_de", "opus_mt_en_ru", "wmt19_en_ru"]
    config["mirror"] = None
    config_path = write_config(tmp_path / "c.yaml", config)
    result = snakemake("-n", "--cores", "2", "--quiet", "rules", "--configfile", config_path, cwd=tmp_path,
                       env={"HEADCOUNT_MIRROR": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2
                and line.split()[1].isdigit())
    assert jobs["import_pretrained"] == "3" and jobs["pruning_report"] == "3" and jobs["head_roles"] == "3"
    for absent in ("train_subwords", "train_baseline", "train_from_scratch"):
        assert absent not in jobs, absent


@pytest.mark.slow
def test_a_fairseq_checkpoint_imports_translates_and_runs_every_stage(tmp_path):
    """A transformer that fairseq-train trained (tests/data/fairseq/pre, see test_fairseq.py):
    `pretrained: {family: fairseq, ...}` imports it with its dictionaries and sentencepiece models in
    the workflow, which prepares the data and parses too (one Snakemake run); translation through its
    tokenizer, scores, head scores, roles, gates and head removal follow, the rules' own functions in
    this process with the rules' settings (toyflow.run_stages): the imported model is a translation
    model like MarianMT, whose whole run (test_a_pretrained_marian_model_runs_through_every_stage)
    takes those rules through the workflow."""
    from pathlib import Path

    from toyflow import CORES, STAGE_INPUTS, copy_workflow, run_stages

    folder = Path(__file__).parent / "data" / "fairseq" / "pre"
    mirror = make_toy_mirror(tmp_path)
    config = pretrained_config(mirror, "unused")
    config["experiments"]["toy"]["pretrained"] = {
        "family": "fairseq", "checkpoint": str(folder / "checkpoint.pt"), "data": str(folder),
        "sentencepiece": {"src": str(folder / "src.model"), "tgt": str(folder / "tgt.model")}}
    workdir = copy_workflow(tmp_path / "wf")
    config_path = write_config(workdir / "fairseq.yaml", config)
    result = snakemake(*STAGE_INPUTS, "--cores", CORES, "--configfile", config_path, cwd=workdir,
                       snakefile=workdir / "Snakefile")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = workdir / "results/toy"
    record = json.loads((results / "baseline/training.json").read_text())
    assert record["family"] == "fairseq" and record["model_config"]["norm"] == "pre"
    assert (results / "pretrained/tokenizer/fairseq_tokenizer.json").exists()

    run_stages(results, config, "enc")
    scores = json.loads((results / "baseline/scores/test_2016_flickr.json").read_text())
    assert scores["sentences"] == 40
    heads = pd.read_parquet(results / "heads/scores.parquet")
    assert len(heads) == 3 * 2 * 4  # 2+2 layers, 4 heads
    for _, layer in heads.groupby(["type", "layer"]):
        assert layer["lrp"].sum() == pytest.approx(1.0, abs=1e-6)
    assert len(pd.read_csv(results / "syntax/roles.csv")) == 2 * 4
    gates = json.loads((results / "prune/enc/lambda_2/gates.json").read_text())
    assert gates["retained"]["dec_self"] == 8 and gates["steps"]["fine_tuning"] == 6
    export = json.loads((results / "prune/enc/lambda_2/physical/summary.json").read_text())
    assert sum(export["heads"]["enc_self"]) == gates["retained"]["enc_self"]


@pytest.mark.slow
def test_a_fairseq_experiment_with_missing_files_is_a_config_error_naming_each(tmp_path):
    config = smoke_config(make_toy_mirror(tmp_path))
    config["defaults"]["training"].update(snapshot_interval=0)
    config["defaults"]["prune"].update(from_scratch={"all": False}, lr_schedule="noam")
    config["experiments"]["toy"]["pretrained"] = {"family": "fairseq", "checkpoint": str(tmp_path / "ckpt.pt"),
                                                  "data": str(tmp_path / "data-bin"), "sentencepiece": "./spm.model"}
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for key in ("pretrained.checkpoint': file", "pretrained.data': directory", "pretrained.sentencepiece.src'"):
        assert f"'experiments.toy.{key}" in output, key
    assert not (tmp_path / "results").exists()
