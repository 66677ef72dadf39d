"""Subword segmentation: one sentencepiece BPE model per language (SPEC section 2), and headcount's
own special ids. A stage opens its tokenizer with models.loading.open_tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import sentencepiece as spm

from headcount.data.special import SpecialIds
from headcount.io import atomic_path

# headcount's own token ids: its sentencepiece models are trained with them (train_bpe), and its
# Transformer says them (models.transformer). A library function takes a model's ids, never these.
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_IDS = SpecialIds(pad=PAD_ID, bos=BOS_ID, eos=EOS_ID, unk=UNK_ID)


def train_bpe(
    text_path: str | os.PathLike,
    model_path: str | os.PathLike,
    vocab_size: int,
    seed_sentences: int = 2_000_000,
    character_coverage: float = 1.0,
    threads: int = 1,
    max_piece_length: int = 16,
) -> None:
    """Learn a BPE model on one sentence per line; writes `model_path` (a .model file) atomically.

    The vocabulary size is a soft limit (hard_vocab_limit=False) so a corpus too small for it
    gets a smaller vocabulary instead of an error: the model reads the real size from the file.
    """
    model_path = Path(model_path)
    with atomic_path(model_path) as tmp:
        prefix = str(tmp) + ".spm"
        spm.SentencePieceTrainer.train(
            input=str(text_path),
            model_prefix=prefix,
            vocab_size=vocab_size,
            model_type="bpe",
            character_coverage=character_coverage,
            max_sentencepiece_length=max_piece_length,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            hard_vocab_limit=False,
            input_sentence_size=seed_sentences,
            shuffle_input_sentence=True,
            num_threads=threads,
            minloglevel=2,
        )
        os.replace(prefix + ".model", tmp)
        os.unlink(prefix + ".vocab")


class Segmenter:
    """Text <-> subword ids for one language."""

    def __init__(self, model_path: str | os.PathLike):
        self.path = str(model_path)
        self.sp = spm.SentencePieceProcessor(model_file=self.path)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.sp.encode(lines, out_type=int)

    def pieces(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.sp.decode(ids)


def pieces_fingerprint(model_path: str | os.PathLike) -> str:
    """A sentencepiece model's identity for resuming: its pieces, their scores and kinds, in id
    order; what segmentation and the model's vocabulary depend on. Not the file's bytes: the
    .model file also stores the trainer's options, among them train_bpe's random temporary
    model_prefix, so the same pieces learned again would not resume a run's checkpoint."""
    import hashlib
    import json

    sp = spm.SentencePieceProcessor(model_file=str(model_path))

    def kind(i: int) -> str:
        return ("unknown" if sp.is_unknown(i) else "control" if sp.is_control(i) else "unused" if sp.is_unused(i)
                else "byte" if sp.is_byte(i) else "normal")

    pieces = [[sp.id_to_piece(i), sp.get_score(i), kind(i)] for i in range(sp.get_piece_size())]
    return "pieces:" + hashlib.sha256(json.dumps(pieces, ensure_ascii=False).encode()).hexdigest()


# A tokenizer directory holding a headcount model's two sentencepiece models (the import of a
# headcount checkpoint trained by another run writes it; models.loading.open_tokenizer reads it).
TOKENIZER_MANIFEST = "headcount_tokenizer.json"


def write_tokenizer_dir(directory: str | os.PathLike, models: dict[str, str]) -> None:
    """Copy the source and target sentencepiece models ({"src", "tgt"}) into `directory`."""
    import json
    import shutil

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        shutil.copyfile(models[side], directory / f"{side}.model")
    (directory / TOKENIZER_MANIFEST).write_text(json.dumps({"src": "src.model", "tgt": "tgt.model"}) + "\n")


def open_tokenizer_dir(directory: str | os.PathLike, side: str) -> Segmenter:
    """One side ("source"/"target") of a directory write_tokenizer_dir wrote."""
    return Segmenter(Path(directory) / ("src.model" if side == "source" else "tgt.model"))
