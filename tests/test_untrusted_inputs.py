"""Configs and models from other people (issue 59): no config value writes outside the project, no
checkpoint runs code or hangs its reader, and each refusal names the key or file and the fix."""

import copy
import json
import os
import random
import re
import signal
from contextlib import contextmanager
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
    from headcount.models.hf import write_tiny_marian
    from headcount.models.hf_lm_tiny import write_tiny_gpt2
    from headcount.pipeline.training_runs import import_pretrained_baseline

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
