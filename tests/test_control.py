"""The positive control: the synthetic language's invariants, and a tiny model trained on it in
which the role analysis finds the planted positional and syntactic heads."""

import random
from collections import Counter

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
                other = next(n for n in lexicon.words["NOUN"] if lexicon.noun_class[n] != lexicon.noun_class[w.form]
                             and lexicon.tone[n] == lexicon.tone[w.form])
                changed = translate(lexicon, _replace(s, i, other))
                verb_at = sum(x.pos == "ADV" for x in s.words)  # target order: ADV* VERB ...
                assert changed[verb_at] != base[verb_at]
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
    assert len({suffix for alphabet in SUFFIXES for suffix in alphabet}) == 12


def test_names_are_rare_and_regular_words_are_not():
    counts = Counter(w.form for s in corpus(20000) for w in s.words)
    names = {form: n for form, n in counts.items() if form[0] in NAME_PREFIXES}
    regular = {form: n for form, n in counts.items() if form[0] not in NAME_PREFIXES}
    assert len(regular) == 24 + 12 + 12 + 8
    assert max(names.values()) < 10 < min(regular.values())
    assert sum(1 for n in names.values() if n == 1) > len(names) / 3
