"""Scores come from sacrebleu with their signatures; checked against sacrebleu's own API."""

import pytest
import sacrebleu

from headcount.io import DataError
from headcount.training.evaluate import score_translations

HYPS = ["Ein Hund läuft über die Wiese.", "Zwei Kinder spielen im Sand."]
REFS = ["Ein Hund rennt über die Wiese.", "Zwei kleine Kinder spielen im Sand."]


def test_scores_match_sacrebleu_and_carry_signatures():
    scores = score_translations(HYPS, REFS)
    assert scores["bleu"] == pytest.approx(round(sacrebleu.corpus_bleu(HYPS, [REFS]).score, 2))
    assert scores["chrf"] == pytest.approx(round(sacrebleu.corpus_chrf(HYPS, [REFS]).score, 2))
    assert "case:mixed" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]
    assert scores["chrf_signature"].startswith("nrefs:1")
    assert score_translations(REFS, REFS)["bleu"] == 100.0


def test_lowercase_scoring_is_recorded():
    scores = score_translations([h.upper() for h in HYPS], REFS, lowercase=True)
    assert "case:lc" in scores["bleu_signature"]
    assert scores["bleu"] == score_translations(HYPS, REFS)["bleu"]


def test_incomplete_translations_are_refused():
    with pytest.raises(DataError, match="1 translations for 2 references"):
        score_translations(HYPS[:1], REFS)


def _systems():
    """A small fixed test set: 40 sentences, a system close to the references and a worse one."""
    import random

    rng = random.Random(7)
    words = "ein hund eine katze läuft rennt über die wiese zwei kinder spielen im sand am strand".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + "." for _ in range(40)]

    def noisy(p):
        return [" ".join(w if rng.random() > p else rng.choice(words) for w in r.rstrip(".").split()) + "."
                for r in refs]

    return noisy(0.15), noisy(0.4), refs


def test_paired_bootstrap_uses_sacrebleus_resamples():
    """The system's resampled mean, half-width and p-value are sacrebleu's own --paired-bs output,
    so the interval of the difference is read off sacrebleu's resamples."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from headcount.training.evaluate import BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED, paired_bootstrap

    good, bad, refs = _systems()
    ours = paired_bootstrap(good, bad, refs)
    test = PairedTest([("bad", bad), ("good", good)], {"BLEU": BLEU()}, [refs], test_type="bs",
                      n_samples=BOOTSTRAP_SAMPLES)
    assert test._seed == BOOTSTRAP_SEED  # SACREBLEU_SEED unset: sacrebleu's default seed
    _, scores = test()
    theirs = scores["BLEU"][1]
    assert ours["bleu"] == pytest.approx(theirs.score)
    assert ours["bleu_mean"] == pytest.approx(theirs.mean)
    assert ours["bleu_half_width"] == pytest.approx(theirs.ci)
    assert ours["p_value"] == pytest.approx(theirs.p_value)
    assert ours["difference"] == pytest.approx(theirs.score - scores["BLEU"][0].score)
    assert ours["low"] < ours["difference"] < ours["high"]


@pytest.mark.slow
def test_paired_bootstrap_interval_is_the_percentile_interval_of_resampled_differences():
    """An independent computation: resample sentences with numpy, rescore with sacrebleu's corpus_bleu."""
    import numpy as np

    from headcount.training.evaluate import interval_excludes_zero, paired_bootstrap

    good, bad, refs = _systems()
    ours = paired_bootstrap(good, bad, refs, n_samples=200, seed=3)
    index = np.random.default_rng(3).choice(len(refs), size=(200, len(refs)), replace=True)
    diffs = sorted(sacrebleu.corpus_bleu([good[i] for i in row], [[refs[i] for i in row]]).score
                   - sacrebleu.corpus_bleu([bad[i] for i in row], [[refs[i] for i in row]]).score
                   for row in index)
    assert ours["low"] == pytest.approx(diffs[5], abs=1e-3)
    assert ours["high"] == pytest.approx(diffs[194], abs=1e-3)
    assert interval_excludes_zero(ours["low"], ours["high"])
    same = paired_bootstrap(good, good, refs, n_samples=50)
    assert same["low"] == same["high"] == same["difference"] == 0.0
    assert not interval_excludes_zero(same["low"], same["high"])


def test_paired_bootstrap_refuses_unequal_systems():
    from headcount.training.evaluate import paired_bootstrap

    with pytest.raises(DataError, match="same sentences"):
        paired_bootstrap(HYPS, HYPS[:1], REFS)
