"""Per-head access (analysis.head_access, headcount.heads) against independent computations on
every family's tiny model: a zero-ablated head set equals transformers' own forward with the heads'
W^O columns zeroed, a scaled set the columns scaled, a mean ablation the columns zeroed and their
mean output folded into W^O's bias, patching the heads' W^O inputs swapped by a hook on
transformers' own module, and the cache transformers' attention probabilities and W^O inputs.
Then the caller's model: left as it was by heads, analyse and prune, on success and on failure."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import toy_corpus

transformers = pytest.importorskip("transformers")

from test_hf_lm import DECODERS, FAMILIES, GQA, transformers_model  # noqa: E402
from test_hf_models import FAMILIES as SEQ2SEQ_FAMILIES  # noqa: E402
from test_hf_models import batch as seq2seq_batch  # noqa: E402
from test_hf_models import tiny, zero_head_columns  # noqa: E402

import headcount  # noqa: E402
from headcount.analysis.head_access import HeadNames, head_name  # noqa: E402
from headcount.analysis.importance import HeadEdit, edited_scores  # noqa: E402
from headcount.models.restore import fingerprint  # noqa: E402
from headcount.training.perplexity import paired_bootstrap_nll  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

SET = [(0, 1), (1, 3)]  # a set across both layers of the tiny models (counted from 0)


def w_o(hf, family: str, layer: int):
    """The transformers module that is W^O of a layer, and the head size."""
    from headcount.models import families

    attention = families.FAMILIES[family].attentions(hf)[layer]
    if family == "gpt2":
        return attention.c_proj, attention.head_dim
    if family == "gpt_neox":
        return attention.dense, attention.head_size
    if family == "opt":
        return attention.out_proj, attention.head_dim
    if family in GQA:
        return attention.o_proj, attention.head_dim
    return attention.output.dense, attention.self.attention_head_size


def edit_columns(hf, family: str, layer: int, head: int, factor: float = 0.0, mean: torch.Tensor | None = None):
    """Scale head `head`'s input columns of W^O by `factor` in the transformers model itself; with
    `mean` (Dh,), add W^O's columns times it to the bias (the head's output replaced by its mean)."""
    module, Dh = w_o(hf, family, layer)
    cols = slice(head * Dh, (head + 1) * Dh)
    with torch.no_grad():
        columns = module.weight[cols].t() if family == "gpt2" else module.weight[:, cols]  # (out, Dh)
        if mean is not None:
            if module.bias is None:  # Llama's o_proj has none: a zero one, to fold the mean into
                module.bias = torch.nn.Parameter(module.weight.new_zeros(module.weight.shape[0]))
            module.bias += columns @ mean.to(columns.dtype)
        if family == "gpt2":  # Conv1D: weight (in, out)
            module.weight[cols] *= factor
        else:
            module.weight[:, cols] *= factor


def per_text_nll(hf, access, texts) -> np.ndarray:
    """Each text's summed NLL from transformers' own forward on the batches the API builds."""
    from headcount.analysis.head_access import encode_texts

    model = access.model
    batches = encode_texts(model, access.src_tokenizer, access.tgt_tokenizer, texts, None, 2000, "cpu")
    out = np.zeros(len(texts))
    for (src, tgt_in, tgt_out), rows in zip(batches.batches, batches.indices):
        x = src if model.model_kind == "encoder_only" else tgt_in
        real = x.ne(model.special.pad) if model.model_kind == "encoder_only" else model.special.decoder_positions(x)
        with torch.no_grad():
            logits = hf(input_ids=x, attention_mask=real.long()).logits
        nll = F.cross_entropy(logits.transpose(1, 2), tgt_out, reduction="none", ignore_index=model.special.pad)
        for r, i in enumerate(rows):
            out[i] = float(nll[r].double().sum())
    return out


def opened(tiny_dirs, family):
    hf = transformers_model(tiny_dirs[family], family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dirs[family]))
    return hf, tokenizer


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_a_head_set_equals_transformers_with_its_columns_edited(tiny_dirs, lines, family):
    hf, tokenizer = opened(tiny_dirs, family)
    before = fingerprint(hf)
    texts = lines[:5]
    names = [head_name(("t", layer, head)) for layer, head in SET]
    with headcount.heads(hf, tokenizer) as h:
        mean_of = h.cache(texts, heads=names, patterns=False)
        found = h.measure(texts, {"set": names, "scaled": h.scale(names, 0.5),
                                  "mean": h.ablate(names, how="mean")}, per_token=True)
        access = h
        mean = {name: mean_of.mean_output(name) for name in names}
        reference = {"none": per_text_nll(transformers_model(tiny_dirs[family], family), access, texts)}
    assert fingerprint(hf) == before  # the caller's model is back: names and values
    for name, factor, with_mean in (("set", 0.0, False), ("scaled", 0.5, False), ("mean", 0.0, True)):
        edited = transformers_model(tiny_dirs[family], family)
        for (layer, head), head_label in zip(SET, names):
            edit_columns(edited, family, layer, head, factor, mean[head_label] if with_mean else None)
        theirs = per_text_nll(edited, access, texts)
        np.testing.assert_allclose(found.sums[found.sets.index(name)], theirs, rtol=1e-6, atol=2e-5)
        reference[name] = theirs
    # each edit mattered: the zeroed and scaled heads changed the loss, and a mean is not a zero
    assert np.abs(reference["set"] - reference["none"]).max() > 2e-4
    assert np.abs(reference["scaled"] - reference["none"]).max() > 1e-4
    assert np.abs(reference["mean"] - reference["set"]).max() > 1e-4
    np.testing.assert_allclose(found.sums[found.sets.index("none")], reference["none"], rtol=1e-6, atol=2e-5)
    # the per-token values add up to the sums; the interval is the paired bootstrap of those sums
    assert np.allclose([t.sum() for t in found.tokens["set"]], found.sums[found.sets.index("set")])
    expected = paired_bootstrap_nll(found.sums[1], found.sums[0], found.units)
    assert found.compare("set", "none")["low"] == expected["low"]
    assert found.table.set_index("set").loc["set", "difference"] == pytest.approx(found.value("set") -
                                                                                   found.value("none"))


@pytest.mark.parametrize("family", SEQ2SEQ_FAMILIES)
def test_an_encoder_decoder_head_set_across_types_equals_zeroed_columns(family):
    """The shared path (importance.edited_scores) on every encoder-decoder family: a set across the
    three attention types against transformers' forward with the heads' columns zeroed or scaled."""
    model = tiny(family)
    src, tgt_in = seq2seq_batch(model)
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full_like(tgt_in[:, :1], model.special.pad)], dim=1)
    heads = [("enc_self", 0, 1), ("dec_self", 1, 3), ("dec_enc", 0, 2)]
    found = edited_scores(model, [(src, tgt_in, tgt_out)],
                          [None, HeadEdit.masking(heads), HeadEdit({head: 0.5 for head in heads})])
    for row, factor in ((1, 0.0), (2, 0.5)):
        reference = copy.deepcopy(model)
        for head in heads:
            zero_head_columns(reference, *head, scale=factor)
        with torch.no_grad():
            logits = reference(src, tgt_in)[0]
        nll = F.cross_entropy(logits.transpose(1, 2), tgt_out, reduction="none", ignore_index=model.special.pad)
        np.testing.assert_allclose(found.sums[row], nll.double().sum(dim=1).numpy(), rtol=1e-5, atol=1e-5)
        assert np.abs(found.sums[row] - found.sums[0]).max() > 1e-4


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "opt", "llama", "bert"])
def test_the_cache_is_transformers_own_patterns_and_w_o_inputs(tiny_dirs, lines, family):
    hf, tokenizer = opened(tiny_dirs, family)
    texts = lines[:3]
    with headcount.heads(hf, tokenizer) as h:
        cache = h.cache(texts)
        from headcount.analysis.head_access import encode_texts

        batches = encode_texts(h.model, h.src_tokenizer, h.tgt_tokenizer, texts, None, 2000, "cpu")
    reference = transformers_model(tiny_dirs[family], family)
    inputs = {}
    for layer in range(2):
        module, Dh = w_o(reference, family, layer)
        module.register_forward_pre_hook(lambda m, args, layer=layer: inputs.__setitem__(layer, args[0].detach()))
    encoder = family not in DECODERS
    kind = "enc_self" if encoder else "dec_self"
    for (src, tgt_in, _), rows in zip(batches.batches, batches.indices):
        x = src if encoder else tgt_in
        real = x.ne(hf.config.pad_token_id if encoder else -1) if encoder else batches.special.decoder_positions(x)
        with torch.no_grad():
            out = reference(input_ids=x, attention_mask=real.long(), output_attentions=True)
        for r, i in enumerate(rows):
            n = int(real[r].sum())
            for layer in range(2):
                torch.testing.assert_close(cache.patterns[(kind, layer)][i], out.attentions[layer][r, :, :n, :n],
                                           rtol=1e-5, atol=1e-6)
                z = inputs[layer][r, :n].view(n, 4, -1).transpose(0, 1)  # (H, T, Dh)
                torch.testing.assert_close(cache.outputs[(kind, layer)][i], z, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(cache.output(head_name((kind, layer, 2)), text=i), z[2])
    frame = cache.pattern("2.3", text=0)
    assert frame.shape[0] == frame.shape[1] and np.allclose(frame.to_numpy().sum(axis=1), 1, atol=1e-5)


def test_patching_equals_swapping_the_w_o_inputs_in_transformers(tiny_dirs, lines):
    """Heads 1.2 and 2.4 on texts A with their outputs on texts B (same token lengths), against
    transformers' Llama with those heads' slice of o_proj's input replaced by B's, by a hook."""
    family = "llama"
    hf, tokenizer = opened(tiny_dirs, family)
    by_length = {}
    for line in lines:
        by_length.setdefault(len(tokenizer(line)["input_ids"]), []).append(line)
    pairs = [group[:2] for group in by_length.values() if len(group) >= 2][:3]
    assert len(pairs) == 3
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    with headcount.heads(hf, tokenizer) as h:
        source = h.cache(b, patterns=False)
        found = h.measure(a, {"patched": h.patch(["1.2", "2.4"], source)})
        access = h
        from headcount.analysis.head_access import encode_texts

        batches_b = encode_texts(h.model, h.src_tokenizer, h.tgt_tokenizer, b, None, 2000, "cpu")
    reference = transformers_model(tiny_dirs[family], family)
    saved = {}
    handles = [w_o(reference, family, layer)[0].register_forward_pre_hook(
        lambda m, args, layer=layer: saved.__setitem__(layer, args[0].detach().clone())) for layer in range(2)]
    sources = {}  # text -> {layer: its W^O input (T, H * Dh)}
    for (_, tgt_in, _), rows in zip(batches_b.batches, batches_b.indices):
        with torch.no_grad():
            reference(input_ids=tgt_in, attention_mask=batches_b.special.decoder_positions(tgt_in).long())
        for r, i in enumerate(rows):
            sources[i] = {layer: saved[layer][r] for layer in range(2)}
    for handle in handles:
        handle.remove()
    expected = []
    Dh = w_o(reference, family, 0)[1]
    for i, text in enumerate(a):
        def swap(module, args, layer, i=i):
            x = args[0].clone()
            head = {0: 1, 1: 3}[layer]
            n = x.shape[1]
            x[0, :, head * Dh:(head + 1) * Dh] = sources[i][layer][:n, head * Dh:(head + 1) * Dh]
            return (x,)

        handles = [w_o(reference, family, layer)[0].register_forward_pre_hook(
            lambda m, args, layer=layer, swap=swap: swap(m, args, layer)) for layer in range(2)]
        expected.append(per_text_nll(reference, access, [text])[0])
        for handle in handles:
            handle.remove()
    np.testing.assert_allclose(found.sums[found.sets.index("patched")], expected, rtol=1e-6, atol=2e-5)
    assert np.abs(found.sums[1] - found.sums[0]).max() > 1e-3


def test_a_metric_per_text_or_per_token(tiny_dirs, lines):
    hf, tokenizer = opened(tiny_dirs, "gpt2")

    def nll(logits, targets, real):  # per token: the loss itself
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none") * real

    def first(logits, targets, real):  # per text: the log-probability of the first target
        return logits[:, 0].log_softmax(-1).gather(1, targets[:, :1])[:, 0]

    with headcount.heads(hf, tokenizer) as h:
        sets = {"a": ["1.1", "2.2"], "b": [(1, 0)]}
        loss = h.measure(lines[:6], sets)
        mine = h.measure(lines[:6], sets, metric=nll, per_token=True, sets_per_pass=1)
        per_text = h.measure(lines[:6], sets, metric=first)
        with pytest.raises(headcount.ArgumentError, match="^metric:"):
            h.measure(lines[:6], sets, metric=lambda logits, targets, real: logits.sum())
    np.testing.assert_allclose(mine.sums, loss.sums, rtol=1e-6)
    np.testing.assert_allclose(mine.units, loss.units)
    assert (per_text.units == 1).all() and per_text.tokens is None
    assert per_text.value("b") == pytest.approx(per_text.values("b").mean())


def test_names_say_their_base_and_agree_with_the_published_tables(tiny_dirs):
    from headcount.report import head_label

    hf, tokenizer = opened(tiny_dirs, "llama")
    with headcount.heads(hf, tokenizer) as h:
        names = h.names
        assert names.key("2.3") == ("dec_self", 1, 2) == names.key((1, 2)) == names.key(("dec_self", 1, 2))
        assert all(row["name"] == head_label(row["layer"], row["head"]) for _, row in h.heads.iterrows())
        for bad, match in (("2.3", "one head, not a list"), ((1, 2), "one head, not a list"),
                           (["0.1"], "count layers and heads from 1"), (["3.1"], "not a head of this model"),
                           ([(2, 0)], "not a head of this model"), (["2.3", (1, 2)], "named twice")):
            with pytest.raises(headcount.ArgumentError, match="^heads: .*" + match):
                names.keys(bad)
        with pytest.raises(headcount.ArgumentError, match=r"^sets\['x'\]: '2.3' is one head"):
            h.measure(["a b"], {"x": "2.3"})
    seq2seq = HeadNames(tiny("bart"))
    assert seq2seq.key("dec_enc:1.2") == ("dec_enc", 0, 1) and seq2seq.name(("dec_enc", 0, 1)) == "dec_enc:1.2"
    with pytest.raises(headcount.ArgumentError, match="say which"):
        seq2seq.key("1.2")


# --------------------------------------------------------------------------------------------
# The caller's model


def _state(hf):
    return fingerprint(hf), hf.training, hf.config._attn_implementation, [type(m).__name__ for m in hf.modules()]


def test_analyse_leaves_the_model_as_it_was_and_save_pretrained_round_trips(tiny_dirs, lines, tmp_path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["gpt2"]))  # sdpa attention, as loaded
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dirs["gpt2"]))
    hf.train()
    before = _state(hf)
    found = headcount.analyse(hf, tokenizer, lines[:6], measures=["confidence", "ablation"], roles=False, log=False)
    assert _state(hf) == before and hf.config._attn_implementation != "eager"
    hf.eval()
    hf.save_pretrained(tmp_path / "after")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "after")
    ids = \
        {"input_ids": torch.tensor([tokenizer(lines[0])["input_ids"]])}
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**ids).logits, hf(**ids).logits, rtol=0, atol=0)
    # ablation of some heads: the same numbers as ablating all
    some = headcount.analyse(hf, tokenizer, lines[:6], measures=["ablation"], roles=False, log=False,
                             ablation_heads=["1.2"], ablation_layers=[1]).ablation.set_index(["layer", "head"])
    every = found.ablation.set_index(["layer", "head"])
    done = some["delta_loss"].dropna()
    assert sorted(done.index) == [(0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
    np.testing.assert_allclose(done, every.loc[done.index, "delta_loss"], rtol=1e-6)

    class Stop(Exception):
        pass

    def failing(line):
        if line.startswith("ablation"):
            raise Stop(line)

    with pytest.raises(Stop, match="^ablation"):  # fails mid-way, with the gates in
        headcount.analyse(hf, tokenizer, lines[:6], measures=["ablation"], roles=False, log=failing)
    assert _state(hf)[0] == fingerprint(hf) and _state(hf)[2:] == before[2:]


def test_prune_leaves_the_model_as_it_was_and_trains_only_gates_on_a_pretrained_model(tiny_dirs, lines):
    hf, tokenizer = opened(tiny_dirs, "llama")
    before = _state(hf)
    pruned = headcount.prune(hf, tokenizer, lines[:20], lam=0.1, steps=4, training={"max_tokens": 300}, log=False)
    assert _state(hf) == before
    assert pruned.record["gates_only"] and pruned.record["undecided"] == len(pruned.undecided) > 0
    assert set(pruned.undecided["p_open"].between(0.1, 0.9)) == {True}
    # frozen weights: every weight but W^O (the gates fold into it) is the caller's
    ours = dict(pruned.model.hf.named_parameters())
    for name, value in hf.named_parameters():
        if ".o_proj." not in name:
            torch.testing.assert_close(ours[name], value, rtol=0, atol=0)

    class Stop(Exception):
        pass

    def failing(line):  # the training loop's line after its last gate step: gates trained, not yet folded
        if line.startswith("step "):
            raise Stop(line)

    with pytest.raises(Stop, match="^step 4/4"):
        headcount.prune(hf, tokenizer, lines[:20], lam=0.1, steps=4, training={"max_tokens": 300}, log=failing)
    assert _state(hf) == before


@pytest.mark.parametrize("call, named", [
    (lambda m, t, x: headcount.analyse(m, t, x, measures="confidence"), "measures"),
    (lambda m, t, x: headcount.analyse(m, t, x, ablation_heads="1.2"), "ablation_heads"),
    (lambda m, t, x: headcount.analyse(m, t, x, ablation_layers=[7]), "ablation_layers"),
    (lambda m, t, x: headcount.analyse(m, t, x, measures=["confidence"], ablation_layers=[0]),
     "ablation_heads, ablation_layers"),
    (lambda m, t, x: headcount.analyse(m, t, x, device="tpu"), "device"),
    (lambda m, t, x: headcount.prune(m, t, x + ["word " * 3000], 0.1), "train_texts"),
    (lambda m, t, x: headcount.prune(m, t, x, 0.1, recipe={"heal_steps": 5}, gates_only=True), "recipe"),
    (lambda m, t, x: headcount.prune(m, t, x, 0.1, gates_only="yes"), "gates_only"),
    (lambda m, t, x: headcount.prune(m, t, x, 0.1, device="cuda:x"), "device"),
])
def test_a_bad_argument_is_named_before_any_work(tiny_dirs, lines, call, named):
    hf, tokenizer = opened(tiny_dirs, "gpt2")
    before = _state(hf)
    with pytest.raises(headcount.ArgumentError, match="^" + named + ":"):
        call(hf, tokenizer, lines[:3])
    assert _state(hf) == before


def test_an_encoder_decoder_through_the_api(tmp_path):
    """A MarianMT model with its tokenizer: targets required, heads named by type, a cross-attention
    pattern over the source's tokens, and a set across the three types measured against the model
    with the heads' columns zeroed."""
    from headcount.testing.tiny_seq2seq import write_tiny_marian

    src, tgt = toy_corpus(60, seed=11)
    directory = write_tiny_marian(tmp_path / "marian", src, tgt, vocab_size=40)
    hf = transformers.MarianMTModel.from_pretrained(str(directory)).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(directory))
    heads = ["enc_self:1.2", "dec_self:2.1", "dec_enc:1.3"]
    with headcount.heads(hf, tokenizer) as h:
        with pytest.raises(headcount.ArgumentError, match="^targets:"):
            h.measure(src[:2], {"x": heads})
        cache = h.cache(src[:2], tgt[:2], layers=[("dec_enc", 0)])
        pattern = cache.pattern("dec_enc:1.3", text=1)
        found = h.measure(src[:4], {"x": heads}, tgt[:4])
        model = h.model
        reference = copy.deepcopy(model)  # wrapped, as inside the context: its W^O columns are at hand
        for name in heads:
            zero_head_columns(reference, *h.names.key(name))
        from headcount.analysis.head_access import encode_texts

        batches = encode_texts(model, h.src_tokenizer, h.tgt_tokenizer, src[:4], tgt[:4], 2000, "cpu")
    assert pattern.columns[-1] == "<eos>" and pattern.index[0] == "<bos>"  # keys: the source; queries: the target
    expected = np.zeros(4)
    for (s, t_in, t_out), rows in zip(batches.batches, batches.indices):
        with torch.no_grad():
            logits = reference(s, t_in)[0]
        nll = F.cross_entropy(logits.transpose(1, 2), t_out, reduction="none", ignore_index=model.special.pad)
        expected[rows] = nll.double().sum(dim=1).numpy()
    np.testing.assert_allclose(found.sums[found.sets.index("x")], expected, rtol=1e-6, atol=2e-5)


def test_matched_random_sets_take_as_many_heads_from_the_same_layers(tiny_dirs):
    hf, tokenizer = opened(tiny_dirs, "llama")
    with headcount.heads(hf, tokenizer) as h:
        named = ["1.2", "2.1", "2.4"]
        sets = h.matched_random(named, draws=30, seed=4)
        assert sets == h.matched_random(named, draws=30, seed=4) != h.matched_random(named, draws=30, seed=5)
        keys = [sorted(h.names.keys(s)) for s in sets.values()]
        assert all([k[1] for k in ks] == [0, 1, 1] and not set(ks) & set(h.names.keys(named)) for ks in keys)
        assert len({tuple(k) for k in keys}) > 1  # the draws differ
        with pytest.raises(headcount.ArgumentError, match="^heads: layer 0"):
            h.matched_random(["1.1", "1.2", "1.3"])


def test_a_recipe_that_heals_fine_tunes_the_weights_as_the_paper_does(tiny_dirs, lines):
    hf, tokenizer = opened(tiny_dirs, "gpt2")
    pruned = headcount.prune(hf, tokenizer, lines[:20], lam=0.1, steps=3, recipe={"heal_steps": 2},
                             training={"max_tokens": 300}, log=False)
    assert not pruned.record["gates_only"]
    embeddings = dict(pruned.model.hf.named_parameters())["transformer.wte.weight"]
    assert not torch.equal(embeddings, hf.transformer.wte.weight)  # the copy's weights trained; the caller's did not


def test_a_gguf_loaded_model_prunes_heals_and_saves(tiny_dirs, lines, tmp_path):
    """What transformers' gguf_file route leaves on a model, a quantisation record holding a
    QuantizationMethod, stopped healing (the checkpoint's pickle refused it) and save_pretrained;
    prune drops it from its copy, and the caller's model keeps it. A model still quantised
    otherwise is refused by name."""
    from transformers.utils.quantization_config import QuantizationMethod

    hf, tokenizer = opened(tiny_dirs, "llama")
    hf.config.quantization_config = {"quant_method": QuantizationMethod.GGUF}
    hf.hf_quantizer, hf.is_quantized = object(), True
    pruned = headcount.prune(hf, tokenizer, lines[:20], lam=0.1, steps=2, recipe={"heal_steps": 2},
                             training={"max_tokens": 300}, log=False)
    assert hf.config.quantization_config["quant_method"] == QuantizationMethod.GGUF and hf.is_quantized
    pruned.save_pretrained(tmp_path / "pruned")
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").config.to_dict().get(
        "quantization_config") is None
    hf.config.quantization_config = {"quant_method": QuantizationMethod.BITS_AND_BYTES}
    with pytest.raises(headcount.ArgumentError, match="^model: quantised with bitsandbytes"):
        headcount.prune(hf, tokenizer, lines[:20], lam=0.1, steps=2, log=False)


def test_token_ids_in_place_of_texts(tiny_dirs, lines):
    """Repeated random tokens, say: ids give what their texts give."""
    hf, tokenizer = opened(tiny_dirs, "gpt2")
    ids = [tokenizer(line)["input_ids"] for line in lines[:4]]
    with headcount.heads(hf, tokenizer) as h:
        from_texts = h.measure(lines[:4], {"a": ["1.2", "2.3"]})
        from_ids = h.measure(ids, {"a": ["1.2", "2.3"]})
        cache = h.cache([ids[0] * 2], layers=[1])
        with pytest.raises(headcount.ArgumentError, match=r"^texts\[1\]:"):
            h.measure([ids[0], "a text"], {"a": ["1.2"]})
    np.testing.assert_array_equal(from_ids.sums, from_texts.sums)
    assert cache.pattern("2.1").shape == (2 * len(ids[0]), 2 * len(ids[0]))
