"""headcount.report.matched_heads: BLEU resampled from sacrebleu's statistics against sacrebleu's
own paired bootstrap, and the prunable verdicts at matched head counts on made-up seeds whose
answer is known (no loss, a loss beyond the margin, too noisy to tell)."""

import random

import numpy as np
import pandas as pd
import pytest

from headcount.report.claims import FAILS, HOLDS, NOT_RESOLVED, NOT_SHOWN
from headcount.report.matched_heads import (
    RunEvidence,
    bleu_difference,
    bleu_statistics,
    matched_markdown,
    matched_rows,
    nll_difference,
    prunable_verdict,
)
from headcount.report.seed_statistics import SeedRun, ratio_of_sums, two_level_bootstrap
from headcount.training.evaluate import paired_bootstrap
from headcount.training.perplexity import paired_bootstrap_nll


def test_bleu_from_summed_statistics_is_sacrebleus_paired_bootstrap():
    rng = random.Random(0)
    words = "ein hund eine katze läuft über die wiese zwei kinder spielen im sand".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(60)]
    noisy = [" ".join(w if rng.random() > 0.3 else "x" for w in r.split()) for r in refs]
    noisier = [" ".join(w if rng.random() > 0.5 else "x" for w in r.split()) for r in refs]
    value = bleu_difference(bleu_statistics(noisier, refs), bleu_statistics(noisy, refs))
    run = SeedRun(10, value)
    got = two_level_bootstrap({1: [run], 2: [run]}, 10, len(refs))  # seeds that are copies: one level
    expected = paired_bootstrap(noisier, noisy, refs)
    assert got.estimate == pytest.approx(expected["difference"])
    assert (got.low, got.high) == pytest.approx((expected["low"], expected["high"]))


def test_nll_difference_is_the_paired_nll_bootstrap():
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 12, size=80)
    control = pd.DataFrame({"nll": tokens * 2.0 + rng.random(80), "tokens": tokens})
    pruned = pd.DataFrame({"nll": control["nll"] + tokens * 0.05 + rng.random(80), "tokens": tokens})
    got = two_level_bootstrap({1: [SeedRun(5, nll_difference(pruned, control))]} | {
        2: [SeedRun(5, nll_difference(pruned, control))]}, 5, 80)
    expected = paired_bootstrap_nll(pruned["nll"], control["nll"], tokens)
    assert (got.estimate, got.low, got.high) == pytest.approx(
        (expected["difference"], expected["low"], expected["high"]))


def made_up_runs(loss_per_head_lost: float, noise: float, n: int = 2000, seeds=(1, 2, 3)) -> list[RunEvidence]:
    """Encoder-only curves of three seeds: pruned - control BLEU per sentence is -loss * (heads
    pruned) / 48 plus noise, at 48, 20, 12, 8, 4 and 0 heads kept."""
    rng = np.random.default_rng(2)
    runs = []
    for s in seeds:
        for heads in (48, 20, 12, 8, 4, 0):
            per_sentence = -loss_per_head_lost * (48 - heads) / 48 + rng.normal(0, noise, size=n)
            value = ratio_of_sums(per_sentence, np.ones(n))
            runs.append(RunEvidence(s, "enc", 0.1, heads, {("control", "bleu"): value, ("control", "nll"): value}))
    return runs


@pytest.mark.parametrize("loss, noise, expected", [
    (0.0, 1.0, HOLDS),  # no loss, intervals of about +-0.05: no loss beyond 0.25 at 4-12 heads
    (3.0, 1.0, FAILS),  # losses of 2.25-2.75 at 4-12 heads, far beyond 0.25
    (0.0, 20.0, NOT_RESOLVED),  # no loss, but intervals of about +-1
])
def test_the_prunable_verdict_at_matched_counts(loss, noise, expected):
    rows = matched_rows(made_up_runs(loss, noise), n_sentences=2000, n_samples=300)
    verdict, basis = prunable_verdict(rows, "enc")
    assert verdict == expected, basis
    enc = rows[(rows["setting"] == "enc") & (rows["measure"] == "bleu") & (rows["difference"] == "control")]
    assert list(enc["heads"]) == [4, 10, 12]
    # the curve read at 10 heads, between the runs at 12 and 8: -loss * 38 / 48
    tolerance = 3 * noise / 2000**0.5
    assert enc[enc["heads"] == 10]["estimate"].item() == pytest.approx(-loss * 38 / 48, abs=tolerance)
    if expected == NOT_RESOLVED:
        assert "test sentences" in basis or "seeds" in basis
    text = matched_markdown("toy", rows, 2000)
    assert f"**{expected}**" in text and "| enc | 10 | pruned - control |" in text


def test_a_count_no_seed_reaches_is_said_not_guessed():
    runs = [r for r in made_up_runs(0.0, 1.0) if r.heads >= 8]  # no seed's curve reaches 4 heads
    rows = matched_rows(runs, n_sentences=2000, n_samples=100)
    four = rows[(rows["setting"] == "enc") & (rows["heads"] == 4)]
    assert four["estimate"].isna().all()
    assert "fewer than two seeds reach 4 heads" in matched_markdown("toy", rows, 2000)


def test_a_difference_one_seed_ran_says_so():
    """Twins for training.seed alone (seed_from_scratch: false): pruned - from scratch has one seed's
    curve, which the table names instead of an interval over seeds or a count not reached."""
    runs = [RunEvidence(r.seed, r.setting, r.lam, r.heads,
                        {**r.values, **({("scratch", m): r.values[("control", m)] for m in ("bleu", "nll")}
                                        if r.seed == 1 else {})}) for r in made_up_runs(0.0, 1.0)]
    rows = matched_rows(runs, n_sentences=2000, n_samples=100)
    scratch = rows[(rows["setting"] == "enc") & (rows["difference"] == "scratch")]
    assert (scratch["seeds_run"] == 1).all() and scratch["estimate"].isna().all()
    text = matched_markdown("toy", rows, 2000)
    assert "| enc | 10 | pruned - from scratch | 1 seed ran this difference: no interval over seeds |" in text
    assert "| enc | 10 | pruned - control | +" in text or "| enc | 10 | pruned - control | -" in text


@pytest.mark.slow
def test_the_workflow_step_reads_each_seeds_runs_from_files(tmp_path):
    """write_matched_over_seeds on the files the workflow names: two seeds, encoder-only runs
    keeping 20, 12 and 2 heads (the first seed) and 16 and 6 (the second), against one control each."""
    import json

    from headcount.io import write_lines
    from headcount.pipeline.seed_verdicts import write_matched_over_seeds

    rng = random.Random(3)
    words = "ein hund eine katze läuft über die wiese zwei kinder spielen im sand".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(40)]
    write_lines(tmp_path / "refs.txt", refs)

    def model(name, p_wrong):
        hyps = [" ".join(w if rng.random() > p_wrong else "x" for w in r.split()) for r in refs]
        write_lines(tmp_path / f"{name}.txt", hyps)
        tokens = [9] * len(refs)
        pd.DataFrame({"sentence": range(len(refs)), "nll": [t * (1 + p_wrong) for t in tokens],
                      "tokens": tokens}).to_csv(tmp_path / f"{name}.nll.tsv", sep="\t", index=False)
        return {"hyps": str(tmp_path / f"{name}.txt"), "nll": str(tmp_path / f"{name}.nll.tsv")}

    runs = []
    for seed, kept in ((1, (20, 12, 2)), (2, (16, 6))):
        control = model(f"control{seed}", 0.1)
        for i, heads in enumerate(kept):
            gates = tmp_path / f"gates{seed}_{i}.json"
            gates.write_text(json.dumps({"setting": "enc", "retained": {"enc_self": heads, "dec_self": 48,
                                                                         "dec_enc": 48}}))
            runs.append({"seed": seed, "setting": "enc", "lam": 0.1 * (i + 1), "gates": str(gates),
                         "pruned": model(f"pruned{seed}_{i}", 0.1 + 0.3 * (48 - heads) / 48), "control": control})
    _spread({1: ((0.1, 0.6), (-0.01, 0.01)), 2: ((-0.3, 0.2), (-0.01, -0.002))}).to_csv(
        tmp_path / "spread.tsv", sep="\t", index=False)
    rows = write_matched_over_seeds("toy", runs, str(tmp_path / "refs.txt"), str(tmp_path / "matched.md"),
                                    str(tmp_path / "matched.tsv"), log=lambda m: None,
                                    spread=str(tmp_path / "spread.tsv"))
    nll = rows[(rows["setting"] == "enc") & (rows["measure"] == "nll") & (rows["difference"] == "control")]
    # NLL per token is 1 + p_wrong: pruned - control = 0.3 * (48 - heads) / 48 on every seed's curve
    # (seed 2 keeps 6 heads at the fewest: 4 heads is seed 1's alone, not enough for a mean over seeds)
    by_count = nll.set_index("heads")["estimate"]
    assert by_count[[10, 12]].to_list() == pytest.approx([0.3 * 38 / 48, 0.3 * 36 / 48]) and pd.isna(by_count[4])
    assert list(nll["seeds"].dropna()) == ["1,2", "1,2"]
    assert "| enc | 10 | pruned - control |" in (tmp_path / "matched.md").read_text()
    assert "baseline not converged: seeds 1, 2" in (tmp_path / "matched.md").read_text()  # BLEU, NLL
    written = pd.read_csv(tmp_path / "matched.tsv", sep="\t")
    assert written.shape[0] == len(rows) and set(written["counting"]) == {"headcount"}  # no paper counts given


def _spread(enc: dict[int, tuple[tuple[float, float], tuple[float, float]]]) -> pd.DataFrame:
    """seeds/spread.tsv's control rows (seed_spread): seed -> (BLEU interval, NLL interval) of the
    encoder-only control - baseline; the all-types control gains nothing on any seed."""
    rows = []
    for system, pick in (("control enc - baseline", 0), ("control enc - baseline, NLL", 1),
                         ("control all - baseline", None), ("control all - baseline, NLL", None)):
        row = {"system": system}
        for seed, intervals in enc.items():
            low, high = intervals[pick] if pick is not None else (-0.5, 0.5)
            row |= {f"seed_{seed}": (low + high) / 2, f"seed_{seed}_low": low, f"seed_{seed}_high": high}
        rows.append(row)
    return pd.DataFrame(rows)


def test_the_verdicts_over_seeds_name_the_seeds_whose_control_gains():
    """The control's check (rules of 2026-11-27): a seed whose lambda = 0 control gains over its
    baseline beyond the paired interval, in BLEU or in NLL, had not converged; the verdicts say so."""
    rows = matched_rows(made_up_runs(0.0, 1.0), n_sentences=2000, n_samples=100)
    gains = _spread({1: ((0.02, 0.68), (-0.0064, 0.0011)), 2: ((-0.4, 0.3), (-0.002, 0.003)),
                     3: ((-0.3, 0.2), (-0.02, -0.001))})
    text = matched_markdown("toy", rows, 2000, gains)
    enc_row = next(line for line in text.splitlines() if line.startswith("| most encoder heads"))
    assert enc_row.endswith("baseline not converged: seeds 1, 3 |")
    all_row = next(line for line in text.splitlines() if line.startswith("| most heads prunable"))
    assert "not converged" not in all_row
    assert "- seed 1, enc: " in text and "BLEU +0.35 [+0.02, +0.68]" in text and "- seed 2" not in text
    assert "- seed 3, enc: " in text and "NLL (nats/token) -0.0105 [-0.0200, -0.0010]" in text
    settled = matched_markdown("toy", rows, 2000, _spread({1: ((-0.4, 0.3), (0.01, 0.02))}))  # a loss: no gain
    assert "not converged" not in settled and "finds every seed's baseline converged" in settled
    assert "converged" not in matched_markdown("toy", rows, 2000)  # without the spread, nothing is claimed


def test_the_verdicts_over_seeds_read_the_gates_as_the_rules_ask():
    """The rules of 2026-11-27: a run with more than 5% of its gates undecided is named, and where the
    paper's count (log alpha < 0) differs from headcount's by more than 2 heads in some run, the
    verdict is given under both, the paper's from every run recounted."""
    from dataclasses import replace

    from headcount.report.matched_heads import gate_checks

    runs = made_up_runs(3.0, 1.0)  # losses of 2.25-2.75 BLEU at 4-12 heads: does not hold
    agreeing = [replace(r, paper_heads=min(48, r.heads + 2), gated=48,
                        undecided=3 if (r.seed, r.heads) == (2, 12) else 2) for r in runs]
    checks = gate_checks(agreeing, 2000, n_samples=100)
    assert checks.paper_rows is None and [(r.seed, r.heads) for r in checks.undecided] == [(2, 12)]
    text = matched_markdown("toy", matched_rows(agreeing, 2000, n_samples=100), 2000, gates=checks)
    enc_row = next(line for line in text.splitlines() if line.startswith("| most encoder heads"))
    assert f"**{FAILS}**" in enc_row and enc_row.endswith("; gates undecided in seed 2 lambda 0.1 |")
    assert "seed 2, enc lambda 0.1: 3 of 48" in text and "paper's count" not in text
    # the paper's rule keeps 30 more heads: no seed's recounted curve reaches 4-12 heads
    apart = [replace(r, paper_heads=min(48, r.heads + 30)) for r in runs]
    checks = gate_checks(apart, 2000, n_samples=100)
    assert checks.paper_rows is not None and len(checks.apart["enc"]) == 15  # 20, 12, 8, 4, 0 heads; 3 seeds
    text = matched_markdown("toy", matched_rows(apart, 2000, n_samples=100), 2000, gates=checks)
    enc_row = next(line for line in text.splitlines() if line.startswith("| most encoder heads"))
    assert enc_row.startswith(f"| most encoder heads prunable (encoder only) | **{FAILS}** |")
    assert "by the paper's count (log alpha < 0; it differs from headcount's by more than 2 heads in seed 1 " \
           "lambda 0.1" in enc_row and f"**{NOT_SHOWN}**" in enc_row
