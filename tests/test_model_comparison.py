"""The comparison of several experiments' models (headcount.report.model_comparison, issue 36):
per-sentence positional counts, the paired bootstrap of the largest positional share, the table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from headcount.analysis.roles.statistics import PositionalStats
from headcount.io import HeadcountError
from headcount.report.claims import FAILS, HOLDS
from headcount.report.model_comparison import (
    ABLATION_BLEU_COST,
    ABLATION_LOSS_COST,
    ModelOutputs,
    ModelRun,
    compare_models,
    comparison_markdown,
    comparison_table,
    model_row,
    positional_bootstrap,
    resample_weights,
)
from headcount.training.evaluate import BOOTSTRAP_SEED

torch.set_num_threads(1)


def planted_maps(lengths: list[int], targets: list[list[list[int]]]) -> torch.Tensor:
    """(L=1, B, H, S, S) maps over n real tokens + EOS per sentence: query q of head h in sentence b
    puts 0.6 on targets[b][h][q], 0.3 on EOS and the rest evenly on the real keys; padding keys get
    0.9 (never counted)."""
    S = max(lengths) + 1
    H = len(targets[0])
    probs = np.zeros((1, len(lengths), H, S, S))
    for b, n in enumerate(lengths):
        for h in range(H):
            for q in range(n):
                probs[0, b, h, q, :n + 1] = 0.1 / (n + 1)
                probs[0, b, h, q, n] += 0.3
                probs[0, b, h, q, targets[b][h][q]] += 0.6
            probs[0, b, h, :n, n + 1:] = 0.9
    return torch.tensor(probs, dtype=torch.float32)


def random_targets(lengths: list[int], heads: int, right: list[float], offsets: list[int], seed: int):
    """Per sentence and head, each query's argmax: q + offsets[h] with probability right[h] where
    that is a real token, else a random real token."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        sentence = []
        for h in range(heads):
            sentence.append([q + offsets[h] if 0 <= q + offsets[h] < n and rng.random() < right[h]
                             else int(rng.integers(n)) for q in range(n)])
        out.append(sentence)
    return out


def direct_counts(lengths, targets, offsets):
    """Per sentence and head, hits at and queries valid for the head's offset, counted in a loop."""
    hits = np.zeros((len(lengths), 1, len(offsets)), np.int64)
    valid = np.zeros_like(hits)
    for b, n in enumerate(lengths):
        for h, k in enumerate(offsets):
            for q in range(n):
                if 0 <= q + k < n:
                    valid[b, 0, h] += 1
                    hits[b, 0, h] += targets[b][h][q] == q + k
    return hits, valid


def test_sentence_counts_are_each_sentences_share_of_the_pooled_table():
    lengths = [5, 12, 3, 9, 7, 14]
    targets = random_targets(lengths, 3, right=[0.9, 0.6, 0.3], offsets=[-1, 1, -2], seed=1)
    stats = PositionalStats(per_sentence=True)
    for part in (slice(0, 2), slice(2, 6)):  # two batches of different widths
        stats.update(planted_maps(lengths[part], targets[part]), [n + 1 for n in lengths[part]])
    table = stats.table()
    assert table["offset"].tolist() == [-1, 1, -2]
    hits, valid = stats.sentence_counts()
    expected_hits, expected_valid = direct_counts(lengths, targets, [-1, 1, -2])
    np.testing.assert_array_equal(hits, expected_hits)
    np.testing.assert_array_equal(valid, expected_valid)
    np.testing.assert_allclose(hits.sum(0)[0] / valid.sum(0)[0], table["fraction"])


def loop_bootstrap(counts: dict, n_samples: int, seed: int) -> dict:
    """The largest share of each resample, resampled by indexing sentences one by one."""
    n = next(iter(counts.values()))[0].shape[0]
    draws = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    out = {}
    for name, (hits, valid) in counts.items():
        largest = []
        for draw in draws:
            shares = [sum(hits[i].ravel()[h] for i in draw) / sum(valid[i].ravel()[h] for i in draw)
                      for h in range(hits[0].size)]
            largest.append(max(shares))
        out[name] = np.array(largest)
    return out


def test_the_paired_bootstrap_matches_resampling_sentence_by_sentence():
    lengths = [6, 11, 4, 9, 8, 13, 5, 10]
    offsets = [-1, 1]
    counts = {}
    for name, right, seed in (("a", [0.9, 0.5], 2), ("b", [0.6, 0.55], 3)):
        targets = random_targets(lengths, 2, right, offsets, seed)
        counts[name] = direct_counts(lengths, targets, offsets)
    shares, differences = positional_bootstrap(counts, n_samples=200, seed=BOOTSTRAP_SEED)
    loop = loop_bootstrap(counts, 200, BOOTSTRAP_SEED)
    for name in ("a", "b"):
        row = shares.set_index("experiment").loc[name]
        ordered = np.sort(loop[name])
        assert (row["positional_share_low"], row["positional_share_high"]) == pytest.approx((ordered[5], ordered[194]))
        hits, valid = counts[name]
        assert row["positional_share"] == pytest.approx(max(hits.sum(0).ravel() / valid.sum(0).ravel()))
    gap = np.sort(loop["b"] - loop["a"])
    d = differences.iloc[0]
    assert (d["experiment"], d["minus"]) == ("b", "a")
    assert (d["low"], d["high"]) == pytest.approx((gap[5], gap[194]))
    assert d["difference"] == pytest.approx(shares["positional_share"].iloc[1] - shares["positional_share"].iloc[0])


def test_the_interval_is_a_point_when_every_sentence_is_the_same():
    lengths = [9] * 12
    one = random_targets([9], 2, right=[0.7, 0.4], offsets=[-1, 1], seed=4)[0]
    other = random_targets([9], 2, right=[1.0, 0.2], offsets=[-1, 1], seed=5)[0]
    counts = {"a": direct_counts(lengths, [one] * 12, [-1, 1]), "b": direct_counts(lengths, [other] * 12, [-1, 1])}
    shares, differences = positional_bootstrap(counts)
    for r in shares.itertuples():
        assert r.positional_share_low == r.positional_share == r.positional_share_high
    assert shares["positional_share"].iloc[1] == 1.0  # a perfect -1 head
    d = differences.iloc[0]
    assert d["low"] == d["difference"] == d["high"] == pytest.approx(1.0 - shares["positional_share"].iloc[0])


def test_models_counted_on_different_sentences_are_refused():
    counts = {"a": (np.ones((3, 1, 2)), np.ones((3, 1, 2))), "b": (np.ones((4, 1, 2)), np.ones((4, 1, 2)))}
    with pytest.raises(HeadcountError, match="same analysis sentences"):
        positional_bootstrap(counts)


def test_resample_weights_draw_as_evaluate_does():
    weights = resample_weights(7, n_samples=5, seed=3)
    index = np.random.default_rng(3).choice(7, size=(5, 7), replace=True)
    assert weights.tolist() == [np.bincount(row, minlength=7).tolist() for row in index]


# --------------------------------------------------------------------------------------------
# The table, on result files written here


TYPES = ("enc_self", "dec_self", "dec_enc")


def write_results(root, name: str, roles: list[str], fractions: list[float], offsets: list[int], lrp: dict,
                  delta_bleu: list[float], delta_loss: dict, bleu: float) -> ModelOutputs:
    """An experiment's baseline/scores.tsv, heads/scores.csv and syntax/roles.csv: 2 layers of 2
    heads per type, heads in (layer, head) order."""
    folder = root / name
    for sub in ("baseline", "heads", "syntax"):
        (folder / sub).mkdir(parents=True)
    pd.DataFrame({"experiment": [name], "split": ["test_2016_flickr"], "sentences": [1000], "bleu": [bleu],
                  "chrf": [60.0]}).to_csv(folder / "baseline/scores.tsv", sep="\t", index=False)
    heads = [(layer, head) for layer in range(2) for head in range(2)]
    rows = []
    for kind in TYPES:
        for i, (layer, head) in enumerate(heads):
            rows.append({"type": kind, "layer": layer, "head": head, "confidence": 0.5, "michel": 0.1,
                         "michel_raw": 0.1, "lrp": lrp[kind][i], "delta_loss": delta_loss[kind][i],
                         "delta_bleu": delta_bleu[i] if kind == "enc_self" else np.nan})
    pd.DataFrame(rows).to_csv(folder / "heads/scores.csv", index=False)
    pd.DataFrame({"layer": [h[0] for h in heads], "head": [h[1] for h in heads], "role": roles,
                  "positional_offset": offsets, "positional_fraction": fractions}).to_csv(
        folder / "syntax/roles.csv", index=False)
    return ModelOutputs(name, str(folder / "baseline/scores.tsv"), str(folder / "heads/scores.csv"),
                        str(folder / "syntax/roles.csv"))


def two_experiments(root) -> list[ModelOutputs]:
    even = {"enc_self": [0.5, 0.5, 0.5, 0.5], "dec_self": [0.5, 0.5, 0.5, 0.5], "dec_enc": [0.5, 0.5, 0.5, 0.5]}
    peaked = {"enc_self": [0.9, 0.1, 0.3, 0.7], "dec_self": [0.6, 0.4, 0.2, 0.8], "dec_enc": [1.0, 0.0, 0.5, 0.5]}
    loss = {"enc_self": [0.001, 0.02, 0.0, 0.05], "dec_self": [0.0, 0.0, 0.011, 0.0], "dec_enc": [0.3, 0.0, 0.0, 0.0]}
    return [
        write_results(root, "fairseq", ["positional", "rare", "none", "positional"], [0.95, 0.2, 0.51, 0.97],
                      [-1, 1, 1, 1], peaked, [-0.2, -1.5, 0.1, -0.7], loss, bleu=35.1),
        write_results(root, "headcount", ["rare", "syntactic", "none", "none"], [0.3, 0.36, 0.1, 0.2],
                      [1, -1, 2, 1], even, [0.0, 0.0, 0.0, 0.0], {k: [0.0] * 4 for k in TYPES}, bleu=33.0),
    ]


def test_a_models_row_reads_its_three_files(tmp_path):
    fairseq, headcount = (model_row(o) for o in two_experiments(tmp_path))
    assert fairseq["bleu_test_2016_flickr"] == 35.1
    assert {k: fairseq[f"role_{k}"] for k in ("positional", "syntactic", "rare", "none")} == {
        "positional": 2, "syntactic": 0, "rare": 1, "none": 1}
    assert (fairseq["positional_share"], fairseq["positional_head"], fairseq["positional_offset"]) == (0.97, "2.2", 1)
    assert (headcount["positional_share"], headcount["positional_head"], headcount["positional_offset"]) == (
        0.36, "1.2", -1)
    # LRP concentration: the top head's share per layer, averaged over the layers
    assert fairseq["lrp_concentration_enc_self"] == pytest.approx((0.9 + 0.7) / 2)
    assert fairseq["lrp_concentration_dec_enc"] == pytest.approx((1.0 + 0.5) / 2)
    assert headcount["lrp_concentration_dec_self"] == pytest.approx(0.5)
    # ablation: BLEU cost is BLEU falling (delta_bleu < 0), loss cost the loss rising
    assert (fairseq["ablation_bleu_max_enc_self"], fairseq["ablation_bleu_head_enc_self"]) == (1.5, "1.2")
    assert fairseq["ablation_bleu_over_enc_self"] == 2 and ABLATION_BLEU_COST == 0.5
    assert "ablation_bleu_max_dec_self" not in fairseq  # measured for encoder heads only
    assert (fairseq["ablation_loss_max_dec_enc"], fairseq["ablation_loss_head_dec_enc"]) == (0.3, "1.1")
    assert fairseq["ablation_loss_over_enc_self"] == 2 and ABLATION_LOSS_COST == 0.01
    assert fairseq["ablation_loss_over_dec_self"] == 1
    assert headcount["ablation_bleu_over_enc_self"] == 0


def test_the_markdown_has_a_column_per_model_and_the_differences(tmp_path):
    outputs = two_experiments(tmp_path)
    shares = pd.DataFrame({"experiment": ["fairseq", "headcount"], "positional_share": [0.97, 0.36],
                           "positional_share_low": [0.93, 0.31], "positional_share_high": [0.99, 0.40],
                           "sentences": [500, 500]})
    differences = pd.DataFrame({"experiment": ["headcount"], "minus": ["fairseq"], "difference": [-0.61],
                                "low": [-0.66], "high": [-0.55]})
    table = comparison_table([model_row(o) for o in outputs], shares, differences)
    assert table.loc[1, "positional_share_minus_fairseq"] == -0.61
    assert pd.isna(table.loc[0, "positional_share_minus_fairseq"])
    text = comparison_markdown("toolkits", table, differences, {"fairseq": "fairseq-train, 2,000 updates"})
    lines = text.splitlines()
    assert lines[0] == "### toolkits: the same analyses on 2 models"
    assert lines[2] == "| | fairseq | headcount |"
    assert "| test BLEU, test_2016_flickr | 35.10 | 33.00 |" in lines
    assert "| enc_self heads: positional | 2 of 4 | 0 of 4 |" in lines
    assert ("| largest enc_self positional share [95% interval] (head, offset) | 0.97 [0.93, 0.99] (2.2, offset +1) "
            "| 0.36 [0.31, 0.40] (1.2, offset -1) |") in lines
    assert "| largest ablation BLEU cost, enc_self (head) | 1.50 (1.2) | 0.00 (1.1) |" in lines
    assert not any("BLEU cost, dec_self" in line for line in lines)
    assert "| headcount - fairseq | -0.61 [-0.66, -0.55], difference |" in lines
    assert "500 analysis sentences" in text and "fairseq: fairseq-train, 2,000 updates." in text


def test_a_missing_file_names_itself_and_the_fix(tmp_path):
    outputs = two_experiments(tmp_path)[0]
    (tmp_path / "fairseq/syntax/roles.csv").unlink()
    with pytest.raises(HeadcountError, match=r"roles.csv: missing; .*run its workflow first"):
        model_row(outputs)


# --------------------------------------------------------------------------------------------
# The stage, on a tiny model


@pytest.mark.slow
def test_compare_models_on_tiny_models(tmp_path):
    from conftest import tiny_config, toy_corpus

    from headcount.data.subwords import Segmenter, train_bpe
    from headcount.models.checkpoint import save_checkpoint
    from headcount.models.transformer import Transformer

    sources = toy_corpus(200, 1)[0]
    (tmp_path / "train.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (tmp_path / "dev.txt").write_text("\n".join(toy_corpus(12, 2)[0]) + "\n", encoding="utf-8")
    train_bpe(tmp_path / "train.txt", tmp_path / "src.model", 60)
    cfg = tiny_config(src_vocab=len(Segmenter(str(tmp_path / "src.model"))))
    for seed in (0, 1):
        torch.manual_seed(seed)
        save_checkpoint(tmp_path / f"model{seed}.pt", {"model": Transformer(cfg).state_dict(),
                                                       "model_config": cfg.to_dict()})
    outputs = two_experiments(tmp_path / "results")
    runs = {o.name: ModelRun(str(tmp_path / f"model{i}.pt"), str(tmp_path / "src.model"), str(tmp_path / "dev.txt"),
                             False) for i, o in enumerate(outputs)}
    out = {"table": str(tmp_path / "comparison.tsv"), "markdown": str(tmp_path / "comparison.md")}
    logs = []
    table = compare_models("toys", outputs, runs, 10, out, n_samples=100, log=logs.append)
    written = pd.read_csv(out["table"], sep="\t")
    assert written["positional_sentences"].eq(10).all() and len(written) == 2
    assert written["positional_share_bootstrap"].between(0, 1).all()
    row = written.iloc[1]
    assert row["positional_share_minus_fairseq_low"] <= row["positional_share_minus_fairseq_high"]
    assert table["experiment"].tolist() == ["fairseq", "headcount"]
    # roles.csv written here is not these models': the recomputed share says so
    assert any("WARNING: fairseq" in line for line in logs)
    assert "| headcount - fairseq |" in (tmp_path / "comparison.md").read_text()

    # the same model twice: no difference, and an interval of exactly 0
    same = {o.name: runs["fairseq"] for o in outputs}
    table = compare_models("toys", outputs, same, 10, out, n_samples=100, log=lambda _: None)
    assert table.loc[1, ["positional_share_minus_fairseq_low", "positional_share_minus_fairseq_high"]].tolist() == [
        0.0, 0.0]

    (tmp_path / "other.txt").write_text("A different sentence .\n" * 12, encoding="utf-8")
    runs["headcount"] = ModelRun(runs["headcount"].model, runs["headcount"].src_tokenizer, str(tmp_path / "other.txt"),
                                 False)
    with pytest.raises(HeadcountError, match="analysis sentences of headcount and fairseq differ"):
        compare_models("toys", outputs, runs, 10, out, log=lambda _: None)


# --------------------------------------------------------------------------------------------
# The `compare` key of the configuration


def shipped_config(**changes) -> dict:
    import yaml
    from toyflow import REPO

    with open(REPO / "config/config.yaml") as f:
        config = yaml.safe_load(f)
    return {**config, **changes}


def compare_problems(config: dict) -> str:
    from toyflow import REPO

    from headcount.config import ConfigError, load_experiments

    with pytest.raises(ConfigError) as error:
        load_experiments(config, REPO / "workflow/schemas/config.schema.yaml")
    return str(error.value)


def test_a_comparison_of_experiments_that_run_is_valid():
    from toyflow import REPO

    from headcount.config import load_experiments

    config = shipped_config(run=["multi30k_en_de", "multi30k_en_fr"], compare={"two": ["multi30k_en_de",
                                                                                      "multi30k_en_fr"]})
    assert set(load_experiments(config, REPO / "workflow/schemas/config.schema.yaml")) >= set(config["run"])


@pytest.mark.parametrize("compare, run, expected", [
    ({"two": ["multi30k_en_de", "multi30k_en_fr"]}, ["multi30k_en_de"],
     "config key 'compare.two.1': 'multi30k_en_fr' is not in 'run', so its results are not built; add it to "
     "'run' or remove it from compare.two"),
    ({"two": ["multi30k_en_de", "nowhere"]}, ["multi30k_en_de"], "config key 'compare.two.1': no experiment named "
     "'nowhere'"),
    ({"two": ["multi30k_en_de"]}, ["multi30k_en_de"], "compare.two"),  # one model compares nothing (schema)
    ({"two": ["multi30k_en_de", "multi30k_en_fr"]}, ["multi30k_en_de", "multi30k_en_fr"],
     "config key 'compare.two': the experiments analyse different sentences (multi30k_en_de: dev[:500], "
     "multi30k_en_fr: dev[:100]); give them the same analysis.set and analysis.max_sentences"),
])
def test_a_bad_comparison_names_the_key_and_the_fix(compare, run, expected):
    config = shipped_config(run=run, compare=compare)
    config["experiments"]["multi30k_en_fr"]["analysis"] = {"max_sentences": 100}
    assert expected in compare_problems(config)


def test_the_lrp_rule_reads_each_layers_top_heads_averaged_over_the_models(tmp_path):
    """Issue 61's rule for "a few heads carry most relevance": each layer's top two heads' share,
    averaged over the models, above one half in more than half of the layers."""
    from headcount.report.model_comparison import lrp_concentration_verdict

    outputs = two_experiments(tmp_path)
    table = comparison_table([model_row(o) for o in outputs])
    # 2 heads a layer: the top two hold everything in every layer, for every model
    verdict, basis = lrp_concentration_verdict(table, "enc_self")
    assert verdict == HOLDS and basis.startswith("2 of 2 layers")
    # 4 heads a layer, two models: layer 0 concentrated in one (0.9 + 0.1 of 1) and even in the other
    # (0.5 of 1): mean 0.7 > 0.5; layer 1 even in both (0.5): not above; 1 of 2 layers is not more than half
    table = pd.DataFrame({"lrp_top_shares_enc_self": ["0.900000,0.500000", "0.500000,0.500000"]})
    verdict, basis = lrp_concentration_verdict(table, "enc_self")
    assert verdict == FAILS and basis.startswith("1 of 2 layers") and "per layer 0.70, 0.50" in basis
    assert lrp_concentration_verdict(pd.DataFrame({"x": [1]}), "enc_self") is None
    text = comparison_markdown("toolkits", comparison_table([model_row(o) for o in outputs]))
    assert "| a few heads carry most relevance, enc_self (over these models) | **holds**: 2 of 2 layers" in text
