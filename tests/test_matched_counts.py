"""pruning.matched_counts: the arms' head sets, the resumable scoring, and the preregistered verdict
rule, on hand-made cases whose answers are known, and on a tiny language model against
HeadAccess.measure."""

import numpy as np
import pandas as pd
import pytest
import torch

import headcount
from headcount.analysis.head_access import BASELINE, Measurement
from headcount.pruning import matched_counts as mc
from headcount.report import preregistered

KEYS = [("dec_self", layer, head) for layer in range(3) for head in range(4)]


def test_counts_follow_the_preregistered_fractions():
    assert mc.counts_removed(270) == [68, 135, 202]
    assert mc.counts_removed(72) == [18, 36, 54]
    assert preregistered.MATCHED_FRACTIONS_REMOVED == (0.25, 0.5, 0.75)


def test_translation_counts_are_the_papers_where_the_model_is_the_papers():
    # heads kept 4, 10, 12 of 48 encoder heads; 26, 28, 36 of 144 (report.preregistered.MATCHED_HEADS)
    assert mc.matched_counts(48, "enc") == [36, 38, 44]
    assert mc.matched_counts(144, "all") == [108, 116, 118]
    assert mc.matched_counts(24, "all") == mc.counts_removed(24) == [6, 12, 18]  # another model: fractions
    assert mc.matched_counts(270) == mc.counts_removed(270)


def test_a_ranking_removes_the_lowest_first_and_its_sets_are_nested():
    scores = {key: float(i) for i, key in enumerate(reversed(KEYS))}  # the last key scores lowest
    arm = mc.ranking_arm("x", scores, [3, 6], "hand-made")
    assert arm.removed[3] == list(reversed(KEYS))[:3]
    assert arm.removed[6][:3] == arm.removed[3]


def test_random_draws_are_nested_distinct_and_reproducible():
    arms = mc.random_arms(KEYS, [3, 6, 9], draws=5, seed=1)
    again = mc.random_arms(KEYS, [3, 6, 9], draws=5, seed=1)
    assert [a.removed for a in arms] == [a.removed for a in again]
    for arm in arms:
        assert arm.removed[9][:6] == arm.removed[6] and len(set(arm.removed[9])) == 9
    assert len({tuple(a.removed[3]) for a in arms}) > 1


def test_iterative_ranking_rescores_with_the_removed_heads_known():
    seen = []

    def rescore(removed):  # the heads' scores fall once a neighbour in their layer is gone
        seen.append(list(removed))
        gone_layers = {layer for _, layer, _ in removed}
        return {k: (0.0 if k[1] in gone_layers else 1.0) + 0.01 * k[2] for k in KEYS}

    arm = mc.iterative_arm("it", rescore, KEYS, [2, 4], step=1, ranked_on="", log=lambda m: None)
    assert len(seen) == 4 and seen[0] == []
    # after the first head (layer 0, head 0) goes, its layer's heads score lowest: layer 0 empties first
    assert arm.removed[4] == [("dec_self", 0, h) for h in range(4)]
    assert arm.removed[2] == arm.removed[4][:2]
    # the scores with nothing removed, given, are not computed again
    seen.clear()
    again = mc.iterative_arm("it", rescore, KEYS, [2, 4], step=1, ranked_on="", log=lambda m: None,
                             first={k: 1.0 + 0.01 * k[2] + k[1] for k in KEYS})
    assert len(seen) == 3 and [] not in seen and again.removed[4] == arm.removed[4]


def test_whole_units_come_nearest_the_count():
    layers = {("dec_self", la): [k for k in KEYS if k[1] == la] for la in range(3)}
    arm = mc.unit_arm("layers", layers, {("dec_self", 0): 2.0, ("dec_self", 1): 0.5, ("dec_self", 2): 1.0},
                      [3, 6, 11], "")
    assert arm.removed[3] == layers[("dec_self", 1)]  # 4 heads: nearest 3
    assert len(arm.removed[6]) in (4, 8) and len(arm.removed[11]) == 8  # never every layer


def test_kv_groups_follow_transformers_repeat_kv():
    from transformers.models.llama.modeling_llama import repeat_kv

    groups = mc.kv_groups({"dec_self": [9, 9]}, kv_heads=3)
    kv = torch.arange(3.0).view(1, 3, 1, 1)  # key/value head i holds the value i
    expanded = repeat_kv(kv, 3).flatten()  # which key/value head each query head reads
    for (_, _, group), heads in groups.items():
        assert [int(expanded[h]) for _, _, h in heads] == [group] * 3
    assert mc.kv_groups({"dec_self": [4]}, kv_heads=None) == {}
    assert mc.kv_bytes_per_token([("dec_self", 0, h) for h in range(3)], groups, head_dim=64) == 2 * 64 * 2 * 5
    assert mc.kv_bytes_per_token([("dec_self", 0, 0), ("dec_self", 0, 4)], groups, head_dim=64) == 2 * 64 * 2 * 6


def _measurement(values: dict[str, float], texts: int = 40, noise: float = 0.01, seed: int = 0) -> Measurement:
    """Per-text losses around each set's value, with text effects shared by every set (what makes
    the intervals paired)."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 0.5, texts)
    names = [BASELINE, *values]
    sums = np.stack([3.0 + shared + (values.get(n, 0.0) + rng.normal(0, noise, texts)) for n in names]) * 10
    return Measurement(names, {n: [] for n in names}, sums, np.full(texts, 10.0), baseline=BASELINE)


def test_the_verdict_rule_on_known_cases():
    draws = mc.random_arms(KEYS, [6], draws=20, seed=0)
    good = mc.Arm("good", "method", "", {6: KEYS[:6]})
    edge = mc.Arm("at the edge", "method", "", {6: KEYS[6:]})
    bad = mc.Arm("bad", "method", "", {6: KEYS[3:9]})
    values = {mc.set_name(a, 6): 1.0 + 0.05 * i for i, a in enumerate(draws)}  # the band: 1.0-1.95
    values.update({mc.set_name(good, 6): 0.2, mc.set_name(edge, 6): 1.045, mc.set_name(bad, 6): 3.0})
    measured = _measurement(values, noise=0.1)  # a 0.005 difference is not resolved, 0.8 is
    table = mc.verdicts(measured, [good, edge, bad, *draws], margin=0.05).set_index("arm")
    assert table.loc["good", "beats_random"] and table.loc["good", "below_band"]
    # numpy's 5th percentile of 1.00, 1.05, ...: 1.0475, above the unpruned model's loss
    assert table.loc["good", "random_p5"] - measured.value(BASELINE) == pytest.approx(1.0475, abs=0.05)
    assert not table.loc["at the edge", "beats_random"]  # below the band's edge, but not beyond the draw at it
    assert not table.loc["bad", "below_band"] and not table.loc["bad", "beats_random"]
    assert table.loc["good", "next_arm"] == "at the edge" and table.loc["good", "vs_next_high"] < 0
    assert not table.loc["good", "no_loss"]  # 0.2 nats above the unpruned model
    fewer = mc.Arm("fewer heads", "structure", "", {6: KEYS[:4]})  # whole units, short of the count
    values[mc.set_name(fewer, 6)] = 0.1
    judged = mc.verdicts(_measurement(values, noise=0.1), [fewer, *draws], margin=0.05).set_index("arm")
    assert judged.loc["fewer heads", "below_band"] and pd.isna(judged.loc["fewer heads", "beats_random"])
    near = mc.verdicts(_measurement({mc.set_name(good, 6): 0.0, **{mc.set_name(a, 6): 1.0 for a in draws}}),
                       [good, *draws], margin=0.05).set_index("arm")
    assert near.loc["good", "no_loss"]
    summary = mc.summary(table.reset_index(), total_heads=12)
    assert set(summary["arm"]) == {"good", "at the edge", "bad", "random (median of draws)"}
    assert (summary["kept"] == 6).all()


def test_a_verdict_over_seeds_holds_only_where_it_holds_on_every_seed(tmp_path):
    draws = mc.random_arms(KEYS, [6], draws=20, seed=0)
    steady = mc.Arm("steady", "method", "", {6: KEYS[:6]})  # below the band on every seed
    fickle = mc.Arm("fickle", "method", "", {6: KEYS[6:]})  # inside the band on seed 3
    partial = mc.Arm("partial", "method", "", {6: KEYS[3:9]})  # a score seed 2 lacks (as LRP)
    summaries, expected = {}, {}
    for seed, fickle_value in ((1, 0.3), (2, 0.4), (3, 1.5)):
        values = {mc.set_name(a, 6): 1.0 + 0.05 * i + 0.01 * seed for i, a in enumerate(draws)}
        values.update({mc.set_name(steady, 6): 0.1 * seed, mc.set_name(fickle, 6): fickle_value,
                       mc.set_name(partial, 6): 0.35})
        arms = [steady, fickle, *draws] + ([partial] if seed != 2 else [])
        table = mc.summary(mc.verdicts(_measurement(values, noise=0.02, seed=seed), arms, margin=0.05), 12)
        table.to_csv(tmp_path / f"seed{seed}.tsv", sep="\t", index=False)  # as published, and read back
        summaries[seed] = pd.read_csv(tmp_path / f"seed{seed}.tsv", sep="\t")
        expected[seed] = table.set_index("arm")
    over = mc.over_seeds(summaries).set_index("arm")
    assert over.loc["steady", "held_beats_random"] and over.loc["steady", "beats_random_seeds"] == 3
    assert over.loc["fickle", "beats_random_seeds"] == 2 and not over.loc["fickle", "held_beats_random"]
    assert over.loc["partial", "seeds"] == 2 and not over.loc["partial", "held_beats_random"]
    assert not over["held_no_loss"].dropna().any()  # every arm costs 0.1 nats or more, above the 0.05 margin
    for arm in ("steady", "fickle"):  # the means and the per-seed columns are the seeds' own numbers
        seeds = [expected[s].loc[arm] for s in (1, 2, 3)]
        assert over.loc[arm, "loss_mean"] == pytest.approx(np.mean([t["loss"] for t in seeds]))
        assert over.loc[arm, "difference_max"] == pytest.approx(max(t["difference"] for t in seeds))
        assert over.loc[arm, "difference_seed3"] == pytest.approx(seeds[2]["difference"])
    band = over.loc["random (median of draws)"]
    assert band["random_p5_min"] == pytest.approx(min(expected[s].loc[band.name, "random_p5"] for s in (1, 2, 3)))
    assert list(over.index[:2]) == ["steady", "partial"]  # ordered by mean loss at each count


@pytest.fixture(scope="module")
def tiny_access(tiny_dirs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = tiny_dirs["llama"]
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    with headcount.heads(model, tokenizer) as access:
        yield access


def test_scoring_resumes_and_matches_a_direct_measurement(tiny_access, lines, tmp_path):
    keys = [(r.type, int(r.layer), int(r.head)) for r in tiny_access.heads.itertuples()]
    counts = mc.counts_removed(len(keys))
    arms = [mc.ranking_arm("order", {k: i for i, k in enumerate(keys)}, counts, ""),
            *mc.random_arms(keys, counts, draws=3, seed=0)]
    texts = lines[:6]
    store = tmp_path / "scored.tsv"
    first = mc.measure_arms(tiny_access, texts, arms[:2], store, chunk=2, log=lambda m: None)
    rows = store.read_text().count("\n")
    # a set cut off mid-write is scored again, and the sets already scored are not
    with store.open("a") as handle:
        handle.write(f"{mc.set_name(arms[2], counts[0])}\t0\t1.0\t1.0\n")
    found = mc.measure_arms(tiny_access, texts, arms, store, chunk=2, log=lambda m: None)
    assert store.read_text().count("\n") == rows + 1 + (len(found.sets) - len(first.sets)) * len(texts)
    direct = tiny_access.measure(texts, {"x": [tiny_access.names.name(k) for k in arms[0].removed[counts[1]]]})
    assert found.value(mc.set_name(arms[0], counts[1])) == pytest.approx(direct.value("x"), rel=1e-6)
    assert found.value(BASELINE) == pytest.approx(direct.value(direct.baseline), rel=1e-6)
    # an arm defined anew under the same name (other heads) is scored again, not read back
    changed = mc.ranking_arm("order", {k: -i for i, k in enumerate(keys)}, counts, "")
    again = mc.measure_arms(tiny_access, texts, [changed, *arms[1:]], store, chunk=2, log=lambda m: None)
    direct = tiny_access.measure(texts, {"x": [tiny_access.names.name(k) for k in changed.removed[counts[1]]]})
    assert again.value(mc.set_name(changed, counts[1])) == pytest.approx(direct.value("x"), rel=1e-6)
    assert again.value(mc.set_name(changed, counts[1])) != pytest.approx(found.value(mc.set_name(arms[0], counts[1])))
    # the store keeps both scorings: the new set against the old, over the same texts
    compared = mc.rescored(store, len(texts)).set_index("set")
    assert set(compared.index) == {mc.set_name(changed, k) for k in counts}  # not the draws, cut-off or baseline
    name = mc.set_name(changed, counts[1])
    assert compared.loc[name, "before"] == pytest.approx(found.value(name), rel=1e-6)
    assert compared.loc[name, "difference"] == pytest.approx(again.value(name) - found.value(name), rel=1e-5)
    assert compared.loc[name, "low"] <= compared.loc[name, "difference"] <= compared.loc[name, "high"]


def test_a_run_resumes_only_from_the_same_inputs(tmp_path):
    from headcount.pipeline.head_counts import start_afresh_unless

    out = tmp_path / "counts"
    start_afresh_unless(out, {"baseline": "a", "draws": 20}, log=lambda m: None)
    (out / "scored.tsv").write_text("kept")
    (out / "l0_10").mkdir()
    start_afresh_unless(out, {"draws": 20, "baseline": "a"}, log=lambda m: None)  # the same, in another order
    assert (out / "scored.tsv").exists() and (out / "l0_10").is_dir()
    start_afresh_unless(out, {"baseline": "b", "draws": 20}, log=lambda m: None)  # another baseline
    assert sorted(p.name for p in out.iterdir()) == ["fingerprint.json"]


def test_the_l0_arm_removes_exactly_the_count_and_reports_the_runs_own_error(tmp_path):
    """A run that ends off its target (its own rule keeps one head too many, one gate undecided):
    the arm still removes the count, the heads of lowest log alpha, and the table keeps the run's
    error, its expected count and its undecided share."""
    from headcount.pipeline.head_counts import target_arm

    keys = [("dec_self", layer, head) for layer in range(2) for head in range(4)]
    log_alpha = [-9.0, 5.0, -0.5, 7.0, 6.0, -8.0, 4.0, 5.5]  # gate 2 undecided, still open by the rule

    def run(kept):
        p_open = 1 / (1 + np.exp(-(np.array(log_alpha) + 2.0)))
        return pd.DataFrame({"type": [k[0] for k in keys], "layer": [k[1] for k in keys],
                             "head": [k[2] for k in keys], "gated": True, "log_alpha": log_alpha,
                             "p_open": p_open, "pruned": [a < -3 for a in log_alpha]})

    arm, table = target_arm(run, [3], len(keys), tmp_path, log=lambda m: None)
    assert sorted(arm.removed[3]) == [("dec_self", 0, 0), ("dec_self", 0, 2), ("dec_self", 1, 1)]
    row = table.iloc[0]
    assert (row["target_kept"], row["kept"], row["error"], row["arm_kept"]) == (5, 6, 1, 5)
    assert row["undecided"] == 1 and row["undecided_share"] == 1 / 8
    assert row["expected_kept"] == pytest.approx(sum(1 / (1 + np.exp(-(a + 2.0))) for a in log_alpha), abs=0.01)
    assert (tmp_path / "gates_target_5.tsv").exists()  # read back, not trained again
    again, _ = target_arm(lambda kept: pytest.fail("trained again"), [3], len(keys), tmp_path)
    assert again.removed == arm.removed
