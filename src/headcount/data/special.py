"""Token ids and tokenizers as every model family and analysis sees them (torch-free).

A model says its own ids (`model.special`, a SpecialIds); a stage's tokenizer turns text into that
model's ids and back (`Tokenizer`). Nothing here is one model's: headcount's own ids are
data.subwords'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class SpecialIds:
    """The token ids an analysis needs; each model says its own."""

    pad: int
    bos: int  # what the decoder input starts with (Marian: its pad id)
    eos: int
    unk: int | None = None
    # What every target begins with after the start token, forced by search: a multilingual
    # model's target-language tag (mBART-50, M2M100, NLLB), BART's <s>; () for most models.
    forced: tuple[int, ...] = ()
    mask: int | None = None  # what a masked-LM input holds in place of a masked token (BERT's [MASK])

    def never_generated(self) -> tuple[int, ...]:
        """Ids that search and LRP never pick as an output token."""
        return tuple(sorted({self.pad, self.bos} - {self.eos}))

    def decoder_positions(self, tgt_in: Tensor) -> Tensor:
        """(B, T) True at the real positions of decoder inputs (start token, then the target's
        tokens, padding after): the start token counts even where it is the pad id (Marian)."""
        real = tgt_in.ne(self.pad)
        real[:, :1] = True
        return real


# The piece string of a token that stands for no text (a language tag a tokenizer puts first):
# Tokenizer.pieces gives it so that pieces and ids stay one to one, and it belongs to no word.
SPECIAL_PIECE = ""


class Tokenizer(Protocol):
    """Text <-> subword ids for one side of a model (no EOS added: batching adds it; a language
    tag the model expects before the text is part of the ids)."""

    def __len__(self) -> int: ...

    def encode(self, lines: list[str]) -> list[list[int]]: ...

    def pieces(self, line: str) -> list[str]: ...  # the subword strings, one per id (SPECIAL_PIECE for a tag)

    def decode(self, ids: list[list[int]]) -> list[str]: ...


def positions(n_subwords: int) -> int:
    """The model positions a sentence of `n_subwords` takes, on either side: the source gets EOS,
    the decoder's input BOS and its output EOS (data.batching's source_tensor and target_tensors)."""
    return n_subwords + 1
