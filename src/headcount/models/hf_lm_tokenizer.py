"""A pretrained language model's tokenizer as headcount's `Tokenizer` (data.special), for hf_lm.py's
models (torch-free until a tokenizer is loaded: loading.open_tokenizer checks LM_TOKENIZER_MANIFEST).

`LMTokenizer` gives the same tokenizer for "source" and "target" (text in, ids without
special tokens out: batching adds BOS/EOS). Its `pieces` are spelled the sentencepiece way, whatever
the tokenizer's own spelling, so that roles.alignment maps pieces to words as it does for
sentencepiece models: a piece that starts a whitespace-delimited word begins with the word-start
marker '▁'. Byte-level BPE (GPT-2, RoBERTa, Qwen): the bytes of each piece are decoded, the space
'Ġ' stands for becomes '▁', and the line's first piece gets '▁' too (GPT-2 adds no space before the
first word); a character split over several pieces belongs to the first of them (the others are a
zero-width space), a piece that is only a space is a lone '▁' (the next piece continues its word).
sentencepiece-style pieces (Llama: '▁', '<0xNN>' byte fallback) the same way. WordPiece (BERT): a
'##' piece continues the word before it; any other piece opens a word where a space (or the line's
start) precedes it in the text (its character offsets), so punctuation attached to a word continues it.
"""

from __future__ import annotations

import functools
import json
import os
import re

from headcount.io import HeadcountError

# What import_pretrained_lm writes beside the tokenizer's files: loading.open_tokenizer reads a
# directory holding it as one language model tokenizer for both sides.
LM_TOKENIZER_MANIFEST = "headcount-lm-tokenizer.json"


class LMTokenizer:
    """A language model's (fast) transformers tokenizer as headcount's `Tokenizer`, the same for
    source and target: ids without special tokens (batching adds BOS and EOS), pieces spelled the
    sentencepiece way (the module docstring)."""

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise HeadcountError(f"{type(tokenizer).__name__} is not a fast (tokenizers-backed) tokenizer; headcount "
                                 f"needs its character offsets: save the model's tokenizer.json with it")
        self.tokenizer = tokenizer
        self.prefix: list[int] = []
        self.scheme = _scheme(tokenizer)

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, lines: list[str]) -> list[list[int]]:
        lines = list(lines)  # transformers' fast tokenizers fail on an empty batch
        return self.tokenizer(lines, add_special_tokens=False)["input_ids"] if lines else []

    def pieces(self, line: str) -> list[str]:
        """One string per id of encode([line])[0], spelled as sentencepiece's (the module docstring)."""
        encoded = self.tokenizer(line, add_special_tokens=False, return_offsets_mapping=True)
        tokens = self.tokenizer.convert_ids_to_tokens(encoded["input_ids"])
        if self.scheme == "wordpiece":  # '##' continues a word; others open one where a space precedes
            return [token[2:] if token.startswith("##") else
                    ("\u2581" if begin == 0 or line[begin - 1].isspace() else "") + token
                    for token, (begin, _) in zip(tokens, encoded["offset_mapping"])]
        return _spelled(tokens, self.scheme)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode([list(map(int, x)) for x in ids], skip_special_tokens=True)


def _scheme(tokenizer) -> str:
    """How the tokenizer spells its pieces: "wordpiece" ('##' continuations), "byte_level" (GPT-2's
    bytes-as-characters, 'Ġ' a space) or "metaspace" (sentencepiece's '▁', '<0xNN>' byte fallback)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    if (state.get("model") or {}).get("type") == "WordPiece":
        return "wordpiece"
    if '"ByteLevel"' in json.dumps([state.get("pre_tokenizer"), state.get("decoder")]):
        return "byte_level"
    return "metaspace"


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte -> the byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def _token_bytes(token: str, scheme: str) -> bytes:
    if scheme == "byte_level":
        decoder = _byte_decoder()
        return bytes(decoder[c] for c in token if c in decoder)
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):  # sentencepiece's byte fallback
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


def _spelled(tokens: list[str], scheme: str) -> list[str]:
    """Byte-level or metaspace tokens -> their text, a leading space (or the start of the line)
    written '▁'. Each character goes to the token that holds its first byte; a token left with no
    character (the rest of a split character) is a zero-width space, one that is only a space the
    lone marker '▁' (the word it opens gets no second one)."""
    raw = [_token_bytes(token, scheme) for token in tokens]
    owner = [k for k, b in enumerate(raw) for _ in b]  # the token of each byte
    texts = [""] * len(raw)
    position = 0
    for char in b"".join(raw).decode("utf-8", errors="replace"):
        texts[owner[position]] += char
        position += len(char.encode("utf-8")) if char != "\ufffd" else 1
        if position >= len(owner):
            break
    out, first, pending = [], True, False  # pending: a lone '▁' piece opened the word already
    for text in texts:
        stripped = text.lstrip()
        if not text:
            out.append("\u200b")
        elif not stripped:
            out.append("\u2581")
            pending = True
        else:
            opens = (first or stripped != text) and not pending
            out.append(("\u2581" if opens else "") + stripped)
            first = pending = False
    return out


def load_lm_tokenizer(name_or_dir: str | os.PathLike, offline: bool | None = None) -> LMTokenizer:
    from transformers import AutoTokenizer

    from headcount.models.hf_source import resolve_source, unavailable

    source = resolve_source(name_or_dir, offline)
    try:
        return LMTokenizer(AutoTokenizer.from_pretrained(source.name, **source.kwargs))
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None


def open_lm_tokenizer_dir(path: str | os.PathLike) -> LMTokenizer:
    """The tokenizer import_pretrained_lm wrote (loading.open_tokenizer: either side)."""
    return load_lm_tokenizer(path, offline=True)
