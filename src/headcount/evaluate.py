"""Translation quality with sacrebleu: BLEU and chrF on detokenised text, with signatures."""

from __future__ import annotations

from sacrebleu.metrics import BLEU, CHRF

from .io import DataError


def score_translations(hypotheses: list[str], references: list[str], lowercase: bool = False) -> dict:
    """Corpus BLEU and chrF; each score comes with the sacrebleu signature that reproduces it."""
    if len(hypotheses) != len(references):
        raise DataError(f"{len(hypotheses)} translations for {len(references)} references: "
                        f"the translation output is incomplete; delete it and rerun the translate rule")
    bleu, chrf = BLEU(lowercase=lowercase), CHRF(lowercase=lowercase)
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def corpus_bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> float:
    return BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score
