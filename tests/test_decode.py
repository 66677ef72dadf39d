"""Greedy and beam search against exhaustive search and against each other."""

import itertools

import pytest
import torch
from conftest import tiny_config

from headcount.data.batching import source_tensor
from headcount.data.subwords import BOS_ID, EOS_ID, SPECIAL_IDS, UNK_ID
from headcount.models.transformer import Transformer
from headcount.training.decode import beam_search, greedy_search, length_penalty, translate


def sequence_logprob(model, src, hyp):
    """log P(hyp + EOS | src) by one teacher-forced pass."""
    tgt_in = torch.tensor([[BOS_ID] + hyp])
    logits, _ = model(src, tgt_in)
    logp = logits.log_softmax(-1)[0]
    return sum(logp[t, tok].item() for t, tok in enumerate(hyp + [EOS_ID]))


def exhaustive_best(model, src, max_len, alpha):
    """The hypothesis that maximises log P / lp over every sequence of up to max_len tokens."""
    allowed = [UNK_ID] + list(range(4, model.cfg.tgt_vocab))
    best, best_score = None, float("-inf")
    for length in range(max_len):  # tokens before EOS
        for hyp in itertools.product(allowed, repeat=length):
            score = sequence_logprob(model, src, list(hyp)) / length_penalty(length + 1, alpha)
            if score > best_score:
                best, best_score = list(hyp), score
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_optimum(seed, alpha):
    torch.manual_seed(seed)
    model = Transformer(tiny_config(tgt_vocab=7)).eval()  # 4 tokens besides PAD/BOS/EOS
    src = source_tensor([[5, 6, 7]], SPECIAL_IDS)
    max_len = 3  # EOS included: max_len_a=0, max_len_b=3
    with torch.no_grad():
        expected = exhaustive_best(model, src, max_len, alpha)
        # 1 + 4 + 16 = 21 hypotheses: a beam of 16 keeps every prefix alive.
        found = beam_search(model, src, beam=16, alpha=alpha, max_len_a=0.0, max_len_b=max_len)[0]
    assert found == expected


def test_beam_of_one_is_greedy():
    torch.manual_seed(4)
    model = Transformer(tiny_config()).eval()
    src = source_tensor([[5, 6, 7, 8], [9, 10], [11, 12, 13]], SPECIAL_IDS)
    greedy = greedy_search(model, src, max_len_a=1.0, max_len_b=5)
    beam = beam_search(model, src, beam=1, alpha=0.0, max_len_a=1.0, max_len_b=5)
    assert greedy == beam


@pytest.mark.slow
def test_batching_and_order_do_not_change_translations():
    torch.manual_seed(5)
    model = Transformer(tiny_config()).eval()
    sentences = [[5, 6, 7, 8, 9], [10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20], [21, 22]]
    alone = [beam_search(model, source_tensor([s], SPECIAL_IDS), beam=3, alpha=0.6)[0] for s in sentences]
    together = translate(model, sentences, beam=3, alpha=0.6, max_tokens=40)
    assert together == alone
    assert translate(model, sentences, beam=1, max_tokens=40) == [
        greedy_search(model, source_tensor([s], SPECIAL_IDS))[0] for s in sentences
    ]


def test_outputs_respect_the_length_limit_and_contain_no_specials():
    torch.manual_seed(6)
    model = Transformer(tiny_config()).eval()
    src = source_tensor([[5, 6], [7, 8, 9, 10]], SPECIAL_IDS)
    # Limit: a * (source tokens with EOS) + b target tokens, EOS included: 1*3+2 and 1*5+2.
    hyps = beam_search(model, src, beam=4, max_len_a=1.0, max_len_b=2)
    for hyp, limit in zip(hyps, (5, 7)):
        assert len(hyp) + 1 <= limit
        assert not {0, BOS_ID, EOS_ID} & set(hyp)


def test_gnmt_length_penalty():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx((12 / 6) ** 0.6)
    assert length_penalty(10, 0.0) == 1.0
