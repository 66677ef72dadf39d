"""fairseq checkpoints read by headcount (models/fairseq.py), checked against fairseq's own outputs.

tests/data/fairseq/{pre,post}/ hold two tiny transformers trained by fairseq-train itself
(tools/fairseq_reference.py, 1,500 updates on a synthetic language pair; `recipe.json` says how)
and what fairseq computed with them (`reference.pt`): greedy translations from its
SequenceGenerator, every head's attention probabilities from its MultiheadAttention, each reference
token's log-probability, and the same with some heads' output-projection columns zeroed. "pre" is
pre-LN with fairseq's sinusoids and separate vocabularies; "post" is post-LN with learned positions,
one shared vocabulary, an embedding LayerNorm, GELU and no embedding scale. fairseq itself is not
needed here: these are its answers, recorded.

The architecture variants (transformer.py) are also checked on random models: the LRP forward
pass reproduces the model, conservation holds without biases, incremental decoding equals a full
pass.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import (
    masked_loglik_against_fairseq,
    random_batch,
    randomise_norms_and_biases,
    teacher_forced,
    tiny_config,
)
from torch import nn

from headcount.io import CheckpointError
from headcount.models.fairseq import FairseqUnsupported, load_fairseq_checkpoint, model_args, read_fairseq
from headcount.models.loading import load_model, open_tokenizer
from headcount.models.lrp import lrp_forward, make_rules, step_relevance
from headcount.models.transformer import Transformer
from headcount.training.decode import greedy_search

DATA = Path(__file__).parent / "data" / "fairseq"
KINDS = ("pre", "post")


@pytest.fixture(scope="module", params=KINDS)
def fairseq_model(request):
    """(kind, headcount's reading of fairseq's checkpoint, fairseq's recorded outputs)."""
    model, _ = read_fairseq(DATA / request.param / "checkpoint.pt")
    reference = torch.load(DATA / request.param / "reference.pt", weights_only=True)
    return request.param, model, reference


def test_the_architecture_is_read_as_written(fairseq_model):
    kind, model, _ = fairseq_model
    cfg = model.cfg
    assert (cfg.enc_layers, cfg.dec_layers, cfg.d_model, cfg.n_heads, cfg.d_ff) == (2, 2, 32, 4, 64)
    assert model.special.pad == 1 and model.special.bos == model.special.eos == 2
    expected = {"pre": dict(norm="pre", positions="fairseq_sinusoidal", layernorm_embedding=False,
                            activation="relu", scale_embeddings=True, share_all_embeddings=False),
                "post": dict(norm="post", positions="learned", layernorm_embedding=True, activation="gelu",
                             scale_embeddings=False, share_all_embeddings=True)}[kind]
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert model.generator.weight is model.tgt_embed.weight  # tied in both


@pytest.mark.slow
def test_greedy_translations_equal_fairseqs_sequence_generator(fairseq_model):
    _, model, ref = fairseq_model
    assert len(ref["sources"]) == 20
    same = 0
    for src, fairseq_tokens in zip(ref["sources"], ref["greedy"]):
        # fairseq lets max_len tokens come before the EOS it forces; headcount counts that EOS in.
        hyp = greedy_search(model, torch.tensor([src]), ref["max_len_a"], ref["max_len_b"] + 1)[0]
        same += hyp + [model.special.eos] == fairseq_tokens
    assert same == len(ref["sources"])
    assert len({tuple(g) for g in ref["greedy"]}) > 10  # a trained model: translations differ


def test_attention_probabilities_equal_fairseqs(fairseq_model, record_property):
    _, model, ref = fairseq_model
    worst = 0.0
    for i, recorded in enumerate(ref["attention"]):
        _, attention = teacher_forced(model, ref["sources"][i], ref["targets"][i], need_weights=True)
        for kind, layers in recorded.items():
            for mine, theirs in zip(attention[kind], layers):
                assert mine[0].shape == theirs.shape  # (H, Tq, Tk)
                worst = max(worst, float((mine[0] - theirs).abs().max()))
    record_property("attention_max_abs_error", worst)
    print(f"attention: largest error {worst:.2e}")
    assert worst < 1e-5


def test_log_likelihoods_equal_fairseqs(fairseq_model, record_property):
    _, model, ref = fairseq_model
    worst = max(float((teacher_forced(model, s, t)[0] - theirs).abs().max())
                for s, t, theirs in zip(ref["sources"], ref["targets"], ref["loglik"]))
    record_property("loglik_max_abs_error_per_token", worst)
    print(f"log-likelihoods: largest per-token error {worst:.2e}")
    assert worst < 1e-5


def test_masked_heads_equal_fairseq_with_those_output_columns_zeroed(fairseq_model, record_property):
    _, model, ref = fairseq_model
    worst, moved = masked_loglik_against_fairseq(model, ref)
    record_property("masked_loglik_max_abs_error_per_token", worst)
    assert moved > 1e-2  # the masked heads mattered, so agreement is not agreement by default
    assert worst < 1e-5


def test_removing_the_masked_heads_physically_gives_fairseqs_masked_outputs(fairseq_model):
    """Physical pruning (what export_pruned writes) of a fairseq-trained model: with the masked
    heads' weights gone, the log-likelihoods are fairseq's own with those heads' output columns
    zeroed, and the model is smaller."""
    import copy

    from headcount.pruning.removal import remove_pruned_heads

    _, model, ref = fairseq_model
    pruned = copy.deepcopy(model)
    masks = {kind: torch.ones(len(layers), model.cfg.n_heads) for kind, layers in pruned.attention_modules().items()}
    for kind, layer, head in ref["masked_heads"]:
        masks[kind][layer, head] = 0
    pruned.set_head_mask(masks)
    remove_pruned_heads(pruned)
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    worst = max(float((teacher_forced(pruned, s, t)[0] - theirs).abs().max())
                for s, t, theirs in zip(ref["sources"], ref["targets"], ref["loglik_masked"]))
    assert worst < 1e-5


def test_the_import_writes_a_checkpoint_and_tokenizer_the_stages_read(tmp_path, fairseq_model):
    from headcount.models.fairseq import import_fairseq

    kind, model, ref = fairseq_model
    folder = DATA / kind
    spm = {"src": str(folder / "src.model"), "tgt": str(folder / "tgt.model")}
    import_fairseq(folder / "checkpoint.pt", folder, spm, tmp_path / "model.pt", tmp_path / "tokenizer")
    loaded = load_model(tmp_path / "model.pt").eval()
    assert loaded.cfg == model.cfg
    source, target = open_tokenizer(tmp_path / "tokenizer", "source"), open_tokenizer(tmp_path / "tokenizer", "target")
    # The same ids as fairseq-preprocess gave the same lines (EOS is added by batching, as for every model).
    assert [ids + [model.special.eos] for ids in source.encode(ref["src_text"])] == ref["sources"]
    assert [ids + [model.special.eos] for ids in target.encode(ref["tgt_text"])] == ref["targets"]
    assert target.decode([t[:-1] for t in ref["targets"]]) == ref["tgt_text"]
    s, t = ref["sources"][0], ref["targets"][0]
    torch.testing.assert_close(teacher_forced(loaded, s, t)[0], teacher_forced(model, s, t)[0], rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Refusals


def _rewritten(tmp_path, change) -> Path:
    """A copy of the "pre" checkpoint with its args changed by `change(args)` (a dict)."""
    state = load_fairseq_checkpoint(DATA / "pre" / "checkpoint.pt")
    args = model_args(state)
    change(args)
    path = tmp_path / "changed.pt"
    torch.save({"model": state["model"], "args": argparse.Namespace(**args)}, path)
    return path


@pytest.mark.parametrize("change, named", [
    (lambda a: a.update(arch="lstm"), "architecture 'lstm'"),
    (lambda a: a.update(adaptive_softmax_cutoff="100,200"), "adaptive_softmax_cutoff"),
    (lambda a: a.update(decoder_normalize_before=False), "decoder_normalize_before"),
    (lambda a: a.update(activation_fn="tanh"), "activation_fn='tanh'"),
])
def test_what_the_reader_cannot_hold_is_refused_by_name(tmp_path, change, named):
    with pytest.raises(FairseqUnsupported, match=named):
        read_fairseq(_rewritten(tmp_path, change))


class Payload:
    """A pickled object that is not configuration: loading it would run its class's code."""


def test_a_checkpoint_with_any_other_pickled_object_is_refused_unread(tmp_path):
    state = load_fairseq_checkpoint(DATA / "pre" / "checkpoint.pt")
    torch.save({"model": state["model"], "args": argparse.Namespace(**model_args(state)), "extra": Payload()},
               tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match=r"refused, not loaded.*Payload"):
        read_fairseq(tmp_path / "evil.pt")


def test_an_omegaconf_configuration_reads_like_the_namespace():
    """tests/data/fairseq/omegaconf_cfg.pt: the "pre" model's configuration as fairseq 0.10 pickled it,
    an omegaconf DictConfig (made with omegaconf 2.0 in fairseq's environment); read here without
    omegaconf, through inert stand-ins."""
    state = load_fairseq_checkpoint(DATA / "omegaconf_cfg.pt")
    from_omegaconf = model_args(state)
    from_namespace = model_args(load_fairseq_checkpoint(DATA / "pre" / "checkpoint.pt"))
    keys = ("arch", "encoder_layers", "encoder_embed_dim", "encoder_normalize_before", "dropout", "activation_fn",
            "share_decoder_input_output_embed", "max_source_positions")
    assert {k: from_omegaconf[k] for k in keys} == {k: from_namespace[k] for k in keys}
    assert from_omegaconf["encoder_embed_dim"] == 32  # a nested encoder group, flattened


# --------------------------------------------------------------------------------------------
# The architecture variants on random models

VARIANTS = {
    "post-learned-lnemb-gelu-shared": dict(norm="post", positions="learned", layernorm_embedding=True,
                                           activation="gelu", scale_embeddings=False, share_all_embeddings=True,
                                           pad_id=1, bos_id=2, eos_id=2, unk_id=3),
    "pre-fairseq-sinusoids": dict(positions="fairseq_sinusoidal", pad_id=1, bos_id=2, eos_id=2, unk_id=3),
}


def variant(name: str, seed: int = 0, biases: bool = True) -> Transformer:
    torch.manual_seed(seed)
    cfg = tiny_config(src_vocab=14, tgt_vocab=14, d_model=8, n_heads=2, d_ff=16, enc_layers=2, dec_layers=2,
                      max_len=40)
    model = randomise_norms_and_biases(Transformer(dataclasses.replace(cfg, **VARIANTS[name])).double().eval(), biases)
    with torch.no_grad():  # learned positions and embeddings at unit scale, as trained ones are
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                module.weight.normal_(0, 1)
    return model


@pytest.mark.parametrize("name", VARIANTS)
def test_lrp_forward_reproduces_each_variant(name):
    model = variant(name, seed=1)
    src, tgt_in = random_batch(model)
    logits, _ = model(src, tgt_in)
    logits[..., list(model.special.never_generated())] = float("-inf")
    for rule in ("ding", "attnlrp"):
        trace = lrp_forward(model, src, tgt_in, make_rules(rule))
        torch.testing.assert_close(trace.top_logit, logits.max(dim=-1).values, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", VARIANTS)
def test_lrp_conserves_relevance_without_biases_in_each_variant(name):
    model = variant(name, seed=2, biases=False)
    src, tgt_in = random_batch(model)
    result = step_relevance(model, src, tgt_in, rule="ding")
    for cut, total in result.cuts.items():
        torch.testing.assert_close(total[result.valid], torch.ones_like(total[result.valid]), rtol=0, atol=1e-9,
                                   msg=cut)


@pytest.mark.parametrize("name", VARIANTS)
def test_incremental_decoding_equals_a_full_pass_in_each_variant(name):
    model = variant(name, seed=3)
    src, tgt_in = random_batch(model)
    memory, src_pad, _ = model.encode(src)
    full, _, _ = model.decode(tgt_in, memory, src_pad)
    cache = model.new_cache()
    steps = [model.decode(tgt_in[:, t:t + 1], memory, src_pad, cache=cache, start=t)[0] for t in range(tgt_in.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)


def test_a_headcount_checkpoint_from_another_run_imports_with_its_sentencepiece_models(tmp_path):
    """`pretrained: {family: headcount, checkpoint, sentencepiece}`: a model trained elsewhere (here a
    random one sized to two sentencepiece models) becomes the baseline with its own tokenizer."""
    import json

    from headcount.data.subwords import Segmenter
    from headcount.io import HeadcountError
    from headcount.pipeline.training_runs import import_pretrained_baseline

    spm = {"src": str(DATA / "pre" / "src.model"), "tgt": str(DATA / "pre" / "tgt.model")}
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab=len(Segmenter(spm["src"])), tgt_vocab=len(Segmenter(spm["tgt"]))))
    model.save(tmp_path / "trained.pt")
    source = {"family": "headcount", "checkpoint": str(tmp_path / "trained.pt"), "sentencepiece": spm}
    summary = import_pretrained_baseline(source, str(tmp_path / "model.pt"), str(tmp_path / "training.json"),
                                         str(tmp_path / "tokenizer"), "en", "de", log=lambda _: None)
    assert summary["family"] == "headcount" and json.loads((tmp_path / "training.json").read_text())["arch"]
    loaded = load_model(tmp_path / "model.pt")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    line = "some text here"
    assert open_tokenizer(tmp_path / "tokenizer", "target").encode([line]) == Segmenter(spm["tgt"]).encode([line])
    from headcount.data.subwords import train_bpe

    (tmp_path / "text.txt").write_text("".join(f"word{i} other{i % 7} text\n" for i in range(200)))
    other = str(tmp_path / "other.model")  # another run's model, of another size
    train_bpe(tmp_path / "text.txt", other, vocab_size=40)
    assert len(Segmenter(other)) != len(Segmenter(spm["src"]))
    with pytest.raises(HeadcountError, match="not its model"):
        import_pretrained_baseline({**source, "sentencepiece": {"src": other, "tgt": spm["tgt"]}},
                                   str(tmp_path / "m2.pt"), str(tmp_path / "t2.json"), str(tmp_path / "tok2"),
                                   "en", "de", log=lambda _: None)
