"""Causal tests of head roles (analysis.causal_roles) against a planted copying circuit and against
independent computations.

The planted circuit (tools/make_copying_control.py, tests/data/copying_control): a two-layer Llama
trained on r + r until the second copy costs almost nothing. The heads that prefix matching finds
must include one whose ablation the induction test calls causal and whose copying score is
positive; a set drawn away from them must not be causal; and ablating the layer-0 previous-token
heads must lower the layer-1 induction heads' prefix matching. On tiny random models: the copying
score of a head recomputed with plain torch from transformers' own forward, the induction test's
effect from transformers' forward with the heads' W^O columns zeroed, the ICL score from
transformers' per-token losses, and the arguments' errors."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, load_script

transformers = pytest.importorskip("transformers")

import headcount  # noqa: E402
from headcount.analysis import causal_roles as cr  # noqa: E402
from headcount.analysis.head_access import ArgumentError  # noqa: E402
from headcount.report import preregistered  # noqa: E402
from headcount.testing import tiny_lm  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

CONTROL = Path(__file__).parent / "data" / "copying_control"
HALF = 20  # a length inside the control's training range (10-30)
THRESHOLD = 0.4  # roles.registry.INDUCTION_THRESHOLD, for prefix matching and the previous-token score alike


# --------------------------------------------------------------------------------------------
# The planted circuit


@pytest.fixture(scope="module")
def control():
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(CONTROL), attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(CONTROL))
    with headcount.heads(hf, tokenizer, device="cpu") as h:
        sequences = cr.repeated_random_tokens(hf.config.vocab_size, 30, half=HALF, seed=3, avoid=cr.special_ids(h))
        yield h, sequences, _scores(h.cache(sequences, outputs=False), len(sequences))


def _scores(cache, n: int) -> dict:
    """(layer, head) -> mean attention over the copied queries p of r + r (read by indexing here):
    to p - HALF + 1 (prefix matching) and to p - 1 (previous token)."""
    q = torch.arange(HALF + 1, 2 * HALF)
    out = {}
    for (_, layer), per_text in cache.patterns.items():
        maps = torch.stack(per_text)  # (texts, H, T, T)
        for head in range(maps.shape[1]):
            out[(layer, head)] = {"prefix": float(maps[:, head, q, q - HALF + 1].mean()),
                                  "previous": float(maps[:, head, q, q - 1].mean())}
    assert len(per_text) == n
    return out


def test_the_fixture_is_the_recipes_output_and_small():
    maker = load_script(REPO / "tools" / "make_copying_control.py", "make_copying_control")
    made = json.loads((CONTROL / "recipe.json").read_text())
    expected = json.loads(json.dumps(maker.recipe()))
    assert {k: made[k] for k in expected} == expected, \
        "tests/data/copying_control was made with another recipe: run tools/make_copying_control.py"
    weights = CONTROL / "model.safetensors"
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == made["sha256"]
    assert sum(f.stat().st_size for f in CONTROL.iterdir()) < 1_000_000
    # what it was trained for: the first copy at chance (64 - 3 ids), the second copied
    assert made["losses"]["first_half"] > 0.9 * np.log(61) and made["losses"]["second_half"] < 0.1


@pytest.mark.slow
def test_a_prefix_matching_head_is_causal_and_copies(control):
    h, sequences, scores = control
    found = sorted(key for key, s in scores.items() if s["prefix"] >= THRESHOLD)
    assert found and all(layer == 1 for layer, _ in found), found
    # the library's prefix matching is the indexing above
    sums, units = cr.prefix_matching(h, sequences, [found[0]])
    assert sums.sum() / units.sum() == pytest.approx(scores[found[0]]["prefix"], abs=1e-6)
    tests = {key: cr.induction_test(h, [key], sequences, seed=0) for key in found}
    causal = [key for key, t in tests.items() if t.causal]
    assert causal, {key: t.table.to_dict("records") for key, t in tests.items()}
    copying = cr.copying_scores(h, sequences, heads=causal).set_index(["layer", "head"])
    for key in causal:
        assert copying.loc[key, "copying_score"] > 0 and copying.loc[key, "positive_share"] > 0.9
        row = tests[key].table.iloc[0]
        assert row["effect"] > row["random_percentile"] and row["low"] > 0
        assert row["draws"] == preregistered.RANDOM_DRAWS


@pytest.mark.slow
def test_a_set_drawn_away_from_the_induction_heads_is_not_causal(control):
    """The test of the test: as many heads, drawn from the induction heads' layer less the heads
    prefix matching finds."""
    h, sequences, scores = control
    found = [key for key, s in scores.items() if s["prefix"] >= THRESHOLD]
    others = [key for key in scores if key[0] == 1 and key not in found]
    rng = np.random.default_rng(0)
    drawn = [others[i] for i in rng.choice(len(others), 1, replace=False)]
    result = cr.induction_test(h, drawn, sequences, seed=0)
    assert not result.causal, result.table.to_dict("records")


@pytest.mark.slow
def test_the_previous_token_heads_feed_the_induction_heads(control):
    """Ablating the layer-0 previous-token heads lowers the layer-1 induction heads' prefix
    matching, and the clearest of them does it alone. Whether the set beats random layer-0 heads
    is reported, not asserted: the control's layer 0 also holds a head that attends to its own
    position, which the induction heads read too (ablated alone, it lowers their prefix matching
    more than the previous-token head does), and every random draw of a 4-head layer can take it."""
    h, sequences, scores = control
    induction = sorted(key for key, s in scores.items() if s["prefix"] >= THRESHOLD)
    previous = sorted(key for key, s in scores.items() if s["previous"] >= THRESHOLD)
    assert previous and all(layer == 0 for layer, _ in previous), previous
    result = cr.composition_test(h, previous, induction, sequences, seed=0)
    assert result.effect > 0 and result.low > 0 and result.left_out == []
    assert np.isfinite(result.random_percentile) and len(result.random_effects) == preregistered.RANDOM_DRAWS
    strongest = max(previous, key=lambda key: scores[key]["previous"])
    alone = result.per_head.set_index(["layer", "head"]).loc[strongest]
    assert alone["drop"] > 0.1 and alone["low"] > 0
    # the random sets came from layer 0 alone, without the named heads
    assert all({h.names.key(n)[1] for n in names} == {0} and not {h.names.key(n)[1:] for n in names} & set(previous)
               for names in result.random_sets.values())


# --------------------------------------------------------------------------------------------
# Tiny random models: mechanics and independent computations


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, lines):
    """family -> (directory): tiny random models, written once for this file."""
    root = tmp_path_factory.mktemp("causal_tiny")
    return {"llama": tiny_lm.write_tiny_llama(root / "llama", lines),
            "gpt2": tiny_lm.write_tiny_gpt2(root / "gpt2", lines),
            "bert": tiny_lm.write_tiny_bert(root / "bert", lines)}


def _model(directory, masked: bool = False):
    """The transformers model in the directory with non-trivial norms (the same weights each call)."""
    auto = transformers.AutoModelForMaskedLM if masked else transformers.AutoModelForCausalLM
    hf = auto.from_pretrained(str(directory), attn_implementation="eager")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            if "norm" in name or "ln_" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return hf.eval()


@pytest.fixture(scope="module")
def llama(tiny):
    hf = _model(tiny["llama"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny["llama"]))
    with headcount.heads(hf, tokenizer, device="cpu") as h:
        yield h, cr.repeated_random_tokens(hf.config.vocab_size, 8, half=10, seed=1, avoid=cr.special_ids(h))


def _inputs(sequences, bos: int) -> torch.Tensor:
    """BOS + x[:-1]: what the model reads of each sequence (all of one length)."""
    return torch.tensor([[bos] + list(x[:-1]) for x in sequences])


def test_repeated_random_tokens():
    seqs = cr.repeated_random_tokens(40, 5, half=12, seed=2, prefix=1, avoid={0, 1, 2})
    assert len(seqs) == 5 and all(len(x) == 25 and x[0] == 1 and x[1:13] == x[13:] for x in seqs)
    assert all(len(set(x[1:13])) == 12 and not {0, 1, 2} & set(x[1:]) for x in seqs)
    assert seqs == cr.repeated_random_tokens(40, 5, half=12, seed=2, prefix=1, avoid={0, 1, 2})
    assert seqs != cr.repeated_random_tokens(40, 5, half=12, seed=3, prefix=1, avoid={0, 1, 2})
    assert cr.repeated_random_tokens(10, 1, half=4, low=5)[0][0] >= 5
    assert len(cr.repeated_random_tokens(10, 1)[0]) == 2 * preregistered.REPEATED_HALF
    with pytest.raises(ArgumentError, match="^half"):
        cr.repeated_random_tokens(40, 2, half=1)
    with pytest.raises(ArgumentError, match="^vocab_size"):
        cr.repeated_random_tokens(3, 2, avoid={0, 1})


def test_the_preregistered_rules_are_the_defaults():
    """The interval paired_bootstrap_nll gives is the preregistered level; the defaults are the rules'."""
    assert preregistered.INTERVAL_LEVEL == 0.95
    t = cr.CausalTest("x", [], 0.0, 0.0, 0.0, 1.0, {}, {"random 1": 0.0})
    assert t.percentile == preregistered.CAUSAL_PERCENTILE
    import inspect

    assert inspect.signature(cr.induction_test).parameters["draws"].default == preregistered.RANDOM_DRAWS
    assert inspect.signature(cr.icl_scores).parameters["positions"].default == preregistered.ICL_POSITIONS


def test_ablating_nothing_has_no_effect(llama):
    h, seqs = llama
    for result in (cr.induction_test(h, [], seqs, draws=3), cr.sink_test(h, [], seqs, draws=3)):
        assert result.effect == 0 and result.low == 0 and result.high == 0 and not result.causal
        assert set(result.random_effects.values()) == {0.0} and result.table.shape[0] == 1
    # previous-token heads that sit at or after the induction layer are left out: nothing is ablated
    result = cr.composition_test(h, ["2.1"], ["2.2"], seqs, draws=3)
    assert result.effect == 0 and not result.causal and result.left_out == ["2.1"] and "left out" in result.note
    assert result.per_head.empty


def test_the_induction_effect_is_transformers_own_loss_with_the_heads_zeroed(tiny, llama):
    """The effect on the copied positions, against transformers' forward with the heads' W^O
    columns zeroed in the model itself."""
    h, seqs = llama
    heads = [(0, 1), (1, 3)]
    result = cr.induction_test(h, heads, seqs, draws=4, seed=5)
    reference = _model(tiny["llama"])
    x = _inputs(seqs, h.model.special.bos)
    targets = torch.tensor(seqs)
    copied = torch.arange(10 + 1, 20)  # the second copy but its first token

    def loss(model) -> float:
        with torch.no_grad():
            nll = F.cross_entropy(model(input_ids=x).logits.transpose(1, 2), targets, reduction="none")
        return float(nll[:, copied].double().mean())

    before = loss(reference)
    Dh = reference.config.head_dim
    with torch.no_grad():
        for layer, head in heads:
            reference.model.layers[layer].self_attn.o_proj.weight[:, head * Dh:(head + 1) * Dh] = 0
    assert result.effect == pytest.approx(loss(reference) - before, abs=1e-5)
    assert result.low <= result.effect <= result.high
    # the random sets: layer-matched, none of the named heads, as many
    for names in result.random_sets.values():
        keys = [h.names.key(n) for n in names]
        assert sorted(k[1] for k in keys) == [0, 1] and not {(k[1], k[2]) for k in keys} & set(heads)


def test_a_copying_score_by_hand(tiny, llama):
    """One head's copying score recomputed with plain torch: its W^O input and pattern from
    transformers' own forward, its W^O columns, the final norm's weight and the unembedding."""
    h, seqs = llama
    layer, head = 1, 2
    found = cr.copying_scores(h, seqs, heads=[(layer, head)]).iloc[0]
    reference = _model(tiny["llama"])
    attention = reference.model.layers[layer].self_attn
    kept = {}
    attention.o_proj.register_forward_pre_hook(lambda m, args: kept.__setitem__("z", args[0].detach()))
    x = _inputs(seqs, h.model.special.bos)
    with torch.no_grad():
        out = reference(input_ids=x, output_attentions=True)
    Dh = reference.config.head_dim
    z = kept["z"][..., head * Dh:(head + 1) * Dh].double()  # (B, T, Dh)
    pattern = out.attentions[layer][:, head].double()  # (B, T, T)
    w_o = attention.o_proj.weight.detach()[:, head * Dh:(head + 1) * Dh].double()
    gamma, w_u = reference.model.norm.weight.detach().double(), reference.lm_head.weight.detach().double()
    raises = []
    for b in range(len(seqs)):
        for q in range(11, 20):
            logits = ((z[b, q] @ w_o.T) * gamma) @ w_u.T
            logits = logits - logits.mean()
            raises.append(sum(float(pattern[b, q, k] * logits[x[b, k]]) for k in range(1, q + 1)))
    raises = np.array(raises)
    assert found["copying_score"] == pytest.approx(raises.mean(), rel=1e-6, abs=1e-9)
    assert found["positive_share"] == pytest.approx((raises > 0).mean())
    assert found["positions"] == len(raises)


def test_copying_scores_cover_every_head_and_refuse_a_masked_lm(tiny, lines):
    hf = _model(tiny["gpt2"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny["gpt2"]))
    with headcount.heads(hf, tokenizer, device="cpu") as h:
        seqs = cr.repeated_random_tokens(hf.config.vocab_size, 3, half=6, seed=0, avoid=cr.special_ids(h))
        table = cr.copying_scores(h, seqs)
    assert table.shape[0] == 8 and list(table["name"])[:2] == ["1.1", "1.2"]
    assert table["positions"].eq(3 * 5).all() and table["positive_share"].between(0, 1).all()
    hf = _model(tiny["bert"], masked=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny["bert"]))
    with headcount.heads(hf, tokenizer, device="cpu") as h:
        with pytest.raises(ArgumentError, match="masked_lm"):
            cr.copying_scores(h, [[10, 11, 10, 11]])
        assert h.model.family.name == "bert"
        with pytest.raises(ArgumentError, match="bert does not expose"):
            cr._readout(h.model)


def test_arguments_are_named_in_errors(llama):
    h, seqs = llama
    with pytest.raises(ArgumentError, match="^draws"):
        cr.induction_test(h, ["1.1"], seqs, draws=0)
    with pytest.raises(ArgumentError, match="^heads"):
        cr.induction_test(h, "1.1", seqs)
    with pytest.raises(ArgumentError, match=r"^sequences\[1\]: not some tokens"):
        cr.induction_test(h, ["1.1"], [seqs[0], [5, 6, 7, 8]])
    with pytest.raises(ArgumentError, match=r"^sequences\[0\]: holds the model's special ids"):
        cr.copying_scores(h, [[1, 5, 6, 1, 5, 6]])
    with pytest.raises(ArgumentError, match="^sequences: a non-empty list"):
        cr.composition_test(h, ["1.1"], ["2.1"], [])
    with pytest.raises(ArgumentError, match="^induction_heads: no heads"):
        cr.composition_test(h, ["1.1"], [], seqs)
    with pytest.raises(ArgumentError, match="^previous_heads: .* also among induction_heads"):
        cr.composition_test(h, ["2.1"], ["2.1"], seqs)
    with pytest.raises(ArgumentError, match="^sink_heads"):
        cr.sink_test(h, ["9.1"], seqs)
    with pytest.raises(ArgumentError, match=r"^windows\[0\]: 20 tokens"):
        cr.icl_scores(h, seqs, {"x": ["1.1"]}, positions=(10, 40), radius=2)
    with pytest.raises(ArgumentError, match="^positions"):
        cr.icl_scores(h, seqs, {"x": ["1.1"]}, positions=(10, 12), radius=2)


def test_random_sets_fall_back_to_other_layers_where_one_is_short(llama):
    """Every head of layer 1 named: each random set takes all four from layer 2 and says so."""
    h, seqs = llama
    sets, note = cr.random_sets(h, ["1.1", "1.2", "1.3", "1.4"], draws=3, seed=0)
    assert note.startswith("layer(s) [0]") and len(sets) == 3
    assert all(sorted(names) == ["2.1", "2.2", "2.3", "2.4"] for names in sets.values())
    sets, note = cr.random_sets(h, ["1.1", "1.2", "1.3", "2.1"], draws=5, seed=0)
    assert note and all(len(names) == 4 and "1.4" in names and not {"1.1", "1.2", "1.3", "2.1"} & set(names)
                        for names in sets.values())
    assert cr.random_sets(h, ["1.1"], draws=3, seed=0) == (h.matched_random(["1.1"], 3, 0), "")
    result = cr.sink_test(h, ["1.1", "1.2", "1.3", "1.4"], seqs, draws=2)
    assert result.note.startswith("layer(s) [0]") and result.table.iloc[0]["note"] == result.note
    # more sinks than other heads (SmolLM2: 189 of 270): the random sets are drawn from every head
    most = ["1.1", "1.2", "1.3", "1.4", "2.1"]
    result = cr.sink_test(h, most, seqs, draws=3)
    assert "drawn from every head" in result.note and len(result.random_sets) == 3
    assert all(len(set(names)) == 5 for names in result.random_sets.values())
    assert len({tuple(names) for names in result.random_sets.values()}) > 1
    with pytest.raises(ArgumentError, match="^previous_heads: 4 heads named and only 0 other heads"):
        cr.random_sets(h, ["1.1", "1.2", "1.3", "1.4"], layers=[0], argument="previous_heads")


def test_the_icl_score_is_transformers_own_losses(tiny, llama):
    h, _ = llama
    rng = np.random.default_rng(4)
    windows = [rng.integers(3, 80, size=50).tolist() for _ in range(6)]
    table = cr.icl_scores(h, windows, {"a": ["1.1", "2.3"]}, positions=(10, 40), radius=2).set_index("set")
    assert list(table.index) == ["none", "a"] and table.loc["none", "difference"] == 0
    reference = _model(tiny["llama"])
    with torch.no_grad():
        logits = reference(input_ids=_inputs(windows, h.model.special.bos)).logits
    nll = F.cross_entropy(logits.transpose(1, 2), torch.tensor(windows), reduction="none").double()
    expected = (nll[:, 38:43].mean(1) - nll[:, 8:13].mean(1)).mean()
    assert table.loc["none", "icl_score"] == pytest.approx(float(expected), abs=1e-5)
    assert table.loc["none", "low"] <= table.loc["none", "icl_score"] <= table.loc["none", "high"]
    assert table.loc["a", "difference"] == pytest.approx(table.loc["a", "icl_score"] - table.loc["none", "icl_score"])


# --------------------------------------------------------------------------------------------
# Syntactic heads


def _parse(tmp_path, rows: list[tuple[str, int, str]]):
    """One sentence as a parse table: rows of (word, head word from 1, relation), words spaced."""
    from headcount.data.parses import read_conllu

    text = " ".join(word for word, _, _ in rows)
    lines = ["# sent_id = s1", f"# text = {text}"] + [
        f"{i}\t{word}\t{word.lower()}\tX\t_\t_\t{head}\t{rel}\t_\t_" for i, (word, head, rel) in enumerate(rows, 1)]
    path = tmp_path / "s.conllu"
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return read_conllu(path)


def _after_word(tokenizer, text: str, word: int) -> int:
    """The index of the token after word `word` (from 0) of the space-separated text, by the
    tokenizer's own character offsets."""
    start = sum(len(w) + 1 for w in text.split(" ")[:word])
    end = start + len(text.split(" ")[word])
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    inside = [i for i, (b, e) in enumerate(offsets) if e > start and b < end]
    return inside[-1] + 1


def test_syntactic_positions_follow_each_query_word_whose_related_word_came_first(llama, tmp_path, tiny):
    h, _ = llama
    # "Small dog sees blue cow mouse": dog <-nsubj- sees -obj-> cow, blue -amod-> cow
    table = _parse(tmp_path, [("Small", 2, "amod"), ("dog", 3, "nsubj"), ("sees", 0, "root"),
                              ("blue", 5, "amod"), ("cow", 3, "obj"), ("mouse", 5, "conj")])
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny["llama"]))
    text = table["text"].iloc[0]
    ids, found = cr.relation_positions(h, [table], "nsubj", "head->dep")  # the verb reads its subject
    assert ids == [tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert found == [[_after_word(tokenizer, text, 2)]]
    # the object reads its verb; the verb cannot read its object, which comes after it
    assert cr.relation_positions(h, [table], "obj", "dep->head")[1] == [[_after_word(tokenizer, text, 4)]]
    assert cr.relation_positions(h, [table], "obj", "head->dep")[1] == [[]]
    # both adjectives precede their nouns: the nouns read them
    assert cr.relation_positions(h, [table], "amod", "head->dep")[1] == [
        [_after_word(tokenizer, text, 1), _after_word(tokenizer, text, 4)]]
    assert cr.relation_positions(h, [table], "advmod", "head->dep")[1] == [[]]


def test_a_syntactic_effect_is_transformers_own_loss_at_its_positions_with_the_head_zeroed(tiny, llama):
    h, seqs = llama
    texts = [list(x) for x in seqs]
    positions = [[3, 7, 12], [], [5], [2, 19]] + [[9]] * (len(texts) - 4)
    others = [[1], [4, 6], [], [8]] + [[10, 11]] * (len(texts) - 4)
    found = cr.syntactic_tests(h, {"a": ((1, 2), positions), "b": ("2.3", others), "c": ("2.3", positions)},
                               texts, draws=6, seed=2)
    assert [t.test for t in found] == ["syntactic a", "syntactic b", "syntactic c"]
    reference = _model(tiny["llama"])
    x, targets = _inputs(seqs, h.model.special.bos), torch.tensor(seqs)

    def nll(model) -> torch.Tensor:
        with torch.no_grad():
            return F.cross_entropy(model(input_ids=x).logits.transpose(1, 2), targets, reduction="none").double()

    def mean_at(loss: torch.Tensor, where) -> float:
        return float(sum(loss[i, p].sum() for i, p in enumerate(where) if p) / sum(len(p) for p in where))

    before = nll(reference)
    Dh = reference.config.head_dim
    with torch.no_grad():
        reference.model.layers[1].self_attn.o_proj.weight[:, 2 * Dh:3 * Dh] = 0
    after = nll(reference)
    for test, where in zip(found, (positions, others, positions)):
        assert test.heads == ["2.3"] and test.effect == pytest.approx(mean_at(after - before, where), abs=1e-5)
        assert test.low <= test.effect <= test.high and len(test.random_effects) == 6
        assert np.isfinite([test.low, test.high]).all()  # texts without positions are left out of the resamples
        # layer-matched single heads: another head of layer 2 (from 1)
        assert all(names != ["2.3"] and len(names) == 1 and names[0].startswith("2.")
                   for names in test.random_sets.values())
    # a random draw's effect is that head's own: the same head named in a test of its own
    draw, names = next(iter(found[0].random_sets.items()))
    alone = cr.syntactic_tests(h, {"a": (names[0], positions)}, texts, draws=2)[0]
    assert found[0].random_effects[draw] == pytest.approx(alone.effect, abs=1e-9)
    # one text with positions: the others are left out, not resampled as 0 / 0
    one = cr.syntactic_tests(h, {"d": ("2.3", [[4]] + [[]] * (len(texts) - 1))}, texts, draws=2)[0]
    assert one.low == pytest.approx(one.effect) == pytest.approx(one.high)
    with pytest.raises(ArgumentError, match="positions for 1 texts"):
        cr.syntactic_tests(h, {"a": ("2.3", [[1]])}, texts)
    with pytest.raises(ArgumentError, match="no position"):
        cr.syntactic_tests(h, {"a": ("2.3", [[]] * len(texts))}, texts)
