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
from headcount.models.hf_source import gguf_read_once
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


@gguf_read_once()
def import_pretrained(name_or_dir: str | os.PathLike, model_out: str | os.PathLike,
                      tokenizer_dir: str | os.PathLike | None = None, offline: bool | None = None,
                      src_lang: str | None = None, tgt_lang: str | None = None,
                      allow_weights: dict | None = None, objective: str | None = None) -> Seq2SeqWithHeads:
    """One entry point for a pretrained transformers model, whatever its kind: a causal or masked
    language model (its config's model type is a decoder-only or encoder-only entry of
    families.FAMILIES) -> hf_lm.import_pretrained_lm, an encoder-decoder model ->
    hf.import_pretrained. Both write a headcount checkpoint to `model_out` and the tokenizer's files
    to `tokenizer_dir` (open_tokenizer reads them).
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


def adapt_model(model, tokenizer, objective: str | None = None, argument: str = "model"):
    """A model and its tokenizer already in memory -> (headcount model, source tokenizer, target
    tokenizer): what headcount.api works on.

    `model`: a headcount model (one load_model returns: kept as it is), or a transformers model of
    a supported family (families.FAMILIES): a decoder-only or masked LM, an encoder-decoder, or,
    with `objective="sentence_embedding"`, an encoder analysed through its pooled embedding
    (hf_sentence). A transformers model is wrapped in place: head gates (open: the outputs do not
    change) go into its attention modules, and its attention runs eagerly (the one implementation
    that returns probabilities).
    `tokenizer`: a headcount tokenizer (data.special.Tokenizer), a (source, target) pair of them,
    or the model's transformers tokenizer. `argument` names `model` in errors."""
    from headcount.io import HeadcountError

    if hasattr(model, "attention_modules") and hasattr(model, "special"):  # already headcount's
        if isinstance(tokenizer, tuple) and len(tokenizer) == 2:
            return model, tokenizer[0], tokenizer[1]
        if not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "pieces")):
            raise HeadcountError(f"tokenizer: a headcount model takes a headcount tokenizer (loading.open_tokenizer) "
                                 f"or a (source, target) pair of them, not {type(tokenizer).__name__}")
        return model, tokenizer, tokenizer
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type") or not hasattr(model, "state_dict"):
        raise HeadcountError(f"{argument}: {type(model).__name__} is neither a headcount model nor a transformers "
                             f"model (one with a .config); load one with transformers' from_pretrained, or "
                             f"headcount.models.loading.load_model")
    if not hasattr(tokenizer, "convert_ids_to_tokens"):
        raise HeadcountError(f"tokenizer: a transformers model takes its transformers tokenizer "
                             f"(AutoTokenizer.from_pretrained), not {type(tokenizer).__name__}")
    if getattr(config, "auto_map", None):
        raise HeadcountError(f"{argument}: its config maps its classes onto its own code (auto_map); headcount "
                             f"analyses only architectures transformers ships")
    from headcount.models.families import LANGUAGE_MODELS, family_of
    from headcount.models.hf_lm import HFCausalLM, HFMaskedLM, special_ids_of

    if objective == "sentence_embedding":
        from headcount.models.hf_lm_tokenizer import LMTokenizer
        from headcount.models.hf_sentence import HFSentenceEncoder, encoder_family

        encoder_family(config, argument)
        wrapped = HFSentenceEncoder(model, special=special_ids_of(config, tokenizer))
        return wrapped.eval(), LMTokenizer(tokenizer), LMTokenizer(tokenizer)
    if objective not in (None, "language_model", "translation"):
        raise HeadcountError(f"objective: {objective!r}; use None (the model's own), or 'sentence_embedding'")
    family = family_of(config)  # an unsupported type: the error lists the supported ones
    if family.model_kind in LANGUAGE_MODELS:
        from headcount.models.hf_lm_tokenizer import LMTokenizer

        cls = HFCausalLM if family.model_kind == "decoder_only" else HFMaskedLM
        wrapped = cls(model, special=special_ids_of(config, tokenizer))
        return wrapped.eval(), LMTokenizer(tokenizer), LMTokenizer(tokenizer)
    from headcount.models.hf import HFSeq2Seq, tokenizer_sides

    return (HFSeq2Seq(model).eval(), *tokenizer_sides(tokenizer, argument))
