"""Where a transformers model is read from, and what headcount refuses on the way in.

A pretrained model reaches transformers' `from_pretrained` in one of three forms: a hub id, a local
directory (save_pretrained's or `hf download`'s), or a GGUF file (what llama.cpp and Ollama users
have; transformers dequantises it with the `gguf` package). `resolve_source` tells them apart and
`ModelSource.kwargs` is what every `from_pretrained` call here passes, so that no call can forget
`trust_remote_code=False`: a model's own Python code is never run, whatever its config asks.

`check_loading_report` refuses a model whose checkpoint lacks weights its class needs (transformers
would fill them in at random and say so only on the console) or holds weights the class does not
use, unless the experiment allows them by name (`allow_weights:`).
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from headcount.io import HeadcountError


class PretrainedModelUnavailable(HeadcountError):
    """The pretrained model cannot be loaded (no network for a hub id, a wrong path, ...)."""


class UnsafeModel(HeadcountError):
    """The model asks for something headcount never does (run its own code)."""


class MissingWeights(HeadcountError):
    """The checkpoint lacks weights the model's objective needs, or holds weights it does not use."""


# The GGUF package headcount is tested with (constraints.txt); transformers needs >= 0.10.
GGUF_REQUIREMENT = "gguf==0.19.0"


@dataclass(frozen=True)
class ModelSource:
    """What `from_pretrained` reads: `name` (hub id or directory), whether only local files may be
    read, and the GGUF file inside `name` when the model is one."""

    label: str  # as the user wrote it, for messages
    name: str
    local_only: bool
    gguf_file: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        return Path(self.name).is_dir()

    @property
    def kwargs(self) -> dict:
        """Keyword arguments for every from_pretrained call (config, tokenizer, model)."""
        kwargs = {"local_files_only": self.local_only, "trust_remote_code": False}
        if self.gguf_file is not None:
            kwargs["gguf_file"] = self.gguf_file
        return kwargs


def looks_like_path(name: str) -> bool:
    """How `pretrained:` names a local directory or file rather than a hub id (config.py agrees)."""
    return name.startswith((".", "/", "~"))


def resolve_source(name_or_path: str | os.PathLike, offline: bool | None = None) -> ModelSource:
    """A hub id, a local directory or a local `.gguf` file -> the ModelSource to load it from.

    offline: True reads only local files (a directory, or the HuggingFace cache); None: True when
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set."""
    label = str(name_or_path)
    path = Path(label).expanduser()
    if path.is_dir():
        _refuse_remote_code(path / "config.json", label)
        return ModelSource(label, str(path), True)
    if path.is_file() and path.suffix.lower() == ".gguf":
        check_gguf(path)
        return ModelSource(label, str(path.parent), True, gguf_file=path.name)
    if path.is_file():
        raise PretrainedModelUnavailable(
            f"pretrained model {label!r} is a file that is neither a model directory nor a .gguf file; "
            f"`pretrained:` takes a hub id, a directory written by save_pretrained (or `hf download`), "
            f"or a GGUF file")
    if looks_like_path(label) or path.exists():
        raise PretrainedModelUnavailable(
            f"pretrained model {label!r} does not exist: `pretrained:` names a local directory or .gguf file "
            f"by a path starting with ., / or ~ (relative paths are read from the directory snakemake runs in)")
    if offline is None:
        offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                      for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return ModelSource(label, label, offline)


def _refuse_remote_code(config_json: Path, label: str) -> None:
    """A config that maps the model onto its own Python code (`auto_map`) is refused before
    transformers sees it: its prompt ("Do you wish to run the custom code?") would appear inside a
    workflow job, and headcount analyses only architectures that transformers itself ships."""
    if not config_json.is_file():
        return
    try:
        config = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PretrainedModelUnavailable(f"{config_json}: not a readable JSON config ({error})") from None
    if isinstance(config, dict) and config.get("auto_map"):
        raise UnsafeModel(
            f"{config_json}: the model maps its classes onto its own Python code (auto_map: "
            f"{sorted(config['auto_map'])}); headcount never runs a model's code (trust_remote_code is always "
            f"False). Use a model whose architecture transformers ships (model_type {config.get('model_type')!r} "
            f"is not one), or port it to one and save it with save_pretrained")


def check_gguf(path: Path) -> None:
    """Refuse a GGUF file transformers cannot convert, before the slow part: no `gguf` package, an
    architecture transformers has no mapping for, or a quantisation `gguf` cannot dequantise. A file
    that passed is not read again while unchanged: every load resolves its source, and parsing a
    GGUF's header (its vocabulary field by field) takes seconds."""
    stat = path.stat()
    _check_gguf_once(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)  # a refusal raises, and is not cached
def _check_gguf_once(path_text: str, size: int, mtime_ns: int) -> None:
    path = Path(path_text)
    if importlib.util.find_spec("gguf") is None:
        raise PretrainedModelUnavailable(
            f"{path}: reading a GGUF model needs the `gguf` package, which is not installed; "
            f"`pip install {GGUF_REQUIREMENT}` (headcount's `make setup` installs it)")
    from gguf import GGUFReader
    from gguf.quants import GGMLQuantizationType, _type_traits

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as error:
        raise PretrainedModelUnavailable(f"{path}: not a readable GGUF file ({error})") from None
    architecture = _gguf_string(reader, "general.architecture")
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise PretrainedModelUnavailable(
            f"{path}: GGUF architecture {architecture!r} has no conversion in transformers (it converts "
            f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); convert the model to a transformers directory "
            f"elsewhere and point `pretrained:` at it")
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    unsupported = sorted({t.tensor_type.name for t in reader.tensors
                          if t.tensor_type not in plain and t.tensor_type not in _type_traits})
    if unsupported:
        raise PretrainedModelUnavailable(
            f"{path}: quantisation {', '.join(unsupported)} cannot be dequantised by gguf "
            f"{importlib.metadata.version('gguf')}; use a GGUF of this model in another quantisation "
            f"(Q4_0, Q4_1, Q8_0, F16, ...)")


def _gguf_string(reader, key: str) -> str | None:
    field_ = reader.fields.get(key)
    if field_ is None:
        return None
    return bytes(field_.parts[field_.data[0]]).decode("utf-8")


def gguf_architecture(path: str | os.PathLike) -> str | None:
    """The architecture a GGUF file declares (general.architecture), read from its header."""
    from gguf import GGUFReader

    return _gguf_string(GGUFReader(str(path)), "general.architecture")


def check_loading_report(label: str, model_class: str, report: dict,
                         allowed: dict[str, Iterable[str]] | None = None) -> None:
    """Refuse a load whose report (from_pretrained's `output_loading_info`) has missing or
    unexpected weights, except those the experiment allows by name: `allowed` maps "missing" and
    "unexpected" to fnmatch patterns of parameter names (`allow_weights:` in the config)."""
    allowed = allowed or {}
    problems = []
    for what in ("missing", "unexpected", "mismatched"):
        names = sorted(_names(report.get(f"{what}_keys", ())))
        left = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in allowed.get(what, ()))]
        if left:
            shown = ", ".join(left[:6]) + (f" and {len(left) - 6} more" if len(left) > 6 else "")
            problems.append(f"{len(left)} {what} ({shown})")
    if problems:
        raise MissingWeights(
            f"pretrained model {label!r} loaded as {model_class} has {'; '.join(problems)} weights: transformers "
            f"would give missing ones random values, and every score that rests on them would be noise. Use a "
            f"checkpoint that has them (e.g. a model trained with this head), or, if you know they do not "
            f"matter, allow them by name in the experiment: allow_weights: {{missing: [pattern, ...], "
            f"unexpected: [pattern, ...]}} (fnmatch patterns of parameter names)")


def _names(keys) -> list[str]:
    # mismatched_keys are (name, shape in checkpoint, shape in model) triples
    return [k[0] if isinstance(k, (tuple, list)) else str(k) for k in keys]


def unavailable(source: ModelSource | str, error: Exception | None) -> PretrainedModelUnavailable:
    """The error for a model that failed to load: for a hub id, how to bring it onto a machine
    without a network; for a local path, what is wrong with it."""
    label = source.label if isinstance(source, ModelSource) else str(source)
    local = isinstance(source, ModelSource) and (source.is_local or source.gguf_file is not None)
    text = str(error).splitlines()[0] if error is not None and str(error) else ""
    reason = f" ({type(error).__name__}: {text})" if error is not None else ""
    if "weights_only" in text or "pytorch_model.bin" in text or "safetensors" in text.lower():
        return PretrainedModelUnavailable(
            f"pretrained model {label!r} cannot be loaded{reason}. headcount reads weights as safetensors "
            f"(or torch's weights-only format) and never unpickles a model's objects, which can run code. "
            f"Convert it to safetensors where you trust the file: `model = AutoModel...from_pretrained(dir); "
            f"model.save_pretrained(dir_out, safe_serialization=True)`, then point `pretrained:` at dir_out")
    if local:
        return PretrainedModelUnavailable(
            f"pretrained model {label!r} cannot be loaded{reason}. The directory (or GGUF file) must be what "
            f"save_pretrained writes: config.json, the weights as model.safetensors, and the tokenizer's files")
    base = Path(label).name or "model"
    return PretrainedModelUnavailable(
        f"pretrained model {label!r} cannot be loaded{reason}. If it is a hub id, this machine may have no "
        f"access to the HuggingFace hub: on a machine with network, download it with "
        f"`hf download {label} --local-dir models/{base}` (older huggingface_hub: `huggingface-cli download "
        f"{label} --local-dir models/{base}`), or in Python `AutoModel...from_pretrained({label!r})"
        f".save_pretrained(dir)` and the same with AutoTokenizer; copy that directory here and set "
        f"`pretrained:` to it.")


__all__ = ["GGUF_REQUIREMENT", "MissingWeights", "ModelSource", "PretrainedModelUnavailable", "UnsafeModel",
           "check_gguf", "check_loading_report", "gguf_architecture", "looks_like_path", "resolve_source",
           "unavailable"]
