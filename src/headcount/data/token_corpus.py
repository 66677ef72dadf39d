"""Subword-encoded corpora in compact form: one flat int32 array of ids per side and int64
offsets, instead of a Python list of lists.

A Python int in a list takes 36 bytes (8 for the pointer, 28 for the object; ids above 256 are not
shared), a sentence's list 56 more: 6M pairs of ~15 subwords a side would take ~8 GB as lists,
~0.8 GB here. Indexing gives a sentence back as a list, so code written for lists runs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np


class TokenCorpus(Sequence):
    """Sentences of subword ids: `tokens[offsets[i]:offsets[i + 1]]` is sentence i."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray):
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
            raise ValueError("offsets must start at 0 and end at the number of tokens")
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)

    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], chunk: int = 50_000) -> TokenCorpus:
        """From sentences of ids, taken `chunk` at a time (only one chunk is ever a list)."""
        return cls.encode_lines(list, sequences, chunk)

    @classmethod
    def encode_lines(cls, encode, lines: Iterable, chunk: int = 50_000) -> TokenCorpus:
        """Encode lines with `encode` (a list of them -> a list of id lists, e.g. Segmenter.encode;
        `list` for sentences already of ids), `chunk` at a time."""
        parts, lengths, batch = [], [], []
        for line in lines:
            batch.append(line)
            if len(batch) >= chunk:
                cls._flush(encode(batch), parts, lengths)
                batch.clear()
        if batch:
            cls._flush(encode(batch), parts, lengths)
        return cls._join(parts, lengths)

    @staticmethod
    def _flush(sequences: list, parts: list, lengths: list) -> None:
        if not sequences:
            return
        n = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        flat = np.fromiter((i for s in sequences for i in s), dtype=np.int32, count=int(n.sum()))
        parts.append(flat)
        lengths.append(n)

    @classmethod
    def _join(cls, parts: list, lengths: list) -> TokenCorpus:
        n = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        offsets = np.zeros(len(n) + 1, dtype=np.int64)
        np.cumsum(n, out=offsets[1:])
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(tokens, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sentence {index} of a corpus of {len(self)}")
        return self.tokens[self.offsets[index] : self.offsets[index + 1]].tolist()

    def lengths(self) -> np.ndarray:
        """Subwords per sentence (int64)."""
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.offsets.nbytes

    def __eq__(self, other) -> bool:
        if isinstance(other, TokenCorpus):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.tokens, other.tokens)
        return NotImplemented

    __hash__ = None


def encode_file(segmenter, path: str | os.PathLike, chunk: int = 50_000) -> TokenCorpus:
    """A text file headcount wrote (one sentence per line), encoded `chunk` lines at a time."""
    from headcount.io import iter_lines

    return TokenCorpus.encode_lines(segmenter.encode, iter_lines(path), chunk)


def sequence_lengths(sequences) -> list[int]:
    """Lengths of a TokenCorpus or a list of id lists, as a list of ints (what make_batches takes)."""
    if isinstance(sequences, TokenCorpus):
        return sequences.lengths().tolist()
    return [len(s) for s in sequences]
