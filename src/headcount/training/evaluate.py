"""Translation quality with sacrebleu: BLEU and chrF on detokenised text, with signatures, and
paired bootstrap intervals of BLEU differences."""

from __future__ import annotations

import numpy as np
from sacrebleu import significance
from sacrebleu.metrics import BLEU, CHRF

from headcount.io import DataError, read_lines, write_json
from headcount.provenance import provenance


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


def score_file(hyp_path: str, ref_path: str, lowercase: bool, out_path: str, extra: dict | None = None) -> dict:
    """Score a file of translations against its references and write the scores with provenance."""
    scores = score_translations(read_lines(hyp_path), read_lines(ref_path), lowercase=lowercase)
    scores = {**scores, **(extra or {}), "provenance": provenance()}
    write_json(out_path, scores)
    return scores


def corpus_bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> float:
    return BLEU(lowercase=lowercase).corpus_score(hypotheses, [references]).score


BOOTSTRAP_SAMPLES, BOOTSTRAP_SEED = 1000, 12345  # sacrebleu's defaults for its paired bootstrap


def paired_bootstrap(hypotheses: list[str], reference_system: list[str], references: list[str],
                     lowercase: bool = False, n_samples: int = BOOTSTRAP_SAMPLES,
                     seed: int = BOOTSTRAP_SEED) -> dict:
    """BLEU(hypotheses) - BLEU(reference_system) on the same sentences, with a 95% interval from
    paired bootstrap resampling over sentences (Koehn 2004).

    The resamples are sacrebleu's own (`sacrebleu --paired-bs`): the same per-sentence BLEU
    statistics, the same index draw from numpy's default_rng(seed), BLEU recomputed from the
    summed statistics of each resample, and its p-value. sacrebleu reports each system's mean
    and half-width but not the interval of the difference, so that interval is read off the
    same resamples with the order statistics sacrebleu uses for its own intervals (the 25th
    lowest and highest of 1000).
    """
    if not len(hypotheses) == len(reference_system) == len(references):
        raise DataError(f"paired bootstrap over {len(hypotheses)} and {len(reference_system)} translations "
                        f"of {len(references)} references: both systems must translate the same sentences; "
                        f"delete the incomplete translation file and rerun the translate rule")
    metric = BLEU(lowercase=lowercase)
    stats = [np.array(metric._extract_corpus_statistics(h, [references]), dtype="float32")
             for h in (hypotheses, reference_system)]
    score, reference_score = (metric._compute_score_from_stats(s.sum(0)).score for s in stats)
    index = bootstrap_indices(len(references), n_samples, seed)
    resampled = [np.array([metric._compute_score_from_stats(row.sum(0)).score for row in s[index]])
                 for s in stats]
    low, high = bootstrap_interval(resampled[0] - resampled[1])
    sample_gaps = np.abs(resampled[0] - resampled[1])
    p_value = significance._compute_p_value(sample_gaps - sample_gaps.mean(), abs(score - reference_score))
    mean, half_width = significance.estimate_ci(resampled[0])
    return {"difference": score - reference_score, "low": low, "high": high, "p_value": float(p_value), "bleu": score,
            "bleu_mean": float(mean), "bleu_half_width": float(half_width), "samples": n_samples, "seed": seed}


def bootstrap_indices(n: int, n_samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """(n_samples, n): the sentences each resample draws, with replacement, from numpy's
    default_rng(seed). Every paired bootstrap of the project draws these, so two statistics
    resampled with the same seed are resampled over the same sentences."""
    return np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)


def bootstrap_interval(samples) -> tuple[float, float]:
    """The 95% interval of a statistic from its bootstrap resamples: the order statistics sacrebleu
    uses for its own intervals (the 25th lowest and highest of 1000)."""
    ordered = np.sort(np.asarray(samples, dtype=float))
    low = len(ordered) // 40
    return float(ordered[low]), float(ordered[len(ordered) - low - 1])


def interval_excludes_zero(low: float, high: float) -> bool:
    """Whether a difference counts as one: its 95% interval lies wholly on one side of 0."""
    return low > 0 or high < 0
