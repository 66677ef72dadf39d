"""LRP's conservation tolerance: a score table keeps its `lrp` column where relevance is conserved
within relevance.CONSERVATION_TOLERANCE at every cut, and loses it, with a log line and a marked
conservation table, where it is not; the model comparison reads a score table without it."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import random_batch, randomise_norms_and_biases, tiny_config

from headcount.analysis import relevance
from headcount.analysis.measures import ScoringInputs, score_table
from headcount.analysis.relevance import CONSERVATION_TOLERANCE, conservation_failures, mark_conservation
from headcount.models.transformer import Transformer


def test_the_tolerance_is_float32s_reach():
    assert CONSERVATION_TOLERANCE == 1 / torch.finfo(torch.float32).eps


def test_cuts_are_marked_against_the_tolerance():
    errors = [0.0, 3.69e5, CONSERVATION_TOLERANCE, 1.01 * CONSERVATION_TOLERANCE, 1e15, math.inf, math.nan]
    table = pd.DataFrame({"cut": [f"enc.{i}" for i in range(len(errors))], "mean_abs_error": errors})
    marked = mark_conservation(table)
    assert marked["within_tolerance"].tolist() == [True, True, True, False, False, False, False]
    assert (marked["tolerance"] == CONSERVATION_TOLERANCE).all()
    assert [f.split()[0] for f in conservation_failures(marked)] == ["enc.3", "enc.4", "enc.5", "enc.6"]
    assert mark_conservation(table, tolerance=1.0)["within_tolerance"].tolist() == [True] + [False] * 6


def model_and_batches():
    torch.manual_seed(2)
    model = randomise_norms_and_biases(Transformer(tiny_config(
        src_vocab=12, tgt_vocab=12, d_model=8, n_heads=2, d_ff=16, enc_layers=2, dec_layers=2)).double().eval())
    src, tgt_in = random_batch(model)
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full_like(tgt_in[:, :1], model.special.pad)], dim=1)
    return model, [(src, tgt_in, tgt_out)]


def scores(model, batches):
    lines = []
    inputs = ScoringInputs(model, batches, batches, log=lines.append)
    return score_table(inputs, ["confidence", "lrp"]), inputs.notes, lines


def test_a_conserved_lrp_keeps_its_column():
    model, batches = model_and_batches()
    table, notes, lines = scores(model, batches)
    assert "lrp" in table and np.isfinite(table["lrp"]).all()
    conservation = notes["lrp_conservation"]
    assert conservation["within_tolerance"].all() and (conservation["tolerance"] == CONSERVATION_TOLERANCE).all()
    assert conservation["mean_abs_error"].max() > 1e-3  # biases: it drifts, within the tolerance
    assert "lrp_dropped" not in notes and not any("left out" in line for line in lines)


def test_conservation_beyond_the_tolerance_drops_the_column(monkeypatch):
    """MiniLM's failure (1e15 at the lowest cut), reproduced by scaling the lowest cut's totals."""
    exact = relevance._accumulate

    def blown_up(result, *args, **kwargs):
        result.cuts["enc.0"] = result.cuts["enc.0"] * 1e15
        return exact(result, *args, **kwargs)

    monkeypatch.setattr(relevance, "_accumulate", blown_up)
    model, batches = model_and_batches()
    table, notes, lines = scores(model, batches)
    assert "lrp" not in table and "confidence" in table and len(table) == 3 * 2 * 2  # every head, no lrp
    conservation = notes["lrp_conservation"].set_index("cut")
    assert not conservation.loc["enc.0", "within_tolerance"]
    assert conservation.drop(index="enc.0")["within_tolerance"].all()
    assert any("conservation fails" in line and "enc.0" in line and "lrp column is left out" in line
               for line in lines)
    assert "enc.0" in notes["lrp_dropped"]


def test_a_tighter_tolerance_drops_a_drifting_lrp(monkeypatch):
    """The real drift of a model with biases (> 1e-3 below the top cut, none above it) against a
    tolerance of 1e-6: the cuts below the top fail, the top one holds."""
    monkeypatch.setattr(relevance, "CONSERVATION_TOLERANCE", 1e-6)
    model, batches = model_and_batches()
    table, notes, lines = scores(model, batches)
    assert "lrp" not in table
    conservation = notes["lrp_conservation"]
    expected = conservation["mean_abs_error"] <= 1e-6
    assert conservation["within_tolerance"].tolist() == expected.tolist()
    assert conservation["within_tolerance"].iloc[0] and not conservation["within_tolerance"].all()


def test_the_model_comparison_reads_scores_without_lrp(tmp_path):
    from test_model_comparison import two_experiments

    from headcount.report.model_comparison import model_row

    outputs = two_experiments(tmp_path)
    path = outputs[0].head_scores
    pd.read_csv(path).drop(columns="lrp").to_csv(path, index=False)
    row = model_row(outputs[0])
    assert not any(key.startswith("lrp_concentration") for key in row)
    assert row["ablation_loss_over_enc_self"] == 2  # the rest of the row as before
    assert model_row(outputs[1])["lrp_concentration_dec_self"] == pytest.approx(0.5)
