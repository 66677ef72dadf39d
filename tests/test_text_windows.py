"""data.text_windows: windows of running text that fit, in order, from the mirror's files."""

import gzip

import pytest

from headcount.data import text_windows as tw
from headcount.io import HeadcountError


def words(text: str) -> int:
    return len(text.split())


def test_windows_fit_keep_the_order_and_leave_out_what_cannot_fit():
    sentences = [f"s{i} " + "w " * (i % 7) for i in range(60)] + ["x " * 40]
    windows = tw.windows_of([s.strip() for s in sentences], words, max_tokens=20)
    assert all(words(w) <= 20 for w in windows)
    joined = " ".join(windows).split()
    assert [t for t in joined if t.startswith("s")] == [f"s{i}" for i in range(60)]  # every sentence, in order
    assert "x" not in joined  # 40 words: never fits
    assert len(windows) <= 60 * 4 // 20 + 2  # filled, not one sentence a window


def test_a_window_the_sum_undercounts_is_cut_back_to_fit():
    def merging(text: str) -> int:  # each join costs a token more than its parts
        return words(text) + text.count(". ")

    windows = tw.windows_of(["a b c."] * 30, merging, max_tokens=10)  # 3 sentences sum to 9, cost 11
    assert windows and all(merging(w) <= 10 for w in windows)
    assert " ".join(windows).count("a") == 30 - len(windows)  # one sentence given up per window, no more


def test_spread_takes_evenly_spaced_windows():
    assert tw.spread(list(range(10)), 5) == [0, 2, 4, 6, 8]
    assert tw.spread([1, 2], 5) == [1, 2]


def test_sources_read_lines_and_treebank_text(tmp_path):
    (tmp_path / "opus-mt-testsets/eng-deu").mkdir(parents=True)
    with gzip.open(tmp_path / "opus-mt-testsets/eng-deu/newstest2019.eng.gz", "wt") as handle:
        handle.write("One two three.\n\nFour five.\n")
    (tmp_path / "UD_English-EWT").mkdir()
    (tmp_path / "UD_English-EWT/en_ewt-ud-test.conllu").write_text(
        "# sent_id = 1\n# text = A tree.\n1\tA\n2\ttree\n\n# text = Two.\n1\tTwo\n", encoding="utf-8")
    texts, names = tw.source_windows(tmp_path, ["newstest2019", "ewt_test"], words, max_tokens=100, per_source=3)
    assert texts == ["One two three. Four five.", "A tree. Two."] and names == ["newstest2019", "ewt_test"]
    cache = {}
    tw.source_windows(tmp_path, ["ewt_test"], words, max_tokens=100, per_source=3, cache=cache)
    (tmp_path / "UD_English-EWT/en_ewt-ud-test.conllu").unlink()  # a cached source is not read again
    assert tw.source_windows(tmp_path, ["ewt_test"], words, 100, 3, cache=cache) == (["A tree. Two."], ["ewt_test"])
    with pytest.raises(HeadcountError, match="newstest2020.eng.gz: no such file"):
        tw.source_windows(tmp_path, ["newstest2020"], words, 100, 1)
    with pytest.raises(HeadcountError, match="not known"):
        tw.source_windows(tmp_path, ["wikipedia"], words, 100, 1)
    assert not set(tw.TRAIN_SOURCES) & set(tw.HELD_OUT_SOURCES)
