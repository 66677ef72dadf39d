"""headcount's Transformer as a seq2seq.Seq2SeqWithHeads: the interface pieces, loading by model
family, and analyses that take every token id from the model (model.special)."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from conftest import random_batch, tiny_config

from headcount.analysis.importance import dev_batches, head_confidence, michel_importance
from headcount.data.special import SpecialIds
from headcount.data.subwords import BOS_ID, EOS_ID, UNK_ID
from headcount.models.checkpoint import save_checkpoint
from headcount.models.loading import load_model
from headcount.models.lrp import step_relevance
from headcount.models.seq2seq import HeadSlots, Seq2SeqWithHeads
from headcount.models.transformer import Transformer
from headcount.training.decode import translate


def test_headcount_transformer_implements_the_interface(tiny_model):
    assert isinstance(tiny_model, Seq2SeqWithHeads)
    assert all(isinstance(m, HeadSlots) for mods in tiny_model.attention_modules().values() for m in mods)
    assert tiny_model.special == SpecialIds(pad=0, bos=2, eos=3, unk=1)
    assert (tiny_model.max_positions, tiny_model.d_model) == (64, 16)
    hidden = torch.randn(2, 3, 16)
    torch.testing.assert_close(tiny_model.logits(hidden), tiny_model.generator(hidden))
    encoder = {id(p) for p in tiny_model.encoder_parameters()}
    names = {n for n, p in tiny_model.named_parameters() if id(p) in encoder}
    assert names and all(n.startswith(("src_embed", "encoder_layers", "encoder_norm")) for n in names)
    assert len(encoder) == sum(1 for n, _ in tiny_model.named_parameters() if n.startswith(("src_embed", "encoder")))


def _select_cache_before_the_interface(cache, rows):
    """decode._select_cache as it was before reorder_cache replaced it."""
    for layer in cache:
        for part in layer.values():
            for key in ("k", "v"):
                if key in part:
                    part[key] = part[key].index_select(0, rows)


def test_reorder_cache_keeps_the_rows_as_before(tiny_model):
    src, tgt = random_batch(tiny_model, batch=3)
    memory, src_pad, _ = tiny_model.encode(src)
    cache = tiny_model.new_cache()
    assert cache == [{} for _ in range(2)]
    with torch.no_grad():
        tiny_model.decode(tgt[:, :2], memory, src_pad, cache=cache)
    rows = torch.tensor([2, 0, 0])
    expected = copy.deepcopy(cache)
    _select_cache_before_the_interface(expected, rows)
    tiny_model.reorder_cache(cache, rows)
    for got, want in zip(cache, expected):
        assert got.keys() == want.keys()
        for part in got:
            for key in ("k", "v"):
                assert torch.equal(got[part][key], want[part][key])
    # the reordered cache decodes the next step as the selected sentences would on their own
    with torch.no_grad():
        step, _, _ = tiny_model.decode(tgt[rows, 2:3], memory[rows], src_pad[rows], cache=cache, start=2)
        full, _, _ = tiny_model.decode(tgt[rows, :3], memory[rows], src_pad[rows])
    torch.testing.assert_close(step[:, 0], full[:, 2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kept", [[0, 2], [3], [], [0, 1, 2, 3]])
def test_keep_heads_equals_masking_the_other_heads(tiny_model, kept):
    masked = copy.deepcopy(tiny_model)
    mask = torch.zeros(4)
    mask[kept] = 1.0
    for mods in masked.attention_modules().values():
        for m in mods:
            m.head_mask.copy_(mask)
    src, tgt = random_batch(tiny_model)
    with torch.no_grad():
        expected, _ = masked(src, tgt)
        for mods in tiny_model.attention_modules().values():
            for m in mods:
                m.keep_heads(kept)
        got, _ = tiny_model(src, tgt)
    module = tiny_model.attention_modules()["dec_enc"][1]
    assert module.n_heads == len(kept) and module.q_proj.out_features == 4 * len(kept)
    assert module.head_mask.tolist() == [1.0] * len(kept)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_keep_heads_refuses_hard_concrete_gates(tiny_model):
    from headcount.models.gates import attach_gates

    attach_gates(tiny_model, ("enc_self",))
    with pytest.raises(ValueError, match="fold the Hard Concrete gates"):
        tiny_model.attention_modules()["enc_self"][0].keep_heads([0])


@pytest.mark.slow
def test_load_model_reads_checkpoints_written_before_families_and_after(tmp_path, tiny_model):
    src, tgt = random_batch(tiny_model)
    with torch.no_grad():
        expected, _ = tiny_model(src, tgt)
    # the format every checkpoint had before model families: no "family" key
    save_checkpoint(tmp_path / "old.pt", {"model": tiny_model.state_dict(), "model_config": tiny_model.cfg.to_dict()})
    tiny_model.save(tmp_path / "new.pt", {"summary": {"steps": 3}})
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert new["family"] == "headcount" and new["summary"] == {"steps": 3}
    for name in ("old.pt", "new.pt"):
        model = load_model(tmp_path / name).eval()
        assert type(model) is Transformer
        with torch.no_grad():
            got, _ = model(src, tgt)
        assert torch.equal(got, expected), name
    save_checkpoint(tmp_path / "other.pt", {**new, "family": "no-such-family"})
    with pytest.raises(ValueError, match="'no-such-family', which no module registers"):
        load_model(tmp_path / "other.pt")


def _swapped_twin(model: Transformer) -> Transformer:
    """A Transformer whose BOS and EOS ids are swapped (its configuration's ids): the same model as
    its twin with token ids 2 and 3 exchanged on both sides. Analyses that take ids from
    `model.special` see the twin."""
    twin = Transformer(dataclasses.replace(model.cfg, bos_id=EOS_ID, eos_id=BOS_ID))
    assert twin.special == SpecialIds(pad=0, bos=EOS_ID, eos=BOS_ID, unk=UNK_ID)
    state = model.state_dict()
    for name in ("src_embed.weight", "tgt_embed.weight", "generator.weight"):
        state[name] = state[name][[0, 1, 3, 2, *range(4, state[name].shape[0])]]
    twin.load_state_dict(state)
    return twin.eval()


def test_analyses_take_the_special_ids_from_the_model():
    torch.manual_seed(3)
    model = Transformer(tiny_config()).eval()
    with torch.no_grad():  # a start token that matters, and a BOS logit that would win if allowed
        model.tgt_embed.weight[BOS_ID] *= 10
    twin = _swapped_twin(model)
    g = torch.Generator().manual_seed(0)
    sentences = [torch.randint(4, 23, (n,), generator=g).tolist() for n in (4, 3, 6, 1, 8, 5)]
    targets = [torch.randint(4, 19, (n,), generator=g).tolist() for n in (2, 3, 1, 4, 6, 2)]
    for beam in (1, 3):
        hyps = translate(model, sentences, beam=beam, max_tokens=500)
        assert sum(map(len, hyps)) > 4
        assert translate(twin, sentences, beam=beam, max_tokens=500) == hyps
    batches = dev_batches(sentences, targets, special=model.special)
    twin_batches = dev_batches(sentences, targets, special=twin.special)
    assert int(twin_batches[0][0].eq(BOS_ID).sum()) > 0  # the twin's sources end with its EOS, id 2
    assert head_confidence(twin, twin_batches).equals(head_confidence(model, batches))
    assert np.allclose(michel_importance(twin, twin_batches)["michel"], michel_importance(model, batches)["michel"])
    for (src, tgt_in, _), (twin_src, twin_tgt, _) in zip(batches, twin_batches):
        got, want = step_relevance(twin, twin_src, twin_tgt).heads, step_relevance(model, src, tgt_in).heads
        for kind in want:
            torch.testing.assert_close(got[kind], want[kind])


class StartsFromPad(Transformer):
    """Decoder inputs start from the pad id, as Marian's do."""

    special = SpecialIds(pad=0, bos=0, eos=EOS_ID, unk=UNK_ID)


def test_a_start_token_equal_to_the_pad_id_still_counts():
    special = StartsFromPad.special
    tgt_in = torch.tensor([[0, 5, 6], [0, 7, 0]])
    assert special.decoder_positions(tgt_in).tolist() == [[True, True, True], [True, True, False]]
    torch.manual_seed(0)
    model = StartsFromPad(tiny_config()).eval()
    src = torch.tensor([[5, 6, EOS_ID], [7, EOS_ID, 0]])
    relevance = step_relevance(model, src, tgt_in)
    assert relevance.valid.T.tolist() == [[True, True, True], [True, True, False]]
    assert (relevance.heads["enc_self"][0].sum(dim=-1) > 0).all()  # the first step was explained
    michel = michel_importance(model, [(src, tgt_in, torch.tensor([[5, 6, EOS_ID], [7, EOS_ID, 0]]))])
    assert (michel["michel_raw"] > 0).all()
