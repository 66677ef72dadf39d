"""The positive control: the synthetic language's invariants, and a tiny model trained on it in
which the role analysis finds the planted positional and syntactic heads."""

import random
import re
from collections import Counter

import pandas as pd
import pytest

from headcount.parses import read_conllu_files
from headcount.synthetic_language import (
    NAME_PREFIXES,
    SUFFIXES,
    Grammar,
    Lexicon,
    Sentence,
    Word,
    generate,
    sample_sentence,
    translate,
    write_corpus,
)

STEPS = 1000  # the tiny model has learned agreement by then, and its syntactic heads are sharp


def corpus(n=2000, seed=1, **grammar):
    return dict(generate(Grammar(**grammar), seed, {"train": n}))["train"]


def test_generation_is_seeded_and_splits_are_independent():
    a = dict(generate(Grammar(), 3, {"train": 50, "dev": 20}))
    b = dict(generate(Grammar(), 3, {"dev": 20}))
    c = dict(generate(Grammar(), 4, {"dev": 20}))
    assert [s.source for s in a["dev"]] == [s.source for s in b["dev"]]
    assert [s.source for s in b["dev"]] != [s.source for s in c["dev"]]


def test_gold_parse_follows_the_grammar():
    for s in corpus(500):
        words = s.words
        roots = [i for i, w in enumerate(words) if w.head == 0]
        assert len(roots) == 1 and words[roots[0]].pos == "VERB" and words[roots[0]].relation == "root"
        verb = roots[0] + 1
        assert sorted(w.relation for w in words if w.pos in ("NOUN", "PROPN")) == ["nsubj", "obj"]
        for i, w in enumerate(words):
            if w.pos in ("NOUN", "PROPN", "ADV"):
                assert w.head == verb
            if w.relation == "nsubj":
                assert i < verb - 1
            if w.relation == "obj":
                assert i > verb - 1
            if w.pos == "ADJ":  # the noun its phrase ends with, after it
                assert w.relation == "amod" and w.head - 1 > i and words[w.head - 1].pos == "NOUN"
                assert all(words[j].pos == "ADJ" for j in range(i + 1, w.head - 1))


def test_partners_sit_at_varying_distances():
    """No fixed offset finds a planted syntactic partner most of the time (else a positional head
    would pass for a syntactic one)."""
    offsets = {"nsubj": Counter(), "obj": Counter(), "amod": Counter(), "advmod": Counter()}
    for s in corpus(2000):
        for i, w in enumerate(s.words):
            if w.relation in offsets:
                offsets[w.relation][i - (w.head - 1)] += 1
    for relation, counts in offsets.items():
        assert max(counts.values()) / sum(counts.values()) < 0.75, (relation, counts)


def test_conllu_reads_back_as_the_sentences(tmp_path):
    sizes = {"train": 30, "dev": 20}
    outputs = {split: {"src": str(tmp_path / f"{split}.src.txt"), "tgt": str(tmp_path / f"{split}.tgt.txt"),
                       "conllu": str(tmp_path / f"{split}.conllu")} for split in sizes}
    stats = write_corpus(Grammar(), 1, sizes, outputs, str(tmp_path / "stats.json"), log=lambda m: None)
    assert stats["pairs"] == 30
    table = read_conllu_files([outputs["dev"]["conllu"]])
    sources = (tmp_path / "dev.src.txt").read_text().splitlines()
    sentences = dict(generate(Grammar(), 1, sizes))["dev"]
    assert table.groupby("sentence")["text"].first().tolist() == sources
    for k, s in enumerate(sentences):
        rows = table[table["sentence"] == k]
        assert rows["form"].tolist() == [w.form for w in s.words]
        assert rows["head"].tolist() == [w.head for w in s.words]
        assert rows["relation"].tolist() == [w.relation for w in s.words]


def test_target_is_a_function_of_the_source():
    targets = {}
    for s in corpus(5000, nouns=4, verbs=3, adjectives=2, adverbs=2, names=20):
        assert targets.setdefault(s.source, s.target) == s.target


def _replace(sentence: Sentence, i: int, form: str) -> Sentence:
    words = [Word(w.form, w.pos, w.head, w.relation) for w in sentence.words]
    words[i].form = form
    return Sentence(words)


def test_each_planted_function_changes_the_target():
    """Changing a word's hidden tone changes its neighbours' suffixes (positional), a noun's class
    its verb's and adjectives' agreement (syntactic), a name the register of every word (rare)."""
    lexicon = Lexicon(Grammar(), 1)
    rng = random.Random(0)
    checked = Counter()
    for _ in range(300):
        s = sample_sentence(lexicon, rng)
        base = translate(lexicon, s)
        for i, w in enumerate(s.words):
            if w.pos == "NOUN":
                other = next(n for n in lexicon.words["NOUN"] if lexicon.noun_class[n] != lexicon.noun_class[w.form])
                changed = translate(lexicon, _replace(s, i, other))
                verb_at = sum(x.pos == "ADV" for x in s.words)  # target order: ADV* VERB ...
                agreement = 1 if w.relation == "nsubj" else 2  # the verb is: stem -subject -object -prev -next
                assert changed[verb_at].split()[agreement] != base[verb_at].split()[agreement]
                checked["syntactic"] += 1
            if w.pos in ("ADJ", "ADV") and 0 < i < len(s.words) - 1:
                other = next(x for x in lexicon.words[w.pos] if lexicon.tone[x] != lexicon.tone[w.form])
                changed = translate(lexicon, _replace(s, i, other))
                # Exactly three target words differ: the word itself and its two source neighbours
                # (or fewer where a neighbour is a name, which has no suffix).
                differ = sum(a != b for a, b in zip(base, changed))
                neighbours = sum(s.words[j].pos != "PROPN" for j in (i - 1, i + 1))
                assert differ == 1 + neighbours
                checked["positional"] += 1
            if w.pos == "PROPN":
                twin = next(n for n in lexicon.names if n[0] != w.form[0])
                changed = translate(lexicon, _replace(s, i, twin))
                assert all(a != b for a, b in zip(base, changed))
                checked["rare"] += 1
    assert min(checked.values()) > 10, checked
    assert {w.form[0] for w in sum((s.words for s in corpus(200)), []) if w.pos == "PROPN"} == set(NAME_PREFIXES)
    assert len({suffix for alphabet in SUFFIXES for suffix in alphabet}) == 3 * 16


def test_names_are_rare_and_regular_words_are_not():
    counts = Counter(w.form for s in corpus(20000) for w in s.words)
    names = {form: n for form, n in counts.items() if form[0] in NAME_PREFIXES}
    regular = {form: n for form, n in counts.items() if form[0] not in NAME_PREFIXES}
    assert len(regular) == 24 + 12 + 12 + 8
    assert max(names.values()) < 10 < min(regular.values())
    assert sum(1 for n in names.values() if n == 1) > len(names) / 3


def test_tiny_model_has_the_planted_syntactic_heads_and_headcount_finds_them(tmp_path):
    """Train a tiny Transformer on a small version of the language (no names): the role analysis
    must find a syntactic head for a planted relation. (Positional heads are planted too, but
    models this small carry the neighbours' tones in several diffuse heads, none of which puts 90%
    of its argmaxes on one offset: docs/results.md, "Positive control".)"""
    import torch

    from headcount.io import read_lines
    from headcount.model import ModelConfig, Transformer
    from headcount.positive_control import found_heads
    from headcount.roles import assign_roles, count_words, encoder_head_statistics
    from headcount.subwords import Segmenter, train_bpe
    from headcount.train import Corpus, DevSet, TrainConfig, train

    grammar = Grammar(nouns=6, verbs=3, adjectives=3, adverbs=3, names=300, name_rate=0.0)
    sizes = {"train": 4000, "dev": 200}
    paths = {split: {"src": str(tmp_path / f"{split}.src.txt"), "tgt": str(tmp_path / f"{split}.tgt.txt"),
                     "conllu": str(tmp_path / f"{split}.conllu")} for split in sizes}
    write_corpus(grammar, 1, sizes, paths, str(tmp_path / "stats.json"), log=lambda m: None)
    segmenters = {}
    for side in ("src", "tgt"):
        train_bpe(paths["train"][side], tmp_path / f"{side}.model", 300)
        segmenters[side] = Segmenter(tmp_path / f"{side}.model")
    data = {split: [segmenters[side].encode(read_lines(paths[split][side])) for side in ("src", "tgt")]
            for split in sizes}
    torch.manual_seed(1)
    model = Transformer(ModelConfig(src_vocab=len(segmenters["src"]), tgt_vocab=len(segmenters["tgt"]), d_model=64,
                                    n_heads=4, d_ff=128, enc_layers=2, dec_layers=1, dropout=0.0, attn_dropout=0.0,
                                    relu_dropout=0.0, max_len=128))
    cfg = TrainConfig(max_tokens=800, max_steps=STEPS, warmup_steps=60, lr_scale=0.5, label_smoothing=0.0,
                      log_interval=STEPS,
                      eval_interval=STEPS, checkpoint_interval=STEPS, dev_bleu_sentences=0, select="last",
                      precision="fp32", device="cpu")
    train(model, cfg, Corpus(*data["train"]), DevSet(*data["dev"]), tmp_path / "work", log=lambda m: None)

    table = read_conllu_files([paths["dev"]["conllu"]])
    frequencies = count_words(read_lines(paths["train"]["src"]), lowercase=False)
    stats = encoder_head_statistics(model, segmenters["src"], table, frequencies, False, top_k=50, log=lambda m: None)
    settings = {"syntactic_margin": 0.10, "min_instances": 10}
    roles = assign_roles(stats["positional"], stats["syntactic"], stats["rare"], min_instances=10, rare_margin=0.1)
    found = found_heads(roles, stats["syntactic"], settings)
    hits = found.dropna(subset=["layer"])
    assert set(hits["function"]) & {"nsubj v->s", "obj v->o", "amod adj->noun", "advmod adv->v"}, found.to_string()
    assert (hits["rate"] >= hits["baseline"] + 0.3).any(), found.to_string()  # sharp, not marginal


def _role_tables():
    """Two layers of two heads: 0.0 attends to the previous token, 1.1 finds subjects."""
    roles = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "role": ["positional", "none", "none",
                                                                              "syntactic"],
                          "positional_offset": [-1, 0, 1, 0], "positional_fraction": [0.95, 0.5, 0.3, 0.2],
                          "is_positional": [True, False, False, False], "is_rare": [False] * 4,
                          "rate_two_rarest": [0.1] * 4, "rare_uniform_two_rarest": [0.2] * 4})
    syntactic = pd.DataFrame({"relation": "nsubj", "name": "v->s", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                              "accuracy": [0.3, 0.2, 0.45, 0.8], "n": 50, "baseline_accuracy": 0.4})
    scores = pd.DataFrame({"type": "enc_self", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
                           "lrp": [0.7, 0.3, 0.4, 0.6], "delta_loss": [0.2, 0.01, 0.3, 0.1]})
    gates = [{"setting": "enc", "lambda": lam, "heads": [
        {"type": "enc_self", "layer": layer, "head": head, "pruned": (layer, head) in closed}
        for layer in (0, 1) for head in (0, 1)]} for lam, closed in
        ((0.0, set()), (0.1, {(0, 1)}), (1.0, {(0, 1), (1, 0), (1, 1)}))]
    return roles, syntactic, scores, gates


def test_planted_vs_found_lists_found_heads_ranks_and_closing_lambdas():
    from headcount.positive_control import closing_lambdas, gate_order, planted_vs_found, report_markdown

    roles, syntactic, scores, gates = _role_tables()
    table = planted_vs_found(roles, syntactic, scores, gates, {"syntactic_margin": 0.10, "min_instances": 10})
    found = table.dropna(subset=["layer"]).set_index("function")
    assert list(found.index) == ["positional -1", "nsubj v->s"]  # 1.0 at +1 is below the threshold
    assert (found.loc["positional -1", ["layer", "head", "rate"]].tolist()) == [0, 0, 0.95]
    assert found.loc["nsubj v->s", "rate"] == 0.8 and found.loc["nsubj v->s", "baseline"] == 0.4
    assert found.loc["positional -1", "lrp_rank"] == 1 and found.loc["positional -1", "delta_loss_rank"] == 1
    assert found.loc["nsubj v->s", "lrp_rank"] == 1 and found.loc["nsubj v->s", "delta_loss_rank"] == 2
    assert pd.isna(found.loc["positional -1", "closes_at_enc"])  # never closes
    assert found.loc["nsubj v->s", "closes_at_enc"] == 1.0
    closing = closing_lambdas(gates).set_index(["layer", "head"])["closes_at"]
    assert closing[(0, 1)] == 0.1 and closing[(1, 0)] == 1.0  # the first lambda that closes it
    missing = table[table["layer"].isna()]["function"].tolist()
    assert "positional +1" in missing and "rare token" in missing
    order = gate_order(roles, gates)
    assert order[["lambda", "open", "specialised_open", "other_open"]].values.tolist() == [
        [0.0, 4, 2, 2], [0.1, 3, 2, 1], [1.0, 1, 1, 0]]
    text = report_markdown(table, order, n_heads=2)
    assert "| positional -1 | yes | 1.1 | 0.95 |" in text and "| positional +1 | **NO** |" in text


def _shipped_config():
    import yaml
    from conftest import REPO

    return yaml.safe_load((REPO / "config/config.yaml").read_text()), REPO / "workflow/schemas/config.schema.yaml"


def test_the_control_experiment_is_valid_and_reads_no_source(tmp_path):
    from headcount.config import check_mirror, load_experiments, test_sets

    config, schema = _shipped_config()
    control = load_experiments(config, schema)["control"]
    assert test_sets(control) == ["test"] and control["roles"]["parser"] == "gold"
    check_mirror(str(tmp_path), config, [control])  # an empty mirror lacks nothing it needs


@pytest.mark.parametrize("edit,expected", [
    (lambda c: c.update(train=[{"src": "a", "tgt": "b"}]),
     "'experiments.control.train': a synthetic experiment generates its data; remove train"),
    (lambda c: c["roles"].update(treebanks=["UD_English-EWT/en_ewt-ud-dev.conllu"]),
     "'experiments.control.roles.treebanks': a synthetic experiment's gold parses are generated"),
    (lambda c: c["synthetic"].pop("dev"), "experiments.control.synthetic"),
    (lambda c: c.pop("synthetic"), "'train' is a required property"),
])
def test_a_broken_synthetic_experiment_is_named(edit, expected):
    from headcount.config import ConfigError, load_experiments

    config, schema = _shipped_config()
    edit(config["experiments"]["control"])
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_experiments(config, schema)
