"""A synthetic language pair whose grammar plants the head functions of Voita et al. (2019).

The positive control of SPEC section 3: if headcount's analyses find no positional, syntactic or
rare-token head in a real model, that means something only if they find them where they are known
to be useful. This module generates such a task, seeded, in pure Python, with the gold dependency
parse of every source sentence.

Source sentences (words separated by spaces, no punctuation):

    [ADV] NP_subj ADV{0..2} VERB NP_obj [ADV]        NP = ADJ{0..max_adjectives} NOUN  |  NAME

Every regular word is spelled as two syllables, an onset and a coda, drawn from a grid: each
onset begins words of several parts of speech and classes, and so does each coda, so only the pair
says which word it is. Nouns have one of three agreement classes, verbs one of three verb classes.
Names are drawn from a large pool (so each is rare), start with `q` or `x` (their class, readable
from the spelling), and replace a noun phrase in `name_rate` of the sentences. The gold parse:
the verb is the root; nsubj and obj attach the nouns (or names) to it, amod each adjective to its
noun, advmod each adverb to the verb.

The target is a deterministic function of the source. Each regular word becomes its translation
and agreement morphemes: a verb shows its subject's and its object's class, an adjective its
noun's, an adverb its verb's; a name is copied verbatim. The target then lists the words by a
class, source order within a class: the subject by its own, an adjective by its noun's, the verb
by its subject's, the object and the adverbs by the verb's. To find the next word the one-layer
decoder must match that class against each source word, so the encoder has to bring the class to
the word:

    positional  from the word's own two pieces: class, part of speech and translation are
                functions of the pair (a head at -1 from the coda, or at +1 from the onset);
    syntactic   from its partner at a varying distance, so no fixed offset finds it: the verb's
                subject (nsubj, v->s), the object's verb (obj, o->v), the adjective's noun
                (amod, adj->noun), the adverb's verb (advmod, adv->v); where a model brings the
                class the other way (the subject to the verb), the other direction finds it;
    rare token  a name's class (q or x) sets the register: which of three translations every
                regular word takes (no name: the first).

The first version planted positional heads with suffixes given by the previous and the next
word's hidden tone, and agreement without the reordering by class. Models fetched each neighbour
and partner through the decoder-encoder attention, and no encoder head became positional
(docs/results.md, "Positive control"): what the decoder can look up itself needs no encoder
head. A class the decoder must match at a source word can only come from the encoder.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

# What the grammar plants, as the role analysis (headcount.roles) names it. The positional
# function is one: a word's two pieces joined, by a head at -1 (at the coda) or at +1 (at the
# onset); either serves, so either finds it.
PLANTED_OFFSETS = (-1, 1)
# The relations the target needs (module docstring). Which end of an arc looks at the other is the
# model's choice (the verb at its subject, or the subject at its verb), so either direction finds it.
PLANTED_RELATIONS = ("nsubj", "obj", "amod", "advmod")
# Four letters a word, so sentencepiece pieces of at most four characters (the word-start mark
# counts as one) can never hold a whole word: config `subwords.max_piece_length`.
PIECE_LENGTH = 4

N_NOUN_CLASSES = N_VERB_CLASSES = 3
N_REGISTERS = 3  # no name, a q-name, an x-name
NAME_PREFIXES = ("q", "x")  # a name's class is its first letter; regular words use neither
SOURCE_CONSONANTS = "bdfgklmnprstvz"
TARGET_CONSONANTS = "bcdfghjklmnprstvwz"
VOWELS = "aeiou"
# Agreement morphemes: subject / noun class (verbs, adjectives), object class (verbs), verb class
# (adverbs).
NOUN_AGREEMENT = ("n", "r", "s")
OBJECT_AGREEMENT = ("m", "l", "t")
VERB_AGREEMENT = ("k", "p", "v")
MORPHEME = "-"  # marks agreement morphemes in the target text


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

    @property
    def regular_words(self) -> int:
        return self.nouns + self.verbs + self.adjectives + self.adverbs


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
    """The words of both languages, their syllables and classes, drawn from one seed."""

    def __init__(self, grammar: Grammar, seed: int):
        rng = random.Random(f"lexicon-{seed}")
        syllables = [c + v for c in SOURCE_CONSONANTS for v in VOWELS]
        rng.shuffle(syllables)
        # The smallest square grid that holds every regular word; onsets and codas disjoint, so a
        # syllable says where in the word it stands but not which word it is.
        side = math.ceil(math.sqrt(grammar.regular_words))
        if 2 * side > len(syllables):
            raise ValueError(f"{grammar.regular_words} regular words need a grid of {side}x{side} syllables; "
                             f"there are {len(syllables)} (at most {(len(syllables) // 2) ** 2} regular words)")
        self.onsets, self.codas = syllables[:side], syllables[side:2 * side]
        cells = [a + b for a in self.onsets for b in self.codas]
        rng.shuffle(cells)
        self.grammar = grammar
        counts = {"NOUN": grammar.nouns, "VERB": grammar.verbs, "ADJ": grammar.adjectives, "ADV": grammar.adverbs}
        self.words, start = {}, 0
        for pos, n in counts.items():
            self.words[pos], start = cells[start:start + n], start + n
        self.pos = {w: pos for pos, forms in self.words.items() for w in forms}
        self.noun_class = {w: i % N_NOUN_CLASSES for i, w in enumerate(self.words["NOUN"])}
        self.verb_class = {w: i % N_VERB_CLASSES for i, w in enumerate(self.words["VERB"])}
        taken = set(self.pos)

        def fresh(consonants: str, prefix: str = "") -> str:
            while True:
                form = prefix + "".join(rng.choice(consonants) + rng.choice(VOWELS) for _ in range(2))
                if form not in taken:
                    taken.add(form)
                    return form

        # One translation per register; target letters cannot collide with source words.
        self.stem = {w: tuple(fresh(TARGET_CONSONANTS) for _ in range(N_REGISTERS)) for w in self.pos}
        most = 3 * len(NAME_PREFIXES) * len(syllables) ** 2 // 4  # rejection sampling stays quick below this
        if grammar.names > most:
            raise ValueError(f"names: {grammar.names} is more than a two-syllable spelling allows ({most})")
        self.names = [fresh(SOURCE_CONSONANTS, prefix=NAME_PREFIXES[i % 2]) for i in range(grammar.names)]

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


def listing_order(lexicon: Lexicon, sentence: Sentence) -> list[int]:
    """The source words' indices in the order the target lists them (module docstring): by the
    class each word is listed by, source order within a class."""
    words = sentence.words
    verb = next(i for i, w in enumerate(words) if w.pos == "VERB")
    subject = next(i for i, w in enumerate(words) if w.relation == "nsubj")

    def key(i: int) -> int:
        """The class a word is listed by: the subject its own, an adjective its noun's, the verb
        its subject's, the object and the adverbs the verb's (one partner each, so one head can
        fetch it)."""
        w = words[i]
        if w.relation == "nsubj":
            return lexicon.agreement_class(w.form)
        if w.pos == "ADJ":
            return lexicon.agreement_class(words[w.head - 1].form)
        if w.pos == "VERB":
            return lexicon.agreement_class(words[subject].form)
        return lexicon.verb_class[words[verb].form]  # the object and the adverbs

    # To find the next word the decoder needs each word's class at the word itself, so the
    # encoder must bring it there, from the word's own two pieces and from its syntactic partner.
    return sorted(range(len(words)), key=lambda i: (key(i), i))


def translate(lexicon: Lexicon, sentence: Sentence) -> list[str]:
    """The target words of a parsed source sentence (module docstring), in `listing_order`; a word
    is its stem and its morphemes, separated by spaces (each morpheme is one token, so a tiny model
    learns them separately)."""
    words = sentence.words
    name = next((w.form for w in words if w.pos == "PROPN"), None)
    register = 0 if name is None else 1 + lexicon.name_class(name)
    verb = next(i for i, w in enumerate(words) if w.pos == "VERB")
    subject = next(i for i, w in enumerate(words) if w.relation == "nsubj")
    obj = next(i for i, w in enumerate(words) if w.relation == "obj")

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
        return " ".join([lexicon.stem[w.form][register], *(MORPHEME + m for m in agreement)])

    return [form(i) for i in listing_order(lexicon, sentence)]


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

    from headcount.io import atomic_open, write_json, write_lines

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
