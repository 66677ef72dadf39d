"""A synthetic language pair whose grammar plants the head functions of Voita et al. (2019).

The positive control of SPEC section 3: if headcount's analyses find no positional, syntactic or
rare-token head in a real model, that means something only if they find them where they are known
to be useful. This module generates such a task, seeded, in pure Python, with the gold dependency
parse of every source sentence.

Source sentences (words separated by spaces, no punctuation):

    [ADV] NP_subj ADV{0..2} VERB NP_obj [ADV]        NP = ADJ{0..max_adjectives} NOUN  |  NAME

Every regular word has a hidden "tone" (one of sixteen); nouns have one of three agreement classes, verbs one
of three verb classes. Names are drawn from a large pool (so each is rare), start with `q` or `x`
(their class, readable from the spelling), and replace a noun phrase in `name_rate` of the
sentences. The gold parse: the verb is the root; nsubj and obj attach the nouns (or names) to it,
amod each adjective to its noun, advmod each adverb to the verb.

The target is a deterministic function of the source, built so that each planted function is
needed to produce it:

    positional  every target word ends in two suffixes: one given by the tone of the PREVIOUS source
                word, one by the tone of the NEXT (0 at the sentence edges): offsets -1 and +1;
    syntactic   the verb agrees with its subject's and its object's class (v->s, v->o), an
                adjective with its noun's class (adj->noun), an adverb with its verb's class
                (adv->v); the partners sit at varying distances, so no fixed offset finds them;
    rare token  a name is copied verbatim, and its class sets the register: which of three suffix
                alphabets every target word uses (no name: the first);

and the target order (ADV* VERB NP_obj NP_subj, adjectives before their noun) puts each word
before the partner it agrees with, so the decoder cannot read the feature off its own output.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

# What the grammar plants, as the role analysis (headcount.roles) names it.
PLANTED_OFFSETS = (-1, 1)
PLANTED_RELATIONS = (("nsubj", "v->s"), ("obj", "v->o"), ("amod", "adj->noun"), ("advmod", "adv->v"))

N_NOUN_CLASSES = N_VERB_CLASSES = 3
NAME_PREFIXES = ("q", "x")  # a name's class is its first letter; regular words use neither
SOURCE_CONSONANTS = "bdfgklmnprstvz"
TARGET_CONSONANTS = "bcdfghjklmnprstvwz"
VOWELS = "aeiou"
# Agreement morphemes: subject / noun class (verbs, adjectives), object class (verbs), verb class
# (adverbs). Suffixes: the previous word's tone, in one alphabet per register, then the next word's.
NOUN_AGREEMENT = ("n", "r", "s")
OBJECT_AGREEMENT = ("m", "l", "t")
VERB_AGREEMENT = ("k", "p", "v")
# Sixteen tones rather than two: a head that mixes a neighbour with other positions cannot carry a
# sixteen-way identity through its few dimensions, so only a sharp +-1 head serves (with two
# tones, tiny models solved the task with diffuse heads whose argmax was on -1 in 40% of queries).
N_TONES = 16
TONE_CODES = tuple(c + v for c in "bdgk" for v in "aeio")
SUFFIXES = tuple(tuple(mark + code for code in TONE_CODES) for mark in ("", "u", "y"))
NEXT_SUFFIXES = tuple("n" + code for code in TONE_CODES)
MORPHEME = "-"  # marks agreement morphemes and suffixes in the target text


@dataclass(frozen=True)
class Grammar:
    """The sizes of the language; `synthetic` in an experiment's config sets any of them."""

    nouns: int = 24
    verbs: int = 12
    adjectives: int = 12
    adverbs: int = 8
    names: int = 5000
    name_rate: float = 0.4
    max_adjectives: int = 3

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Word:
    form: str
    pos: str  # NOUN, PROPN, VERB, ADJ, ADV
    head: int = 0  # 1-based index of the head word, 0 for the root
    relation: str = "root"


@dataclass
class Sentence:
    words: list[Word]
    target: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return " ".join(w.form for w in self.words)

    def conllu(self, sent_id: str) -> str:
        """The gold parse as one CoNLL-U block (FORM = LEMMA; no features)."""
        lines = [f"# sent_id = {sent_id}", f"# text = {self.source}"]
        for i, w in enumerate(self.words, start=1):
            lines.append(f"{i}\t{w.form}\t{w.form}\t{w.pos}\t_\t_\t{w.head}\t{w.relation}\t_\t_")
        return "\n".join(lines) + "\n"


class Lexicon:
    """The words of both languages, their hidden tones and classes, drawn from one seed."""

    def __init__(self, grammar: Grammar, seed: int):
        rng = random.Random(f"lexicon-{seed}")
        taken: set[str] = set()

        def fresh(consonants: str, syllables: int, prefix: str = "") -> str:
            while True:
                form = prefix + "".join(rng.choice(consonants) + rng.choice(VOWELS) for _ in range(syllables))
                if form not in taken:
                    taken.add(form)
                    return form

        self.grammar = grammar
        counts = {"NOUN": grammar.nouns, "VERB": grammar.verbs, "ADJ": grammar.adjectives, "ADV": grammar.adverbs}
        self.words = {pos: [fresh(SOURCE_CONSONANTS, 2) for _ in range(n)] for pos, n in counts.items()}
        self.pos = {w: pos for pos, forms in self.words.items() for w in forms}
        self.tone = {w: rng.randrange(N_TONES) for w in self.pos}
        self.noun_class = {w: i % N_NOUN_CLASSES for i, w in enumerate(self.words["NOUN"])}
        self.verb_class = {w: i % N_VERB_CLASSES for i, w in enumerate(self.words["VERB"])}
        # Target stems are drawn after the source words so their letters cannot collide.
        self.stem = {w: fresh(TARGET_CONSONANTS, 2) for w in self.pos}
        self.names = [fresh(SOURCE_CONSONANTS, rng.choice((2, 3)), prefix=NAME_PREFIXES[i % 2])
                      for i in range(grammar.names)]

    def name_class(self, name: str) -> int:
        return NAME_PREFIXES.index(name[0])

    def agreement_class(self, noun: str) -> int:
        """A noun's class; a name agrees as its own class."""
        return self.name_class(noun) if noun[0] in NAME_PREFIXES else self.noun_class[noun]


def _noun_phrase(lexicon: Lexicon, rng: random.Random, name: str | None) -> list[Word]:
    if name is not None:
        return [Word(name, "PROPN")]
    n_adj = rng.randint(0, lexicon.grammar.max_adjectives)
    return [Word(rng.choice(lexicon.words["ADJ"]), "ADJ") for _ in range(n_adj)] + [
        Word(rng.choice(lexicon.words["NOUN"]), "NOUN")]


def sample_sentence(lexicon: Lexicon, rng: random.Random) -> Sentence:
    """One source sentence with its gold parse and its target."""
    g = lexicon.grammar
    name = rng.choice(lexicon.names) if rng.random() < g.name_rate else None
    name_in_subject = rng.random() < 0.5
    adverb = lambda: Word(rng.choice(lexicon.words["ADV"]), "ADV")  # noqa: E731
    words = [adverb()] if rng.random() < 0.3 else []
    subject = _noun_phrase(lexicon, rng, name if name_in_subject else None)
    words += subject
    subject_noun = len(words) - 1
    words += [adverb() for _ in range(rng.choice((0, 0, 1, 1, 2)))]
    verb_index = len(words)
    words.append(Word(rng.choice(lexicon.words["VERB"]), "VERB"))
    obj = _noun_phrase(lexicon, rng, None if name_in_subject else name)
    words += obj
    if rng.random() < 0.3:
        words.append(adverb())
    object_noun = verb_index + len(obj)
    # Arcs, 1-based heads: nouns to the verb, adjectives to the next noun, adverbs to the verb.
    for i, w in enumerate(words):
        if w.pos in ("NOUN", "PROPN"):
            w.head, w.relation = verb_index + 1, "nsubj" if i == subject_noun else "obj"
            assert i in (subject_noun, object_noun)
        elif w.pos == "ADJ":
            w.head, w.relation = next(j for j in range(i, len(words)) if words[j].pos == "NOUN") + 1, "amod"
        elif w.pos == "ADV":
            w.head, w.relation = verb_index + 1, "advmod"
    sentence = Sentence(words)
    sentence.target = translate(lexicon, sentence)
    return sentence


def translate(lexicon: Lexicon, sentence: Sentence) -> list[str]:
    """The target words of a parsed source sentence (module docstring); a word is its stem and its
    morphemes, separated by spaces (each morpheme is one token, so a tiny model learns them
    separately)."""
    words = sentence.words
    name = next((w.form for w in words if w.pos == "PROPN"), None)
    register = 0 if name is None else 1 + lexicon.name_class(name)
    verb = next(i for i, w in enumerate(words) if w.pos == "VERB")
    subject = next(i for i, w in enumerate(words) if w.relation == "nsubj")
    obj = next(i for i, w in enumerate(words) if w.relation == "obj")

    def tone(i: int) -> int:
        return lexicon.tone.get(words[i].form, 0) if 0 <= i < len(words) else 0

    def form(i: int) -> str:
        w = words[i]
        if w.pos == "PROPN":
            return w.form
        if w.pos == "VERB":
            agreement = [NOUN_AGREEMENT[lexicon.agreement_class(words[subject].form)],
                         OBJECT_AGREEMENT[lexicon.agreement_class(words[obj].form)]]
        elif w.pos == "ADJ":
            agreement = [NOUN_AGREEMENT[lexicon.agreement_class(words[w.head - 1].form)]]
        elif w.pos == "ADV":
            agreement = [VERB_AGREEMENT[lexicon.verb_class[words[verb].form]]]
        else:
            agreement = []
        suffixes = (SUFFIXES[register][tone(i - 1)], NEXT_SUFFIXES[tone(i + 1)])
        return " ".join([lexicon.stem[w.form], *(MORPHEME + m for m in (*agreement, *suffixes))])

    def phrase(noun: int) -> list[int]:
        return [j for j, w in enumerate(words) if w.relation == "amod" and w.head == noun + 1] + [noun]

    order = [j for j, w in enumerate(words) if w.pos == "ADV"] + [verb] + phrase(obj) + phrase(subject)
    return [form(i) for i in order]


def generate(grammar: Grammar, seed: int, sizes: dict[str, int]) -> Iterator[tuple[str, list[Sentence]]]:
    """(split, sentences) for each split of `sizes`, in order; one lexicon for all splits, and
    each split drawn from its own seeded stream, so a split's sentences do not depend on the
    sizes of the others."""
    lexicon = Lexicon(grammar, seed)
    for split, n in sizes.items():
        rng = random.Random(f"{split}-{seed}")
        yield split, [sample_sentence(lexicon, rng) for _ in range(n)]


def write_corpus(grammar: Grammar, seed: int, sizes: dict[str, int], outputs: dict[str, dict[str, str]],
                 stats_out: str, log=print) -> dict:
    """Generate every split and write, per split, `outputs[split]` = {"src", "tgt"} (one sentence
    a line) and, if it is given, "conllu" (the gold parses); and the statistics to `stats_out`."""
    from collections import Counter

    from .io import atomic_open, write_json, write_lines

    stats: dict = {"synthetic": {"seed": seed, "sizes": sizes, "grammar": grammar.to_dict()}}
    for split, sentences in generate(grammar, seed, sizes):
        paths = outputs[split]
        write_lines(paths["src"], (s.source for s in sentences))
        write_lines(paths["tgt"], (" ".join(s.target) for s in sentences))
        if "conllu" in paths:
            with atomic_open(paths["conllu"], "w", encoding="utf-8") as f:
                f.write("\n".join(s.conllu(f"{split}-{i + 1}") for i, s in enumerate(sentences)) + "\n")
        names = Counter(w.form for s in sentences for w in s.words if w.pos == "PROPN")
        words = sum(len(s.words) for s in sentences)
        stats[split] = {"pairs": len(sentences), "source_words": words,
                        "sentences_with_a_name": sum(names.values()), "distinct_names": len(names)}
        log(f"{split}: {len(sentences)} pairs, {words} source words, {sum(names.values())} names "
            f"({len(names)} distinct)")
    stats["pairs"] = stats["train"]["pairs"] if "train" in stats else 0
    write_json(stats_out, stats)
    return stats
