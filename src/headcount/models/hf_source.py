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
import mmap
import os
import struct
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from headcount.io import HeadcountError
from headcount.models.remote_code import UnsafeModel, refuse_auto_map, ships_architecture


class PretrainedModelUnavailable(HeadcountError):
    """The pretrained model cannot be loaded (no network for a hub id, a wrong path, ...)."""


class MissingWeights(HeadcountError):
    """The checkpoint lacks weights the model's objective needs, or holds weights it does not use."""


class MalformedGGUF(PretrainedModelUnavailable):
    """A GGUF file whose header does not fit its own size or bounds (damaged, or built to exhaust the reader)."""


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
        _check_pickled_weights(path)
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


# The files of a model directory that transformers reads as configs, any of which may map a class
# onto the directory's own Python code (auto_map).
CONFIG_FILES = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def _refuse_remote_code(config_json: Path, label: str) -> None:
    """A config that maps the model onto its own Python code (`auto_map`) is refused before
    transformers sees it: its prompt ("Do you wish to run the custom code?") would appear inside a
    workflow job, and headcount analyses only architectures that transformers itself ships. The
    tokenizer's and processor's configs beside it are read the same way."""
    for path in [config_json.parent / name for name in CONFIG_FILES]:
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as error:
            raise PretrainedModelUnavailable(f"{path}: not a readable JSON config ({error})") from None
        if isinstance(config, dict):
            refuse_auto_map(config, str(path))


def _check_pickled_weights(directory: Path) -> None:
    """A pytorch_model.bin is unpickled by transformers itself (weights only, whose allowed calls
    take the file's arguments): its pickle is checked first as headcount's own checkpoints are."""
    from headcount.models.checkpoint import check_pickle_stream

    for weights in sorted(directory.glob("pytorch_model*.bin")):
        check_pickle_stream(weights)


def rebuilt_config(state: dict, label: str = "the checkpoint"):
    """The transformers config a headcount checkpoint carries ('model_config', JSON), rebuilt with
    eager attention: the one way a config is rebuilt from a checkpoint, refusing auto_map (the
    model is then built with from_config(config, trust_remote_code=False))."""
    from transformers import AutoConfig

    from headcount.io import CheckpointError
    from headcount.models.checkpoint import config_settings

    text = state.get("model_config")
    if not isinstance(text, str):
        raise CheckpointError(f"{label}: its 'model_config' is {type(text).__name__}, not the JSON of a "
                              f"transformers config; the file was not written by headcount or was altered")
    settings = config_settings(text, label)
    refuse_auto_map(settings, f"{label}: its 'model_config'", in_checkpoint=True)
    model_type = settings.pop("model_type", None)
    if not ships_architecture(model_type):
        raise CheckpointError(f"{label}: its 'model_config' names model_type {model_type!r}, which is no "
                              f"architecture transformers ships; the file was not written by headcount or was "
                              f"altered")
    try:
        config = AutoConfig.for_model(model_type, **settings)
    except (TypeError, ValueError, AttributeError, KeyError) as error:
        raise CheckpointError(f"{label}: its 'model_config' does not rebuild a {model_type} config "
                              f"({type(error).__name__}: {str(error)[:200]}); the file was damaged or "
                              f"altered") from None
    config._attn_implementation = "eager"
    return config


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
    from gguf.quants import GGMLQuantizationType, _type_traits

    reader = _gguf_reader(path)
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
    return _gguf_string(_gguf_reader(Path(path)), "general.architecture")


@contextmanager
def gguf_read_once():
    """Within the block, each GGUF file's metadata is parsed once. transformers reads it anew for
    the config, the tokenizer and the weights: in one import of SmolLM2, seven readers and six
    parses of its 49,152-token vocabulary (8 and 2 CPU s each), and 397 tensor-name maps (14 s),
    60 of the import's 70 s. transformers imports gguf's reader and name map, and its own metadata
    parser, where it uses them, so the block puts memoised ones in their place (the metadata handed
    out as a copy, which its callers edit) and the originals back after."""
    import copy

    try:
        import gguf
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no GGUF can be read then: nothing to share (resolve_source names the install)
        yield
        return
    if getattr(gguf.GGUFReader, "memoised", False):  # an outer block is in force
        yield
        return
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint)
    readers, name_maps, metadata = {}, {}, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = originals[0](path, mode)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = originals[1](arch, n_blocks)
        return name_maps[arch, n_blocks]

    def checkpoint(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return originals[2](path, return_tensors=return_tensors, **kwargs)
        key = os.path.realpath(path)
        if key not in metadata:
            metadata[key] = originals[2](path, return_tensors=False)
        return copy.deepcopy(metadata[key])

    reader.memoised = True
    gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = reader, name_map, checkpoint
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint = originals


def _gguf_reader(path: Path):
    """gguf's reader on a file whose header check_gguf_header passed (MalformedGGUF otherwise)."""
    from gguf import GGUFReader

    check_gguf_header(path)
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as error:
        raise MalformedGGUF(f"{path}: not a readable GGUF file ({type(error).__name__}: {str(error)[:200]}); "
                            f"replace it with one from a source you trust") from None


# A GGUF header is lengths and counts that its reader (the `gguf` package, and transformers through
# it) trusts: a 110-byte file declaring an array of 2**62 bytes made it loop past the file's end
# until memory ran out. check_gguf_header reads the header first, in the file as it is (mmap), and
# refuses any length or count that does not fit in the bytes left, and more keys or tensors than any
# model has (SmolLM2-135M: 37 keys, 272 tensors; a 70B Llama: under 1,000 tensors).
MAX_GGUF_KEYS = 65_536
MAX_GGUF_TENSORS = 1 << 20
MAX_GGUF_ARRAY_DEPTH = 8  # arrays of arrays
MAX_GGUF_DIMS = 4  # ggml's GGML_MAX_DIMS
GGUF_VERSIONS = (2, 3)  # what gguf's reader reads
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # value type -> bytes
_GGUF_STRING, _GGUF_ARRAY, _GGUF_UINT32 = 8, 9, 4


class _GGUFHeader:
    def __init__(self, data, order: str):
        self.data, self.size, self.order, self.at = data, len(data), order, 0

    def fail(self, what: str):
        raise _BadHeader(f"{what} (at byte {self.at:,} of {self.size:,})")

    def number(self, code: str) -> int:
        width = struct.calcsize(code)
        if self.at + width > self.size:
            self.fail("the file ends inside the header")
        (value,) = struct.unpack_from(self.order + code, self.data, self.at)
        self.at += width
        return value

    def room(self, count: int, each: int, what: str) -> None:
        if count * each > self.size - self.at:
            items = "bytes" if each == 1 else f"items of at least {each} bytes"
            self.fail(f"{what} declares {count:,} {items}, more than the {self.size - self.at:,} bytes left")

    def string(self, what: str) -> str:
        length = self.number("Q")
        self.room(length, 1, what)
        raw = self.data[self.at:self.at + length]
        self.at += length
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not UTF-8")

    def skip_string(self, what: str) -> None:
        length = self.number("Q")
        self.room(length, 1, what)
        self.at += length

    def value(self, kind: int, what: str, depth: int = 0):
        if kind in _GGUF_FIXED:
            code = {1: "B", 2: "H", 4: "I", 8: "Q"}[_GGUF_FIXED[kind]]
            return self.number(code)
        if kind == _GGUF_STRING:
            return self.skip_string(what)
        if kind != _GGUF_ARRAY:
            self.fail(f"{what} has value type {kind}, which GGUF does not define")
        if depth >= MAX_GGUF_ARRAY_DEPTH:
            self.fail(f"{what} nests arrays more than {MAX_GGUF_ARRAY_DEPTH} deep")
        item, count = self.number("I"), self.number("Q")
        if item in _GGUF_FIXED:
            self.room(count, _GGUF_FIXED[item], what)
            self.at += count * _GGUF_FIXED[item]
            return None
        self.room(count, 8 if item == _GGUF_STRING else 12, what)
        for _ in range(count):
            self.value(item, what, depth + 1)
        return None


class _BadHeader(Exception):
    pass


def check_gguf_header(path: str | os.PathLike) -> None:
    """Refuse (MalformedGGUF, naming the file and the fault) a GGUF file whose header does not fit
    it: a length or count beyond the bytes left, more keys or tensors than MAX_GGUF_KEYS and
    MAX_GGUF_TENSORS, a key or tensor named twice, a tensor of more than 4 dimensions, of a type
    ggml does not define, or whose data lies beyond the file's end. Reads the header only, in a
    memory map: linear in the header's size, with no allocation it declares."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _read_gguf_header(data, GGML_QUANT_SIZES, GGMLQuantizationType)
    except _BadHeader as why:
        raise MalformedGGUF(f"{path}: not a valid GGUF file: {why}. The file is damaged or was built to exhaust "
                            f"the reader; replace it with one from a source you trust.") from None
    except (OSError, ValueError) as error:  # an empty file cannot be mapped
        raise MalformedGGUF(f"{path}: not a readable GGUF file ({type(error).__name__}: {error})") from None


def _read_gguf_header(data, quant_sizes: dict, quant_type) -> None:
    header = _GGUFHeader(data, "<")
    if bytes(data[:4]) != b"GGUF":
        header.fail("it does not start with GGUF's magic bytes")
    header.at = 4
    version = header.number("I")
    if version & 0xFFFF == 0:  # written on a machine of the other byte order
        header.order, header.at = ">", 4
        version = header.number("I")
    if version not in GGUF_VERSIONS:
        header.fail(f"GGUF version {version}, where the reader reads {' and '.join(map(str, GGUF_VERSIONS))}")
    tensors, keys = header.number("Q"), header.number("Q")
    for count, limit, what in ((keys, MAX_GGUF_KEYS, "keys"), (tensors, MAX_GGUF_TENSORS, "tensors")):
        if count > limit:
            header.fail(f"it declares {count:,} {what}, more than the {limit:,} any model has")
    header.room(keys, 8 + 4 + 1, "its key count")
    seen: dict[str, int] = {}
    alignment = 32
    for _ in range(keys):
        key = header.string("a key")
        if key in seen:
            header.fail(f"key {key!r} appears twice")
        kind = header.number("I")
        seen[key] = kind
        value = header.value(kind, f"key {key!r}")
        if key == "general.alignment":
            if kind != _GGUF_UINT32 or not value or value & (value - 1):
                header.fail("general.alignment is not a power of two stored as uint32")
            alignment = value
    header.room(tensors, 8 + 4 + 8 + 4 + 8, "its tensor count")
    names, extents = set(), []
    for _ in range(tensors):
        name = header.string("a tensor name")
        if name in names:
            header.fail(f"tensor {name!r} appears twice")
        names.add(name)
        dims = header.number("I")
        if not 1 <= dims <= MAX_GGUF_DIMS:
            header.fail(f"tensor {name!r} has {dims} dimensions (ggml's tensors have 1 to {MAX_GGUF_DIMS})")
        elements = 1
        for _ in range(dims):
            elements *= header.number("Q")
        kind = header.number("I")
        try:
            block, block_bytes = quant_sizes[quant_type(kind)]
        except (ValueError, KeyError):
            header.fail(f"tensor {name!r} has type {kind}, which ggml does not define")
        if elements % block:
            header.fail(f"tensor {name!r} has {elements:,} elements, not whole blocks of {block}")
        extents.append((name, header.number("Q"), elements // block * block_bytes))
    start = -(-header.at // alignment) * alignment
    for name, offset, nbytes in extents:
        if start + offset + nbytes > header.size:
            header.fail(f"tensor {name!r} ({nbytes:,} bytes at offset {offset:,}) ends beyond the file's end")


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


__all__ = ["GGUF_REQUIREMENT", "MalformedGGUF", "MissingWeights", "ModelSource", "PretrainedModelUnavailable",
           "UnsafeModel", "check_gguf", "check_gguf_header", "check_loading_report", "gguf_architecture",
           "looks_like_path", "rebuilt_config", "refuse_auto_map", "resolve_source", "unavailable"]
