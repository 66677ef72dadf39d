"""Scores come from sacrebleu with their signatures; checked against sacrebleu's own API."""

import pytest
import sacrebleu

from headcount.evaluate import score_translations
from headcount.io import DataError

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
