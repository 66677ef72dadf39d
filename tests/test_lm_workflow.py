"""The workflow on a pretrained language model (`text:` and `lang:`, issue 37): a small GPT-2 that
transformers' own Trainer trained here on English text (tools/train_lm_reference.py, cached in
tests/data/gpt2_multi30k) through import, perplexity, head scores, roles, one pruning run and its
physical export; a small BERT the Trainer trained the same way (tests/data/bert_multi30k) planned
and imported by the workflow, then through the same stages' functions in-process; each one's loss
as the Trainer computed it, recomputed (and that of a Qwen2 trained the same way,
tests/data/qwen2_multi30k); and the config errors of the new keys."""

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import make_toy_mirror, toy_corpus
from toyflow import (
    STAGE_INPUTS,
    copy_workflow,
    run_stages,
    run_to,
    shipped_config,
    smoke_config,
    snakemake,
    write_config,
)

pytest.importorskip("transformers")

TRAINED_GPT2 = Path(__file__).parent / "data" / "gpt2_multi30k"
TRAINED_BERT = Path(__file__).parent / "data" / "bert_multi30k"
TRAINED_QWEN2 = Path(__file__).parent / "data" / "qwen2_multi30k"


def lm_config(mirror, model_dir) -> dict:
    """The smoke config's toy English text, analysed with the language model in `model_dir`: the
    one setting of a language model (all; its control and one lambda), a few fine-tuning steps."""
    config = smoke_config(mirror)
    config["defaults"]["training"].update(snapshot_interval=0)
    # Fewer jobs (each starts torch and transformers): no ablation, the test set is the analysis set.
    config["defaults"]["heads"].update(ablation=False)
    config["defaults"]["roles"].update(parser="spacy", treebanks=[])
    config["defaults"]["prune"].update(
        # `enc` stays in the merged defaults' grid: a language model ignores it.
        lambdas={"all": [0, 2.0]}, from_scratch={"all": False}, michel_step=0.5, lr_schedule="noam", heal_steps=0,
        training={"max_steps": 6, "warmup_steps": 2, "lr_scale": 0.3, "log_interval": 2, "eval_interval": 6,
                  "checkpoint_interval": 6})
    config["experiments"] = {"toy": {
        "pretrained": str(model_dir), "lang": "en", "analysis": {"set": "test_2016_flickr", "max_sentences": 40},
        "text": {"train": "toy/train.en.gz", "dev": "toy/val.en.gz",
                 "test": {"test_2016_flickr": "toy/test_2016_flickr.en.gz"}}}}
    return config


@pytest.mark.workflow
def test_a_pretrained_gpt2_runs_through_every_stage(tmp_path):
    mirror = make_toy_mirror(tmp_path)
    model_dir = TRAINED_GPT2
    # A pruned model's perplexity is the baseline's rule on another model, and the pruning table and
    # the ranked curve only read files: test_the_pruning_table_* runs them in-process, in seconds.
    results = run_to(tmp_path, lm_config(mirror, model_dir), "all", "language-model")

    # No subwords, no training, no translation: the model and its one tokenizer were imported.
    assert not (results / "subwords").exists() and not (results / "baseline/translations").exists()
    record = json.loads((results / "baseline/training.json").read_text())
    assert record["family"] == "gpt2" and record["model_kind"] == "decoder_only" and record["lang"] == "en"

    # Quality: perplexity of the test text (the same text on both sides of the toy pairs).
    scores = json.loads((results / "baseline/scores/test_2016_flickr.json").read_text())
    assert scores["sentences"] == 40 and scores["tokens"] > 40 and scores["perplexity"] > 1
    nll = pd.read_csv(results / "baseline/scores/test_2016_flickr.nll.tsv", sep="\t")
    assert len(nll) == 40 and nll["tokens"].sum() == scores["tokens"]

    # Head scores on the causal self-attention only (2 layers x 4 heads), LRP normalised per layer.
    heads = pd.read_parquet(results / "heads/scores.parquet")
    assert set(heads["type"]) == {"dec_self"} and len(heads) == 2 * 4
    assert {"confidence", "michel", "lrp"} <= set(heads.columns)
    assert heads.groupby("layer")["lrp"].sum().to_numpy() == pytest.approx([1.0, 1.0])
    roles = pd.read_csv(results / "syntax/roles.csv")
    assert len(roles) == 2 * 4 and {"induction", "sink"} <= {c.split("_")[0] for c in roles.columns}

    # Pruning: the all setting gates the 8 heads; the export counts the KV cache it frees.
    gates = json.loads((results / "prune/all/lambda_2/gates.json").read_text())
    assert set(gates["retained"]) == {"dec_self"} and gates["steps"]["fine_tuning"] == 6
    export = json.loads((results / "prune/all/lambda_2/physical/summary.json").read_text())
    assert sum(export["heads"]["dec_self"]) == gates["retained"]["dec_self"]
    before, after = export["before"]["kv_cache_bytes_per_token"], export["after"]["kv_cache_bytes_per_token"]
    # 2 layers, keys and values, d 64, 2 bytes a value
    assert before == 2 * 2 * 64 * 2 and after == before * gates["retained"]["dec_self"] // 8
    # Beside it the same model for plain transformers, with its tokenizer (pruning.transformers_export).
    assert export["transformers"]["exported"] and "tokenizer.json" in export["transformers"]["tokenizer_files"]
    assert (results / "prune/all/lambda_2/physical/transformers/model.safetensors").is_file()
    api_against_workflow(results, lm_config(mirror, model_dir), model_dir)


def api_against_workflow(results: Path, config: dict, model_dir: Path) -> None:
    """headcount.analyse and headcount.prune (docs/api.md) on the same model, read by transformers
    into memory, with the same text and settings give the tables the workflow wrote (issue 62).
    Scores agree to 1e-6 (the workflow's jobs ran with their own thread counts, whose sums may
    round apart); the roles and the gates exactly."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import headcount
    from headcount.api import DEFAULT_ROLE_SETTINGS

    defaults = config["defaults"]
    n = config["experiments"]["toy"]["analysis"]["max_sentences"]
    texts = (results / "data/test_2016_flickr.src.txt").read_text(encoding="utf-8").splitlines()[:n]
    train = (results / "data/train.src.txt").read_text(encoding="utf-8").splitlines()
    role_settings = {k: v for k, v in defaults["roles"].items() if k in DEFAULT_ROLE_SETTINGS}
    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    found = headcount.analyse(model, tokenizer, texts, measures=["confidence", "michel", "lrp"],
                              parses=pd.read_parquet(results / "syntax/parses.parquet"), frequency_texts=train,
                              role_settings=role_settings, lrp_rule=defaults["heads"]["lrp_rule"],
                              max_tokens=defaults["heads"]["max_tokens"], device="cpu", log=False)
    workflow = pd.read_parquet(results / "heads/scores.parquet")
    pd.testing.assert_frame_equal(found.scores, workflow, rtol=1e-6, check_dtype=False)
    labels = ["text", "parser", "syntactic_text"]  # what each run calls its text and parses
    as_written = pd.read_csv(io.StringIO(found.roles.to_csv(index=False, float_format="%.4g")))  # roles.csv's way
    pd.testing.assert_frame_equal(as_written.drop(columns=labels),
                                  pd.read_csv(results / "syntax/roles.csv").drop(columns=labels), check_exact=True)

    prune = {k: v for k, v in defaults["prune"].items() if k in headcount.api.DEFAULT_PRUNE_SETTINGS}
    gated = headcount.prune(model, tokenizer, train, 2.0,
                            dev_texts=(results / "data/dev.src.txt").read_text(encoding="utf-8").splitlines(),
                            training=defaults["training"], recipe={**prune, "training": defaults["prune"]["training"]},
                            gates_only=False, device="cpu", log=False)  # as the workflow's lambda runs: weights train
    workflow_gates = pd.DataFrame(json.loads((results / "prune/all/lambda_2/gates.json").read_text())["heads"])
    pd.testing.assert_frame_equal(gated.gates, workflow_gates[gated.gates.columns], rtol=1e-5, check_dtype=False)


@pytest.mark.slow
def test_a_trained_bert_plans_like_gpt2_imports_and_runs_every_stage(tmp_path):
    """A masked LM shares GPT-2's DAG: it plans the same rules, and the workflow imports it and
    prepares its text and parses (one Snakemake run). The stages after that are the rules' own
    functions in this process, with the settings the rules pass (the merged config): perplexity of a
    fixed masking, head scores with LRP on its one attention type, roles with the sink role, a gated
    pruning run and its physical export. (test_a_pretrained_gpt2_runs_through_every_stage runs those
    rules' jobs through the workflow; a masked LM takes no other rule.)"""
    config = lm_config(make_toy_mirror(tmp_path), TRAINED_BERT)
    workdir = copy_workflow(tmp_path / "wf")
    config_path = write_config(workdir / "lm.yaml", config)
    result = snakemake("-n", "--cores", "1", "--quiet", "rules", "--configfile", config_path, cwd=workdir,
                       snakefile=workdir / "Snakefile")
    assert result.returncode == 0, result.stderr[-3000:]
    for rule in ("import_pretrained", "lm_quality", "score_heads", "head_roles", "prune_heads", "ranked_curve",
                 "lm_pruning_report"):
        assert rule in result.stdout, rule
    for absent in ("translate", "train_subwords", "train_baseline", "pruning_report "):
        assert f"\n{absent}" not in result.stdout, absent
    result = snakemake(*STAGE_INPUTS, "--cores", "1", "--configfile", config_path, cwd=workdir,
                       snakefile=workdir / "Snakefile")
    assert result.returncode == 0, result.stderr[-3000:]
    results = workdir / "results/toy"
    record = json.loads((results / "baseline/training.json").read_text())
    assert record["family"] == "bert" and record["model_kind"] == "encoder_only"

    scores = run_stages(results, config, "all")
    assert scores["sentences"] == 40 and 0 < scores["tokens"] < 40 * 20 and scores["perplexity"] > 1
    heads = pd.read_parquet(results / "heads/scores.parquet")
    assert set(heads["type"]) == {"enc_self"} and len(heads) == 2 * 4
    assert heads.groupby("layer")["lrp"].sum().to_numpy() == pytest.approx([1.0, 1.0])
    roles = pd.read_csv(results / "syntax/roles.csv")
    assert len(roles) == 2 * 4 and "sink_share" in roles.columns and "induction_score" not in roles.columns
    gates = json.loads((results / "prune/all/lambda_2/gates.json").read_text())
    assert set(gates["retained"]) == {"enc_self"}
    export = json.loads((results / "prune/all/lambda_2/physical/summary.json").read_text())
    assert sum(export["heads"]["enc_self"]) == gates["retained"]["enc_self"]


@pytest.mark.slow
def test_what_a_language_model_experiment_cannot_have_is_a_config_error_with_the_fix(tmp_path):
    """Every problem at once, one experiment per mistake (one dry run: each costs a second or two)."""
    config = lm_config(make_toy_mirror(tmp_path), "Qwen/Qwen3-0.6B")  # a hub id: not checked offline
    good, pair = config["experiments"]["toy"], smoke_config(tmp_path / "mirror")["experiments"]["toy"]
    config["experiments"] = {
        "no_model": {k: v for k, v in good.items() if k != "pretrained"},
        "with_pairs": {**good, "train": pair["train"], "src_lang": "en"},
        "with_enc": {**good, "prune": {"lambdas": {"enc": [0, 0.1]}, "select": "best_dev_bleu"}},
        "lang_only": {**pair, "lang": "en"}}
    config["run"] = list(config["experiments"])
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for expected in ("'experiments.no_model.text': a language-model experiment analyses a pretrained",
                     "set pretrained: <hub id or local directory>",
                     "'experiments.with_pairs.train': not with text", "give the fine-tuning text as text.train",
                     "'experiments.with_pairs.src_lang': not with text", "give the text's language as lang",
                     "'experiments.with_enc.prune.lambdas.enc': a language model has one kind of attention",
                     "set prune.lambdas.enc: []", "'experiments.with_enc.prune.select': best_dev_bleu",
                     "set prune.select: last", "'experiments.lang_only.lang': only a language-model experiment"):
        assert expected in output, expected
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_language_model_experiment_without_lang_is_a_config_error(tmp_path):
    config = lm_config(make_toy_mirror(tmp_path), "Qwen/Qwen3-0.6B")
    del config["experiments"]["toy"]["lang"]
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(tmp_path / "c.yaml", config), cwd=tmp_path)
    assert result.returncode != 0
    assert "'experiments.toy': 'lang' is a required property" in result.stdout + result.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_the_shipped_gpt2_experiment_plans_in_a_dry_run(tmp_path):
    """gpt2_en (config/config.yaml) names a hub id: planned without a network (nothing loads the
    model before the import job), perplexity where a translation experiment has BLEU."""
    config = shipped_config()
    config["run"] = ["gpt2_en"]
    config["mirror"] = None
    result = snakemake("-n", "--cores", "2", "--quiet", "rules", "--configfile",
                       write_config(tmp_path / "c.yaml", config), cwd=tmp_path, env={"HEADCOUNT_MIRROR": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2
                and line.split()[1].isdigit())
    # baseline and 4 pruned models on one test set (the pruning table's), the baseline on the other
    assert jobs["import_pretrained"] == "1" and jobs["lm_quality"] == "6" and jobs["prune_heads"] == "4"
    assert jobs["lm_pruning_report"] == "1" and jobs["ranked_curve"] == "1"
    assert jobs["atlas"] == "1"  # `all` builds a language model's head atlas too
    for absent in ("translate", "score", "pruning_report", "train_subwords", "train_baseline"):
        assert absent not in jobs, absent


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_the_pruning_table_and_ranked_curve_of_a_language_model_read_perplexity(tmp_path, family):
    """What rules lm_quality, ranked_curve and lm_pruning_report run, in-process on a tiny causal and
    masked LM: perplexity with each sentence's NLL, the Michel curve in perplexity, and the pruning
    table with the NLL difference's paired bootstrap interval (a 'pruned' model equal to the
    baseline differs by 0)."""
    from headcount.models.loading import import_pretrained
    from headcount.pipeline.lm_quality import lm_pruning_report, score_text
    from headcount.pipeline.pruning_runs import ranked_curve
    from headcount.testing import tiny_lm

    lines = toy_corpus(60, seed=1)[0]
    source = getattr(tiny_lm, f"write_tiny_{family}")(tmp_path / family, lines)
    model, tokenizer = tmp_path / "model.pt", tmp_path / "tokenizer"
    import_pretrained(source, model, tokenizer)
    text = tmp_path / "test.txt"
    text.write_text("".join(line + "\n" for line in lines[:20]), encoding="utf-8")
    scores, nll = tmp_path / "scores.json", tmp_path / "scores.nll.tsv"
    record = score_text(str(model), str(tokenizer), str(text), "test", 500, str(scores), str(nll), device="cpu",
                        log=lambda _: None)
    assert record["sentences"] == 20 and record["perplexity"] == pytest.approx(np.exp(record["nll"]))
    per_sentence = pd.read_csv(nll, sep="\t")
    assert per_sentence["tokens"].sum() == record["tokens"] > 0

    kind = "dec_self" if family == "gpt2" else "enc_self"
    heads = pd.DataFrame([{"type": kind, "layer": layer, "head": head, "michel": layer * 4 + head}
                          for layer in range(2) for head in range(4)])
    heads.to_parquet(tmp_path / "heads.parquet")
    curve = ranked_curve(str(model), str(tmp_path / "heads.parquet"), str(tokenizer), str(tokenizer), str(text),
                         str(text), "all", 0.5, {"max_tokens": 500}, False, str(tmp_path / "all/michel.tsv"),
                         device="cpu", log=lambda _: None, translations_out=str(tmp_path / "michel.jsonl"))
    assert curve["retained_total"].tolist() == [8, 4]
    assert curve["perplexity"].iloc[0] == pytest.approx(record["perplexity"])

    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"setting": "all", "lambda": 0.0, "control": True, "retained": {kind: 8},
                                 "steps": {"total": 6}}))
    table = lm_pruning_report(str(scores), str(nll), [str(gates)], [str(scores)], [str(nll)],
                              [str(tmp_path / "all/michel.tsv")], str(tmp_path / "pruning.tsv"),
                              str(tmp_path / "pruning.md"), "toy", log=lambda _: None)
    row = table.iloc[0]
    assert row["lam"] == 0 and row["delta_nll"] == row["delta_nll_low"] == row["delta_nll_high"] == 0
    assert row["perplexity"] == pytest.approx(record["perplexity"])
    markdown = (tmp_path / "pruning.md").read_text()
    assert "perplexity (lower is better)" in markdown and "## Ranked: michel" in markdown


def test_the_score_stage_says_why_a_model_has_no_lrp():
    """An architecture LRP does not reproduce (lrp.LRPNotImplemented): the reason the head-score
    stage logs when it leaves the lrp column out."""
    from headcount.models.lrp import LRPNotImplemented
    from headcount.pipeline.head_scores import _lrp_unavailable

    class NoLRP:
        def lrp_forward(self):
            raise LRPNotImplemented("sliding-window attention")

    class WithLRP:
        def lrp_forward(self):
            return object()

    assert _lrp_unavailable(NoLRP()) == "sliding-window attention"
    assert _lrp_unavailable(WithLRP()) is None


@pytest.mark.parametrize("model_dir", [TRAINED_GPT2, TRAINED_QWEN2], ids=["gpt2", "qwen2"])
def test_headcounts_nll_of_a_trained_causal_lm_is_the_trainers_own(model_dir):
    """The Trainer's evaluation loss (one line a batch: the mean over lines of each line's mean
    NLL) on sentences of our own, recorded when it trained the model, recomputed by headcount's
    adapter, batching and perplexity code with several lines padded into one batch: GPT-2, and
    Qwen2 (grouped-query attention, rotary positions, no BOS of its own)."""
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer
    from headcount.training.perplexity import sentence_nll

    summary = json.loads((model_dir / "reference_summary.json").read_text())
    model = load_pretrained_lm(model_dir)
    ids = load_lm_tokenizer(model_dir).encode(summary["probe_lines"])
    nll, tokens = sentence_nll(model, ids, ids, max_tokens=400)
    assert float(np.mean(nll / tokens)) == pytest.approx(summary["trainer_probe_loss"], abs=1e-5)
    assert summary["trainer_eval_loss"] < 4.0  # trained: far below log(1000) = 6.9 on Multi30k's dev text


def test_headcounts_masked_nll_of_the_trained_bert_is_the_trainers_own():
    """The masked-LM counterpart: a BERT trained by the Trainer with transformers' own masking
    collator, then evaluated by the Trainer (one line a batch) on headcount's fixed, seeded masking
    of sentences of our own; headcount's adapter, batching (several lines padded into one batch)
    and perplexity code recompute that loss from the text."""
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer
    from headcount.training.perplexity import sentence_nll

    summary = json.loads((TRAINED_BERT / "reference_summary.json").read_text())
    model = load_pretrained_lm(TRAINED_BERT)
    assert model.model_kind == "encoder_only"
    ids = load_lm_tokenizer(TRAINED_BERT).encode(summary["probe_lines"])
    nll, tokens = sentence_nll(model, ids, ids, max_tokens=400)
    assert tokens.min() >= 1 and tokens.sum() < sum(map(len, ids))  # the masked tokens alone are scored
    assert float(np.mean(nll / tokens)) == pytest.approx(summary["trainer_probe_loss"], abs=1e-5)
    assert summary["trainer_eval_loss"] < 0.7 * np.log(summary["recipe"]["vocab"])  # trained, not random

