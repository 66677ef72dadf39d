"""Tiny random encoder-decoder models, written as transformers' save_pretrained writes a pretrained
model: fixtures for tests and dry runs where the hub is out of reach (nothing is downloaded), not
analysis code. `write_tiny_marian` writes an opus-mt-shaped directory (a sentencepiece model per
side, one shared vocabulary); `write_tiny_fsmt` a wmt19-shaped one (Moses and BPE merges learned
here, a vocabulary per side). hf.load_pretrained, load_tokenizers and import_pretrained read the
directories offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from headcount.models.hf import _WORD_END


def write_tiny_marian(directory: str | os.PathLike, src_lines: list[str], tgt_lines: list[str],
                      vocab_size: int = 60, d_model: int = 16, layers: int = 2, heads: int = 4, ffn: int = 32,
                      seed: int = 0) -> Path:
    """A randomly initialised MarianMT model with a tokenizer trained on the given lines, written
    as transformers writes a pretrained model (save_pretrained): a stand-in for an opus-mt
    directory where the hub is out of reach (tests, dry runs). Source and target get their own
    sentencepiece model and share one vocabulary, as opus-mt models do."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    pieces = ["</s>", "<unk>"]
    for side, lines in (("source", src_lines), ("target", tgt_lines)):
        (directory / f"{side}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(directory / f"{side}.txt"), model_prefix=str(directory / side),
                                       vocab_size=vocab_size, model_type="unigram", character_coverage=1.0,
                                       hard_vocab_limit=False, minloglevel=2, num_threads=1)
        (directory / f"{side}.txt").unlink()
        (directory / f"{side}.vocab").unlink()
        os.replace(directory / f"{side}.model", directory / f"{side}.spm")
        sp = spm.SentencePieceProcessor(model_file=str(directory / f"{side}.spm"))
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if not (sp.is_control(i) or sp.is_unknown(i)) and sp.id_to_piece(i) not in pieces]
    pieces.append("<pad>")  # opus-mt: </s> 0, <unk> 1, <pad> last
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False),
                                          encoding="utf-8")
    tokenizer = MarianTokenizer(source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
                                vocab=str(directory / "vocab.json"))
    pad = tokenizer.pad_token_id
    config = MarianConfig(vocab_size=len(pieces), d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                          encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                          decoder_ffn_dim=ffn, max_position_embeddings=512, pad_token_id=pad,
                          decoder_start_token_id=pad, eos_token_id=tokenizer.eos_token_id,
                          forced_eos_token_id=tokenizer.eos_token_id, activation_function="swish",
                          scale_embedding=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    MarianMTModel(config).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def _learn_bpe(words: dict[str, int], merges: int) -> list[tuple[str, str]]:
    """BPE merges learned from word counts, each word's last symbol marked '</w>' (the scheme of
    fairseq's WMT19 models): at each step the most frequent adjacent pair is merged (ties: the
    pair that sorts last)."""
    corpus = {tuple(w[:-1]) + (w[-1] + _WORD_END,): n for w, n in words.items() if w}
    learned = []
    for _ in range(merges):
        counts: dict[tuple[str, str], int] = {}
        for symbols, n in corpus.items():
            for pair in zip(symbols, symbols[1:]):
                counts[pair] = counts.get(pair, 0) + n
        if not counts:
            break
        best = max(counts, key=lambda pair: (counts[pair], pair))
        learned.append(best)
        merged: dict[tuple[str, ...], int] = {}
        for symbols, n in corpus.items():
            out, i = [], 0
            while i < len(symbols):
                if symbols[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        corpus = merged
    return learned


def write_tiny_fsmt(directory: str | os.PathLike, src_lines: list[str], tgt_lines: list[str],
                    langs: tuple[str, str] = ("en", "de"), merges: int = 60, d_model: int = 16, layers: int = 2,
                    heads: int = 4, ffn: int = 32, seed: int = 0) -> Path:
    """A randomly initialised FSMT model with a tokenizer built from the given lines, written as
    save_pretrained writes facebook/wmt19-*: a stand-in where the hub is out of reach (tests, dry
    runs). As there, the text is Moses-tokenized in its own language, one set of BPE merges
    (merges.txt) is learned from both sides, and each side has its own vocabulary (vocab-src.json,
    vocab-tgt.json: fairseq's four special tokens, every single character of that side in both
    its word-inner and word-final form, then the pieces its lines segment into)."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq's dictionary: 0, 1, 2, 3

    def tokenizer(pair: tuple[str, str]) -> FSMTTokenizer:
        return FSMTTokenizer(langs=list(pair), src_vocab_file=str(directory / "vocab-src.json"),
                             tgt_vocab_file=str(directory / "vocab-tgt.json"),
                             merges_file=str(directory / "merges.txt"))

    sides = {"src": (src_lines, tuple(langs)), "tgt": (tgt_lines, tuple(langs[::-1]))}
    for name in ("src", "tgt"):
        (directory / f"vocab-{name}.json").write_text(json.dumps({t: i for i, t in enumerate(specials)}),
                                                      encoding="utf-8")
    (directory / "merges.txt").write_text("", encoding="utf-8")
    words: dict[str, int] = {}
    for lines, pair in sides.values():
        moses = tokenizer(pair)
        for line in lines:
            for word in moses.moses_tokenize(moses.moses_pipeline(line, pair[0]), pair[0]):
                words[word] = words.get(word, 0) + 1
    learned = _learn_bpe(words, merges)
    (directory / "merges.txt").write_text("".join(f"{a} {b}\n" for a, b in learned), encoding="utf-8")
    for name, (lines, pair) in sides.items():
        segmenter = tokenizer(pair)
        chars = sorted({c for line in lines for c in "".join(segmenter.moses_tokenize(
            segmenter.moses_pipeline(line, pair[0]), pair[0]))})
        vocab = {t: i for i, t in enumerate(specials)}
        for piece in [*chars, *(c + _WORD_END for c in chars),
                      *(p for line in lines for p in segmenter.tokenize(line))]:
            vocab.setdefault(piece, len(vocab))
        (directory / f"vocab-{name}.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    final = tokenizer(tuple(langs))
    config = FSMTConfig(langs=list(langs), src_vocab_size=final.src_vocab_size, tgt_vocab_size=final.tgt_vocab_size,
                        d_model=d_model, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
                        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
                        max_position_embeddings=512, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    FSMTForConditionalGeneration(config).save_pretrained(str(directory))
    final.save_pretrained(str(directory))
    return directory


__all__ = ["write_tiny_fsmt", "write_tiny_marian"]
