"""Checkpoint files: the one place every model family and the training loop write and read them.

A checkpoint is a dict saved with torch.save, written atomically; it is read back with torch's
weights-only unpickler. What a model's checkpoint holds is the family's business (seq2seq.py:
`save`); a training checkpoint adds the optimizer, the step and the random state (training.loop).
"""

from __future__ import annotations

import _compat_pickle
import json
import os
import pickle
import pickletools
import re
import zipfile
from pathlib import Path

import torch

from headcount.io import CheckpointError, atomic_path
from headcount.models.remote_code import refuse_auto_map


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


# Beyond tensors, numbers, strings and containers, the one type headcount's files hold: the torch
# version in a model's provenance (a str subclass; constructing one runs no other code).
CHECKPOINT_TYPES = [torch.torch_version.TorchVersion]


def load_checkpoint(path: str | os.PathLike, map_location="cpu") -> dict:
    """What a checkpoint or model file holds. Read with torch's weights-only unpickler: tensors,
    numbers, strings and containers (and CHECKPOINT_TYPES) are all that headcount writes, and a file
    that holds anything else (a pickled object, whose loading would run code the file names) is
    refused unread."""
    state = read_weights_only(path, CHECKPOINT_TYPES, "headcount's checkpoints hold only tensors, numbers, "
                              "strings and containers, so this file was not written by headcount or was altered. "
                              "Delete it, or replace it with one from a source you trust.", map_location)
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a headcount checkpoint (no 'model' entry); delete it")
    _check_model_config(path, state)
    return state


def _check_model_config(path, state: dict) -> None:
    """Every checkpoint headcount writes carries the configuration its model is rebuilt from: a
    transformers family's as JSON, which may not map the model onto Python code of its own."""
    config = state.get("model_config")
    if not isinstance(config, (str, dict)):
        found = "no" if config is None else f"a {type(config).__name__} as its"
        raise CheckpointError(f"{path}: not a headcount checkpoint ({found} 'model_config' entry); it was not "
                              f"written by headcount or was altered. Delete it, "
                              f"or replace it with one from a source you trust.")
    if isinstance(config, str):
        refuse_auto_map(config_settings(config, path), f"{path}: its 'model_config'", in_checkpoint=True)


def config_settings(text: str, path) -> dict:
    """A transformers configuration saved as JSON in a checkpoint -> its settings (CheckpointError,
    naming `path`, for anything but a JSON object)."""
    try:
        settings = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{path}: its 'model_config' is not readable JSON ({type(error).__name__}: "
                              f"{str(error)[:200]}); the file was damaged or altered. Delete it.") from None
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path}: its 'model_config' is JSON {type(settings).__name__}, not an object; "
                              f"the file was damaged or altered. Delete it.")
    return settings


def read_weights_only(path: str | os.PathLike, allowed: list, refusal: str, map_location="cpu"):
    """torch.load with the weights-only unpickler, `allowed` the only classes and objects beyond
    plain data (torch.serialization.safe_globals' list: a class, or (stand-in, "module.Name")). A
    file that pickles anything else is refused, naming it and saying `refusal`; a damaged one is a
    CheckpointError too. The one torch.load of the library (other readers, such as the fairseq one,
    pass their own allow-list)."""
    check_pickle_stream(path)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only load failed" not in str(error).lower():
            raise _unreadable(path, error) from None
        wanted = re.search(r"GLOBAL ([\w.]+)", str(error))
        raise CheckpointError(f"{path}: refused, not loaded: it holds a pickled Python object "
                              f"({wanted.group(1) if wanted else 'not plain data'}), and loading it would run code "
                              f"from the file. {refusal}") from None
    except Exception as error:  # a truncated or corrupted file: torch raises several kinds
        raise _unreadable(path, error) from None


# Weights-only loading runs the allowed callables (a tensor's rebuild, OrderedDict, the few types a
# reader adds) on arguments the file chooses. One that turns its argument into a string (str,
# TorchVersion) or allocates by it (bytearray) took minutes and gigabytes on 2-KB files: a list nested
# 40 deep whose halves are one memoised list is 2**40 items once expanded. So the pickle stream is read
# first, opcode by opcode, building nothing (pickletools), and each call's arguments are measured:
# a real checkpoint's calls get a few values nested three deep (a tensor's storage, offset, size and
# stride), and a type made from a literal gets a short string or number.
MAX_CALL_DEPTH = 8  # containers nested in one call's arguments
MAX_CALL_VALUES = 100_000  # values in one call's arguments, each arrival through a shared reference counted
MAX_ALL_CALL_VALUES = 2_000_000  # the same over the whole file (a 3B model and its optimizer: about 30,000)
MAX_LITERAL_LENGTH = 4096  # characters of a string or bytes given to one of LITERAL_CALLS
# Callables that take literals only (strings, bytes, numbers), each making one value of them.
LITERAL_CALLS = {"builtins.str", "builtins.bytearray", "builtins.int", "builtins.float", "builtins.bool",
                 "builtins.complex", "_codecs.encode", "torch.torch_version.TorchVersion"}
SIZE_CALLS = {"builtins.bytearray"}  # bytearray(n) allocates n bytes: a number is no literal for it
# A tensor subclass's rebuild calls the function its first argument names on its third.
INDIRECT_CALLS = {"torch._tensor._rebuild_from_type_v2": (0, 2)}
# The opcodes torch's weights-only unpickler reads (torch.save writes pickle protocol 2).
_LITERAL_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE", "SHORT_BINSTRING", "NONE",
                "NEWTRUE", "NEWFALSE"}


class _Node:
    """A container or an object in the stream: what it holds, as far as the scan needs."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: str, items: list | None = None):
        self.kind, self.items = kind, items if items is not None else []


class _Global:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Mark:
    pass


class _Refused(Exception):
    pass


def check_pickle_stream(path: str | os.PathLike) -> None:
    """Read the pickles of a torch file (torch.save's zip, or the legacy format) without building
    anything, and refuse (CheckpointError naming the file and the call) one whose allowed callables
    would get deeper or larger arguments than MAX_CALL_DEPTH and MAX_CALL_VALUES, a literal-only
    callable that gets anything but a short literal, or a legacy file whose storages declare more
    bytes than it holds. Linear in the pickle's size."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if zipfile.is_zipfile(path):
            _check_zip(path, size)
        else:
            with open(path, "rb") as f:
                _check_legacy(f, size)
    except _Refused as why:
        raise CheckpointError(f"{path}: refused, not loaded: {why}. A file torch.save wrote never does: this one "
                              f"is damaged or was built to exhaust the reader. Replace it with one from a source "
                              f"you trust.") from None
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, IndexError, EOFError, zipfile.BadZipFile, UnicodeDecodeError,
            TypeError, AttributeError, OverflowError) as error:
        raise _unreadable(path, error) from None


def _check_zip(path: Path, size: int) -> None:
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        unpacked = sum(info.file_size for info in members)
        if unpacked > size:  # torch.save stores its records uncompressed
            raise _Refused(f"its zip records unpack to {unpacked:,} bytes from a {size:,}-byte file "
                           f"(compressed records)")
        pickles = [info for info in members if info.filename.endswith("data.pkl")]
        if not pickles:
            raise ValueError("no data.pkl record: not a torch.save file")
        for info in pickles:
            with archive.open(info) as stream:
                _Scan(_Bounded(stream, info.file_size)).run()


def _check_legacy(f, size: int) -> None:
    """torch's format before 1.6: pickles of the magic number, protocol and system info, the object,
    and its storage keys, then each storage's bytes; a storage's size is read from the object's
    pickle and allocated before its bytes are read, so the sizes must fit in the file."""
    stream = _Bounded(f, size)
    for _ in range(3):
        _Scan(stream).run()
    scan = _Scan(stream)
    scan.run()
    _Scan(stream).run()  # the storage keys
    declared = 0
    for storage_type, numel in scan.storages.values():
        try:
            element = torch._utils._element_size(torch.serialization.StorageType(storage_type).dtype)
        except (KeyError, AttributeError, RuntimeError):
            continue  # not a storage torch knows: its loader refuses it
        declared += numel * element if isinstance(numel, int) and numel >= 0 else size + 1
    if declared > size:
        raise _Refused(f"its storages declare {declared:,} bytes in a {size:,}-byte file (each is allocated "
                       f"before it is read)")


class _Bounded:
    """A stream's read and readline, never asked for more than is left (pickletools reads a length
    from the file and then that many bytes)."""

    def __init__(self, f, size: int):
        self.f, self.left, self.pos = f, size, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(self.left if n < 0 else min(n, self.left))
        self.left, self.pos = self.left - len(data), self.pos + len(data)
        return data

    def readline(self) -> bytes:
        data = self.f.readline(min(self.left, 1 << 16))
        self.left, self.pos = self.left - len(data), self.pos + len(data)
        return data

    def tell(self) -> int:  # where pickletools says an opcode is
        return self.pos


class _Scan:
    def __init__(self, stream):
        self.stream, self.stack, self.marks, self.memo = stream, [], [], {}
        self.visited = 0
        self.storages: dict = {}  # legacy format: root key -> (storage type, numel)

    def run(self) -> None:
        for opcode, arg, pos in pickletools.genops(self.stream):
            name = opcode.name
            if name == "STOP":
                return
            self.step(name, arg, pos)
        raise EOFError("the pickle ends before its STOP")

    def pop_mark(self) -> list:
        items, self.stack = self.stack, self.marks.pop()
        return items

    def step(self, name: str, arg, pos) -> None:
        stack = self.stack
        if name in _LITERAL_OPS:
            stack.append(arg)
        elif name == "PROTO":
            pass
        elif name == "GLOBAL":
            module, _, attr = arg.partition(" ")
            module, attr = _compat_pickle.NAME_MAPPING.get((module, attr), (module, attr))
            stack.append(_Global(f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{attr}"))
        elif name in ("EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET", "EMPTY_TUPLE"):
            stack.append(_Node(name[6:].lower()))
        elif name == "MARK":
            self.marks.append(stack)
            self.stack = []
        elif name == "TUPLE":
            items = self.pop_mark()
            self.stack.append(_Node("tuple", items))
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = stack[-n:]
            if len(items) != n:
                raise ValueError(f"{name} at byte {pos} on a stack of {len(items)}")
            del stack[-n:]
            stack.append(_Node("tuple", items))
        elif name in ("APPEND", "SETITEM"):
            items = [stack.pop() for _ in range(1 if name == "APPEND" else 2)][::-1]
            self.container(stack[-1], pos).items.extend(items)
        elif name in ("APPENDS", "SETITEMS"):
            items = self.pop_mark()
            self.container(self.stack[-1], pos).items.extend(items)
        elif name in ("BINPUT", "LONG_BINPUT"):
            self.memo[arg] = stack[-1]
        elif name in ("BINGET", "LONG_BINGET"):
            stack.append(self.memo[arg])
        elif name == "BINPERSID":
            self.persistent(stack.pop())
            stack.append(_Node("storage"))
        elif name in ("REDUCE", "NEWOBJ"):
            args = stack.pop()
            func = stack.pop()
            stack.append(self.call(func, args, pos))
        elif name == "BUILD":
            stack.pop()  # the state: set on the object as it is, never expanded
        else:  # torch's loader reads nothing else
            raise ValueError(f"pickle opcode {name} at byte {pos}, which torch's weights-only loader does not read")

    @staticmethod
    def container(value, pos) -> _Node:
        if not isinstance(value, _Node):
            raise ValueError(f"items added to a {type(value).__name__} at byte {pos}")
        return value

    def persistent(self, pid) -> None:
        if isinstance(pid, _Node) and len(pid.items) >= 5 and isinstance(pid.items[1], _Global):
            self.storages[_literal_key(pid.items[2])] = (pid.items[1].name.rsplit(".", 1)[-1], pid.items[4])

    def call(self, func, args, pos) -> _Node | bytes:
        name = func.name if isinstance(func, _Global) else "a computed callable"
        if not isinstance(args, _Node):
            raise ValueError(f"a call of {name} at byte {pos} without an argument tuple")
        if name in LITERAL_CALLS:  # before measuring: the message names what it got
            for value in args.items:
                if not _short_literal(value, name in SIZE_CALLS):
                    takes = "a string or bytes" if name in SIZE_CALLS else "a string, bytes or a number"
                    raise _Refused(f"it calls {name} on {_describe(value)} (the pickle's byte {pos}), and "
                                   f"{name.rsplit('.', 1)[-1]} takes only {takes} of at most "
                                   f"{MAX_LITERAL_LENGTH:,} characters")
            if name == "_codecs.encode" and args.items and isinstance(args.items[0], str):
                return args.items[0].encode("utf-8", "surrogatepass")  # bytes, a literal to bytearray
        self.measure(name, args)
        if name in INDIRECT_CALLS:
            where, what = INDIRECT_CALLS[name]
            if len(args.items) > max(where, what):
                self.call(args.items[where], args.items[what], pos)
        return _Node("object")

    def measure(self, name: str, args: _Node) -> None:
        count = 0
        open_ids: set = set()

        def walk(value, depth: int) -> None:
            nonlocal count
            count += 1
            if count > MAX_CALL_VALUES:
                raise _Refused(f"it calls {name} on more than {MAX_CALL_VALUES:,} values once its shared "
                               f"references are expanded")
            if not isinstance(value, _Node) or not value.items:
                return
            if id(value) in open_ids:
                raise _Refused(f"it calls {name} on a container that holds itself (a cycle)")
            if depth >= MAX_CALL_DEPTH:
                raise _Refused(f"it calls {name} on containers nested more than {MAX_CALL_DEPTH} deep")
            open_ids.add(id(value))
            for item in value.items:
                walk(item, depth + 1)
            open_ids.discard(id(value))

        walk(args, 0)
        self.visited += count
        if self.visited > MAX_ALL_CALL_VALUES:
            raise _Refused(f"its calls take more than {MAX_ALL_CALL_VALUES:,} values in all")


def _literal_key(value):
    return value if isinstance(value, (str, bytes, int)) else id(value)


def _short_literal(value, sizes: bool) -> bool:
    if isinstance(value, (str, bytes)):
        return len(value) <= MAX_LITERAL_LENGTH
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return not sizes
    if isinstance(value, int):
        return not sizes and abs(value) < 1 << 64
    return False


def _describe(value) -> str:
    if isinstance(value, _Node):
        return f"a {value.kind}" if value.kind != "object" else "an object another call built"
    if isinstance(value, _Global):
        return f"the callable {value.name}"
    if isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} of {len(value):,} characters"
    return f"the number {value!r}" if isinstance(value, int) and abs(value) < 1 << 64 else \
        f"a {type(value).__name__}"


def _unreadable(path, error: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: cannot be read as a checkpoint ({type(error).__name__}: {error}). "
                           f"Delete it to start that stage again.")


def state_step(path: Path) -> int | None:
    try:
        return int(load_checkpoint(path)["step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None


def refused_pickle(model: str | os.PathLike, error: Exception) -> CheckpointError:
    """What a transformers model whose pytorch_model.bin pickles more than tensors fails with: the
    file, the object, and the safe way forward (safetensors). transformers reads such a file with
    torch's weights-only unpickler, whose own message suggests weights_only=False: running the
    file's code, the one fix never to take for a model from someone else."""
    directory = Path(model).expanduser()
    found = sorted(directory.glob("pytorch_model*.bin")) if directory.is_dir() else []
    weights = ", ".join(map(str, found)) or f"the pytorch_model.bin of {str(model)!r}"
    bin_path = str(found[0]) if len(found) == 1 else "<dir>/pytorch_model.bin"
    out_dir = str(directory) if found else "<dir>"
    wanted = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = wanted.group(1) if wanted else "not plain data"
    convert = (f"import torch; from safetensors.torch import save_file; "
               f"sd = torch.load({bin_path!r}, weights_only=True); "
               f"save_file({{k: v.clone().contiguous() for k, v in sd.items() if isinstance(v, torch.Tensor)}}, "
               f"{out_dir + '/model.safetensors'!r})")
    return CheckpointError(
        f"{weights}: refused, not loaded: the model's weights file holds a pickled Python object ({what}) beside "
        f"its tensors, and loading it would run code from the file (torch's hint to pass weights_only=False does "
        f"exactly that; don't). headcount reads transformers weights as safetensors, or as a pytorch_model.bin "
        f"of plain tensors. Download the model's model.safetensors if its publisher has one (`hf download <hub id> "
        f"--include '*.safetensors' '*.json' '*.model' '*.txt' --local-dir <dir>`), or convert the weights once, in "
        f"an environment you trust with the file: python -c \"{convert}\" (if {what} is plain data, such as a "
        f"numpy scalar, load inside `with torch.serialization.safe_globals([{what}]):`; "
        f"if it is a function, the file carries code: take the weights from elsewhere), or load it there with "
        f"from_pretrained and save it with save_pretrained(<dir>) (transformers 5 writes safetensors; older "
        f"versions: save_pretrained(<dir>, safe_serialization=True)); then remove pytorch_model.bin from <dir>.")


# What torch's weights-only unpickler raises, through transformers' from_pretrained, for a
# pytorch_model.bin that pickles more than tensors: loaders turn it into refused_pickle's message.
PickleRefusal = pickle.UnpicklingError
