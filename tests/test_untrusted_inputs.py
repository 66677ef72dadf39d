"""Configs and models from other people (issue 59): no config value writes outside the project, no
checkpoint runs code or hangs its reader, and each refusal names the key or file and the fix."""

import copy
from pathlib import Path

import pytest
from toyflow import REPO, shipped_config, smoke_config, snakemake, write_config

from headcount.config import ConfigError, _path_problems, escapes, load_experiments

SCHEMA = REPO / "workflow/schemas/config.schema.yaml"


def files_under(root: Path, *skip: Path) -> set[Path]:
    """Every file and folder under root, but those under `skip`: what a run may not add to."""
    return {p for p in root.rglob("*") if not any(p == s or s in p.parents for s in skip)}


def problems(config: dict) -> str:
    with pytest.raises(ConfigError) as error:
        load_experiments(config, SCHEMA)
    return str(error.value)


# --------------------------------------------------------------------------------------------
# 1, 2: config values that become paths


@pytest.mark.parametrize("key", ["../../../x/escape.gz", "/some/absolute/path.gz", "toy/../../up.gz", ".hidden.gz",
                                 "toy//val.gz", "toy/./val.gz", "~/val.gz", ""])
def test_a_source_key_that_leaves_resources_data_is_refused_naming_it(key):
    config = shipped_config()
    config["sources"][key] = {"url": "https://example.org/x.gz"}
    message = problems(config)
    assert f"config key 'sources': the key '{key}' is not allowed; use a relative path" in message


@pytest.mark.parametrize("name", ["../../../x/escape_exp", "a/b", "..", ".", "/abs", "-dash", "spa ce"])
def test_an_experiment_name_that_is_no_folder_name_is_refused_naming_it(name):
    config = shipped_config()
    config["experiments"][name] = copy.deepcopy(config["experiments"]["multi30k_en_de"])
    config["run"] = [name]
    message = problems(config)
    assert f"config key 'experiments': the key '{name}' is not allowed; use a name of letters" in message


@pytest.mark.parametrize("where,value,expected", [
    (lambda c: c["experiments"]["multi30k_en_de"]["test"], "..", "experiments.multi30k_en_de.test': the key '..'"),
    (lambda c: c.setdefault("compare", {}), "../x", "compare': the key '../x'"),
])
def test_test_set_and_comparison_names_are_folder_names(where, value, expected):
    config = shipped_config()
    where(config)[value] = ["multi30k_en_de", "multi30k_en_fr"] if "compare" in expected else \
        config["experiments"]["multi30k_en_de"]["test"]["test_2016_flickr"]
    assert expected in problems(config)


@pytest.mark.parametrize("member", ["../../etc/passwd", "/etc/passwd", "a/../../b", "a\\..\\b"])
def test_an_archive_member_outside_the_archive_is_refused(member):
    config = shipped_config()
    config["experiments"]["wmt_en_ru"]["train"][0]["src"]["member"] = member
    assert (f"config key 'experiments.wmt_en_ru.train.0.src.member': the value {member!r} is not allowed"
            in problems(config))


def test_the_resolved_path_check_holds_without_the_schema_patterns():
    """The check behind the patterns: each path-like value resolved, whatever the schema allows."""
    config = shipped_config()
    config["sources"]["../x.gz"] = {"url": "https://example.org/x.gz"}
    config["experiments"]["../escape_exp"] = {}
    config["experiments"]["wmt_en_ru"]["train"][0]["src"]["member"] = "../../etc/passwd"
    found = "\n".join(_path_problems(config))
    assert "config key 'sources': the key '../x.gz' resolves outside resources/data/" in found
    assert "config key 'experiments': the key '../escape_exp' resolves outside results/" in found
    assert "'experiments.wmt_en_ru.train.0.src.member': '../../etc/passwd' resolves outside the archive" in found
    assert _path_problems(shipped_config()) == []
    assert escapes("resources/data", "/etc/passwd") and escapes("results", "a/../..") and escapes("results", "")
    assert not escapes("results", "a/../b") and not escapes("resources/data", "multi30k/train.en.gz")


def test_a_source_key_with_dotdot_writes_nothing_outside_the_project(tmp_path):
    """The reported case: a mirror holding the file where the key's ../ leads, and a real run of the
    fetches (not a dry run), which used to copy it to resources/data/../../../x/ outside the checkout."""
    project = tmp_path / "a/b/project"
    project.mkdir(parents=True)
    mirror = tmp_path / "m/n/o/mirror"
    key = "../../../x/val.en.gz"
    from conftest import make_toy_mirror

    make_toy_mirror(mirror.parent)
    (mirror / key).parent.mkdir(parents=True, exist_ok=True)
    (mirror / key).write_bytes((mirror / "toy/val.en.gz").read_bytes())
    config = smoke_config(mirror)
    config["sources"][key] = {"url": "https://example.org/x/val.en.gz"}
    config["experiments"]["toy"]["dev"]["src"] = key
    before = files_under(tmp_path, project)
    result = snakemake("--cores", "1", "--until", "fetch_source", "--configfile",
                       write_config(project / "escape.yaml", config), cwd=project, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"config key 'sources': the key '{key}' is not allowed" in output
    assert "Traceback" not in output
    assert files_under(tmp_path, project) == before  # nothing written beside the project
    assert not (project / "resources").exists()


def test_an_experiment_named_with_dotdot_plans_nothing(tmp_path):
    project = tmp_path / "a/project"
    project.mkdir(parents=True)
    config = shipped_config()
    name = "../../x/escape_exp"
    config["experiments"] = {name: {**config["experiments"]["control"]}}
    config["run"] = [name]
    config.pop("compare", None)
    before = files_under(tmp_path, project)
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(project / "escape.yaml", config),
                       cwd=project, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-2000:]
    assert f"config key 'experiments': the key '{name}' is not allowed" in output
    assert "Traceback" not in output
    assert files_under(tmp_path, project) == before
