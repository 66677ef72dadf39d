"""The transformers export of a pruned model (pruning.transformers_export): for every family headcount
adapts, the directory save_pretrained writes is loaded by plain transformers in a fresh process that
never imports headcount, and its logits (a sentence encoder: its pooled embedding) equal headcount's
gated model at its evaluation gates: closed heads, open gates below 1 folded into W^O, and (GQA) a
key/value head all of whose query heads are closed. Tiny random models of each family, built here."""

import copy
import json
import subprocess
import sys

import pytest
import torch
from conftest import toy_corpus
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from test_hf_lm import DECODERS, _write, adapter, real  # noqa: E402
from test_hf_lm import FAMILIES as LM_FAMILIES  # noqa: E402
from test_hf_lm import batch as lm_batch  # noqa: E402
from test_hf_models import FAMILIES as SEQ2SEQ_FAMILIES  # noqa: E402
from test_hf_models import batch as seq2seq_batch  # noqa: E402
from test_hf_models import tiny  # noqa: E402

from headcount.models.gates import HardConcreteGates  # noqa: E402
from headcount.models.hf_sentence import HFSentenceEncoder  # noqa: E402
from headcount.models.sentence_embedding import read_pooling  # noqa: E402
from headcount.models.transformer import ModelConfig, Transformer  # noqa: E402
from headcount.pruning.hard_concrete import fold_gates  # noqa: E402
from headcount.pruning.removal import remove_pruned_heads  # noqa: E402
from headcount.pruning.transformers_export import (  # noqa: E402
    NOT_EXPORTED,
    NotExportable,
    export_transformers,
    to_plain_transformers,
)

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights


SENTENCE = "sentence_encoder"
FAMILIES = (*SEQ2SEQ_FAMILIES, *LM_FAMILIES, SENTENCE)
ATOL = 1e-5
# Per layer, the Hard Concrete log alpha of heads 0..3: closed (evaluation gate 0), open below 1
# (0.61 and 0.78), fully open. Layer 0 also closes head 1, so heads 0 and 1 are both closed there:
# with grouped-query attention (4 query heads on 2 KV heads) their shared KV head 0 goes too.
LOG_ALPHA = {0: [-10.0, -10.0, 10.0, 1.0], 1: [-10.0, 0.3, 10.0, 1.0]}

# What the fresh process runs: plain transformers, no headcount; one case per family.
LOADER = """
import json, sys
import torch, transformers

cases, out = json.loads(sys.argv[1]), sys.argv[2]
results = {}
for family, case in cases.items():
    try:
        inputs = torch.load(case["inputs"])
        auto = getattr(transformers, case["auto"])
        model, info = auto.from_pretrained(case["directory"], output_loading_info=True)
        with torch.no_grad():
            output = getattr(model.eval()(**inputs), case["output"])
        if case["pool"]:  # the mean over real tokens: the pooling 1_Pooling/config.json declares
            mask = inputs["attention_mask"][..., None].to(output.dtype)
            output = ((output * mask).sum(1) / mask.sum(1))[:, None, :]
        results[family] = {"output": output, "loading": {k: [str(x) for x in v] for k, v in info.items()}}
    except Exception as error:
        results[family] = {"error": repr(error)}
results["headcount imported"] = "headcount" in sys.modules
torch.save(results, out)
"""


def set_gates(model) -> None:
    """Hard Concrete gates at LOG_ALPHA on every attention, folded as pruning folds them (a closed
    gate's W^O columns become 0); then head 3 of layer 1 closed by its fixed mask alone, its W^O
    columns as they were (as a ranked method's mask leaves them), which the export must zero."""
    for modules in model.attention_modules().values():
        for layer, slot in enumerate(modules):
            slot.hard_concrete = HardConcreteGates(slot.n_heads)
            with torch.no_grad():
                slot.hard_concrete.log_alpha.copy_(torch.tensor(LOG_ALPHA[layer % 2][: slot.n_heads]))
    fold_gates(model.eval())
    for modules in model.attention_modules().values():
        modules[1].head_mask[3] = 0


def sentence_encoder(bert_dir) -> HFSentenceEncoder:
    """A tiny BERT as sentence encoder (AutoModel, mean pooling), biases and norms non-trivial."""
    hf = transformers.AutoModel.from_pretrained(str(bert_dir), attn_implementation="eager")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(bert_dir))
    from headcount.models.hf_lm import special_ids_of

    return HFSentenceEncoder(hf, special=special_ids_of(hf.config, tokenizer)).eval()


def gated_case(family: str, lm_dirs: dict):
    """(the gated model, transformers' auto class, its inputs, output attribute, pooled?)."""
    if family in SEQ2SEQ_FAMILIES:
        model = tiny(family)
        src, tgt_in = seq2seq_batch(model)
        inputs = dict(input_ids=src, attention_mask=src.ne(model.special.pad).long(), decoder_input_ids=tgt_in,
                      decoder_attention_mask=torch.ones_like(tgt_in), use_cache=False)
        return model, "AutoModelForSeq2SeqLM", inputs, "logits", False
    model = sentence_encoder(lm_dirs["bert"]) if family == SENTENCE else adapter(lm_dirs, family)
    x = lm_batch(model)
    inputs = dict(input_ids=x, attention_mask=real(model, x).long())
    if family == SENTENCE:
        return model, "AutoModel", inputs, "last_hidden_state", True
    return model, "AutoModelForCausalLM" if family in DECODERS else "AutoModelForMaskedLM", inputs, "logits", False


def headcount_output(model, inputs: dict) -> torch.Tensor:
    """The gated model's logits (a sentence encoder: its pooled embedding) on the same batch."""
    x = inputs["input_ids"]
    empty = x.new_zeros(x.shape[0], 0)
    kind = getattr(model, "model_kind", "encoder_decoder")
    with torch.no_grad():
        if kind == "encoder_decoder":
            return model(x, inputs["decoder_input_ids"])[0]
        return model(empty, x)[0] if kind == "decoder_only" else model(x, empty)[0]


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
    src, tgt = toy_corpus(120, seed=5)
    return {family: _write(family, tmp_path_factory.mktemp(family), src + tgt) for family in LM_FAMILIES}


@pytest.fixture(scope="module")
def exported(lm_dirs, tmp_path_factory):
    """{family: (headcount's output, what the fresh process got)}: every family's gated model saved
    as headcount saves it, exported by export_transformers, loaded back in one fresh process."""
    cases, expected = {}, {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(f"export_{family}")
        model, auto, inputs, output, pool = gated_case(family, lm_dirs)
        ungated = headcount_output(model, inputs)
        set_gates(model)
        expected[family] = headcount_output(model, inputs)
        # Otherwise equal outputs would not show that the export has the gates.
        assert (expected[family] - ungated).abs().max() > 1e-3, f"{family}: the gates change nothing"
        model.save(root / "model.pt")
        export_transformers(root / "model.pt", root / "transformers", log=lambda line: None)
        torch.save(inputs, root / "inputs.pt")
        cases[family] = {"directory": str(root / "transformers"), "inputs": str(root / "inputs.pt"), "auto": auto,
                         "output": output, "pool": pool}
    out = tmp_path_factory.mktemp("loaded") / "results.pt"
    subprocess.run([sys.executable, "-I", "-c", LOADER, json.dumps(cases), str(out)], check=True, timeout=300,
                   cwd=out.parent)
    results = torch.load(out)
    assert results.pop("headcount imported") is False
    return {family: (expected[family], results[family], cases[family]) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_plain_transformers_loads_the_export_with_the_gated_models_outputs(exported, family, record_property):
    expected, loaded, case = exported[family]
    assert "error" not in loaded, loaded.get("error")
    assert not any(loaded["loading"].values()), loaded["loading"]  # no missing, unexpected or mismatched weights
    error = (loaded["output"] - expected).abs().max().item()
    record_property("max_abs_error", error)
    assert loaded["output"].shape == expected.shape
    assert error <= ATOL, f"{family}: export differs from the gated model by {error}"


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_closed_heads_have_zero_query_key_value_rows_and_output_columns(exported, family):
    """The outputs cannot tell whether Q, K, V were zeroed (W^O's columns already silence the head),
    nor, outside GQA, whether W^O's were (zero V rows silence it too): read the saved weights.
    Layer 0 closes heads 0 and 1 (LOG_ALPHA; Llama's KV head 0 is theirs), layer 1 head 3 by its
    mask alone (set_gates)."""
    weights = load_file(f"{exported[family][2]['directory']}/model.safetensors")
    Dh = 4  # d_model 16, 4 heads
    closed, open_ = slice(0, 2 * Dh), slice(2 * Dh, 4 * Dh)
    if family == "llama":
        layer = "model.layers.{}.self_attn.{}.weight".format
        pairs = [(weights[layer(0, "q_proj")], closed, open_),
                 (weights[layer(0, "k_proj")], slice(0, Dh), slice(Dh, 2 * Dh))]
        out = [weights[layer(k, "o_proj")] for k in (0, 1)]
    elif family == "gpt2":
        qkv = weights["transformer.h.0.attn.c_attn.weight"].t()  # Conv1D: (in, out)
        pairs = [(qkv[k * 16:(k + 1) * 16], closed, open_) for k in range(3)]
        out = [weights[f"transformer.h.{k}.attn.c_proj.weight"].t() for k in (0, 1)]
    else:
        layer = "encoder.block.{}.layer.0.SelfAttention.{}.weight".format
        pairs = [(weights[layer(0, name)], closed, open_) for name in "qkv"]
        out = [weights[layer(k, "o")] for k in (0, 1)]
    for weight, shut, kept in pairs:
        assert (weight[shut] == 0).all() and (weight[kept] != 0).any()
    assert (out[0][:, closed] == 0).all() and (out[0][:, open_] != 0).all()
    assert (out[1][:, 3 * Dh:] == 0).all() and (out[1][:, Dh:3 * Dh] != 0).all()


def test_the_sentence_encoders_export_declares_its_pooling_for_sentence_transformers(exported):
    pooling = read_pooling(exported[SENTENCE][2]["directory"])
    assert pooling.mode == "mean" and not pooling.normalize and pooling.declared_by.endswith("config.json")


def test_gates_still_attached_are_folded_into_the_export():
    """A model whose Hard Concrete gates were not folded exports its evaluation gates all the same."""
    model = tiny("marian")
    for modules in model.attention_modules().values():
        for layer, slot in enumerate(modules):
            slot.hard_concrete = HardConcreteGates(slot.n_heads)
            with torch.no_grad():
                slot.hard_concrete.log_alpha.copy_(torch.tensor(LOG_ALPHA[layer % 2]))
    model.eval()
    src, tgt_in = seq2seq_batch(model)
    with torch.no_grad():
        expected = model(src, tgt_in)[0]
        hf, closed = to_plain_transformers(copy.deepcopy(model))
        got = hf(input_ids=src, attention_mask=src.ne(model.special.pad).long(), decoder_input_ids=tgt_in,
                 use_cache=False).logits
    assert closed["enc_self"] == [[0, 1], [0]]
    assert (got - expected).abs().max().item() <= ATOL


def test_a_physically_pruned_model_is_refused_naming_the_gated_checkpoint():
    model = tiny("bart")
    set_gates(model)
    remove_pruned_heads(model)
    with pytest.raises(NotExportable, match="gated checkpoint"):
        to_plain_transformers(model, "physical/model.pt")


def test_headcounts_own_transformer_keeps_model_pt_only_and_says_so(tmp_path):
    cfg = ModelConfig(src_vocab=20, tgt_vocab=20, d_model=8, n_heads=2, d_ff=16, enc_layers=1, dec_layers=1)
    Transformer(cfg).save(tmp_path / "model.pt")
    record = export_transformers(tmp_path / "model.pt", tmp_path / "transformers", log=lambda line: None)
    assert record["exported"] is False
    assert "no transformers class" in (tmp_path / "transformers" / NOT_EXPORTED).read_text()
    assert list((tmp_path / "transformers").iterdir()) == [tmp_path / "transformers" / NOT_EXPORTED]
