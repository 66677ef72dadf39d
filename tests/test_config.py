"""Configuration validation: every problem named by its key, before any job runs."""

import copy
import re
from pathlib import Path

import pytest
import yaml

from headcount.config import ConfigError, check_yaml_syntax, deep_merge, load_experiments, resolve_mirror
from headcount.report.preregistered import GATE_BUDGET_CAP

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"


@pytest.fixture
def config():
    with open(REPO / "config/config.yaml") as f:
        return yaml.safe_load(f)


def test_the_shipped_config_is_valid_and_complete(config):
    experiments = load_experiments(config, SCHEMA)
    assert config["run"] == ["multi30k_en_de", "control"]
    assert {"multi30k_en_de", "multi30k_en_fr", "wmt_en_ru", "wmt_en_de", "wmt_en_fr",
            "opensubtitles_en_ru"} <= set(experiments)
    default = experiments["multi30k_en_de"]
    assert default["model"]["n_heads"] == 8 and default["model"]["enc_layers"] == 6
    assert "test_2016_flickr" in default["test"]
    assert experiments["wmt_en_ru"]["model"]["d_model"] == 512  # the paper's Transformer base


def problems(config):
    with pytest.raises(ConfigError) as error:
        load_experiments(config, SCHEMA)
    return str(error.value)


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda c: c["defaults"]["training"].update(max_steps="many"),
         "'defaults.training.max_steps': 'many' is not of type 'integer'"),
        (lambda c: c["defaults"]["training"].update(max_stpes=10),
         "'defaults.training': Additional properties are not allowed ('max_stpes' was unexpected)"),
        (lambda c: c["experiments"]["multi30k_en_de"].update(model={"d_model": 100}),
         "'experiments.multi30k_en_de.model.d_model': 100 is not divisible by model.n_heads=8"),
        (lambda c: c.update(run=["multi30k_en_xx"]), "'run.0': no experiment named 'multi30k_en_xx'"),
        (lambda c: c["defaults"]["model"].update(dropout_masks="philox"),
         "'defaults.model.dropout_masks': 'philox' is not one of ['torch', 'fast']"),
        (lambda c: c["experiments"]["multi30k_en_de"]["dev"].update(src="nowhere/val.en.gz"),
         "'experiments.multi30k_en_de.dev.src': source 'nowhere/val.en.gz' is not listed under 'sources'"),
        (lambda c: c["defaults"]["training"].pop("seed"),
         "'experiments.multi30k_en_de.training': 'seed' is a required property"),
        (lambda c: c["defaults"]["training"].update(label_smoothing=-0.1),
         "'defaults.training.label_smoothing': -0.1 is less than the minimum of 0"),
        (lambda c: c["sources"]["multi30k/val.en.gz"].update(url="ftp:/broken"),
         "'sources.multi30k/val.en.gz.url': 'ftp:/broken' does not match"),
        (lambda c: c.update(colour="blue"), "Additional properties are not allowed ('colour' was unexpected)"),
        (lambda c: c["defaults"]["prune"]["lambdas"].update(enc=[0.1, -0.05]),
         "'defaults.prune.lambdas.enc.1': -0.05 is less than the minimum of 0"),
        (lambda c: c["defaults"]["prune"]["lambdas"].update(decoder=[0.1]),
         "'defaults.prune.lambdas': Additional properties are not allowed ('decoder' was unexpected)"),
        (lambda c: c["defaults"]["prune"].update(eval_split="test_2099"),
         "'experiments.multi30k_en_fr.prune.eval_split': 'test_2099' is not one of the test sets"),
        (lambda c: c["defaults"]["prune"]["lambdas"].update(all=[0.1, 0.10]),
         "'experiments.multi30k_en_de.prune.lambdas.all': [0.1, 0.1] repeats a value"),
        (lambda c: c["defaults"]["prune"].update(from_scratch={"decoder": True}),
         "'defaults.prune.from_scratch': Additional properties are not allowed ('decoder' was unexpected)"),
        (lambda c: c["defaults"]["prune"].update(from_scratch={"all": [0.3, 0.7]}),
         "'experiments.multi30k_en_de.prune.from_scratch.all': 0.7 is not in prune.lambdas.all"),
        (lambda c: c["experiments"]["multi30k_en_de"].update(pretrained_langs={"src": "en_XX", "tgt": "de_DE"}),
         "'experiments.multi30k_en_de.pretrained_langs': only a pretrained model has its own language codes"),
        (lambda c: c["experiments"]["opus_mt_en_de"].update(pretrained_langs={"src": "en_XX"}),
         "'experiments.opus_mt_en_de.pretrained_langs': 'tgt' is a required property"),
    ],
)
def test_bad_configs_name_the_key(config, edit, expected):
    edit(config)
    assert expected in problems(config)


def test_all_problems_are_reported_at_once(config):
    config["defaults"]["training"]["max_steps"] = 0
    config["defaults"]["decoding"]["beam"] = 0
    message = problems(config)
    assert "2 problems" in message and "max_steps" in message and "beam" in message


def test_defaults_merge_deeply():
    merged = deep_merge({"a": {"b": 1, "c": [1, 2]}, "d": 1}, {"a": {"c": [3]}, "e": 2})
    assert merged == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}


def test_mirror_from_environment_or_config(config, tmp_path, monkeypatch):
    monkeypatch.delenv("HEADCOUNT_MIRROR", raising=False)
    assert resolve_mirror(config) is None
    config["mirror"] = str(tmp_path)
    assert resolve_mirror(config) == str(tmp_path.resolve())
    monkeypatch.setenv("HEADCOUNT_MIRROR", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="HEADCOUNT_MIRROR: the data mirror .*absent' is not a directory"):
        resolve_mirror(copy.deepcopy(config))


@pytest.mark.parametrize(
    "edit,expected",
    [
        (lambda c: c["defaults"]["prune"]["lambdas"].update(all=[0.01, 0.1]),
         "'experiments.multi30k_en_de.prune.lambdas.all': [0.01, 0.1] lacks 0, the lambda = 0 control the pruning "
         "table, Table 2 and Figure 7 compare against (the cost of fine-tuning alone); add 0 to the grid"),
        (lambda c: c["defaults"]["prune"].update(from_scratch={"all": [0, 0.1]}),
         "'experiments.multi30k_en_de.prune.from_scratch.all': 0 is the control, which prunes no head; leave it out"),
        (lambda c: c["experiments"]["multi30k_en_de"].update(seeds=[2, 3]),
         "'experiments.multi30k_en_de.seeds': [2, 3] lacks training.seed (1), the main run; add it"),
        (lambda c: c["defaults"]["prune"].update(lr_schedule="cosine"),
         "'defaults.prune.lr_schedule': 'cosine' is not one of ['noam', 'constant', 'continue']"),
        (lambda c: c["experiments"]["multi30k_en_de"].update(positive_control="multi30k_en_de"),
         "'experiments.multi30k_en_de.positive_control': 'multi30k_en_de' is not another, synthetic experiment"),
    ],
)
def test_pruning_controls_recipes_and_seeds_are_checked(config, edit, expected):
    edit(config)
    assert expected in problems(config)


def test_a_grid_without_its_control_is_fine_when_no_table_asks_for_it(config):
    config["defaults"]["prune"]["lambdas"] = {"enc": [], "all": []}  # no pruning: no table, no control
    load_experiments(config, SCHEMA)


def readme_example(name: str) -> dict:
    """The YAML example of config/README.md whose first line names the file `name`."""
    text = (REPO / "config/README.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        if block.startswith(f"# {name}:"):
            return yaml.safe_load(block)
    raise AssertionError(f"config/README.md has no example {name}")


@pytest.mark.slow
def test_an_override_merges_and_the_documented_pattern_replaces(config):
    """--configfile merges (snakemake.utils.update_config), so a test set or a setting's grid
    stays unless the experiment is defined whole under a new name, as config/README.md shows."""
    from snakemake.utils import update_config

    merged = copy.deepcopy(config)
    update_config(merged, readme_example("keeps-everything.yaml"))
    kept = load_experiments(merged, SCHEMA)[merged["run"][0]]
    assert list(kept["test"]) == ["test_2016_flickr", "test_2017_flickr"]
    assert kept["prune"]["lambdas"] == {"enc": [0, 0.01, 0.1], "all": config["defaults"]["prune"]["lambdas"]["all"]}

    replaced = copy.deepcopy(config)
    update_config(replaced, readme_example("one-test-set.yaml"))
    (name,) = replaced["run"]
    new = load_experiments(replaced, SCHEMA)[name]
    assert name != "multi30k_en_de" and list(new["test"]) == ["test_2016_flickr"]
    assert new["prune"]["lambdas"] == {"enc": [0, 0.01, 0.1], "all": []}


@pytest.mark.parametrize("text, line, column, problem", [
    ("run: [a\nmirror: null\n", 2, 7, "expected ',' or ']'"),
    ("defaults:\n\tcleaning: {}\n", 2, 1, "found character '\\t' that cannot start any token"),
    ("a: 1\n b: 2\n", 2, 3, "mapping values are not allowed here"),
])
def test_a_yaml_error_names_file_line_and_column(tmp_path, text, line, column, problem):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        check_yaml_syntax(path)
    assert str(error.value).startswith(f"{path}:{line}:{column}: not valid YAML: {problem}")
    path.write_text("run: [a]\n")
    check_yaml_syntax(path)


def test_each_extra_seed_is_an_experiment_with_that_seed_and_the_seed_lambdas(config):
    config["experiments"]["multi30k_en_de"]["seed_lambdas"] = {"enc": [0.3, 0.1, 0.7], "all": [1.0]}
    config["experiments"]["multi30k_en_de"]["prune"] = {"from_scratch": {"all": [0.1, 1.0]}}
    config["experiments"]["multi30k_en_de"]["seed_from_scratch"] = True
    experiments = load_experiments(config, SCHEMA)
    main = experiments["multi30k_en_de"]
    assert [name for name in experiments if name.startswith("multi30k_en_de_")] == [
        "multi30k_en_de_seed2", "multi30k_en_de_seed3"]  # seeds [1, 2, 3]; 1 is training.seed
    seed3 = experiments["multi30k_en_de_seed3"]
    assert seed3["replica_of"] == "multi30k_en_de" and seed3["seeds"] == [3]
    # snapshots only where the seed averages them into its model.pt (config/powered.yaml does)
    snapshots = main["training"]["snapshot_interval"] if main["training"].get("average_snapshots", 1) > 1 else 0
    assert seed3["training"] == {**main["training"], "seed": 3, "snapshot_interval": snapshots}
    # its control and the seed lambdas the grid has, in the grid's order (0.7 is not in it)
    assert seed3["prune"]["lambdas"] == {"enc": [0, 0.1, 0.3], "all": [0, 1.0]}
    assert seed3["prune"]["from_scratch"] == {"all": [1.0]}  # 0.1 is not among the seed's lambdas
    unchanged = {k: v for k, v in seed3.items() if k not in ("training", "prune", "seeds", "seed_lambdas",
                                                             "replica_of", "description")}
    assert unchanged == {k: main[k] for k in unchanged}  # data, model, decoding, roles, ... the same
    assert main["prune"]["lambdas"]["enc"] == config["defaults"]["prune"]["lambdas"]["enc"]  # untouched


@pytest.mark.slow
def test_averaged_weights_need_snapshots_and_every_seed_and_no_twin_keeps_them(config):
    """training.average_snapshots: a config error without a snapshot at every selectable step; the
    seeds snapshot as the main run does (their model.pt is a mean too); a twin neither snapshots nor
    averages (its pruned model does not)."""
    from headcount.config import scratch_training

    exp = config["experiments"]["multi30k_en_de"]
    exp["training"].update(average_snapshots=3, snapshot_interval=300)  # eval_interval 500
    assert ("'experiments.multi30k_en_de.training.average_snapshots': 3 needs a snapshot at every step the run "
            "can select: set training.snapshot_interval to a divisor of training.eval_interval (500)"
            ) in problems(config)
    load_experiments({**config, "run": ["control"]}, SCHEMA)  # an experiment that does not run is not held to it
    exp["training"]["snapshot_interval"] = 250
    experiments = load_experiments(config, SCHEMA)
    assert experiments["multi30k_en_de_seed2"]["training"]["snapshot_interval"] == 250
    twin = scratch_training(experiments["multi30k_en_de"]["training"], experiments["multi30k_en_de"]["prune"])
    assert "average_snapshots" not in twin
    del exp["training"]["average_snapshots"]
    assert load_experiments(config, SCHEMA)["multi30k_en_de_seed2"]["training"]["snapshot_interval"] == 0


@pytest.mark.slow
def test_seed_from_scratch_false_leaves_the_twins_to_training_seed(config):
    exp = config["experiments"]["multi30k_en_de"]
    exp.update(seed_lambdas={"all": [1.0]}, seed_from_scratch=False, prune={"from_scratch": {"all": [0.1, 1.0]}})
    experiments = load_experiments(config, SCHEMA)
    assert experiments["multi30k_en_de_seed2"]["prune"]["lambdas"]["all"] == [0, 1.0]  # the lambdas still run
    assert experiments["multi30k_en_de_seed2"]["prune"]["from_scratch"] == {}
    assert experiments["multi30k_en_de"]["prune"]["from_scratch"] == {"all": [0.1, 1.0]}
    exp["seed_from_scratch"] = "no"
    assert "seed_from_scratch" in problems(config)


@pytest.mark.slow
def test_without_seed_lambdas_the_extra_seeds_run_the_controls_only(config):
    config["experiments"]["multi30k_en_de"]["seed_lambdas"] = None
    seed2 = load_experiments(config, SCHEMA)["multi30k_en_de_seed2"]
    assert seed2["prune"]["lambdas"] == {"enc": [0], "all": [0]}
    assert "multi30k_en_fr_seed2" not in load_experiments(config, SCHEMA)  # one seed: no replica


def test_a_seed_experiment_cannot_take_the_name_of_another(config):
    config["experiments"]["multi30k_en_de_seed2"] = copy.deepcopy(config["experiments"]["multi30k_en_fr"])
    assert "'experiments.multi30k_en_de_seed2': the name of multi30k_en_de's seed 2" in problems(config)


@pytest.mark.slow
def test_the_powered_experiment_is_the_amended_design_on_gpus(config):
    """config/powered.yaml over config/config.yaml (as --configfile merges it): the published CPU
    design becomes the powered one (baselines to their plateau, averaged; the pooled test sets;
    every seed's whole grid with its twins; 2,000 gated steps at a tenth of the weights' rate), each
    job on one GPU and one thread, in fp32; the data, model, decoding and roles stay the default's."""
    default = load_experiments(config, SCHEMA)
    with open(REPO / "config/powered.yaml") as f:
        powered = load_experiments(deep_merge(config, yaml.safe_load(f)), SCHEMA)
    main = powered["multi30k_en_de"]
    assert {k: main["training"][k] for k in ("max_steps", "average_snapshots", "precision")} == {
        "max_steps": 4500, "average_snapshots": 3, "precision": "fp32"}
    assert default["multi30k_en_de"]["training"].get("average_snapshots", 1) == 1  # the published design
    assert main["prune"]["eval_split"] == "pooled" and main["prune"]["weight_lr_scale"] == 0.1
    assert main["prune"]["training"]["max_steps"] == 2000
    assert default["multi30k_en_de"]["prune"]["eval_split"] != "pooled"
    for seed in ("multi30k_en_de_seed2", "multi30k_en_de_seed3"):
        assert powered[seed]["prune"]["lambdas"] == main["prune"]["lambdas"]  # every seed the whole grid
        assert powered[seed]["prune"]["from_scratch"] == main["prune"]["from_scratch"]
    for name in ("multi30k_en_de", "multi30k_en_de_seed2"):
        assert powered[name]["resources"] == {**default[name]["resources"], "gpu": 1, "train_threads": 1,
                                              "eval_threads": 1}
        same = {"model", "decoding", "roles", "train", "dev", "subwords", "cleaning", "analysis", "heads"}
        assert {k: powered[name][k] for k in same} == {k: default[name][k] for k in same}


def test_the_paper_gate_recipe_prunes_the_default_baseline_with_the_authors_recipe(config, tmp_path, monkeypatch):
    """config/paper_gates.yaml (issue 61, item 2): seed 1's baseline of the default, pruned with the
    authors' recipe (one learning rate, restarted Noam warm-up, no healing) for the longest gated
    phase the gate-budget rule allows; the data, subwords and gate settings are the default's."""
    with open(REPO / "config/paper_gates.yaml") as f:
        overlay = yaml.safe_load(f)
    paths = overlay["experiments"]["multi30k_en_de_paper_gates"]["pretrained"]
    monkeypatch.chdir(tmp_path)  # the checkpoint it names is checked, relative to where snakemake runs
    for path in (paths["checkpoint"], *paths["sentencepiece"].values()):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(b"")
    merged = deep_merge(config, overlay)
    paper = load_experiments(merged, SCHEMA)["multi30k_en_de_paper_gates"]
    config["run"] = ["multi30k_en_de"]
    default = load_experiments(config, SCHEMA)["multi30k_en_de"]
    assert paths["checkpoint"] == "results/multi30k_en_de/baseline/model.pt"
    assert {k: paper["prune"][k] for k in ("gate_lr_scale", "lr_schedule", "resume_optimizer", "heal_steps")} == {
        "gate_lr_scale": 1.0, "lr_schedule": "noam", "resume_optimizer": False, "heal_steps": 0}
    assert paper["prune"]["training"]["max_steps"] == GATE_BUDGET_CAP  # the longest the gate-budget rule allows
    for key in ("log_alpha_init", "select"):
        assert paper["prune"][key] == default["prune"][key]
    assert {k: paper["prune"]["training"][k] for k in ("warmup_steps", "lr_scale")} == {
        k: default["prune"]["training"][k] for k in ("warmup_steps", "lr_scale")}
    for key in ("cleaning", "train", "dev"):
        assert paper[key] == default[key]
    assert set(paper["prune"]["lambdas"]["enc"]) <= set(default["prune"]["lambdas"]["enc"])
    assert set(paper["prune"]["lambdas"]["all"]) <= set(default["prune"]["lambdas"]["all"])
