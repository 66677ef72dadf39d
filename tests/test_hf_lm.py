"""The language-model adapters (hf_lm.py) on tiny random GPT-2, GPT-NeoX, OPT, Llama, Qwen2, Qwen3, BERT
and RoBERTa models written by tiny_lm.write_tiny_* with tokenizers trained here on the toy corpus: nothing is
downloaded. Each check compares with transformers' own forward pass."""

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from headcount.io import HeadcountError  # noqa: E402
from headcount.models import families, hf_lm  # noqa: E402
from headcount.models.gates import attach_gates  # noqa: E402
from headcount.models.loading import import_pretrained, load_model, open_tokenizer  # noqa: E402
from headcount.models.seq2seq import HeadSlots, Seq2SeqWithHeads, kind_of  # noqa: E402
from headcount.testing import tiny_lm  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

DECODERS = ("gpt2", "gpt_neox", "opt", "llama", "qwen2", "qwen3")
ENCODERS = ("bert", "roberta")
FAMILIES = DECODERS + ENCODERS
GQA = ("llama", "qwen2", "qwen3")  # 4 query heads sharing 2 KV heads
ATOL = 1e-5


def _write(family: str, directory, lines):
    if family in ("qwen2", "qwen3"):
        return tiny_lm.write_tiny_qwen2(directory, lines, family=family)
    return getattr(tiny_lm, f"write_tiny_{family}")(directory, lines)


def transformers_model(directory, family: str) -> nn.Module:
    """The transformers model in the directory, with non-trivial norms and biases, eval mode; the
    same weights every call."""
    auto = transformers.AutoModelForCausalLM if family in DECODERS else transformers.AutoModelForMaskedLM
    return perturbed(auto.from_pretrained(str(directory), attn_implementation="eager"))


def perturbed(hf: nn.Module) -> nn.Module:
    """The model with its biases and norms moved off their initial values (the same every call), eval mode."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            if name.endswith("bias") or "norm" in name.lower() or "ln_" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return hf.eval()


def adapter(tiny_dirs, family: str):
    hf = transformers_model(tiny_dirs[family], family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dirs[family]))
    cls = hf_lm.HFCausalLM if family in DECODERS else hf_lm.HFMaskedLM
    return cls(hf, special=hf_lm.special_ids_of(hf.config, tokenizer)).eval()


def batch(model, lengths=(7, 5, 3), seed: int = 0) -> torch.Tensor:
    """Rows of ordinary ids, padded: decoder_only BOS + text; encoder_only BOS + text + EOS, a
    masked position in each row."""
    sp = model.special
    g = torch.Generator().manual_seed(seed)
    specials = {sp.pad, sp.bos, sp.eos, sp.unk, sp.mask}
    ordinary = torch.tensor([i for i in range(model.config.vocab_size) if i not in specials])
    extra = 2 if model.model_kind == "encoder_only" else 1
    rows = torch.full((len(lengths), max(lengths) + extra), sp.pad)
    for b, n in enumerate(lengths):
        text = ordinary[torch.randint(len(ordinary), (n,), generator=g)]
        if model.model_kind == "encoder_only":
            text[n // 2] = sp.mask
            rows[b, : n + 2] = torch.cat([torch.tensor([sp.bos]), text, torch.tensor([sp.eos])])
        else:
            rows[b, : n + 1] = torch.cat([torch.tensor([sp.bos]), text])
    return rows


def run(model, x, need_weights=False):
    empty = x.new_zeros(x.shape[0], 0)
    with torch.no_grad():
        if model.model_kind == "encoder_only":
            return model(x, empty, need_weights=need_weights)
        return model(empty, x, need_weights=need_weights)


def real(model, x):
    """(B, T) True at the real positions."""
    return model.special.decoder_positions(x) if model.model_kind == "decoder_only" else x.ne(model.special.pad)


def reference(hf, model, x):
    with torch.no_grad():
        return hf(input_ids=x, attention_mask=real(model, x).long(), output_attentions=True)


def max_error(a, b, where=None) -> float:
    if where is not None:
        a, b = a[where], b[where]
    return (a - b).abs().max().item()


# --------------------------------------------------------------------------------------------
# The forward pass


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_probabilities_match_transformers(tiny_dirs, family, record_property):
    model = adapter(tiny_dirs, family)
    assert isinstance(model, Seq2SeqWithHeads)
    kind = "dec_self" if family in DECODERS else "enc_self"
    assert kind_of(model).attention_types == (kind,)
    assert all(isinstance(m, HeadSlots) for m in model.attention_modules()[kind])
    x = batch(model)
    logits, attn = run(model, x, need_weights=True)
    plain, none = run(model, x)
    ref = reference(model.hf, model, x)
    assert none is None and list(attn) == [kind]
    errors = {"logits": max_error(logits, ref.logits), "probs": max(max_error(a, b) for a, b in zip(attn[kind],
                                                                                                   ref.attentions))}
    record_property("max_abs_error", errors)
    assert errors["logits"] <= ATOL and errors["probs"] <= ATOL
    torch.testing.assert_close(plain, logits, rtol=0, atol=0)
    B, T = x.shape
    assert logits.shape == (B, T, model.config.vocab_size)
    for probs in attn[kind]:
        assert probs.shape == (B, 4, T, T)
        if family in DECODERS:
            assert (probs.triu(1) == 0).all()
    if family in ENCODERS:  # padding gets no attention
        assert (attn[kind][0][2, :, :, 5:] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_does_not_change_a_sentences_logits(tiny_dirs, family):
    model = adapter(tiny_dirs, family)
    x = batch(model, lengths=(7, 3))
    alone = x[1:, : 3 + (2 if family in ENCODERS else 1)]
    together, _ = run(model, x)
    single, _ = run(model, alone)
    assert max_error(together[1:, : alone.shape[1]], single) <= ATOL


@pytest.mark.parametrize("family", DECODERS)
def test_incremental_decoding_equals_the_full_forward(tiny_dirs, family):
    model = adapter(tiny_dirs, family)
    x = batch(model, lengths=(6, 6))
    full, _ = run(model, x)
    memory, src_pad, enc = model.encode(x.new_zeros(2, 0))
    assert memory.shape == (2, 0, model.d_model) and enc == []
    cache, steps = model.new_cache(), []
    with torch.no_grad():
        for t in range(x.shape[1]):
            hidden, self_probs, cross = model.decode(x[:, t:t + 1], memory, src_pad, need_weights=True, cache=cache,
                                                     start=t)
            assert cross == [] and self_probs[0].shape == (2, 4, 1, t + 1)
            steps.append(model.logits(hidden))
    assert max_error(torch.cat(steps, 1), full) <= ATOL
    swapped = x.flip(0)  # beam search: reorder_cache keeps the given rows
    model.reorder_cache(cache, torch.tensor([1, 0]))
    with torch.no_grad():
        step = model.logits(model.decode(swapped[:, -1:], cache=cache, start=x.shape[1])[0])
        again = run(model, torch.cat([swapped, swapped[:, -1:]], 1))[0][:, -1:]
    assert max_error(step, again) <= ATOL
    with pytest.raises(ValueError, match="start"):
        model.decode(x[:, :1], memory, src_pad, cache=cache, start=0)


# --------------------------------------------------------------------------------------------
# Heads


def zero_columns(hf, family: str, layer: int, head: int) -> None:
    """Zero head `head`'s input columns of W^O in the transformers model itself."""
    attention = families.FAMILIES[family].attentions(hf)[layer]
    with torch.no_grad():
        if family == "gpt2":  # Conv1D: weight (in, out)
            Dh = attention.head_dim
            attention.c_proj.weight[head * Dh:(head + 1) * Dh] = 0
        elif family == "gpt_neox":
            Dh = attention.head_size
            attention.dense.weight[:, head * Dh:(head + 1) * Dh] = 0
        elif family == "opt":
            Dh = attention.head_dim
            attention.out_proj.weight[:, head * Dh:(head + 1) * Dh] = 0
        elif family in GQA:
            Dh = attention.head_dim
            attention.o_proj.weight[:, head * Dh:(head + 1) * Dh] = 0
        else:
            Dh = attention.self.attention_head_size
            attention.output.dense.weight[:, head * Dh:(head + 1) * Dh] = 0


@pytest.mark.parametrize("family", FAMILIES)
def test_head_mask_equals_zeroed_output_columns(tiny_dirs, family):
    model = adapter(tiny_dirs, family)
    kind = next(iter(model.attention_modules()))
    x = batch(model)
    for layer, head in ((0, 1), (1, 3)):
        mask = torch.ones(2, 4)
        mask[layer, head] = 0
        model.set_head_mask({kind: mask})
        masked, _ = run(model, x)
        hf = transformers_model(tiny_dirs[family], family)
        zero_columns(hf, family, layer, head)
        ref = reference(hf, model, x)
        where = real(model, x)
        assert max_error(masked, ref.logits, where) <= ATOL
        unmasked = reference(transformers_model(tiny_dirs[family], family), model, x)
        assert max_error(masked, unmasked.logits, where) > 10 * ATOL  # the head mattered
    assert torch.equal(model.head_mask()[kind], mask)


PRUNED = {0: [0, 2, 3], 1: [2, 3]}  # GQA: layer 0 keeps both KV heads (uneven groups), layer 1 loses KV head 0


@pytest.mark.parametrize("family", FAMILIES)
def test_keep_heads_equals_masking(tiny_dirs, family):
    model = adapter(tiny_dirs, family)
    kind = next(iter(model.attention_modules()))
    attach_gates(model, types=(kind,))
    for module in model.attention_modules()[kind]:
        with torch.no_grad():
            module.hard_concrete.log_alpha.normal_(0, 2)
    model.eval()
    x = batch(model)
    mask = torch.zeros(2, 4)
    for layer, heads in PRUNED.items():
        mask[layer, heads] = 1
    masked = copy.deepcopy(model)
    masked.set_head_mask({kind: mask})
    expected, _ = run(masked, x)
    gates_before = [m.gates()[PRUNED[i]] for i, m in enumerate(model.attention_modules()[kind])]
    for layer, heads in PRUNED.items():
        model.attention_modules()[kind][layer].keep_heads(heads)
    pruned, _ = run(model, x)
    where = real(model, x)
    assert max_error(pruned, expected, where) <= ATOL
    modules = model.attention_modules()[kind]
    assert [m.n_heads for m in modules] == [3, 2] and modules[1].kept == [2, 3]
    for before, module in zip(gates_before, modules):
        torch.testing.assert_close(module.gates(), before)
    if family in GQA:
        attention = families.FAMILIES[family].attentions(model.hf)
        Dh = modules[0].head_dim
        assert attention[0].k_proj.out_features == 2 * Dh  # heads 0 and 2, 3 still read KV heads 0 and 1
        assert attention[1].k_proj.out_features == Dh  # KV head 0 had no query head left
        assert modules[0].kv_of == [0, 1, 1] and modules[1].kv_of == [0, 0]
    if family in DECODERS:  # the cache holds each layer's remaining KV heads
        cache, steps = model.new_cache(), []
        with torch.no_grad():
            for t in range(x.shape[1]):
                hidden, _, _ = model.decode(x[:, t:t + 1], cache=cache, start=t)
                steps.append(model.logits(hidden))
        assert max_error(torch.cat(steps, 1), pruned, where) <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_a_layer_without_heads_outputs_the_projection_bias(tiny_dirs, family):
    model = adapter(tiny_dirs, family)
    kind = next(iter(model.attention_modules()))
    x = batch(model)
    masked = copy.deepcopy(model)
    masked.set_head_mask({kind: torch.tensor([[1.0] * 4, [0.0] * 4])})
    expected, _ = run(masked, x)
    model.attention_modules()[kind][1].keep_heads([])
    pruned, attn = run(model, x, need_weights=True)
    assert max_error(pruned, expected, real(model, x)) <= ATOL
    assert attn[kind][1].shape[1] == 0
    assert torch.equal(model.head_mask()[kind][1], torch.zeros(4))
    if family in DECODERS:
        cache = model.new_cache()
        with torch.no_grad():
            steps = [model.logits(model.decode(x[:, t:t + 1], cache=cache, start=t)[0]) for t in range(x.shape[1])]
        assert max_error(torch.cat(steps, 1), pruned, real(model, x)) <= ATOL


VARIANTS = {"gpt_neox": {"use_parallel_residual": False},  # attention, then feed-forward (GPT-J-like NeoX)
            "opt": {"do_layer_norm_before": False, "word_embed_proj_dim": 8}}  # OPT-350m: post-LN, D 16 <-> 8


@pytest.mark.parametrize("family", VARIANTS)
def test_architecture_variants_match_transformers(tiny_dirs, family, record_property):
    """The families' other shapes, from the tiny config: GPT-NeoX adding attention and feed-forward
    one after the other, OPT-350m's post-LN layers between projections from and to a narrower
    embedding. Logits and probabilities against transformers, keep_heads against the head mask, and
    the LRP forward pass against the model (float64; transformers' softmax is float32)."""
    from headcount.models.lrp import lrp_forward, make_rules

    config = transformers.AutoConfig.from_pretrained(str(tiny_dirs[family]))
    for name, value in VARIANTS[family].items():
        setattr(config, name, value)
    torch.manual_seed(0)
    hf = perturbed(transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dirs[family]))
    model = hf_lm.HFCausalLM(copy.deepcopy(hf), special=hf_lm.special_ids_of(config, tokenizer)).eval()
    x = batch(model)
    where = real(model, x)
    logits, attn = run(model, x, need_weights=True)
    ref = reference(hf, model, x)
    errors = {"logits": max_error(logits, ref.logits),
              "probs": max(max_error(a, b) for a, b in zip(attn["dec_self"], ref.attentions))}
    mask = torch.zeros(2, 4)
    for layer, heads in PRUNED.items():
        mask[layer, heads] = 1
    masked = copy.deepcopy(model)
    masked.set_head_mask({"dec_self": mask})
    pruned = copy.deepcopy(model)
    for layer, heads in PRUNED.items():
        pruned.attention_modules()["dec_self"][layer].keep_heads(heads)
    errors["keep_heads"] = max_error(run(pruned, x)[0], run(masked, x)[0], where)
    double = model.double()
    best = run(double, x)[0]
    best[..., list(model.special.never_generated())] = float("-inf")
    best = best.max(dim=-1)
    for rule in ("ding", "attnlrp"):
        trace = lrp_forward(double, x.new_zeros(x.shape[0], 0), x, make_rules(rule))
        errors[f"lrp_{rule}"] = (max_error(trace.top_logit, best.values, where) / best.values[where].abs().max()).item()
        assert torch.equal(trace.target[where], best.indices[where])
    record_property("max_abs_error", errors)
    assert max(errors.values()) <= ATOL, errors
    assert errors["lrp_ding"] <= 1e-7 and errors["lrp_attnlrp"] <= 1e-7, errors


@pytest.mark.slow
def test_transformer_lens_agrees_on_tiny_decoders(record_property):
    """tools/crosscheck_transformer_lens.py in .venv-crosscheck (TransformerLens beside the project;
    make crosscheck-venv builds it) on tiny GPT-2, GPT-NeoX and OPT models: TransformerLens' own
    implementation of each, built from the transformers config and the adapter's weights, against
    the adapter's logits, attention patterns, loss and single-head ablations (every head)."""
    import os
    import re
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    python = root / ".venv-crosscheck" / "bin" / "python"
    if not python.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{python} is missing: make test builds it (make crosscheck-venv)")
        pytest.skip(f"{python} is missing (make crosscheck-venv builds it)")
    families = ("gpt2", "gpt_neox", "opt")
    done = subprocess.run([str(python), str(root / "tools" / "crosscheck_transformer_lens.py"), "--family",
                           ",".join(families)], capture_output=True, text=True, cwd=root, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = re.findall(r"^(\w+) max abs error (\w+)\s+(\S+)$", done.stdout, re.M)
    errors = {family: {key: float(value) for f, key, value in found if f == family} for family in families}
    record_property("max_abs_error", errors)
    for family in families:
        assert set(errors[family]) == {"logits", "pattern", "loss", "ablation"}, done.stdout
        assert errors[family]["pattern"] < 1e-5 and errors[family]["loss"] < 1e-5, errors
        assert errors[family]["logits"] < 1e-4 and errors[family]["ablation"] < 1e-4, errors
        assert re.search(rf"^{family} .*single-head ablation of 8 heads", done.stdout, re.M), done.stdout


# --------------------------------------------------------------------------------------------
# Checkpoints, tokenizers, import


@pytest.mark.parametrize("family", FAMILIES)
def test_import_save_and_load_round_trip(tiny_dirs, family, lines, tmp_path):
    model = import_pretrained(tiny_dirs[family], tmp_path / "model.pt", tmp_path / "tokenizer", offline=True)
    assert model.family.name == family
    kind = next(iter(model.attention_modules()))
    model.attention_modules()[kind][1].keep_heads([1, 2])
    attach_gates(model, types=(kind,))
    model.eval()
    model.save(tmp_path / "pruned.pt")
    loaded = load_model(tmp_path / "pruned.pt")
    assert type(loaded) is type(model) and loaded.special == model.special
    assert loaded.head_counts() == {kind: [4, 2]}
    assert loaded.attention_modules()[kind][1].kept == [1, 2]
    x = batch(model)
    assert max_error(run(loaded, x)[0], run(model, x)[0]) == 0
    for side in ("source", "target"):
        tokenizer = open_tokenizer(tmp_path / "tokenizer", side)
        assert isinstance(tokenizer, hf_lm.LMTokenizer)
        ids = tokenizer.encode(lines[:3])
        assert all(model.special.bos not in row and model.special.eos not in row for row in ids)
        assert all(len(tokenizer.pieces(line)) == len(row) for line, row in zip(lines[:3], ids))
        decoded = tokenizer.decode(ids)
        assert decoded == ([line.lower() for line in lines[:3]] if family == "bert" else lines[:3])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tiny_model_is_the_same_on_every_write(family, lines, tmp_path):
    """The same lines give the same tokenizer and weights: tests and dry runs compare numbers that
    must not depend on the process (WordPiece numbered its tokens in hash order)."""
    first, second = (_write(family, tmp_path / name, lines) for name in ("a", "b"))
    for name in ("tokenizer.json", "config.json"):
        assert (first / name).read_text() == (second / name).read_text(), name
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()


def test_a_language_model_takes_no_language_pair(tiny_dirs, tmp_path):
    with pytest.raises(HeadcountError, match="no language pair"):
        import_pretrained(tiny_dirs["gpt2"], tmp_path / "model.pt", tmp_path / "tok", offline=True, src_lang="en",
                          tgt_lang="de")


def test_pieces_align_with_words(tmp_path):
    from headcount.analysis.roles.alignment import align_pieces

    lines = ["Grüße aus Köln, sagte er.", "the cat sat on the mat"] * 5
    for write in (tiny_lm.write_tiny_gpt2, tiny_lm.write_tiny_opt, tiny_lm.write_tiny_llama,
                  tiny_lm.write_tiny_bert, tiny_lm.write_tiny_roberta):
        tokenizer = hf_lm.load_lm_tokenizer(write(tmp_path / write.__name__, lines), offline=True)
        line = "the cat sagte Grüße"
        pieces = tokenizer.pieces(line)
        words = align_pieces(line.split(), pieces)
        first = [words[i] for i, p in enumerate(pieces) if p.startswith("\u2581")]
        assert list(words) == sorted(words) and set(words) == {0, 1, 2, 3}, (write.__name__, pieces, words)
        assert first == [0, 1, 2, 3], (write.__name__, pieces)  # one word-start piece per word


def test_pieces_mark_word_starts_the_sentencepiece_way(tmp_path):
    lines = ["Grüße aus Köln, sagte er.", "the cat sat on the mat"] * 5
    gpt2 = hf_lm.load_lm_tokenizer(tiny_lm.write_tiny_gpt2(tmp_path / "g", lines), offline=True)
    pieces = gpt2.pieces("Grüße aus the cat")
    assert "".join(pieces).replace("\u200b", "") == "\u2581Grüße\u2581aus\u2581the\u2581cat"
    assert pieces[0].startswith("\u2581")  # the first word has no 'Ġ', but opens a word
    bert = hf_lm.load_lm_tokenizer(tiny_lm.write_tiny_bert(tmp_path / "b", lines, vocab_size=60), offline=True)
    pieces = bert.pieces("sagte catmat.")
    tokens = bert.tokenizer.convert_ids_to_tokens(bert.encode(["sagte catmat."])[0])
    assert [p.startswith("\u2581") for p in pieces] == [not t.startswith("##") and t != "." for t in tokens]


def test_what_a_kind_does_not_have_is_a_clear_error(tiny_dirs):
    bert, gpt2 = adapter(tiny_dirs, "bert"), adapter(tiny_dirs, "gpt2")
    with pytest.raises(HeadcountError, match="encoder-only"):
        bert.decode(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(HeadcountError, match="no encoder"):
        gpt2.encoder_parameters()
    with pytest.raises(HeadcountError, match="encoder-only"):  # LRP: tests/test_lm_lrp.py
        bert.lrp_forward().decode()
    assert sum(p.numel() for p in bert.encoder_parameters()) > 0
    with pytest.raises(HeadcountError, match="not a supported language model"):
        families.family_of(transformers.MarianConfig(), families.LANGUAGE_MODELS)


def test_one_table_holds_every_family_and_a_refusal_lists_them_all():
    """families.FAMILIES is the one table of architectures: the cross-checks here and in
    test_hf_models run on each entry, and a model type outside a lookup's kinds is refused with
    every supported type named, by kind."""
    from types import SimpleNamespace

    from test_hf_models import FAMILIES as SEQ2SEQ_FAMILIES

    from headcount.models.seq2seq import MODEL_KINDS

    assert families.names(*families.LANGUAGE_MODELS) == sorted(FAMILIES)
    assert families.names(families.ENCODER_DECODER) == sorted(SEQ2SEQ_FAMILIES)
    assert {f.model_kind for f in families.FAMILIES.values()} == set(families.KINDS) <= set(MODEL_KINDS)
    assert all(name == f.name for name, f in families.FAMILIES.items())
    with pytest.raises(HeadcountError, match=r"not a supported encoder-decoder model \(it is decoder-only\)"):
        families.family_of(transformers.GPT2Config(), (families.ENCODER_DECODER,))
    with pytest.raises(HeadcountError, match="'mamba' is not supported; headcount supports encoder-decoder: bart, "
                                             ".*; decoder-only: gpt2, .*; encoder-only: bert, roberta$"):
        families.family_of(SimpleNamespace(model_type="mamba"))
