"""headcount.settings holds every default once: one generic walk over its dataclasses holds
config/config.yaml's `defaults` and the schema's `default`s to them, field by field; the API and the
training loop take theirs from the dataclasses."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from headcount import settings

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config/config.yaml"
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
MISSING = object()


def plain(value):
    """A value as YAML writes it: tuples as lists."""
    return [plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def at(mapping: dict, dotted: str):
    for key in dotted.split("."):
        if not isinstance(mapping, dict) or key not in mapping:
            return MISSING
        mapping = mapping[key]
    return mapping


def schema_node(schema: dict, dotted: str):
    """The schema of the key `dotted` of an experiment ($refs followed), or MISSING."""
    def resolved(node):
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
        return node

    node = resolved(schema["$defs"]["partial_experiment"])
    for key in dotted.split("."):
        node = resolved(node).get("properties", {}).get(key, MISSING)
        if node is MISSING:
            return MISSING
    return resolved(node)


def same(ours, theirs) -> bool:
    return (plain(ours) == plain(theirs)) and isinstance(ours, bool) == isinstance(theirs, bool)


def disagreements(config: dict, schema: dict) -> list[str]:
    """Every field of every settings dataclass against config.yaml's defaults and the schema: a
    config-default field must be in the file with its value, an optional one must be out of it and
    be the schema's `default`; any `default` the schema states must be the field's."""
    problems = []
    defaults = config["defaults"]
    for section in settings.SECTIONS:
        for f in dataclasses.fields(section):
            key = f"{section.SECTION}.{f.name}"
            ours = getattr(section(), f.name)
            node = schema_node(schema, key)
            if node is MISSING:
                problems.append(f"{key}: the schema has no such key ({section.__name__}.{f.name})")
                continue
            theirs = at(defaults, key)
            if settings.is_optional(f):
                if theirs is not MISSING:
                    problems.append(f"{key}: optional in {section.__name__}, but config.yaml's defaults set it "
                                    f"({theirs!r}); make it a plain field")
                if "default" not in node:
                    problems.append(f"{key}: the schema states no `default` (headcount.settings: {ours!r})")
            elif theirs is MISSING:
                problems.append(f"{key}: config.yaml's defaults lack it (headcount.settings: {ours!r})")
            elif not same(ours, theirs):
                problems.append(f"{key}: config.yaml's defaults say {theirs!r}, headcount.settings {ours!r}")
            if "default" in node and not same(ours, node["default"]):
                problems.append(f"{key}: the schema's default is {node['default']!r}, headcount.settings {ours!r}")
    return problems


def test_config_yaml_and_the_schema_state_the_settings_defaults():
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    problems = disagreements(config, schema)
    assert not problems, "defaults that disagree with headcount.settings:\n  " + "\n  ".join(problems)


def test_every_schema_default_belongs_to_a_settings_field():
    """A `default` in the schema that no dataclass holds would be a second, unchecked copy."""
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    held = {id(schema_node(schema, f"{s.SECTION}.{f.name}")) for s in settings.SECTIONS for f in dataclasses.fields(s)}
    stray = []

    def walk(node, path):
        if isinstance(node, dict):
            if "default" in node and path[-1:] != ("properties",) and id(node) not in held:
                stray.append(".".join(path))
            for key, value in node.items():
                walk(value, path + (str(key),))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, path + (str(i),))

    walk(schema, ())
    assert not stray, f"schema defaults that headcount.settings does not hold: {stray}"


def test_the_check_sees_a_changed_default():
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    schema = yaml.safe_load(SCHEMA.read_text(encoding="utf-8"))
    config["defaults"]["prune"]["lr_schedule"] = "noam"
    config["defaults"]["training"]["adam_betas"] = [0.9, 0.999]
    del config["defaults"]["heads"]["max_tokens"]
    config["defaults"]["training"]["compile_step"] = "eager"
    schema["$defs"]["prune"]["properties"]["penalty_scale"]["default"] = "per_head"
    problems = "\n".join(disagreements(config, schema))
    for key in ("prune.lr_schedule", "training.adam_betas", "heads.max_tokens", "training.compile_step",
                "prune.penalty_scale"):
        assert key in problems, key


def test_every_settings_dataclass_is_a_section():
    found = {c for _, c in inspect.getmembers(settings, inspect.isclass)
             if dataclasses.is_dataclass(c) and c.__module__ == settings.__name__}
    assert found == set(settings.SECTIONS)
    assert len({s.SECTION for s in settings.SECTIONS}) == len(settings.SECTIONS)


def test_the_training_loop_and_the_api_take_the_settings_defaults():
    pytest.importorskip("torch")
    from headcount import api
    from headcount.training.loop import TrainConfig

    assert TrainConfig().to_dict() == settings.as_dict(settings.TrainingSettings())
    assert api.DEFAULT_TRAINING == settings.as_dict(settings.TrainingSettings())
    assert api.DEFAULT_PRUNE_TRAINING == settings.as_dict(settings.PruneTraining())
    assert api.DEFAULT_PRUNE_SETTINGS == settings.as_dict(settings.PruneRecipe(), with_optional=False)
    assert api.DEFAULT_ROLE_SETTINGS == settings.as_dict(settings.RoleThresholds())
    assert (api.DEFAULT_LRP_RULE, api.DEFAULT_MAX_TOKENS) == (settings.HeadScoring.lrp_rule,
                                                              settings.HeadScoring.max_tokens)
    analyse = inspect.signature(api.analyse).parameters
    assert analyse["beam"].default == settings.Decoding.beam
    assert analyse["atlas_sentences"].default == settings.AtlasSettings.sentences


def test_a_pruning_run_without_a_recipe_key_takes_the_workflows_default():
    pytest.importorskip("torch")
    from headcount.config import fine_tuning_steps, scratch_training
    from headcount.pipeline.pruning_runs import pruning_recipe

    recipe = pruning_recipe("all", 0.1, {"training": {"max_steps": 5}}, {"dev_bleu_sentences": 0})
    assert recipe == {k: getattr(settings.PruneRecipe, k)
                      for k in ("lr_schedule", "resume_optimizer", "heal_steps", "select")}
    assert fine_tuning_steps({"training": {"max_steps": 5}}) == 5 + settings.PruneRecipe.heal_steps
    assert scratch_training({"max_steps": 10}, {"training": {"max_steps": 5}})["select"] == settings.PruneRecipe.select
