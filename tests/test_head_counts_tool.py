"""tools/head_counts.py: which texts the shipped models' runs read."""

import gzip
from pathlib import Path

from conftest import load_script

from headcount.data import text_windows as tw

REPO = Path(__file__).resolve().parents[1]
tool = load_script(REPO / "tools" / "head_counts.py")


class WordTokenizer:
    """A token a word: enough to count a window's length."""

    def encode(self, texts):
        return [text.split() for text in texts]


def _mirror(root: Path) -> Path:
    """Every source of text_windows.SOURCES, 600 sentences of 3-7 words each, named by source."""
    for name, inside in tw.SOURCES.items():
        path = root / inside
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{name} sentence {i} " + "word " * (i % 5) for i in range(600)]
        if ".conllu" in inside:
            lines = [f"# text = {line}\n1\tx\t_\t_\t_\t_\t0\troot\t_\t_\n" for line in lines]
        text = "\n".join(lines) + "\n"
        if inside.endswith(".gz"):
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            path.write_text(text, encoding="utf-8")
    return root


def test_gate_windows_are_cut_to_their_own_length_from_the_training_sources(tmp_path):
    data = _mirror(tmp_path)
    per_source = {"train": 1, "held_out": 2, "gates": 3}
    tokenizer = WordTokenizer()
    long = tool.texts("smollm2", tokenizer, data, per_source)
    short = tool.texts("smollm2", tokenizer, data, per_source, gate_tokens=20)
    assert short["train"] == long["train"] and short["held_out"] == long["held_out"]
    lengths = [len(text.split()) for text in short["gates"][0]]
    assert max(lengths) <= 18 < max(len(text.split()) for text in long["gates"][0])
    assert set(short["gates"][1]) == set(tw.TRAIN_SOURCES) and len(short["gates"][0]) == 3 * len(tw.TRAIN_SOURCES)
    held_out = " ".join(long["held_out"][0])
    assert all(name not in held_out for name in tw.TRAIN_SOURCES)  # neither kind of gate text is held out
    assert not set(long["gates"][0]) & set(long["train"][0])  # the ranking windows are left out


def test_table1s_best_heads_are_read_by_relation_and_direction(tmp_path):
    table = tmp_path / "table1.md"
    table.write_text("Text: treebanks.\n\n| relation | direction | instances | best head (layer, head) | accuracy |\n"
                     "|---|---|---|---|---|\n| nsubj | v->s | 5 of 6 | 14, 9 | 72 |\n"
                     "| amod | adj->noun | 1 of 9 | 3, 1 | 67 |\n\nAccuracy in %.\n", encoding="utf-8")
    assert tool.table1_heads(table) == {("nsubj", "head->dep"): (14, 9), ("amod", "dep->head"): (3, 1)}
    # the published table names all eight rows the test ablates
    assert len(tool.table1_heads(REPO / tool.SYNTACTIC["smollm2"])) == 8
    table.write_text("no table here\n", encoding="utf-8")
    try:
        tool.table1_heads(table)
    except SystemExit as error:
        assert "no Table 1 rows" in str(error)
    else:
        raise AssertionError("a file without Table 1 rows was read")


def test_a_resumed_run_keeps_a_record_of_every_commit_that_ran_it(tmp_path, monkeypatch):
    import headcount.provenance

    for commit in ("a" * 40, "b" * 40, "b" * 40):
        monkeypatch.setattr(headcount.provenance, "provenance", lambda c=commit: {"headcount_commit": c})
        tool.write_record(tmp_path)
    assert sorted(p.name for p in (tmp_path / "provenance").iterdir()) == ["run_aaaaaaaaaaaa.json",
                                                                             "run_bbbbbbbbbbbb.json"]


class NumberTokenizer:
    """A token a word, its id the word's number where it is one (a sentence's index in _mirror)."""

    def encode(self, texts):
        return [[int(w) if w.isdigit() else 0 for w in text.split()] for text in texts]


def test_icl_windows_start_through_each_held_out_source(tmp_path):
    from types import SimpleNamespace

    data = _mirror(tmp_path)
    access = SimpleNamespace(tgt_tokenizer=NumberTokenizer())
    length = tool.preregistered.WINDOW_TOKENS - 2
    # one a source: the middle sentence of each (600 sentences), as the published run read them
    four = tool.icl_windows(access, data, 4)
    assert [w[2] for w in four] == [300] * 4 and all(len(w) == length for w in four)
    # two a source: the middles of each half, in turn through the sources
    eight = tool.icl_windows(access, data, 8)
    assert [w[2] for w in eight] == [150] * 4 + [450] * 4
    assert all(len(w) == length for w in eight)


def test_a_stage_stopped_mid_way_keeps_the_cpu_time_it_spent_and_a_resumed_one_adds_to_it(tmp_path):
    import json

    import pytest

    now = [0.0]
    path = tmp_path / "cost.json"

    def stopped_scoring():
        now[0] += 5.0
        stages.progress("scored 8 of 16 head sets")  # a chunk stored
        now[0] += 3.0
        raise KeyboardInterrupt  # stopped before the next chunk is stored

    stages = tool.StageCost(path, clock=lambda: now[0])
    with pytest.raises(KeyboardInterrupt):
        stages.timed("scoring", stopped_scoring)
    assert json.loads(path.read_text()) == {"scoring": 5.0}

    def resumed_scoring():
        now[0] += 4.0
        return "summary"

    stages = tool.StageCost(path, clock=lambda: now[0])
    assert stages.timed("scoring", resumed_scoring) == "summary"
    assert stages.timed("load", lambda: now.__setitem__(0, now[0] + 1.0)) is None
    assert json.loads(path.read_text()) == {"scoring": 9.0, "load": 1.0}
