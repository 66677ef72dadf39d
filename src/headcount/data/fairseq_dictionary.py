"""fairseq's dictionaries and the tokenizer of a fairseq model, without fairseq (torch-free).

A fairseq translation model reads token ids from its dictionaries (`dict.<lang>.txt` in its
data-bin directory): four specials first, <s> = 0, <pad> = 1, </s> = 2, <unk> = 3, then one
symbol a line ("symbol count", optionally followed by "#fairseq:overwrite"), numbered from 4 in
file order. The text is segmented before that lookup, by the sentencepiece model the data was made
with (`bpe: sentencepiece`) or not at all (text already split into its symbols). Other segmenters
(subword-nmt or fastBPE codes with Moses tokenisation, as the WMT19 models use) are not read here:
transformers' FSMT holds those models with their own tokenizer (docs/pretrained.md).

`FairseqTokenizer` is a data.special.Tokenizer, so every stage reads a fairseq model's text as it
reads headcount's own.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from headcount.data.special import SpecialIds
from headcount.io import HeadcountError

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
FAIRSEQ_SPECIAL = SpecialIds(pad=1, bos=2, eos=2, unk=3)  # the decoder starts from </s>, as fairseq's does
# The file in a tokenizer directory that says it is a fairseq model's (loading.open_tokenizer looks for it).
MANIFEST = "fairseq_tokenizer.json"


def read_dictionary(path: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """A fairseq dictionary file -> (its symbols by id, the four specials first; symbol -> id),
    as fairseq's Dictionary.add_from_file reads it: a repeated symbol is an error unless its line
    ends in "#fairseq:overwrite", which gives it a new id."""
    symbols = list(SPECIAL_SYMBOLS)
    index = {s: i for i, s in enumerate(symbols)}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            overwrite = line.endswith(" #fairseq:overwrite")
            if overwrite:
                line = line[: -len(" #fairseq:overwrite")]
            fields = line.rsplit(" ", 1)
            if len(fields) < 2 or not fields[1].lstrip("-").isdigit():
                raise HeadcountError(f"{path}, line {number}: expected 'symbol count' as fairseq-preprocess writes "
                                     f"dictionaries, got {line!r}")
            if fields[0] in index and not overwrite:
                raise HeadcountError(f"{path}, line {number}: symbol {fields[0]!r} appears twice (fairseq refuses "
                                     f"this too unless the line ends in '#fairseq:overwrite')")
            index[fields[0]] = len(symbols)
            symbols.append(fields[0])
    return symbols, index


class FairseqTokenizer:
    """One side of a fairseq model: sentencepiece (or whitespace) segmentation, then its dictionary."""

    def __init__(self, dictionary: str | os.PathLike, sentencepiece: str | os.PathLike | None = None):
        self.symbols, self.index = read_dictionary(dictionary)
        self.sp = None
        if sentencepiece is not None:
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(sentencepiece))

    def __len__(self) -> int:
        return len(self.symbols)

    def pieces(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str) if self.sp is not None else line.split()

    def encode(self, lines: list[str]) -> list[list[int]]:
        unk = FAIRSEQ_SPECIAL.unk
        return [[self.index.get(p, unk) for p in self.pieces(line)] for line in lines]

    def decode(self, ids: list[list[int]]) -> list[str]:
        skip = {FAIRSEQ_SPECIAL.pad, FAIRSEQ_SPECIAL.eos, 0}
        out = []
        for row in ids:
            pieces = [self.symbols[i] if i < len(self.symbols) else "<unk>" for i in row if i not in skip]
            out.append(self.sp.decode_pieces(pieces) if self.sp is not None else " ".join(pieces))
        return out


def write_tokenizer_dir(directory: str | os.PathLike, dictionaries: dict[str, str],
                        sentencepiece: dict[str, str | None]) -> None:
    """Copy a fairseq model's dictionaries and sentencepiece models into `directory`, with the
    manifest that open_tokenizer reads. dictionaries/sentencepiece: {"src": path, "tgt": path}."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for side in ("src", "tgt"):
        entry = {"dictionary": f"dict.{side}.txt", "sentencepiece": None}
        shutil.copyfile(dictionaries[side], directory / entry["dictionary"])
        if sentencepiece.get(side):
            entry["sentencepiece"] = f"{side}.spm.model"
            shutil.copyfile(sentencepiece[side], directory / entry["sentencepiece"])
        manifest[side] = entry
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def open_tokenizer_dir(directory: str | os.PathLike, side: str) -> FairseqTokenizer:
    """The tokenizer of one side ("source"/"target") of a directory write_tokenizer_dir wrote."""
    directory = Path(directory)
    entry = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))["src" if side == "source" else "tgt"]
    spm = entry["sentencepiece"]
    return FairseqTokenizer(directory / entry["dictionary"], directory / spm if spm else None)
