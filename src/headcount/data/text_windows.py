"""Running English text in windows of at most a few hundred tokens: what a language model is scored
on, instead of 14-token captions (in-context copying and long-range heads need context to show).

The sources are files of ../shared/data-style mirrors: newstest (one sentence a line, in document
order), FLORES-101 devtest, and the text of UD treebanks ("# text = " lines of a .conllu). A window
is consecutive sentences of one source joined by spaces, as many as fit in `max_tokens` tokens.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence
from pathlib import Path

from headcount.io import HeadcountError

# name -> path under the data root. Training text (the gates', the rankings') and held-out text
# never share a file.
SOURCES = {
    **{f"newstest{year}": f"opus-mt-testsets/eng-deu/newstest{year}.eng.gz" for year in range(2012, 2021)},
    "flores101_devtest": "opus-mt-testsets/flores101_devtest/eng.devtest.gz",
    "ewt_train": "UD_English-EWT/en_ewt-ud-train.conllu.gz",
    "ewt_test": "UD_English-EWT/en_ewt-ud-test.conllu",
}
TRAIN_SOURCES = tuple(f"newstest{year}" for year in range(2012, 2019)) + ("ewt_train",)
HELD_OUT_SOURCES = ("newstest2019", "newstest2020", "flores101_devtest", "ewt_test")


def read_sentences(path: str | Path) -> list[str]:
    """The sentences of a text file (one a line) or of a treebank (its "# text = " lines), gzipped
    or not, blank lines left out."""
    path = Path(path)
    if not path.exists():
        raise HeadcountError(f"{path}: no such file; point the data root at a mirror of ../shared/data "
                             f"(text_windows.SOURCES lists the files read)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    if ".conllu" in path.name:
        lines = [line[len("# text = "):] for line in lines if line.startswith("# text = ")]
    return [line.strip() for line in lines if line.strip()]


def windows_of(sentences: Sequence[str], count_tokens: Callable[[str], int], max_tokens: int) -> list[str]:
    """Consecutive sentences joined by spaces into windows of at most `max_tokens` tokens (as
    `count_tokens` counts a text). A sentence longer than a window on its own is left out.

    Each sentence is counted once, with the space before it, and a window's count is their sum
    (one tokenisation per sentence, not one per candidate window); the window is counted whole
    once more and given up sentence by sentence from its end in the rare case where the sum
    undercounts it (a merge across the joining space)."""
    out, current, used = [], [], 0
    counts = [count_tokens(" " + sentence) for sentence in sentences]

    def close():
        while current and count_tokens(" ".join(current)) > max_tokens:
            current.pop()
        if current:
            out.append(" ".join(current))

    for sentence, n in zip(sentences, counts):
        if n > max_tokens:
            continue
        if used + n > max_tokens:
            close()
            current.clear()
            used = 0
        current.append(sentence)
        used += n
    close()
    return out


def spread(windows: Sequence[str], n: int) -> list[str]:
    """`n` windows evenly spaced through `windows` (all of them when there are at most `n`)."""
    if n >= len(windows):
        return list(windows)
    step = len(windows) / n
    return [windows[int(i * step)] for i in range(n)]


def source_windows(data_root: str | Path, sources: Sequence[str], count_tokens: Callable[[str], int],
                   max_tokens: int, per_source: int, cache: dict | None = None) -> tuple[list[str], list[str]]:
    """`per_source` windows from each of `sources`, spread through each source -> (windows, the
    source of each). `cache` ({source: its windows}, filled here): a source another call already
    read and cut is not read and cut again (the same max_tokens and count_tokens)."""
    unknown = [name for name in sources if name not in SOURCES]
    if unknown:
        raise HeadcountError(f"text sources {unknown}: not known; choose from {sorted(SOURCES)}")
    cache = {} if cache is None else cache
    texts, names = [], []
    for name in sources:
        if name not in cache:
            cache[name] = windows_of(read_sentences(Path(data_root) / SOURCES[name]), count_tokens, max_tokens)
        found = spread(cache[name], per_source)
        texts += found
        names += [name] * len(found)
    return texts, names
