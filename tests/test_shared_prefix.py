"""Ablation copies that share the layers below their masked heads (models.shared_prefix, through
importance.masked_sentence_losses) against the full replication they replace, every layer run on
every copy, on tiny models of several families: headcount's Transformer (encoder and decoder
heads), a transformers encoder-decoder (Marian), causal LMs (Llama with rotary embeddings and
grouped-query attention, GPT-2) and a BERT; each pass holds heads of several layers. And the
sharing happens: the layers below the lowest head see the batch once, those from it on k copies."""


import pytest
import torch
from conftest import tiny_config, toy_corpus
from fakes import louder, random_texts, tiny_marian

import headcount.models.shared_prefix as shared_prefix
from headcount.analysis.importance import dev_batches, head_ablation, masked_sentence_losses
from headcount.models.seq2seq import kind_of
from headcount.models.transformer import Transformer

torch.set_num_threads(1)


def rows_per_layer(model, run, layer_stacks=shared_prefix.layer_stacks) -> dict[tuple[str, int], list[int]]:
    """The rows each layer module outputs while `run()` runs, by (stage name, layer)."""
    stacks = layer_stacks(model)
    seen, handles = {}, []
    for kind, layers in stacks.items():
        for index, layer in enumerate(layers):
            key = ("encoder" if kind == "enc_self" else "decoder", index)
            if key in seen:
                continue
            seen[key] = []

            def hook(module, args, output, key=key):
                out = output[0] if isinstance(output, tuple) else output
                seen[key].append(out.shape[0])

            handles.append(layer.register_forward_hook(hook))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def assert_shared_equals_replicated(model, batches, heads, monkeypatch):
    """Per-sentence masked losses with shared layers = with every layer on every copy; and the
    layers below the lowest head ran on the batch alone."""
    shared, units = masked_sentence_losses(model, batches, heads)
    with monkeypatch.context() as m:
        m.setattr(shared_prefix, "layer_stacks", lambda model: None)  # the fallback: inputs copied up front
        replicated, units_ = masked_sentence_losses(model, batches, heads)
    assert (units == units_).all() and shared.shape == (len(heads), units.size)
    spread = abs(replicated - replicated[[i for i, h in enumerate(heads) if h is None] or [0]].mean(axis=0)).max()
    assert spread > 1e-2  # masking the heads moves the losses: agreement is not trivial
    assert abs(shared - replicated).max() < 2e-5 * max(1.0, abs(replicated).max())

    start = min(shared_prefix.head_position(h) for h in heads if h is not None)
    B, k = batches[0][2].shape[0], len(heads)
    seen = rows_per_layer(model, lambda: masked_sentence_losses(model, batches[:1], heads))
    for (stage, layer), rows in seen.items():
        position = (0 if stage == "encoder" else 1, layer)
        assert rows == [k * B if position >= start else B], (stage, layer, rows, start)
    with monkeypatch.context() as m:  # and the reference did run every layer on every copy
        stacks = shared_prefix.layer_stacks
        m.setattr(shared_prefix, "layer_stacks", lambda model: None)
        seen = rows_per_layer(model, lambda: masked_sentence_losses(model, batches[:1], heads), stacks)
    assert all(rows == [k * B] for rows in seen.values()), seen


def test_headcount_transformer_encoder_and_decoder_heads(monkeypatch):
    torch.manual_seed(0)
    model = Transformer(tiny_config(d_model=16, n_heads=4, enc_layers=3, dec_layers=3)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    sp = model.special
    src = random_texts(model.cfg.src_vocab, {sp.pad, sp.bos, sp.eos}, n=7, seed=1)
    tgt = random_texts(model.cfg.tgt_vocab, {sp.pad, sp.bos, sp.eos}, n=7, seed=2)
    batches = dev_batches(src, tgt, max_tokens=40, special=sp)
    assert len(batches) > 1 and any(b[0].shape[0] > 1 for b in batches)
    # copies made in encoder layer 1; the decoder runs on them all
    assert_shared_equals_replicated(
        model, batches, [("dec_self", 2, 1), ("enc_self", 2, 3), None, ("dec_enc", 0, 3), ("enc_self", 1, 0)],
        monkeypatch)
    # decoder heads only: the encoder runs once, copies made in decoder layer 1
    assert_shared_equals_replicated(model, batches, [("dec_enc", 2, 1), ("dec_self", 1, 0), ("dec_self", 2, 3)],
                                    monkeypatch)


def test_a_transformers_encoder_decoder(monkeypatch):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tiny_marian(3)
    sp = model.special
    avoid = {sp.pad, sp.bos, sp.eos, 0, 1, 2, 3}
    batches = dev_batches(random_texts(40, avoid, n=7, seed=1), random_texts(40, avoid, n=7, seed=2), max_tokens=40,
                          special=sp)
    assert_shared_equals_replicated(model, batches, [("dec_enc", 1, 2), ("enc_self", 2, 0), ("enc_self", 1, 3)],
                                    monkeypatch)
    assert_shared_equals_replicated(model, batches, [("dec_self", 2, 1), ("dec_enc", 1, 0), ("dec_self", 1, 3)],
                                    monkeypatch)


@pytest.fixture(scope="module")
def lines():
    src, tgt = toy_corpus(80, seed=5)
    return src + tgt


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_language_models(family, lines, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.testing import tiny_lm

    write = getattr(tiny_lm, f"write_tiny_{family}")
    model = louder(load_pretrained_lm(write(tmp_path / family, lines, layers=4))).eval()
    kind = next(iter(model.head_mask()))
    sp = model.special
    texts = random_texts(model.hf.config.vocab_size, {sp.pad, sp.bos, sp.eos, sp.unk, sp.mask}, n=8)
    batches = dev_batches(texts, texts, max_tokens=60, special=sp, objective=kind_of(model).objective)
    assert any(b[2].shape[0] > 1 for b in batches)
    assert_shared_equals_replicated(model, batches, [(kind, 3, 0), (kind, 2, 3), None, (kind, 2, 1), (kind, 1, 2)],
                                    monkeypatch)
    if family == "llama":  # a batch of one row: its (1, T) position ids and rotary tables are copied too
        one = dev_batches(texts[:1], texts[:1], max_tokens=60, special=sp, objective="causal_lm")
        assert_shared_equals_replicated(model, one, [(kind, 3, 0), (kind, 2, 1)], monkeypatch)


def test_passes_in_layer_order_and_the_table_in_its_own(monkeypatch):
    """head_ablation hands the heads to its passes in the order their layers run (so a pass's
    lowest layer is as high as it can be), and its table keeps the order of before."""
    import headcount.analysis.importance as importance

    torch.manual_seed(0)
    model = Transformer(tiny_config(enc_layers=2, dec_layers=2)).eval()
    sp = model.special
    src = random_texts(model.cfg.src_vocab, {sp.pad, sp.bos, sp.eos}, n=3, seed=1)
    tgt = random_texts(model.cfg.tgt_vocab, {sp.pad, sp.bos, sp.eos}, n=3, seed=2)
    batches = dev_batches(src, tgt, max_tokens=400, special=sp)
    assert len(batches) == 1
    starts = []

    def spy(model, start, rows, copies):
        starts.append((start, copies))
        return shared_prefix.copies_from(model, start, rows, copies)

    monkeypatch.setattr(importance, "copies_from", spy)
    table = head_ablation(model, batches, heads_per_pass=6)
    assert [(r.type, r.layer, r.head) for r in table.itertuples()] == [
        (kind, layer, head) for kind in ("enc_self", "dec_self", "dec_enc") for layer in range(2) for head in range(4)]
    # after the unmasked pass, 24 heads 6 a pass, a decoder layer's self- and cross-attention together
    # (8 heads a decoder layer): encoder 0-1, encoder 1 to decoder 0, decoder 0-1, decoder 1
    assert starts == [((0, 0), 1), ((0, 0), 6), ((0, 1), 6), ((1, 0), 6), ((1, 1), 6)]


def test_a_time_major_family_falls_back_to_full_replication():
    """FSMT's layers take (T, B, D) states beside (B, S) masks and a (T, T) causal mask: its copies
    are made of the inputs, every layer run on each (layer_stacks is None), the same losses."""
    transformers = pytest.importorskip("transformers")
    from headcount.models.hf import HFSeq2Seq

    torch.manual_seed(0)
    config = transformers.FSMTConfig(
        langs=["src", "tgt"], src_vocab_size=30, tgt_vocab_size=30, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, tie_word_embeddings=False)
    model = HFSeq2Seq(transformers.FSMTForConditionalGeneration(config).eval()).eval()
    assert shared_prefix.layer_stacks(model) is None
    sp = model.special
    avoid = {0, 1, 2, 3}
    batches = dev_batches(random_texts(30, avoid, n=7, seed=1), random_texts(30, avoid, n=7, seed=2), max_tokens=40,
                          special=sp)
    sums, _ = masked_sentence_losses(model, batches, [("dec_self", 1, 0), ("enc_self", 1, 2)])
    assert sums.shape[0] == 2 and (sums[0] != sums[1]).any()
