"""Table 1 (syntactic accuracy, best head / positional baseline) as table1.md prints it, on hand-made
parses and word maps whose answers are known: every row says how many instances it rests on, and
a causal model's table holds only the directions its heads can answer (the related word before
the query word)."""

import pandas as pd
from test_causal_roles import causal_word_maps
from test_roles import parse_table

from headcount.analysis.roles.statistics import SyntacticStats, relation_pairs, syntactic_table
from headcount.pipeline.role_finding import _with_paper_table1, table1_markdown

SENTENCES = [  # subject and object: before and after the verb; after and before it in the last
    [("dogs", 2, "nsubj"), ("chase", 0, "root"), ("cats", 2, "obj")],
    [("cats", 2, "nsubj"), ("eat", 0, "root"), ("fish", 2, "obj")],
    [("what", 3, "obj"), ("dogs", 3, "nsubj"), ("chase", 0, "root")],
]
PREVIOUS_WORD, FIRST_WORD = (lambda q: max(q - 1, 0)), (lambda q: 0)  # heads 0 and 1 of layer 0


def table1(causal: bool) -> pd.DataFrame:
    stats = SyntacticStats(causal=causal)
    for words in SENTENCES:
        stats.update(causal_word_maps(len(words), [PREVIOUS_WORD, FIRST_WORD]), relation_pairs(parse_table([words])))
    return _with_paper_table1(syntactic_table(stats.table()))


def rows(markdown: str) -> dict[str, list[str]]:
    """'relation direction' -> the row's other cells."""
    out = {}
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[0] not in ("relation",) and not cells[0].startswith("---"):
            out[f"{cells[0]} {cells[1]}"] = cells[2:6]
    return out


def test_a_causal_models_table_holds_what_its_heads_can_answer_with_counts():
    """v->s: the subject precedes the verb in all three (previous word right 3 of 3, first word 2);
    s->v: the verb never precedes the subject: no row; v->o: only "what dogs chase" has the object
    before the verb (offset -2: the first-word head); o->v: two of three, offset -1."""
    table = table1(causal=True)
    markdown = table1_markdown(table, "Text: hand-made.")
    assert rows(markdown) == {
        "nsubj v->s": ["3 of 3", "1, 1", "100", "100"],
        "obj v->o": ["1 of 3", "1, 2", "100", "100"],
        "obj o->v": ["2 of 3", "1, 1", "100", "100"],
    }
    assert "No instance a causal head can answer, so no row: nsubj s->v (0 of 3), amod noun->adj (0 of 0)" in markdown
    assert "| 0, 0 |" not in markdown and "nan" not in markdown
    assert "precedes the query word" in markdown
    # the CSV keeps every direction, with its counts
    assert len(table) == 8 and table.set_index("name").loc["s->v", ["n", "n_unanswerable"]].tolist() == [0, 3]


def test_a_bidirectional_models_table_counts_every_instance():
    """Without the causal restriction every instance counts: v->o on 3 (the first-word head right
    on 1, the previous word on 0: offsets +1, +1, -2, baseline +1 at 2 of 3)."""
    markdown = table1_markdown(table1(causal=False))
    got = rows(markdown)
    assert got["obj v->o"] == ["3", "1, 2", "33", "67"]
    assert got["nsubj s->v"][0] == "3"
    assert set(got) == {"nsubj v->s", "nsubj s->v", "obj v->o", "obj o->v"}
    assert "No instance, so no row: amod noun->adj (0), amod adj->noun (0), advmod v->adv (0), advmod adv->v (0)." \
        in markdown
    assert "causal" not in markdown
