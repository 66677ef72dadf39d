"""The rules of the powered design, fixed before it ran: docs/method.md's tables, the module that
holds them, the claims code and config/powered.yaml (over config/config.yaml) agree; the plateau
rule against a loop written out."""

import re
from pathlib import Path

import pytest
import yaml

from headcount.config import load_experiments
from headcount.report import claims, preregistered
from headcount.training import evaluate
from headcount.training.convergence import dev_losses, plateau_step

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def experiments():
    """The powered design: config/powered.yaml merged over config/config.yaml, as --configfile merges it."""
    from snakemake.utils import update_config

    with open(ROOT / "config" / "config.yaml") as f:
        config = yaml.safe_load(f)
    with open(ROOT / "config" / "powered.yaml") as f:
        update_config(config, yaml.safe_load(f))
    return load_experiments(config, ROOT / "workflow" / "schemas" / "config.schema.yaml")


def method_rules(title: str = "The powered design: rules fixed before it ran") -> dict[str, str]:
    text = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    table = section.split("| rule | value |\n", 1)[1].split("\n\n", 1)[0]  # the rules' table, not another
    return dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", table, flags=re.M))  # |---| has no spaces


def as_text(value) -> str:
    if isinstance(value, (tuple, list)):
        return ", ".join(as_text(v) for v in value)
    return str(value)


def test_method_md_states_every_rule_with_the_modules_value():
    written = method_rules()
    assert written.keys() == preregistered.rules().keys()
    for name, value in preregistered.rules().items():
        assert written[name] == as_text(value), name


def test_method_md_states_the_amendment_with_the_modules_values_and_every_seed_runs_it(experiments):
    written = method_rules("The powered design: the amendment")
    assert written.keys() == preregistered.amendment().keys()
    for name, value in preregistered.amendment().items():
        assert written[name] == as_text(value), name
    for seed in preregistered.SEEDS:
        exp = experiments["multi30k_en_de" if seed == 1 else f"multi30k_en_de_seed{seed}"]
        assert exp["training"]["average_snapshots"] == preregistered.AVERAGED_SNAPSHOTS, seed
        assert exp["training"]["snapshot_interval"] == exp["training"]["eval_interval"], seed  # one per selectable step
        assert exp["prune"]["weight_lr_scale"] == preregistered.WEIGHT_LR_SCALE, seed
        # auto resolves once per seed; powered.yaml's GPU jobs fix fp32, one precision for every run too
        assert exp["training"]["precision"] in (preregistered.TRAINING_PRECISION, "fp32"), seed
    setting, lam = preregistered.PILOT
    assert lam in experiments["multi30k_en_de"]["prune"]["lambdas"][setting]


def test_the_claims_code_and_the_bootstrap_use_the_fixed_values():
    assert claims.NO_LOSS_MARGIN is preregistered.NO_LOSS_MARGIN and claims.ALPHA == preregistered.ALPHA
    assert claims.MONTE_CARLO_DRAWS == preregistered.MONTE_CARLO_DRAWS
    assert evaluate.BOOTSTRAP_SAMPLES == preregistered.BOOTSTRAP_SAMPLES


def test_the_powered_design_runs_the_fixed_design(experiments):
    exp = experiments["multi30k_en_de"]
    assert tuple(exp["seeds"]) == preregistered.SEEDS
    assert tuple(exp["test"]["pooled"]["pool"]) == preregistered.POOLED_TEST_SETS
    assert exp["prune"]["eval_split"] == "pooled"
    for setting, grid in exp["seed_lambdas"].items():  # every seed runs seed 1's whole grid
        assert grid == exp["prune"]["lambdas"][setting]


def plateau_by_hand(losses, patience, min_delta):
    """The rule read as "none of the last `patience` losses beats every earlier one by min_delta"."""
    for k in range(patience, len(losses)):
        earlier = losses[:k - patience + 1]
        if not any(all(x <= e - min_delta for e in earlier) for x in losses[k - patience + 1:k + 1]):
            return k
    return None


@pytest.mark.parametrize("losses, expected", [
    ([5.0, 4.0, 3.5, 3.3, 3.29, 3.285, 3.284], None),  # 3.3 -> 3.284 is still 0.016
    ([5.0, 4.0, 3.5, 3.3, 3.29, 3.285, 3.284, 3.283], 7),  # 3.29 -> 3.283: 0.007
    ([5.0, 4.0, 3.0, 2.0, 1.0], None),
    ([3.0, 3.1, 3.2, 3.3], 3),  # worse and worse: a plateau as soon as there are three after the first
    ([3.0, 2.995, 2.993, 2.992], 3),
    ([3.0, 2.995, 2.99, 2.985, 2.97], None),
])
def test_the_plateau_step(losses, expected):
    evaluations = [(500 * (i + 1), x) for i, x in enumerate(losses)]
    got = plateau_step(evaluations, 3, 0.01)
    assert got == (None if expected is None else 500 * (expected + 1))
    assert plateau_by_hand(losses, 3, 0.01) == expected


def test_dev_losses_read_a_runs_metrics(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 50, "train_loss": 9}\n{"step": 1000, "dev_loss": 2.5}\n{"step": 500, "dev_loss": 3.0}\n')
    assert dev_losses(path) == [(500, 3.0), (1000, 2.5)]


def test_a_pooled_test_set_is_its_members_in_order(tmp_path):
    from headcount.data.corpora import pool_evaluation_sets
    from headcount.io import read_lines
    members = []
    for name, n in (("a", 2), ("b", 3)):
        (tmp_path / f"{name}.src").write_text("".join(f"{name} src {i}\n" for i in range(n)))
        (tmp_path / f"{name}.tgt").write_text("".join(f"{name} tgt {i}\n" for i in range(n)))
        members.append((name, str(tmp_path / f"{name}.src"), str(tmp_path / f"{name}.tgt")))
    out = {k: str(tmp_path / f"pooled.{k}") for k in ("src", "tgt", "tsv")}
    assert pool_evaluation_sets(members, out["src"], out["tgt"], out["tsv"]) == {"pairs": 5, "members": 2}
    assert read_lines(out["tgt"]) == ["a tgt 0", "a tgt 1", "b tgt 0", "b tgt 1", "b tgt 2"]
    assert read_lines(out["tsv"]) == ["name\tfirst\tlines", "a\t0\t2", "b\t2\t3"]


def test_a_pool_of_a_set_the_experiment_lacks_names_the_key():
    from snakemake.utils import update_config

    from headcount.config import ConfigError

    with open(ROOT / "config" / "config.yaml") as f:
        config = yaml.safe_load(f)
    with open(ROOT / "config" / "powered.yaml") as f:
        update_config(config, yaml.safe_load(f))
    config["experiments"]["multi30k_en_de"]["test"]["pooled"]["pool"].append("test_2099")
    with pytest.raises(ConfigError, match=r"'experiments.multi30k_en_de.test.pooled.pool': test_2099 is not a test"):
        load_experiments(config, ROOT / "workflow" / "schemas" / "config.schema.yaml")


def trajectory(p_open_by_step: dict[int, list[float]]):
    import pandas as pd
    return pd.DataFrame([{"step": step, "type": "enc_self", "layer": 0, "head": h, "p_closed": 1 - p}
                         for step, ps in p_open_by_step.items() for h, p in enumerate(ps)])


def test_the_gate_budget_is_where_every_run_has_decided_and_stays_decided():
    from headcount.report.pruning_report import gate_budget, undecided_at_the_end, undecided_share_by_step

    # 20 heads a run; undecided: P(open) strictly inside 0.1-0.9
    fast = trajectory({50: [0.5] * 20, 100: [0.5] + [0.95] * 19, 150: [0.99] * 20})
    slow = trajectory({50: [0.5] * 20, 300: [0.5] * 2 + [0.01] * 18, 350: [0.5] + [0.01] * 19,
                       400: [0.9] + [0.01] * 19})  # 0.9 sits on the band's edge: decided
    assert list(undecided_share_by_step(slow)) == [1.0, 0.1, 0.05, 0.0]
    # fast: 1 of 20 (5%) at step 100 is at the limit, so decided from 100; slow from 350: 500 in 250s
    assert gate_budget([fast]) == 250 and gate_budget([fast, slow]) == 500
    assert gate_budget([fast], every=50) == 100 and gate_budget([slow], every=50) == 350
    relapse = trajectory({50: [0.01] * 20, 100: [0.5] * 20, 150: [0.01] * 20})  # decided, undecided, decided
    assert gate_budget([relapse]) == 250  # decided for good only from 150
    assert gate_budget([trajectory({50: [0.01] * 20, 100: [0.5] * 20})]) is None  # undecided at its end
    # the cap (2,000 steps): a run undecided there leaves the budget at the cap; short of it, it must go on
    stuck = trajectory({1000: [0.5] * 20, 2000: [0.5] * 20})
    assert gate_budget([fast, stuck]) == 2000 and undecided_at_the_end(undecided_share_by_step(stuck))
    assert not undecided_at_the_end(undecided_share_by_step(fast))
    assert gate_budget([stuck], cap=2500) is None
    late = trajectory({50: [0.5] * 20, 2100: [0.01] * 20})  # decided only past the cap
    assert gate_budget([late]) == 2000 and gate_budget([late], cap=2500) == 2250


def test_method_md_states_the_matched_count_rules_with_the_modules_values():
    written = method_rules("Matched head counts and causal roles: rules fixed before they ran")
    assert written.keys() == preregistered.matched_rules().keys()
    for name, value in preregistered.matched_rules().items():
        assert written[name] == as_text(value), name
