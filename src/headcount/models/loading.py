"""One way in for every model family: `load_model` reads a checkpoint and builds its model,
`open_tokenizer` opens a stage's tokenizer, headcount's sentencepiece model or a pretrained model's,
and `import_pretrained` turns any supported transformers model into a checkpoint and tokenizer files.

A checkpoint names its family; the family's module registers its loader (seq2seq.register_family)
and is imported on demand, so that loading headcount's own checkpoints never imports transformers.
"""

from __future__ import annotations

import os
from pathlib import Path

from headcount.data.special import Tokenizer
from headcount.models.seq2seq import MODEL_FAMILIES, Seq2SeqWithHeads

DEFAULT_FAMILY = "headcount"  # checkpoints written before families existed
# Where the families register themselves (imported on demand, so that loading headcount's own
# checkpoints never imports transformers).
FAMILY_MODULES = ("headcount.models.transformer", "headcount.models.hf", "headcount.models.hf_lm")


def model_from_checkpoint(state: dict) -> Seq2SeqWithHeads:
    """The model a loaded checkpoint holds (checkpoint.load_checkpoint's dict), by its family."""
    import importlib

    if state.get("model_kind") == "sentence_encoder":  # a BERT family's weights; the adapter is not a masked LM
        from headcount.models.hf_sentence import HFSentenceEncoder

        return HFSentenceEncoder.from_checkpoint(state)
    family = state.get("family", DEFAULT_FAMILY)
    for module in FAMILY_MODULES:
        if family in MODEL_FAMILIES:
            break
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name != module:  # the module exists but needs something missing: say so
                raise
    if family not in MODEL_FAMILIES:
        raise ValueError(f"checkpoint of model family {family!r}, which no module registers; known: "
                         f"{sorted(MODEL_FAMILIES)}")
    return MODEL_FAMILIES[family](state)


def load_model(path: str | os.PathLike, map_location="cpu") -> Seq2SeqWithHeads:
    """One loader for every family: read the checkpoint (weights only) and build its model."""
    from headcount.models.checkpoint import load_checkpoint  # torch: loaded only when a model is

    return model_from_checkpoint(load_checkpoint(path, map_location))


def open_tokenizer(path: str | os.PathLike, side: str) -> Tokenizer:
    """A stage's tokenizer (`src_spm`/`tgt_spm` inputs): headcount's sentencepiece model file ->
    data.subwords.Segmenter; a directory holding a fairseq model's dictionaries -> that side's
    data.fairseq_dictionary.FairseqTokenizer; one holding an imported headcount checkpoint's
    sentencepiece models -> that side's Segmenter; a directory holding a transformers tokenizer (a
    pretrained model's, written by the import_pretrained rule) -> that side of it; one holding a
    language model's (hf_lm.import_pretrained_lm wrote it) -> its one tokenizer, whatever the side
    (transformers is imported only then).
    side: "source" or "target"."""
    if Path(path).is_dir():
        from headcount.data import fairseq_dictionary, subwords

        if (Path(path) / fairseq_dictionary.MANIFEST).exists():  # a fairseq model's (import_fairseq wrote it)
            return fairseq_dictionary.open_tokenizer_dir(path, side)
        if (Path(path) / subwords.TOKENIZER_MANIFEST).exists():  # an imported headcount checkpoint's
            return subwords.open_tokenizer_dir(path, side)
        from headcount.models.hf_lm_tokenizer import LM_TOKENIZER_MANIFEST

        if (Path(path) / LM_TOKENIZER_MANIFEST).exists():  # a language model's: one tokenizer, both sides
            from headcount.models.hf_lm_tokenizer import open_lm_tokenizer_dir

            return open_lm_tokenizer_dir(path)
        from headcount.models.hf import load_tokenizers

        return load_tokenizers(path, offline=True)[0 if side == "source" else 1]
    from headcount.data.subwords import Segmenter

    return Segmenter(path)


def import_pretrained(name_or_dir: str | os.PathLike, model_out: str | os.PathLike,
                      tokenizer_dir: str | os.PathLike | None = None, offline: bool | None = None,
                      src_lang: str | None = None, tgt_lang: str | None = None,
                      allow_weights: dict | None = None, objective: str | None = None) -> Seq2SeqWithHeads:
    """One entry point for a pretrained transformers model, whatever its kind: a causal or masked
    language model (its config's model type is one of hf_lm.LM_FAMILIES) -> hf_lm.import_pretrained_lm,
    an encoder-decoder model -> hf.import_pretrained. Both write a headcount checkpoint to
    `model_out` and the tokenizer's files to `tokenizer_dir` (open_tokenizer reads them).
    `objective` (a language model's only): "sentence_embedding" imports an encoder as a sentence
    encoder (hf_sentence.load_sentence_encoder); None, the objective its config says."""
    from headcount.models.hf_lm import import_pretrained_lm, is_language_model

    if is_language_model(name_or_dir, offline=offline):
        if src_lang is not None or tgt_lang is not None:
            from headcount.io import HeadcountError

            raise HeadcountError(f"{name_or_dir}: a language model has one tokenizer and no language pair; "
                                 f"leave out pretrained_langs (got {src_lang!r}, {tgt_lang!r})")
        model = None
        if objective is not None:  # an encoder analysed through its pooled embedding
            from headcount.models.hf_sentence import load_sentence_encoder
            from headcount.models.seq2seq import SENTENCE_EMBEDDING

            if objective != SENTENCE_EMBEDDING:
                from headcount.io import HeadcountError

                raise HeadcountError(f"objective {objective!r}: a pretrained model is analysed by its own objective, "
                                     f"or as a sentence encoder with objective: {SENTENCE_EMBEDDING}; remove the key "
                                     f"or set that")
            model = load_sentence_encoder(name_or_dir, offline=offline, allow_weights=allow_weights)
        return import_pretrained_lm(name_or_dir, model_out, tokenizer_dir, offline=offline,
                                    allow_weights=allow_weights, model=model)
    if objective is not None:
        from headcount.io import HeadcountError

        raise HeadcountError(f"{name_or_dir}: an encoder-decoder model, and objective {objective!r} is for an "
                             f"encoder analysed through its pooled embedding; remove objective")
    from headcount.models.hf import import_pretrained as import_encoder_decoder

    return import_encoder_decoder(name_or_dir, model_out, tokenizer_dir, offline=offline, src_lang=src_lang,
                                  tgt_lang=tgt_lang, allow_weights=allow_weights)
