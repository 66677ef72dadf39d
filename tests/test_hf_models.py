"""The transformers adapter (hf_models.py, hf_lrp.py) on tiny randomly initialised models of each
family, built from configs, with Marian and FSMT tokenizers trained here on the toy corpus: nothing
is downloaded."""

import copy
import json
import math

import numpy as np
import pytest
import torch
from conftest import module_state, toy_corpus
from torch import nn

transformers = pytest.importorskip("transformers")

from headcount.data.special import SPECIAL_PIECE  # noqa: E402
from headcount.io import HeadcountError  # noqa: E402
from headcount.models.gates import attach_gates  # noqa: E402
from headcount.models.hf import (  # noqa: E402
    HFSeq2Seq,
    HFTokenizer,
    PretrainedModelUnavailable,
    import_pretrained,
    load_pretrained,
    load_tokenizers,
)
from headcount.models.loading import load_model, open_tokenizer  # noqa: E402
from headcount.models.lrp import make_rules  # noqa: E402
from headcount.models.seq2seq import ATTENTION_TYPES, HeadSlots, Seq2SeqWithHeads  # noqa: E402
from headcount.testing.tiny_seq2seq import write_tiny_fsmt, write_tiny_marian  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

FAMILIES = ("marian", "bart", "mbart", "m2m_100", "t5", "mt5", "fsmt")
LRP_FAMILIES = ("marian", "bart", "mbart", "m2m_100", "t5", "mt5", "fsmt")
T5_LAYOUT = ("t5", "mt5")


# --------------------------------------------------------------------------------------------
# Tiny models and a tokenizer


def tiny_hf(family: str, vocab: int = 40, d_model: int = 16, heads: int = 4, ffn: int = 32, layers: int = 2,
            seed: int = 0, biases: bool = True, pad: int | None = None, gated: bool = False, tied: bool = True):
    """A transformers model of the family, random weights with non-trivial biases and gains, eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                  encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                  decoder_ffn_dim=ffn, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                  activation_dropout=0.0)
    if family == "marian":
        pad = vocab - 1 if pad is None else pad
        config = transformers.MarianConfig(**common, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                                           activation_function="swish", scale_embedding=True)
        hf = transformers.MarianMTModel(config)
    elif family == "bart":
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig(**common))
    elif family == "mbart":
        hf = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**common, scale_embedding=True))
    elif family == "m2m_100":
        hf = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**common))
    elif family == "fsmt":  # a source vocabulary of its own, larger than the target's (batch draws from the target's)
        sizes = dict(src_vocab_size=vocab + 7, tgt_vocab_size=vocab)
        config = transformers.FSMTConfig(langs=["en", "de"], **sizes, **{k: v for k, v in common.items()
                                                                         if k != "vocab_size"})
        hf = transformers.FSMTForConditionalGeneration(config)
    elif family == "mt5":  # gated feed-forward and an untied output layer, as mT5 checkpoints have
        config = transformers.MT5Config(vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=ffn,
                                        num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                                        relative_attention_num_buckets=8, dropout_rate=0.0,
                                        feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=0,
                                        eos_token_id=1, decoder_start_token_id=0)
        hf = transformers.MT5ForConditionalGeneration(config)
    else:
        config = transformers.T5Config(vocab_size=vocab, d_model=d_model, d_kv=d_model // heads, d_ff=ffn,
                                       num_layers=layers, num_decoder_layers=layers, num_heads=heads,
                                       relative_attention_num_buckets=8, dropout_rate=0.0,
                                       feed_forward_proj="gated-gelu" if gated else "relu", pad_token_id=0,
                                       eos_token_id=1, tie_word_embeddings=tied)
        hf = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, nn.LayerNorm) or type(module).__name__ in ("T5LayerNorm", "MT5LayerNorm"):
                module.weight.uniform_(0.5, 1.5)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0, 0.2) if biases else module.bias.zero_()
            elif isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.2) if biases else module.bias.zero_()
        if hasattr(hf, "final_logits_bias"):
            hf.final_logits_bias.normal_(0, 0.5) if biases else hf.final_logits_bias.zero_()
    return hf.eval()


def tiny(family: str, **kwargs) -> HFSeq2Seq:
    return HFSeq2Seq(tiny_hf(family, **kwargs)).eval()


def toy_roles(model, source, src_lines: list[str], tmp_path):
    """Head roles (positional, rare-token, syntactic) of `model` on toy lines through its tokenizer."""
    from conftest import toy_conllu

    from headcount.analysis.roles.collect import syntactic_statistics, text_statistics
    from headcount.analysis.roles.registry import assign_roles
    from headcount.analysis.roles.statistics import count_words
    from headcount.data.parses import read_conllu

    (tmp_path / "toy.conllu").write_text(toy_conllu(src_lines[:12]), encoding="utf-8")
    text = text_statistics(model, source, src_lines, count_words(src_lines, lowercase=False), lowercase=False,
                           log=lambda line: None)
    parsed = syntactic_statistics(model, source, read_conllu(tmp_path / "toy.conllu"), lowercase=False,
                                  log=lambda line: None)
    return assign_roles(text["positional"], parsed["syntactic"], text["rare"])


def batch(model: HFSeq2Seq, B: int = 3, S: int = 6, T: int = 5, seed: int = 0):
    """Source ids + EOS, padded; decoder input from the model's start token, padded."""
    g = torch.Generator().manual_seed(seed)
    sp, vocab = model.special, model.config.vocab_size
    ordinary = torch.tensor([i for i in range(vocab) if i not in (sp.pad, sp.bos, sp.eos, 0, 1, 2, 3)])
    src = ordinary[torch.randint(len(ordinary), (B, S), generator=g)]
    tgt = ordinary[torch.randint(len(ordinary), (B, T), generator=g)]
    src_lengths, tgt_lengths = [S, S - 2, S - 1][:B], [T, T - 1, T - 2][:B]
    for b in range(B):
        src[b, src_lengths[b] - 1] = sp.eos
        src[b, src_lengths[b]:] = sp.pad
        tgt[b, 0] = sp.bos
        tgt[b, tgt_lengths[b]:] = sp.pad
    return src, tgt


@pytest.fixture(scope="module")
def tiny_marian_dir(tmp_path_factory):
    """A stand-in for an opus-mt directory: tokenizer (source.spm, target.spm, vocab.json) trained
    on the toy corpus, random MarianMT weights, as save_pretrained writes them."""
    src, tgt = toy_corpus(400, seed=11)
    return write_tiny_marian(tmp_path_factory.mktemp("opus-mt-toy"), src, tgt, vocab_size=40)


@pytest.fixture(scope="module")
def marian_tokenizer(tiny_marian_dir):
    return transformers.MarianTokenizer.from_pretrained(str(tiny_marian_dir))


def marian_for(tokenizer, **kwargs) -> HFSeq2Seq:
    model = tiny("marian", vocab=len(tokenizer), pad=tokenizer.pad_token_id, **kwargs)
    assert model.special.eos == tokenizer.eos_token_id
    return model


# --------------------------------------------------------------------------------------------
# The forward pass against transformers' own


def hf_reference(model: HFSeq2Seq, src, tgt_in):
    """transformers' own full forward pass. use_cache=False: FSMT's decoder is causal only without
    a cache (with its default use_cache=True every target position sees the whole target)."""
    pad = model.special.pad
    return model.hf(input_ids=src, attention_mask=src.ne(pad).long(), decoder_input_ids=tgt_in,
                    decoder_attention_mask=torch.ones_like(tgt_in), output_attentions=True, use_cache=False)


@pytest.mark.parametrize("family", [*FAMILIES, "t5-untied"])  # T5 v1.1 and Flan-T5 save untied embeddings
def test_logits_and_probabilities_match_transformers(family):
    model = tiny("t5", tied=False) if family == "t5-untied" else tiny(family)
    assert isinstance(model, Seq2SeqWithHeads)
    assert all(isinstance(m, HeadSlots) for mods in model.attention_modules().values() for m in mods)
    src, tgt_in = batch(model)
    with torch.no_grad():
        logits, attn = model(src, tgt_in, need_weights=True)
        ref = hf_reference(model, src, tgt_in)
        plain, none = model(src, tgt_in)
    assert none is None
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=0)
    torch.testing.assert_close(plain, ref.logits, rtol=0, atol=0)
    B, S, T = src.shape[0], src.shape[1], tgt_in.shape[1]
    for kind, theirs, shape in (("enc_self", ref.encoder_attentions, (B, 4, S, S)),
                                ("dec_self", ref.decoder_attentions, (B, 4, T, T)),
                                ("dec_enc", ref.cross_attentions, (B, 4, T, S))):
        assert len(attn[kind]) == 2
        for mine, reference in zip(attn[kind], theirs):
            assert mine.shape == shape
            torch.testing.assert_close(mine, reference, rtol=0, atol=0)
            torch.testing.assert_close(mine.sum(-1), torch.ones(shape[:-1]))
    # Padded source keys get no attention; future target positions neither.
    assert (attn["dec_enc"][0][1, :, :, S - 2:] == 0).all()
    assert (attn["dec_self"][1][0].triu(1) == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_special_ids(family):
    model = tiny(family)
    expected = {"marian": (39, 39, 0), "bart": (1, 2, 2), "mbart": (1, 2, 2), "m2m_100": (1, 2, 2),
                "t5": (0, 0, 1), "mt5": (0, 0, 1), "fsmt": (1, 2, 2)}[family]
    assert (model.special.pad, model.special.bos, model.special.eos) == expected
    assert model.special.eos not in model.special.never_generated()
    assert model.d_model == 16 and model.max_positions >= 64


# --------------------------------------------------------------------------------------------
# Incremental decoding


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decoding_equals_full_decoding(family):
    model = tiny(family)
    src, tgt_in = batch(model)
    with torch.no_grad():
        memory, src_pad, _ = model.encode(src)
        full, full_self, full_cross = model.decode(tgt_in, memory, src_pad, need_weights=True)
        cache = model.new_cache()
        # The rows of real tokens: what a padding token computes is no part of the contract (FSMT
        # gives padding the pad position in a full pass, the cache length + 1 in a step; no real
        # token sees it either way).
        real = model.special.decoder_positions(tgt_in)
        for t in range(tgt_in.shape[1]):
            hidden, self_probs, cross_probs = model.decode(tgt_in[:, t : t + 1], memory, src_pad, need_weights=True,
                                                           cache=cache, start=t)
            rows = real[:, t]
            torch.testing.assert_close(hidden[rows, 0], full[rows, t], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(model.logits(hidden)[rows, 0], model.logits(full)[rows, t], rtol=1e-5,
                                       atol=1e-5)
            for layer in range(2):
                torch.testing.assert_close(self_probs[layer][rows, :, 0], full_self[layer][rows, :, t, : t + 1],
                                           rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(cross_probs[layer][rows, :, 0], full_cross[layer][rows, :, t],
                                           rtol=1e-5, atol=1e-6)
        assert not real.all()  # padding was there to be skipped
        with pytest.raises(ValueError, match="start"):
            model.decode(tgt_in[:, :1], memory, src_pad, cache=cache, start=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_reorder_cache(family):
    """Two steps on 3 sentences, keep rows [2, 0, 0] (beam search: fewer rows, repeated), two more
    steps: as if those rows had been decoded alone."""
    model = tiny(family)
    src, tgt_in = batch(model, B=3, T=4)
    rows = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory, src_pad, _ = model.encode(src)
        cache = model.new_cache()
        model.decode(tgt_in[:, :2], memory, src_pad, cache=cache)
        model.reorder_cache(cache, rows)
        after, _, _ = model.decode(tgt_in[rows, 2:], memory[rows], src_pad[rows], cache=cache, start=2)
        alone, _, _ = model.decode(tgt_in[rows], memory[rows], src_pad[rows])
    real = model.special.decoder_positions(tgt_in[rows])[:, 2:]  # padding: see the test above
    assert real.any() and not real.all()
    torch.testing.assert_close(after[real], alone[:, 2:][real], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_search_matches_transformers_generate(family):
    """headcount's greedy search through the interface (cache, reorder, the ids never generated,
    EOS forced at the length limit) picks the tokens transformers' own generate picks."""
    from headcount.training.decode import greedy_search

    model = tiny(family, d_model=32, ffn=64, seed=4)
    with torch.no_grad():
        for p in model.parameters():  # sharper distributions: outputs that depend on the input
            if p.dim() == 2:
                p.mul_(3.0)
    src, _ = batch(model)
    sp = model.special
    ours = greedy_search(model, src, max_len_a=0, max_len_b=8)  # 7 tokens, then EOS forced
    out = model.hf.generate(input_ids=src, attention_mask=src.ne(sp.pad).long(), max_new_tokens=8, num_beams=1,
                            do_sample=False, no_repeat_ngram_size=0, repetition_penalty=1.0, min_length=0,
                            forced_bos_token_id=None, forced_eos_token_id=sp.eos,
                            bad_words_ids=[[i] for i in sp.never_generated()], decoder_start_token_id=sp.bos,
                            eos_token_id=sp.eos, pad_token_id=sp.pad)
    theirs = [row[1:] for row in out.tolist()]  # without the start token (BART's is its EOS)
    theirs = [row[: row.index(sp.eos)] if sp.eos in row else row for row in theirs]
    assert ours == theirs


@pytest.mark.parametrize("family", ["mbart", "m2m_100"])
def test_search_forces_the_target_language_tag_as_generate_does(family):
    """A multilingual model's target-language tag (SpecialIds.forced): greedy search matches
    generate with forced_bos_token_id, and beam search starts every hypothesis with the tag."""
    import dataclasses

    from headcount.training.decode import beam_search, greedy_search

    model = tiny(family, d_model=32, ffn=64, seed=4)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    src, _ = batch(model)
    plain = greedy_search(model, src, max_len_a=0, max_len_b=8)
    lang = 3  # a token the unforced search does not start with
    assert all(not row or row[0] != lang for row in plain)
    model.special = dataclasses.replace(model.special, forced=(lang,))
    sp = model.special
    ours = greedy_search(model, src, max_len_a=0, max_len_b=8)  # the tag, 7 tokens, then EOS forced
    out = model.hf.generate(input_ids=src, attention_mask=src.ne(sp.pad).long(), max_new_tokens=9, num_beams=1,
                            do_sample=False, no_repeat_ngram_size=0, repetition_penalty=1.0, min_length=0,
                            forced_bos_token_id=lang, forced_eos_token_id=sp.eos,
                            bad_words_ids=[[i] for i in sp.never_generated()], decoder_start_token_id=sp.bos,
                            eos_token_id=sp.eos, pad_token_id=sp.pad)
    theirs = [row[1:] for row in out.tolist()]
    theirs = [row[: row.index(sp.eos)] if sp.eos in row else row for row in theirs]
    assert ours == theirs and all(row[0] == lang for row in ours)
    assert beam_search(model, src, beam=1, max_len_a=0, max_len_b=8) == ours
    assert all(row[0] == lang for row in beam_search(model, src, beam=4, max_len_a=0, max_len_b=8))


def test_forced_prefix_survives_a_checkpoint(tmp_path):
    from headcount.models.loading import load_model

    model = HFSeq2Seq(tiny_hf("m2m_100"), forced=(5,)).eval()
    model.save(tmp_path / "model.pt")
    assert load_model(tmp_path / "model.pt").special.forced == (5,)
    assert tiny("bart").special.forced == ()  # a model that names no forced token gets none


# --------------------------------------------------------------------------------------------
# Head masks, gates, physical pruning


def zero_head_columns(model: HFSeq2Seq, kind: str, layer: int, head: int, scale: float = 0.0) -> None:
    slot = model.attention_modules()[kind][layer]
    Dh = slot.head_dim
    with torch.no_grad():
        slot.proj.weight[:, head * Dh : (head + 1) * Dh] *= scale


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_head_mask_equals_zeroed_output_columns(family):
    model = tiny(family)
    src, tgt_in = batch(model)
    reference = copy.deepcopy(model)
    masks = {kind: torch.ones(2, 4) for kind in ATTENTION_TYPES}
    for kind, layer, head in (("enc_self", 0, 1), ("dec_self", 1, 3), ("dec_enc", 0, 0), ("dec_enc", 1, 2)):
        masks[kind][layer, head] = 0.0
        zero_head_columns(reference, kind, layer, head)
    model.set_head_mask(masks)
    for kind in ATTENTION_TYPES:
        torch.testing.assert_close(model.head_mask()[kind], masks[kind])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in)[0], reference(src, tgt_in)[0], rtol=1e-6, atol=1e-6)
        assert not torch.allclose(model(src, tgt_in)[0], tiny(family)(src, tgt_in)[0])
    with pytest.raises(ValueError, match="head mask"):
        model.set_head_mask({"enc_self": torch.ones(2, 3)})


@pytest.mark.parametrize("family", FAMILIES)
def test_gates_multiply_each_head_and_hook_sees_contexts(family):
    model = tiny(family)
    src, tgt_in = batch(model)
    reference = copy.deepcopy(model)
    gates = attach_gates(model, types=("dec_enc",))
    model.eval()  # the new gate modules too: their deterministic value
    values = torch.tensor([[0.0, 0.3, 1.0, 0.7], [0.5, 1.0, 0.0, 0.2]])
    with torch.no_grad():
        for g, row in zip(gates, values):
            # deterministic gate = clip(sigmoid(log_alpha) * 1.2 - 0.1, 0, 1); solve for log_alpha
            p = ((row + 0.1) / 1.2).clamp(1e-6, 1 - 1e-6)
            g.log_alpha.copy_(torch.log(p) - torch.log1p(-p))
    for layer, row in enumerate(values):
        torch.testing.assert_close(model.attention_modules()["dec_enc"][layer].gates(), row, rtol=1e-5, atol=1e-5)
        for h, gate in enumerate(model.attention_modules()["dec_enc"][layer].gates().tolist()):
            zero_head_columns(reference, "dec_enc", layer, h, scale=gate)
    seen = []
    slot = model.attention_modules()["enc_self"][1]
    handle = slot.head_context.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in)[0], reference(src, tgt_in)[0], rtol=1e-5, atol=1e-5)
    handle.remove()
    assert seen == [torch.Size([3, 4, src.shape[1], slot.head_dim])]
    # In training mode the gates are sampled, and gradients reach log alpha.
    torch.manual_seed(0)
    with torch.no_grad():
        for g in gates:
            g.log_alpha.zero_()
    model.train()
    loss = model(src, tgt_in)[0].logsumexp(-1).mean()
    loss.backward()
    assert all(g.log_alpha.grad is not None and g.log_alpha.grad.abs().sum() > 0 for g in gates)


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_heads_equals_masking(family):
    model = tiny(family)
    src, tgt_in = batch(model)
    keep = {("enc_self", 0): [0, 2], ("enc_self", 1): [3], ("dec_self", 0): [], ("dec_enc", 0): [],
            ("dec_enc", 1): [1, 2, 3]}
    masks = {kind: torch.ones(2, 4) for kind in ATTENTION_TYPES}
    for (kind, layer), heads in keep.items():
        masks[kind][layer] = torch.tensor([float(h in heads) for h in range(4)])
    model.set_head_mask(masks)
    pruned = copy.deepcopy(model)
    for (kind, layer), heads in keep.items():
        pruned.attention_modules()[kind][layer].keep_heads(heads)
    counts = pruned.head_counts()
    assert counts == {"enc_self": [2, 1], "dec_self": [0, 4], "dec_enc": [0, 3]}
    assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        logits, attn = pruned(src, tgt_in, need_weights=True)
        torch.testing.assert_close(logits, model(src, tgt_in)[0], rtol=1e-5, atol=1e-5)
        assert attn["enc_self"][1].shape[1] == 1 and attn["dec_self"][0].shape[1] == 0
        # Incremental decoding still works with a layer that has no heads left (its cache gets a dummy head).
        memory, src_pad, _ = pruned.encode(src)
        full, _, _ = pruned.decode(tgt_in, memory, src_pad)
        cache = pruned.new_cache()
        steps = [pruned.decode(tgt_in[:, t : t + 1], memory, src_pad, cache=cache, start=t)[0]
                 for t in range(tgt_in.shape[1])]
        real = pruned.special.decoder_positions(tgt_in)  # padding: see test_incremental_decoding_equals_full_decoding
        torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=1e-5, atol=1e-6)
    assert pruned.head_mask()["enc_self"].tolist() == [[1, 1], [1, 0]]
    pruned.set_head_mask(pruned.head_mask())  # the padded layout round-trips
    pruned.set_head_mask({"enc_self": torch.tensor([[0.0, 1.0], [1.0, 0.0]])})
    assert pruned.attention_modules()["enc_self"][1].head_mask.tolist() == [1.0]
    with pytest.raises(ValueError, match="zeros beyond"):
        pruned.set_head_mask({"enc_self": torch.tensor([[1.0, 1.0], [1.0, 1.0]])})


# --------------------------------------------------------------------------------------------
# Checkpoints and loading


@pytest.mark.parametrize("family", FAMILIES)
def test_save_and_load_round_trip_through_the_registry(family, tmp_path):
    model = tiny(family)
    src, tgt_in = batch(model)
    model.attention_modules()["enc_self"][1].keep_heads([0, 3])  # T5: heads 1 and 2 of its position bias go
    model.attention_modules()["dec_enc"][0].keep_heads([])
    gates = attach_gates(model, types=("dec_self",))
    model.eval()
    with torch.no_grad():
        gates[0].log_alpha.copy_(torch.tensor([-3.0, 0.5, 2.0, 0.1]))
    model.set_head_mask({"dec_self": torch.tensor([[1.0, 1, 0, 1], [1, 1, 1, 1]])})
    model.save(tmp_path / "model.pt", extra={"step": 7})
    loaded = load_model(tmp_path / "model.pt")
    assert isinstance(loaded, HFSeq2Seq) and loaded.family.name == family
    assert loaded.head_counts() == model.head_counts()
    torch.testing.assert_close(loaded.head_mask()["dec_self"], model.head_mask()["dec_self"])
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt_in)[0], model(src, tgt_in)[0], rtol=0, atol=0)
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["family"] == family and state["step"] == 7


def test_load_pretrained_from_a_local_directory(tmp_path, marian_tokenizer):
    hf = tiny_hf("marian", vocab=len(marian_tokenizer), pad=marian_tokenizer.pad_token_id)
    hf.save_pretrained(tmp_path / "opus-mt-toy")
    marian_tokenizer.save_pretrained(tmp_path / "opus-mt-toy")
    model = load_pretrained(tmp_path / "opus-mt-toy")
    source, target = load_tokenizers(tmp_path / "opus-mt-toy")
    assert not model.training and model.family.name == "marian"
    src, tgt_in = batch(model)
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in)[0], HFSeq2Seq(hf)(src, tgt_in)[0], rtol=0, atol=0)
    assert source.encode(["Big cat."]) == HFTokenizer(marian_tokenizer, "source").encode(["Big cat."])
    assert target.decode(target.encode(["Gross katze."])) == ["Gross katze."]


def test_import_pretrained_for_the_workflow(tiny_marian_dir, tmp_path):
    """What a stage does for `pretrained:`: a headcount checkpoint and local tokenizer files."""
    model = import_pretrained(tiny_marian_dir, tmp_path / "baseline/model.pt", tmp_path / "tokenizer")
    loaded = load_model(tmp_path / "baseline/model.pt")
    src, tgt_in = batch(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt_in)[0], model(src, tgt_in)[0], rtol=0, atol=0)
    assert torch.load(tmp_path / "baseline/model.pt", weights_only=True)["pretrained"]["source"] == str(tiny_marian_dir)
    lines = toy_corpus(5, seed=3)
    for side, text in zip(("source", "target"), lines):
        tok = open_tokenizer(tmp_path / "tokenizer", side)
        assert tok.encode(text) == open_tokenizer(tiny_marian_dir, side).encode(text)
        assert tok.decode(tok.encode(text)) == text
    segmenter = open_tokenizer(tiny_marian_dir / "source.spm", "source")  # a file: headcount's own kind
    assert type(segmenter).__name__ == "Segmenter"


def test_missing_model_gives_a_clear_error(tmp_path):
    with pytest.raises(PretrainedModelUnavailable) as error:
        load_pretrained("Helsinki-NLP/opus-mt-xx-yy", offline=True)
    message = str(error.value)
    assert "hf download Helsinki-NLP/opus-mt-xx-yy --local-dir" in message and "`pretrained:`" in message
    with pytest.raises(PretrainedModelUnavailable, match="does not exist"):
        load_pretrained(str(tmp_path / "nowhere"))
    with pytest.raises(PretrainedModelUnavailable, match="opus-mt-xx-yy"):
        load_tokenizers("Helsinki-NLP/opus-mt-xx-yy", offline=True)


@pytest.fixture(scope="module")
def tiny_m2m_dir(tmp_path_factory):
    """A multilingual model's directory: an M2M100 tokenizer (a sentencepiece model and vocab
    trained on the toy corpus, language tags after them) and random M2M100 weights."""
    import sentencepiece as spm

    directory = tmp_path_factory.mktemp("m2m-toy")
    src, tgt = toy_corpus(400, seed=11)
    (directory / "text.txt").write_text("\n".join(src + tgt) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(directory / "text.txt"), model_prefix=str(directory / "sp"),
                                   vocab_size=60, model_type="unigram", hard_vocab_limit=False, minloglevel=2,
                                   num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(directory / "sp.model"))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = transformers.M2M100Tokenizer(vocab_file=str(directory / "vocab.json"),
                                             spm_file=str(directory / "sp.model"), src_lang="en", tgt_lang="de")
    tokenizer.save_pretrained(str(directory))
    size = max(*tokenizer.get_vocab().values(), *tokenizer.lang_token_to_id.values()) + 1
    torch.manual_seed(2)  # a seed whose search output depends on the input
    config = transformers.M2M100Config(vocab_size=size, d_model=32, encoder_layers=2, decoder_layers=2,
                                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                       decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0)
    hf = transformers.M2M100ForConditionalGeneration(config)
    with torch.no_grad():
        for p in hf.parameters():  # sharper distributions: outputs that depend on the input
            if p.dim() == 2:
                p.mul_(3.0)
        hf.get_input_embeddings().weight[len(vocab):] *= 0.05  # tags: near-zero logits, text is picked
    hf.save_pretrained(str(directory))
    return directory


def test_a_multilingual_model_translates_as_generate_does(tiny_m2m_dir, tmp_path):
    """Language tags end to end: the source tag before the text, the target tag forced by search,
    both from the tokenizer; headcount's greedy translation of imported checkpoint matches
    transformers' generate on the tokenizer's own input."""
    from headcount.data.batching import source_tensor
    from headcount.training.decode import greedy_search

    model = import_pretrained(tiny_m2m_dir, tmp_path / "model.pt", tmp_path / "tokenizer", src_lang="en",
                              tgt_lang="de")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tiny_m2m_dir), src_lang="en", tgt_lang="de")
    en, de = hf_tok.get_lang_id("en"), hf_tok.get_lang_id("de")
    assert load_model(tmp_path / "model.pt").special.forced == (de,) == model.special.forced
    source, target = open_tokenizer(tmp_path / "tokenizer", "source"), open_tokenizer(tmp_path / "tokenizer", "target")
    lines, tgt_lines = toy_corpus(4, seed=5)
    ids = source.encode(lines)
    assert all(row[0] == en for row in ids) and target.encode(tgt_lines)[0][0] == de
    for line, row in zip(lines, ids):
        pieces = source.pieces(line)
        assert len(pieces) == len(row) and pieces[0] == SPECIAL_PIECE
    src = source_tensor(ids, model.special)
    theirs_in = hf_tok(lines, return_tensors="pt", padding=True)
    assert src.tolist() == theirs_in["input_ids"].tolist()  # the tag, the text, EOS, padding
    ours = greedy_search(model, src, max_len_a=0, max_len_b=8)
    out = model.hf.generate(**theirs_in, forced_bos_token_id=de, max_new_tokens=9, num_beams=1, do_sample=False,
                            forced_eos_token_id=model.special.eos,
                            bad_words_ids=[[i] for i in model.special.never_generated()])
    theirs = [row[1:] for row in out.tolist()]
    theirs = [row[: row.index(model.special.eos)] if model.special.eos in row else row for row in theirs]
    assert ours == theirs and all(row[0] == de for row in ours) and len({tuple(row) for row in ours}) > 1
    # The forced tag is no part of the translation's text.
    assert target.decode(ours) == hf_tok.batch_decode([row[1:] for row in ours]) != hf_tok.batch_decode(ours)


def test_the_workflow_import_takes_the_models_language_codes(tiny_m2m_dir, tmp_path):
    """import_pretrained_baseline (rule import_pretrained) with `pretrained_langs`."""
    from headcount.pipeline.training_runs import import_pretrained_baseline

    summary = import_pretrained_baseline(str(tiny_m2m_dir), tmp_path / "model.pt", tmp_path / "training.json",
                                         tmp_path / "tokenizer", "en", "de", model_langs={"src": "de", "tgt": "en"},
                                         log=lambda _: None)
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_m2m_dir))
    assert summary["forced"] == [tok.get_lang_id("en")] == list(load_model(tmp_path / "model.pt").special.forced)
    assert open_tokenizer(tmp_path / "tokenizer", "source").encode(["x"])[0][0] == tok.get_lang_id("de")


def test_language_codes_the_tokenizer_does_not_know_are_refused(tiny_m2m_dir, tmp_path):
    with pytest.raises(HeadcountError, match="multilingual .*pretrained_langs"):
        import_pretrained(tiny_m2m_dir, tmp_path / "model.pt", tmp_path / "tokenizer")  # no languages given
    with pytest.raises(HeadcountError, match="no language code 'xx'"):
        load_tokenizers(tiny_m2m_dir, src_lang="xx", tgt_lang="de")
    assert not (tmp_path / "model.pt").exists()

    class NllbLike:
        """Maps an unknown language code to <unk>, as NLLB's tokenizer does (id 3)."""
        eos_token_id, unk_token_id, src_lang, tgt_lang = 2, 3, "eng_Latn", "zzz_Zzzz"

        def __call__(self, lines=None, text_target=None, add_special_tokens=True):
            text = lines if lines is not None else text_target
            tag = [7] if lines is not None else [self.unk_token_id]
            return {"input_ids": [(tag if add_special_tokens else []) + [10 + len(w) for w in line.split()]
                                  + ([2] if add_special_tokens else []) for line in text]}

    assert HFTokenizer(NllbLike(), "source").encode(["a bb"]) == [[7, 11, 12]]
    with pytest.raises(HeadcountError, match="target language code 'zzz_Zzzz' is not one of"):
        HFTokenizer(NllbLike(), "target")


def test_the_forced_tag_counts_in_no_loss_and_no_lrp_average():
    """The step that predicts a forced tag: padding in the decoder output (so no loss counts it),
    and left out of LRP's average over steps."""
    import dataclasses

    from headcount.analysis.importance import summed_nll
    from headcount.analysis.relevance import head_relevance
    from headcount.data.batching import target_tensors

    model = tiny("m2m_100", seed=3)
    sp = model.special
    tagged = dataclasses.replace(sp, forced=(7,))
    targets = [[7, 11, 12, 13], [7, 14]]
    tin, tout = target_tensors(targets, tagged)
    plain_in, plain_out = target_tensors(targets, sp)
    assert torch.equal(tin, plain_in) and tout[:, 0].eq(sp.pad).all() and torch.equal(tout[:, 1:], plain_out[:, 1:])
    assert target_tensors([[8, 11]], tagged)[1].tolist() == [[8, 11, sp.eos]]  # no tag there: nothing dropped
    src, _ = batch(model, B=2)
    with torch.no_grad():
        full, n_full = summed_nll(model, src, plain_in, plain_out)
        without, n_without = summed_nll(model, src, tin, tout)
        logp = model(src, plain_in)[0].log_softmax(-1)
    assert n_full - n_without == 2
    torch.testing.assert_close(full - without, -(logp[0, 0, 7] + logp[1, 0, 7]), rtol=1e-5, atol=1e-5)
    plain = head_relevance(model, [(src, tin)], rule="ding")
    model.special = tagged
    skipped = head_relevance(model, [(src, tin)], rule="ding")
    assert int(plain.table["n_steps"].iloc[0]) - int(skipped.table["n_steps"].iloc[0]) == 2
    assert not np.allclose(plain.table["lrp"], skipped.table["lrp"])
    sums = skipped.table.groupby(["type", "layer"])["lrp"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-6)


def test_a_tokenizer_with_the_language_code_after_eos_is_refused(tmp_path):
    """mBART-cc25's tokenizer ends a sentence with EOS and then the language code; headcount's
    batching ends it with EOS, so such a tokenizer is refused with a message that says so."""
    import sentencepiece as spm

    src, _ = toy_corpus(200, seed=3)
    (tmp_path / "text.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "text.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2, num_threads=1)
    tokenizer = transformers.MBartTokenizer(vocab_file=str(tmp_path / "sp.model"), src_lang="en_XX", tgt_lang="de_DE")
    with pytest.raises(HeadcountError, match="after a source sentence.*mBART-cc25"):
        HFTokenizer(tokenizer, "source")


# --------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_round_trip_pieces_and_no_eos(marian_tokenizer):
    source, target = HFTokenizer(marian_tokenizer, "source"), HFTokenizer(marian_tokenizer, "target")
    src_lines, tgt_lines = toy_corpus(20, seed=12)
    assert len(source) == len(target) == len(marian_tokenizer)
    for tok, lines in ((source, src_lines), (target, tgt_lines)):
        ids = tok.encode(lines)
        assert tok.decode(ids) == lines
        assert all(marian_tokenizer.eos_token_id not in row and marian_tokenizer.pad_token_id not in row for row in ids)
        for line, row in zip(lines, ids):
            pieces = tok.pieces(line)
            assert len(pieces) == len(row)
            assert "".join(pieces).replace("\u2581", " ").strip() == line
    # Each side segments with its own sentencepiece model.
    for tok, sp in ((source, marian_tokenizer.spm_source), (target, marian_tokenizer.spm_target)):
        assert tok.pieces("Gross katze, blau hund.") == sp.encode("Gross katze, blau hund.", out_type=str)
    model = marian_for(marian_tokenizer)
    assert model.special.pad == marian_tokenizer.pad_token_id and model.special.eos == marian_tokenizer.eos_token_id


@pytest.fixture(scope="module")
def tiny_fsmt_dir(tmp_path_factory):
    """A stand-in for a facebook/wmt19-* directory: Moses + BPE merges learned from the toy corpus
    (with apostrophes, which Moses escapes and splits by language), a vocabulary per side, random
    FSMT weights."""
    src, tgt = toy_corpus(300, seed=11)
    src += ["The cat's dog isn't old."] * 10
    tgt += ["Die katze's hund ist nicht alt."] * 10
    return write_tiny_fsmt(tmp_path_factory.mktemp("wmt19-toy"), src, tgt, langs=("en", "de"))


@pytest.mark.slow
def test_fsmt_tokenizer_gives_each_side_its_own_vocabulary_and_moses_language(tiny_fsmt_dir, tmp_path):
    """transformers' FSMT tokenizer segments any text with the source's Moses rules and maps it to
    the source vocabulary; the target side (load_tokenizers, after import_pretrained's copy too)
    uses the target's, and pieces align with the words of the text."""
    from headcount.analysis.roles.alignment import align_pieces
    from headcount.data.batching import source_tensor

    model = import_pretrained(tiny_fsmt_dir, tmp_path / "model.pt", tmp_path / "tokenizer")
    assert model.family.name == "fsmt" and model.special.forced == () and model.special.bos == model.special.eos
    frozen = [p.requires_grad for name, p in model.named_parameters() if "embed_positions" in name]
    assert frozen == [False, False]  # fairseq's sinusoids are constants
    vocab = {side: json.loads((tiny_fsmt_dir / f"vocab-{name}.json").read_text())
             for side, name in (("source", "src"), ("target", "tgt"))}
    assert (model.dims()["src_vocab"], model.dims()["tgt_vocab"]) == (len(vocab["source"]), len(vocab["target"]))
    assert vocab["source"] != vocab["target"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(tiny_fsmt_dir))
    src_lines, tgt_lines = toy_corpus(6, seed=5)
    for side, lines, lang in (("source", src_lines, "en"), ("target", tgt_lines, "de")):
        tok = open_tokenizer(tmp_path / "tokenizer", side)
        assert tok.tokenizer.src_lang == lang and len(tok) == len(vocab[side])
        ids = tok.encode(lines)
        assert ids == open_tokenizer(tiny_fsmt_dir, side).encode(lines)
        assert tok.decode(ids) == lines
        for line, row in zip(lines, ids):
            assert [vocab[side][p] for p in tok.tokenizer.tokenize(line)] == row
            assert len(tok.pieces(line)) == len(row)
    source, target = load_tokenizers(tiny_fsmt_dir)
    # transformers' own target-side ids are the source vocabulary's; headcount's are the target's.
    theirs = [row[:-1] for row in hf_tok(text_target=tgt_lines)["input_ids"]]
    assert theirs != target.encode(tgt_lines) and theirs == [[vocab["source"].get(p, 3) for p in hf_tok.tokenize(line)]
                                                             for line in tgt_lines]
    # Moses by language: English makes "katze's" katze + &apos;s, German katze + &apos; + s.
    assert target.tokenizer.moses_tokenize("katze's", "de") != source.tokenizer.moses_tokenize("katze's", "en")
    # Pieces are spelled as sentencepiece's, escapes undone, and align with the words.
    pieces = source.pieces("The cat's dog isn't old.")
    assert pieces[0].startswith("\u2581") and not any("</w>" in p or "&apos;" in p or p == SPECIAL_PIECE
                                                        for p in pieces)
    words = ["The", "cat", "'s", "dog", "is", "n't", "old", "."]
    owner = align_pieces(words, pieces)
    assert ["".join(p.strip("\u2581\u200b") for p, w in zip(pieces, owner) if w == i) for i in range(len(words))] \
        == words
    # The source side is transformers' own: the same input ids, EOS and padding included.
    src = source_tensor(source.encode(src_lines), model.special)
    assert src.tolist() == hf_tok(src_lines, return_tensors="pt", padding=True)["input_ids"].tolist()
    with pytest.raises(HeadcountError, match="translates en -> de only"):
        load_tokenizers(tiny_fsmt_dir, src_lang="de", tgt_lang="en")


# --------------------------------------------------------------------------------------------
# LRP


def lrp_model(family: str, biases: bool = True, seed: int = 3, gated: bool = False) -> HFSeq2Seq:
    """1+1 layers, d_model 8, 2 heads, vocab 12, float64 (T5: optionally its gated feed-forward)."""
    kwargs = {"gated": gated} if family == "t5" else {}
    return tiny(family, vocab=12, d_model=8, heads=2, ffn=16, layers=1, biases=biases, seed=seed, **kwargs).double()


def lrp_batch(model: HFSeq2Seq):
    sp = model.special
    ordinary = [i for i in range(12) if i not in (sp.pad, sp.bos, sp.eos)]
    src = torch.tensor([[ordinary[1], ordinary[3], ordinary[5], sp.eos]])
    tgt_in = torch.tensor([[sp.bos, ordinary[0], ordinary[6], ordinary[2]]])
    return src, tgt_in


def top1(model: HFSeq2Seq, logits: torch.Tensor) -> torch.Tensor:
    logits = logits.clone()
    logits[..., list(model.special.never_generated())] = float("-inf")
    return logits.max(dim=-1)


@pytest.mark.parametrize("family", LRP_FAMILIES)
def test_lrp_forward_matches_the_model(family):
    model = tiny(family, seed=1).double()
    src, tgt_in = batch(model)
    with torch.no_grad():
        logits, _ = model(src, tgt_in)
    best = top1(model, logits)
    forward = model.lrp_forward()
    for rule in ("ding", "attnlrp"):
        rules = make_rules(rule)
        trace = forward.decode(forward.encode(src, rules), tgt_in, rules)
        torch.testing.assert_close(trace.top_logit, best.values, rtol=1e-10, atol=1e-10)
        assert torch.equal(trace.target, best.indices)


from test_lrp import lrp_linear, lrp_sum, sgn  # noqa: E402  the same explicit reference


def lrp_layer_norm(norm, x, y, R_out, rule, eps):
    """Ding: relevance passes unchanged. AttnLRP: the standard deviation a constant, so
    y_j = gamma_j (x_j - mean x) / std + beta_j is linear: centering by the z-rule, gain and bias by
    the epsilon rule."""
    if rule == "ding":
        return R_out.copy()
    gamma, D = norm.weight.detach().numpy(), x.shape[1]
    R = np.zeros_like(x)
    for t in range(x.shape[0]):
        mean = x[t].sum() / D
        std = math.sqrt(sum((x[t, i] - mean) ** 2 for i in range(D)) / D + norm.eps)
        for j in range(D):
            n_j = (x[t, j] - mean) / std
            R_n = gamma[j] * n_j / (y[t, j] + eps * sgn(y[t, j])) * R_out[t, j]
            for i in range(D):
                R[t, i] += x[t, i] * ((i == j) - 1.0 / D) / std / n_j * R_n
    return R


def lrp_attention(attention, slot, acts, probs, x_q, x_kv, R_out, rule, eps):
    """-> (R at the query input, R at the key/value input, sum |R| per head context). The scores are
    raw q.k times the module's scaling (Dh^-0.5; T5: 1) plus, for T5, a constant position bias."""
    H, Dh = slot.n_heads, slot.head_dim
    q_proj, k_proj, v_proj = (getattr(attention, n) for n in (("q", "k", "v") if hasattr(attention, "q")
                                                              else ("q_proj", "k_proj", "v_proj")))
    ctx_in, out = acts[slot.proj]
    R_ctx = lrp_linear(ctx_in, slot.proj.weight.detach().numpy(), out, R_out, eps)
    heads = [float(np.abs(R_ctx[:, h * Dh : (h + 1) * Dh]).sum()) for h in range(H)]
    q, k, v = acts[q_proj][1], acts[k_proj][1], acts[v_proj][1]
    R_q, R_k, R_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(H):
        P = probs[h]
        R_P = np.zeros_like(P)
        for qi in range(q.shape[0]):
            for d in range(Dh):
                c = h * Dh + d
                context = sum(P[qi, kj] * v[kj, c] for kj in range(k.shape[0]))
                for kj in range(k.shape[0]):
                    share = P[qi, kj] * v[kj, c] / (context + eps * sgn(context)) * R_ctx[qi, c]
                    if rule == "ding":
                        R_v[kj, c] += share  # probabilities constant
                    else:
                        R_v[kj, c] += 0.5 * share
                        R_P[qi, kj] += 0.5 * share
        if rule == "attnlrp":
            for qi in range(q.shape[0]):
                total = R_P[qi].sum()
                for kj in range(k.shape[0]):
                    if P[qi, kj] == 0:
                        continue
                    raw = sum(q[qi, h * Dh + d] * k[kj, h * Dh + d] for d in range(Dh))
                    R_score = raw * attention.scaling * (R_P[qi, kj] - P[qi, kj] * total)  # softmax rule
                    for d in range(Dh):
                        share = q[qi, h * Dh + d] * k[kj, h * Dh + d] / (raw + eps * sgn(raw)) * R_score
                        R_q[qi, h * Dh + d] += 0.5 * share
                        R_k[kj, h * Dh + d] += 0.5 * share
    R_xq = lrp_linear(x_q, q_proj.weight.detach().numpy(), q, R_q, eps)
    R_xkv = lrp_linear(x_kv, k_proj.weight.detach().numpy(), k, R_k, eps)
    R_xkv = R_xkv + lrp_linear(x_kv, v_proj.weight.detach().numpy(), v, R_v, eps)
    return R_xq, R_xkv, heads


def capture(model: HFSeq2Seq, src, tgt_in):
    """(input, output) of every Linear and LayerNorm in transformers' own forward pass, sentence 0
    (FSMT's layers see time-major tensors (T, B, .): sentence 0 is [:, 0] there)."""
    acts, hooks = {}, []
    sentence = (lambda x: x[:, 0]) if model.family.time_major else (lambda x: x[0])
    for module in model.modules():
        norm = isinstance(module, nn.LayerNorm) or type(module).__name__ in ("T5LayerNorm", "MT5LayerNorm")
        if (isinstance(module, nn.Linear) or norm) and module is not model.family.output_layer(model.hf):
            hooks.append(module.register_forward_hook(lambda mod, inp, out: acts.__setitem__(
                mod, (sentence(inp[0]).detach().numpy(), sentence(out).detach().numpy()))))
    with torch.no_grad():
        logits, attn = model(src, tgt_in, need_weights=True)
    for h in hooks:
        h.remove()
    probs = {kind: [p[0].numpy() for p in layers] for kind, layers in attn.items()}
    return acts, probs, logits[0].numpy()


def explicit_lrp(model: HFSeq2Seq, src, tgt_in, rule: str, eps: float):
    """Per step of sentence 0: ({type: [H sums of |R|]}, total relevance at the input streams),
    computed neuron by neuron from transformers' own activations, for a 1+1-layer model."""
    if model.family.t5_layout:
        return explicit_lrp_t5(model, src, tgt_in, rule, eps)
    acts, probs, logits = capture(model, src, tgt_in)
    eps = 0.0 if rule == "ding" else eps
    pre = model.family.pre_norm
    encoder, decoder = model.family.stacks(model.hf)
    enc, dec = encoder.layers[0], decoder.layers[0]
    slots = {kind: mods[0] for kind, mods in model.attention_modules().items()}
    W = model.family.output_layer(model.hf).weight.detach().numpy()
    bias = model.hf.final_logits_bias[0].detach().numpy() if hasattr(model.hf, "final_logits_bias") else 0 * W[:, 0]

    def ln(norm, R):  # relevance at a LayerNorm's input
        x, y = acts[norm]
        return lrp_layer_norm(norm, x, y, R, rule, eps)

    def block(x, norm, branch_out, R, branch):
        """Pre-LN x + f(LN(x)) or post-LN LN(x + f(x)) -> relevance at x, and what the branch returns."""
        if pre:
            R_x, R_b = lrp_sum(x, branch_out, R, eps)
            R_in, extra = branch(R_b)
            return R_x + ln(norm, R_in), extra
        R_x, R_b = lrp_sum(x, branch_out, ln(norm, R), eps)
        R_in, extra = branch(R_b)
        return R_x + R_in, extra

    def ffn(layer):
        def branch(R_f):
            x, z = acts[layer.fc1]
            a, f = acts[layer.fc2]
            R_a = lrp_linear(a, layer.fc2.weight.detach().numpy(), f, R_f, eps)  # activation: passes through
            return lrp_linear(x, layer.fc1.weight.detach().numpy(), z, R_a, eps), None
        return branch

    def attention_branch(attention, kind, kv=None):
        def branch(R_h):
            x_q = acts[attention.q_proj][0]
            x_kv = acts[attention.k_proj][0]
            R_q, R_kv, heads = lrp_attention(attention, slots[kind], acts, probs[kind][0], x_q, x_kv, R_h, rule, eps)
            if kv == "memory":
                return R_q, (R_kv, heads)
            return R_q + R_kv, heads
        return branch

    def stream(layer_norm, attention):  # a block's input x
        return acts[layer_norm][0] if pre else acts[attention.q_proj][0]

    # Streams and branch outputs of the forward pass.
    x0 = stream(enc.self_attn_layer_norm, enc.self_attn)
    h_e = acts[slots["enc_self"].proj][1]
    x1 = stream(enc.final_layer_norm, enc.fc1) if pre else acts[enc.self_attn_layer_norm][1]
    f_e = acts[enc.fc2][1]
    y0 = stream(dec.self_attn_layer_norm, dec.self_attn)
    h_s = acts[slots["dec_self"].proj][1]
    y1 = acts[dec.encoder_attn_layer_norm][0] if pre else acts[dec.self_attn_layer_norm][1]
    h_c = acts[slots["dec_enc"].proj][1]
    y2 = acts[dec.final_layer_norm][0] if pre else acts[dec.encoder_attn_layer_norm][1]
    f_d = acts[dec.fc2][1]
    final_dec, final_enc = getattr(decoder, "layer_norm", None), getattr(encoder, "layer_norm", None)
    hidden = acts[final_dec][1] if final_dec is not None else acts[dec.final_layer_norm][1]

    results = []
    for t in range(tgt_in.shape[1]):
        row = logits[t].copy()
        row[list(model.special.never_generated())] = -np.inf
        c = int(row.argmax())
        s = logits[t, c]
        assert abs(s - (hidden[t] @ W[c] + bias[c])) < 1e-9
        R = np.zeros_like(hidden)
        R[t] = hidden[t] * W[c] / (s + eps * sgn(s))  # R = 1 on the logit; its bias keeps a share
        if final_dec is not None:
            R = ln(final_dec, R)
        R, _ = block(y2, dec.final_layer_norm, f_d, R, ffn(dec))
        R, (R_mem, heads_c) = block(y1, dec.encoder_attn_layer_norm, h_c, R,
                                    attention_branch(dec.encoder_attn, "dec_enc", kv="memory"))
        R_y0, heads_s = block(y0, dec.self_attn_layer_norm, h_s, R, attention_branch(dec.self_attn, "dec_self"))
        R = R_mem if final_enc is None else ln(final_enc, R_mem)
        R, _ = block(x1, enc.final_layer_norm, f_e, R, ffn(enc))
        R_x0, heads_e = block(x0, enc.self_attn_layer_norm, h_e, R, attention_branch(enc.self_attn, "enc_self"))
        results.append(({"enc_self": heads_e, "dec_self": heads_s, "dec_enc": heads_c}, R_x0.sum() + R_y0.sum()))
    return results


def lrp_rms_norm(norm, x, y, R_out, rule, eps):
    """T5's RMSNorm y = w x / rms(x). Ding: relevance passes unchanged. AttnLRP: rms a constant, so
    y_j = (w_j / rms) x_j is linear, one input per output: R_x_j = y_j / (y_j + eps sgn y_j) R_y_j."""
    if rule == "ding":
        return R_out.copy()
    R = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(x.shape[1]):
            R[t, j] = y[t, j] / (y[t, j] + eps * sgn(y[t, j])) * R_out[t, j]
    return R


def explicit_lrp_t5(model: HFSeq2Seq, src, tgt_in, rule: str, eps: float):
    """explicit_lrp for a 1+1-layer T5: pre-RMSNorm blocks, ReLU or gated feed-forward, no biases,
    the hidden state scaled by d_model^-0.5 before the tied output layer."""
    acts, probs, logits = capture(model, src, tgt_in)
    eps = 0.0 if rule == "ding" else eps
    encoder, decoder = model.family.stacks(model.hf)
    enc, dec = encoder.block[0], decoder.block[0]
    slots = {kind: mods[0] for kind, mods in model.attention_modules().items()}
    W = model.hf.lm_head.weight.detach().numpy()
    # transformers' T5 scales by d_model^-0.5 when its saved config ties the embeddings; mT5 never.
    tied = getattr(model.config, "scale_decoder_outputs", model.config.tie_word_embeddings)
    scale = model.config.d_model**-0.5 if model.family.name == "t5" and tied else 1.0

    def norm_back(norm, R):
        x, y = acts[norm]
        return lrp_rms_norm(norm, x, y, R, rule, eps)

    def block(norm, branch_out, R, branch):
        """x + f(N(x)) -> relevance at x and what the branch returns."""
        x = acts[norm][0]
        R_x, R_b = lrp_sum(x, branch_out, R, eps)
        R_in, extra = branch(R_b)
        return R_x + norm_back(norm, R_in), extra

    def ffn(layer):
        dense = layer.DenseReluDense

        def branch(R_f):
            a, f = acts[dense.wo]
            R_a = lrp_linear(a, dense.wo.weight.detach().numpy(), f, R_f, eps)
            if hasattr(dense, "wi_0"):  # a = act(z0) * z1: half of the product's relevance to each factor
                x, z0 = acts[dense.wi_0]
                z1 = acts[dense.wi_1][1]
                return (lrp_linear(x, dense.wi_0.weight.detach().numpy(), z0, 0.5 * R_a, eps)
                        + lrp_linear(x, dense.wi_1.weight.detach().numpy(), z1, 0.5 * R_a, eps)), None
            x, z = acts[dense.wi]
            return lrp_linear(x, dense.wi.weight.detach().numpy(), z, R_a, eps), None  # ReLU passes
        return branch

    def attention_branch(attention, kind, memory=False):
        def branch(R_h):
            x_q, x_kv = acts[attention.q][0], acts[attention.k][0]
            R_q, R_kv, heads = lrp_attention(attention, slots[kind], acts, probs[kind][0], x_q, x_kv, R_h, rule, eps)
            return (R_q, (R_kv, heads)) if memory else (R_q + R_kv, heads)
        return branch

    hidden = acts[decoder.final_layer_norm][1] * scale
    results = []
    for t in range(tgt_in.shape[1]):
        row = logits[t].copy()
        row[list(model.special.never_generated())] = -np.inf
        c = int(row.argmax())
        s = logits[t, c]
        assert abs(s - hidden[t] @ W[c]) < 1e-9
        R = np.zeros_like(hidden)
        R[t] = hidden[t] * W[c] / (s + eps * sgn(s))
        R = norm_back(decoder.final_layer_norm, R)
        R, _ = block(dec.layer[2].layer_norm, acts[dec.layer[2].DenseReluDense.wo][1], R, ffn(dec.layer[2]))
        R, (R_mem, heads_c) = block(dec.layer[1].layer_norm, acts[slots["dec_enc"].proj][1], R,
                                    attention_branch(dec.layer[1].EncDecAttention, "dec_enc", memory=True))
        R_y0, heads_s = block(dec.layer[0].layer_norm, acts[slots["dec_self"].proj][1], R,
                              attention_branch(dec.layer[0].SelfAttention, "dec_self"))
        R = norm_back(encoder.final_layer_norm, R_mem)
        R, _ = block(enc.layer[1].layer_norm, acts[enc.layer[1].DenseReluDense.wo][1], R, ffn(enc.layer[1]))
        R_x0, heads_e = block(enc.layer[0].layer_norm, acts[slots["enc_self"].proj][1], R,
                              attention_branch(enc.layer[0].SelfAttention, "enc_self"))
        results.append(({"enc_self": heads_e, "dec_self": heads_s, "dec_enc": heads_c}, R_x0.sum() + R_y0.sum()))
    return results


def fast_lrp(model: HFSeq2Seq, src, tgt_in, rule: str, eps: float):
    """The LRP forward pass with autograd, one backward pass per step (sentence 0): the same
    read-out as lrp.step_relevance, without its batching."""
    forward, rules = model.lrp_forward(), make_rules(rule, eps)
    out = []
    for t in range(tgt_in.shape[1]):
        encoded = forward.encode(src, rules)
        trace = forward.decode(encoded, tgt_in, rules)
        contexts = [c for kind in ATTENTION_TYPES for c in trace.contexts[kind]]
        inputs = [trace.enc_inputs[0], trace.dec_inputs[0]]
        grads = torch.autograd.grad(trace.top_logit[0, t] / trace.top_logit[0, t].detach(), contexts + inputs,
                                    allow_unused=True)
        heads = {kind: (c * g).abs().sum(dim=(0, 2, 3)).tolist()
                 for kind, c, g in zip(ATTENTION_TYPES, contexts, grads)}
        out.append((heads, float(sum((x * g).sum() for x, g in zip(inputs, grads[len(contexts):])).detach())))
    return out


@pytest.mark.parametrize("family", [*LRP_FAMILIES, "t5-gated"])  # post-LN (Marian, BART), pre-LN (the others)
@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
def test_lrp_matches_explicit_per_neuron_lrp(family, rule, record_property):
    model = lrp_model(family.removesuffix("-gated"), gated=family.endswith("-gated"))
    # Gates other than 1 (a head switched off, two scaled): the LRP pass must gate as the model does.
    model.set_head_mask({"enc_self": torch.tensor([[1.0, 0.0]]), "dec_self": torch.tensor([[0.6, 1.0]]),
                         "dec_enc": torch.tensor([[1.0, 0.3]])})
    src, tgt_in = lrp_batch(model)
    eps = 1e-2  # large enough that a missing epsilon would show
    slow = explicit_lrp(model, src, tgt_in, rule, eps)
    fast = fast_lrp(model, src, tgt_in, rule, eps)
    worst = 0.0
    for (heads, total), (fast_heads, fast_total) in zip(slow, fast):
        for kind in ATTENTION_TYPES:
            np.testing.assert_allclose(fast_heads[kind], heads[kind], rtol=1e-6, atol=1e-9)
            worst = max(worst, float(np.abs(np.array(fast_heads[kind]) - np.array(heads[kind])).max()))
        assert fast_total == pytest.approx(total, rel=1e-6, abs=1e-9)
        worst = max(worst, float(abs(fast_total - total)))
    record_property("max_abs_error", worst)
    print(f"LRP {family} {rule}: max abs error against the explicit LRP {worst:.2e}")


@pytest.mark.parametrize("family", ["marian", "m2m_100", "t5"])
@pytest.mark.parametrize("rule", ["ding", "attnlrp"])
def test_lrp_driver_agrees_with_single_steps(family, rule):
    """lrp.step_relevance (batched over steps and sentences) reads the same head relevance."""
    from headcount.models.lrp import step_relevance

    model = lrp_model(family)
    src, tgt_in = lrp_batch(model)
    fast = fast_lrp(model, src, tgt_in, rule, 1e-2)
    driven = step_relevance(model, src, tgt_in, rule=rule, eps=1e-2, max_seeds=3)
    assert bool(driven.valid[:, 0].all()), "every step of the sentence counts (Marian starts from its pad id)"
    for t, (heads, total) in enumerate(fast):
        for kind in ATTENTION_TYPES:
            np.testing.assert_allclose(driven.heads[kind][t, 0, 0].numpy(), heads[kind], rtol=1e-6, atol=1e-9)
        assert float(driven.cuts["enc.0"][t, 0]) == pytest.approx(total, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("family", LRP_FAMILIES)
def test_lrp_conserves_without_biases(family):
    """Bias-free (final_logits_bias included), the paper's rule: every cut holds the start value 1."""
    from headcount.models.lrp import step_relevance

    model = tiny(family, vocab=12, d_model=8, heads=2, ffn=16, layers=2, biases=False, seed=5).double()
    src, tgt_in = lrp_batch(model)
    result = step_relevance(model, src, tgt_in, rule="ding")
    assert len(result.cuts) == 6
    for name, total in result.cuts.items():
        valid = result.valid
        torch.testing.assert_close(total[valid], torch.ones_like(total[valid]), rtol=0, atol=1e-9, msg=name)


@pytest.mark.parametrize("family", LRP_FAMILIES)
def test_lrp_module_rules_leave_the_model_as_it_was(family):
    """LRP runs transformers' own encoder and decoder with the rule on their modules
    (module_rules._module_rules), recomputed layers included (the same relevance as kept ones):
    afterwards no module keeps a forward, hook or config of the pass, and the model computes what
    it did."""
    from headcount.models.lrp import step_relevance

    model = lrp_model(family)
    src, tgt_in = lrp_batch(model)
    with torch.no_grad():
        before, _ = model(src, tgt_in)

    def state():
        return module_state(model.hf)

    kept = state()
    for rule in ("ding", "attnlrp"):
        plain = step_relevance(model, src, tgt_in, rule=rule, eps=1e-2, max_seeds=3)
        recomputed = step_relevance(model, src, tgt_in, rule=rule, eps=1e-2, max_seeds=3, recompute=True)
        for kind in plain.heads:
            torch.testing.assert_close(recomputed.heads[kind], plain.heads[kind], rtol=1e-12, atol=1e-15)
    assert state() == kept
    with torch.no_grad():
        after, _ = model(src, tgt_in)
    assert torch.equal(before, after)
    assert {m.config._attn_implementation for m in model.hf.modules() if hasattr(m, "config")} == {"eager"}


# --------------------------------------------------------------------------------------------
# headcount's analyses on a tiny Marian model, through the interface only


@pytest.mark.slow
def test_analyses_run_on_a_tiny_marian_model(marian_tokenizer, tmp_path):
    from headcount.analysis.importance import dev_batches, head_ablation, head_confidence, michel_importance
    from headcount.analysis.relevance import head_relevance
    from headcount.data.batching import target_tensors
    from headcount.pruning.hard_concrete import fold_gates, gate_table, penalty, prepare_for_pruning
    from headcount.pruning.removal import remove_pruned_heads
    from headcount.training.decode import beam_search, greedy_search, translate
    from headcount.training.loop import Corpus, DevSet, TrainConfig, train

    model = marian_for(marian_tokenizer, d_model=16, heads=4, layers=2, seed=2)
    source, target = HFTokenizer(marian_tokenizer, "source"), HFTokenizer(marian_tokenizer, "target")
    src_lines, tgt_lines = toy_corpus(24, seed=13)
    src_ids, tgt_ids = source.encode(src_lines), target.encode(tgt_lines)
    batches = dev_batches(src_ids, tgt_ids, max_tokens=200, special=model.special)
    src, tgt_in, tgt_out = max(batches, key=lambda b: b[0].shape[0])  # the batch of most sentences
    assert src.shape[0] > 1
    assert (src == model.special.eos).sum() == src.shape[0]  # batching appends the model's own EOS
    assert (tgt_in[:, 0] == model.special.bos).all() and model.special.bos == model.special.pad
    n_heads = 2 * 4

    confidence = head_confidence(model, batches)
    assert len(confidence) == 3 * n_heads and confidence["confidence"].between(0, 1).all()
    michel = michel_importance(model, batches)
    assert len(michel) == 3 * n_heads and np.isfinite(michel["michel"]).all() and (michel["michel_raw"] > 0).all()
    ablation = head_ablation(model, batches[:2])
    assert len(ablation) == 3 * n_heads and np.isfinite(ablation["delta_loss"]).all()
    assert (model.head_mask()["enc_self"] == 1).all()  # restored afterwards

    # LRP on a model's own translations, as the workflow does.
    hyps = greedy_search(model, src)
    beams = beam_search(model, src, beam=3)
    assert len(hyps) == len(beams) == src.shape[0]
    assert all(model.special.pad not in h and model.special.eos not in h for h in hyps + beams)
    translated = translate(model, src_ids[:6], beam=2, max_tokens=100)
    assert len(translated) == 6 and all(isinstance(t, str) for t in target.decode(translated))
    explained = [h if h else [5] for h in hyps]
    tin, _ = target_tensors(explained, model.special)
    relevance = head_relevance(model, [(src, tin)], rule="ding", max_seeds=4)
    table = relevance.table
    assert len(table) == 3 * n_heads
    sums = table.groupby(["type", "layer"])["lrp"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-6)
    assert int(table["n_steps"].iloc[0]) == sum(len(h) + 1 for h in explained)  # BOS (= pad) step included

    # Head roles: positional, rare-token and syntactic statistics through the model's tokenizer.
    roles = toy_roles(model, source, src_lines, tmp_path)
    assert len(roles) == n_heads and roles["role"].notna().all()

    # L0 pruning: gates on the attention, a few training steps with the penalty, fold, remove.
    data = Corpus(src_ids, tgt_ids)
    dev = DevSet(src_ids[:8], tgt_ids[:8], tgt_lines[:8])
    gates, groups = prepare_for_pruning(model, "all", log_alpha_init=None, gate_lr_scale=1.0)
    before = [g.log_alpha.detach().clone() for g in gates]
    cfg = TrainConfig(max_tokens=200, max_steps=4, warmup_steps=2, eval_interval=4, checkpoint_interval=4,
                      log_interval=2, dev_bleu_sentences=0, select="last", device="cpu", precision="fp32",
                      label_smoothing=0.1)
    train(model, cfg, data, dev, tmp_path / "prune", parameters=groups, extra_loss=penalty(gates, 0.5),
          log=lambda line: None)
    assert any(not torch.equal(b, g.log_alpha.detach()) for b, g in zip(before, gates))
    assert len(gate_table(model)) == 3 * n_heads
    model.eval()
    with torch.no_grad():
        gated = model(src, tgt_in)[0]
        fold_gates(model)
        torch.testing.assert_close(model(src, tgt_in)[0], gated, rtol=1e-5, atol=1e-5)
        model.set_head_mask({"enc_self": torch.tensor([[1.0, 0, 1, 0], [0, 1, 1, 1]])})
        masked = model(src, tgt_in)[0]
        remove_pruned_heads(model)
        assert model.head_counts()["enc_self"] == [2, 3]
        torch.testing.assert_close(model(src, tgt_in)[0], masked, rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "pruned.pt")
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "pruned.pt")(src, tgt_in)[0], masked, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_roles_and_pruning_run_on_a_tiny_fsmt_model(tiny_fsmt_dir, tmp_path):
    """FSMT through the stages the other tests leave to Marian: head roles (its BPE pieces aligned
    with the words), a few gated fine-tuning steps (its sinusoids stay constants), an encoder layer
    losing every head, beam search and a checkpoint after that."""

    from headcount.analysis.importance import dev_batches
    from headcount.pruning.hard_concrete import fold_gates, penalty, prepare_for_pruning
    from headcount.pruning.removal import remove_pruned_heads
    from headcount.training.decode import beam_search
    from headcount.training.loop import Corpus, DevSet, TrainConfig, train

    model = import_pretrained(tiny_fsmt_dir, tmp_path / "model.pt", tmp_path / "tokenizer")
    source, target = load_tokenizers(tmp_path / "tokenizer")
    src_lines, tgt_lines = toy_corpus(24, seed=13)
    src_ids, tgt_ids = source.encode(src_lines), target.encode(tgt_lines)
    roles = toy_roles(model, source, src_lines, tmp_path)
    assert len(roles) == 2 * 4 and roles["role"].notna().all()

    positions = [p.detach().clone() for name, p in model.named_parameters() if "embed_positions" in name]
    gates, groups = prepare_for_pruning(model, "all", log_alpha_init=None, gate_lr_scale=1.0)
    cfg = TrainConfig(max_tokens=200, max_steps=3, warmup_steps=1, eval_interval=3, checkpoint_interval=3,
                      log_interval=3, dev_bleu_sentences=0, select="last", device="cpu", precision="fp32")
    train(model, cfg, Corpus(src_ids, tgt_ids), DevSet(src_ids[:4], tgt_ids[:4], tgt_lines[:4]), tmp_path / "prune",
          parameters=groups, extra_loss=penalty(gates, 0.5), log=lambda line: None)
    after = [p for name, p in model.named_parameters() if "embed_positions" in name]
    assert all(torch.equal(a, b) for a, b in zip(positions, after))
    model.eval()
    src, tgt_in, _ = dev_batches(src_ids, tgt_ids, max_tokens=200, special=model.special)[0]
    with torch.no_grad():
        fold_gates(model)
        model.set_head_mask({"enc_self": torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 0]])})
        masked = model(src, tgt_in)[0]
        remove_pruned_heads(model)
        assert model.head_counts()["enc_self"] == [2, 0]
        torch.testing.assert_close(model(src, tgt_in)[0], masked, rtol=1e-5, atol=1e-5)
        assert len(beam_search(model, src, beam=3)) == src.shape[0]
    model.save(tmp_path / "pruned.pt")
    with torch.no_grad():
        torch.testing.assert_close(load_model(tmp_path / "pruned.pt")(src, tgt_in)[0], masked, rtol=1e-5, atol=1e-5)
