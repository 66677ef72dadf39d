"""transformers' FSMT, its port of fairseq's WMT19 models, through headcount's adapter
(models/hf.py), checked against fairseq's own outputs for a model that fairseq-train trained.

tests/data/fairseq/fsmt/ holds a tiny transformer of fairseq's own defaults, the WMT19 models'
architecture at toy size (post-LN, sinusoids, separate vocabularies and an output layer of its
own, ReLU, scaled embeddings: tools/fairseq_reference.py --arch-preset tiny-fsmt, 1,500 updates
on a synthetic language pair), and what fairseq computed with it (`reference.pt`). Its weights
are renamed into FSMT's layout, as transformers' conversion of the WMT19 checkpoints renames them
(`model.` before every name; the sinusoid tables are FSMT's own), and headcount's FSMT adapter
must give fairseq's greedy translations, attention probabilities and log-likelihoods, with and
without some heads masked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import masked_loglik_against_fairseq, teacher_forced

from headcount.models.fairseq import load_fairseq_checkpoint, model_args
from headcount.training.decode import greedy_search

transformers = pytest.importorskip("transformers")

DATA = Path(__file__).parent / "data" / "fairseq" / "fsmt"


def fsmt_from_fairseq(path: Path):
    """headcount's adapter around an FSMTForConditionalGeneration holding a fairseq checkpoint's
    weights."""
    from headcount.models.hf import HFSeq2Seq

    state = load_fairseq_checkpoint(path)
    args, weights = model_args(state, path), state["model"]
    assert not args.get("encoder_normalize_before") and not args.get("share_decoder_input_output_embed")
    config = transformers.FSMTConfig(
        langs=["src", "tgt"], src_vocab_size=weights["encoder.embed_tokens.weight"].shape[0],
        tgt_vocab_size=weights["decoder.embed_tokens.weight"].shape[0], d_model=args["encoder_embed_dim"],
        encoder_layers=args["encoder_layers"], decoder_layers=args["decoder_layers"],
        encoder_attention_heads=args["encoder_attention_heads"],
        decoder_attention_heads=args["decoder_attention_heads"],
        encoder_ffn_dim=args["encoder_ffn_embed_dim"], decoder_ffn_dim=args["decoder_ffn_embed_dim"],
        activation_function="relu", scale_embedding=True, tie_word_embeddings=False, max_position_embeddings=1024,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0)
    hf = transformers.FSMTForConditionalGeneration(config)
    renamed = {f"model.{k}": v for k, v in weights.items() if "embed_positions" not in k and not k.endswith("version")}
    missing, unexpected = hf.load_state_dict(renamed, strict=False)
    assert not unexpected, unexpected
    assert all("embed_positions" in k for k in missing), missing  # FSMT's sinusoids, computed as fairseq's
    return HFSeq2Seq(hf.eval()).eval()


@pytest.fixture(scope="module")
def converted():
    return fsmt_from_fairseq(DATA / "checkpoint.pt"), torch.load(DATA / "reference.pt", weights_only=True)


def test_the_converted_model_is_fsmt_with_fairseqs_ids(converted):
    model, _ = converted
    assert model.family.name == "fsmt"
    assert model.special.pad == 1 and model.special.bos == model.special.eos == 2


@pytest.mark.slow
def test_greedy_translations_equal_fairseqs_sequence_generator(converted):
    model, ref = converted
    same = 0
    for src, fairseq_tokens in zip(ref["sources"], ref["greedy"]):
        # fairseq lets max_len tokens come before the EOS it forces; headcount counts that EOS in.
        hyp = greedy_search(model, torch.tensor([src]), ref["max_len_a"], ref["max_len_b"] + 1)[0]
        same += hyp + [model.special.eos] == fairseq_tokens
    assert same == len(ref["sources"]) == 20
    assert len({tuple(g) for g in ref["greedy"]}) > 10  # a trained model: translations differ


def test_attention_probabilities_equal_fairseqs(converted):
    model, ref = converted
    worst = 0.0
    for i, recorded in enumerate(ref["attention"]):
        _, attention = teacher_forced(model, ref["sources"][i], ref["targets"][i], need_weights=True)
        for kind, layers in recorded.items():
            for mine, theirs in zip(attention[kind], layers, strict=True):
                assert mine[0].shape == theirs.shape  # (H, Tq, Tk)
                worst = max(worst, float((mine[0] - theirs).abs().max()))
    print(f"attention: largest error {worst:.2e}")
    assert worst < 1e-5


def test_log_likelihoods_with_and_without_masked_heads_equal_fairseqs(converted):
    model, ref = converted
    worst = max(float((teacher_forced(model, s, t)[0] - theirs).abs().max())
                for s, t, theirs in zip(ref["sources"], ref["targets"], ref["loglik"]))
    assert worst < 1e-5
    masked, moved = masked_loglik_against_fairseq(model, ref)
    print(f"log-likelihoods: largest error {worst:.2e}, with heads masked {masked:.2e} "
          f"(masking moved them {moved:.2f})")
    assert moved > 1e-2  # the masked heads mattered, so agreement is not agreement by default
    assert masked < 1e-5
