"""fairseq checkpoints as headcount Transformers, read without fairseq.

A fairseq `transformer` model (the architecture of `fairseq-train --arch transformer` and its named
variants: transformer_iwslt_de_en, transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big, ...) is
the encoder-decoder of Vaswani et al. (2017) with options that headcount's own Transformer
(transformer.py) now also has: pre- or post-LayerNorm blocks, fairseq's sinusoids or learned positions,
an embedding scale or none, a LayerNorm on the embeddings, ReLU or GELU, source and target embeddings
shared or separate, the output layer tied or not. `read_fairseq` maps a checkpoint onto that model,
so gates, LRP, Michel importance, ablation, L0 pruning and physical head removal run on it unchanged;
the model it returns is family "headcount" with fairseq's token ids (data.fairseq_dictionary).

Reading a checkpoint runs no code from it: fairseq pickles its configuration as argparse.Namespace
(`args`, and `cfg.model` of legacy architectures) or as omegaconf containers (`cfg`), so the file is
read with torch's weights-only unpickler, allowing argparse.Namespace and, for omegaconf, inert
stand-in classes under omegaconf's names that only hold the pickled state (omegaconf need not be
installed); any other pickled object is refused as checkpoint.load_checkpoint refuses it.

What fairseq offers that the reader refuses, naming the option: other architectures (BART, mBART,
multilingual, LSTM, convolutional, ...), adaptive input or softmax, different encoder and decoder
widths, head counts, feed-forward sizes, normalisation or position kinds, no positions, no
cross-attention, layers to keep, activations other than ReLU and GELU.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import typing
from pathlib import Path

from torch import Tensor

from headcount.data.fairseq_dictionary import FAIRSEQ_SPECIAL
from headcount.io import CheckpointError, HeadcountError
from headcount.models.checkpoint import read_weights_only
from headcount.models.transformer import ModelConfig, Transformer

# fairseq's architectures that are TransformerModel with other defaults (the checkpoint's args hold the
# resolved values, so any of them reads the same way).
TRANSFORMER_ARCHS = {
    "transformer", "transformer_tiny", "transformer_iwslt_de_en", "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big", "transformer_wmt_en_de_big",
    "transformer_wmt_en_de_big_t2t", "transformer_wmt19_de_en",
}


class FairseqUnsupported(HeadcountError):
    pass


# --------------------------------------------------------------------------------------------
# Reading the file without running its code


class _Pickled:
    """An omegaconf object's pickled state, kept as it is (nothing of omegaconf runs)."""

    def __setstate__(self, state):
        self.state = state


_OMEGACONF = ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig", "omegaconf.base.Metadata",
              "omegaconf.base.ContainerMetadata", "omegaconf.nodes.AnyNode", "omegaconf.nodes.StringNode",
              "omegaconf.nodes.IntegerNode", "omegaconf.nodes.FloatNode", "omegaconf.nodes.BooleanNode",
              "omegaconf.nodes.BytesNode", "omegaconf.nodes.PathNode", "omegaconf.nodes.EnumNode")
_STAND_INS = {name: type(name.rsplit(".", 1)[1], (_Pickled,), {"omegaconf_name": name}) for name in _OMEGACONF}
_ANY = object()  # typing.Any, which omegaconf's metadata names
FAIRSEQ_TYPES = [argparse.Namespace, collections.defaultdict, dict, list, int, float, str, bool,
                 (_ANY, "typing.Any"), *((cls, name) for name, cls in _STAND_INS.items())]


# A checkpoint's configuration is read from a file someone else wrote: pickle's memo lets a tiny
# file refer to one container from many places, so expanding it into plain dicts could take
# exponential time and memory (a 1.7 KB file, 60 levels of shared halves) or never end (a list
# that holds itself). A real fairseq configuration is about ten levels deep (omegaconf's nodes
# included) with a few thousand values (its optimizer state too), far inside these bounds.
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_VALUES = 1_000_000  # values visited, each arrival through a shared reference counted
MAX_SHARED_REFERENCES = 10_000  # arrivals at a container already expanded elsewhere


class ConfigTooLarge(CheckpointError):
    pass


def plain(value, where: tuple = ()):
    """Namespace and omegaconf stand-ins -> dicts and lists, all the way down. Refuses
    (ConfigTooLarge, naming the key under `where`) a cycle, or more depth, values or shared
    references than the bounds above, before it takes more time or memory than a real
    configuration would."""
    return _Plainer().plain(value, where, 0)


class _Plainer:
    def __init__(self):
        self.values, self.shared, self.expanded, self.open = 0, 0, set(), set()

    def plain(self, value, where: tuple, depth: int):
        self.values += 1
        if self.values > MAX_CONFIG_VALUES:
            raise _refuse_config(where, f"more than {MAX_CONFIG_VALUES:,} values once its shared references "
                                        f"are expanded")
        if not isinstance(value, (argparse.Namespace, _Pickled, dict, list, tuple)):
            return None if value is _ANY or value is typing.Any else value
        if id(value) in self.open:
            raise _refuse_config(where, "a container that holds itself (a cycle)")
        if depth >= MAX_CONFIG_DEPTH:
            raise _refuse_config(where, f"containers nested more than {MAX_CONFIG_DEPTH} deep")
        if id(value) in self.expanded:
            self.shared += 1
            if self.shared > MAX_SHARED_REFERENCES:
                raise _refuse_config(where, f"more than {MAX_SHARED_REFERENCES:,} shared references")
        self.open.add(id(value))
        try:
            return self.expand(value, where, depth + 1)
        finally:
            self.open.discard(id(value))
            self.expanded.add(id(value))

    def expand(self, value, where: tuple, depth: int):
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if isinstance(value, _Pickled):
            state = getattr(value, "state", None)
            if not isinstance(state, dict):
                raise _refuse_config(where, f"an {type(value).omegaconf_name} whose pickled state is no dict")
            return self.plain(state.get("_content", state.get("_val")), where, depth)
        if isinstance(value, dict):
            return {k: self.plain(v, (*where, k), depth) for k, v in value.items()}
        return [self.plain(v, (*where, i), depth) for i, v in enumerate(value)]


def _refuse_config(where: tuple, what: str) -> ConfigTooLarge:
    key = ".".join(map(str, where)) or "(top level)"
    return ConfigTooLarge(f"refused, not read: its configuration at '{key}' holds {what}, which no fairseq "
                          f"checkpoint does (the file is damaged or was built to exhaust the reader)")


def load_fairseq_checkpoint(path: str | os.PathLike) -> dict:
    """A fairseq checkpoint's dict ({"model": state dict, "args" or "cfg", ...}), configuration as
    plain dicts, read without running code from the file."""
    state = read_weights_only(path, FAIRSEQ_TYPES, "fairseq checkpoints hold tensors, argparse.Namespace and "
                              "omegaconf configurations, which headcount reads; this file holds something else. "
                              "Replace it with one from a source you trust.")
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'model' entry)")
    try:
        return {k: (v if k == "model" else plain(v, (k,))) for k, v in state.items()}
    except ConfigTooLarge as error:
        raise ConfigTooLarge(f"{path}: {error}. Replace it with one from a source you trust.") from None


def model_args(state: dict, path: str | os.PathLike = "checkpoint") -> dict:
    """The model's settings, flat (fairseq's option names with dashes as underscores), from `args`
    (fairseq <= 0.9, and legacy architectures) or `cfg.model` (newer; nested encoder/decoder
    groups are flattened to encoder_embed_dim etc.), plus the task's languages and lengths."""
    cfg = state.get("cfg") or {}
    args = dict(state.get("args") or cfg.get("model") or {})
    if not args:
        raise FairseqUnsupported(f"{path}: no model configuration ('args' or 'cfg.model') in the checkpoint")
    for side in ("encoder", "decoder"):  # fairseq's dataclass TransformerConfig nests these
        group = args.pop(side, None)
        if isinstance(group, dict):
            for key, value in group.items():
                if key in ("learned_pos", "normalize_before", "layers", "attention_heads", "embed_dim",
                           "ffn_embed_dim", "layerdrop", "layers_to_keep", "embed_path", "output_dim", "input_dim"):
                    args.setdefault(f"{side}_{key}", value)
    task = cfg.get("task") or {}
    for key in ("source_lang", "target_lang", "max_source_positions", "max_target_positions"):
        if args.get(key) is None and task.get(key) is not None:
            args[key] = task[key]
    args.setdefault("arch", args.get("_name"))
    return args


# --------------------------------------------------------------------------------------------
# The configuration


def _refuse(path, option: str, value, fix: str) -> FairseqUnsupported:
    return FairseqUnsupported(f"{path}: fairseq option {option}={value!r} is not supported by headcount's "
                              f"reader; {fix}")


def fairseq_config(args: dict, weights: dict[str, Tensor], path: str | os.PathLike = "checkpoint") -> ModelConfig:
    """headcount's ModelConfig for a fairseq transformer's args and weights, or FairseqUnsupported."""
    arch = args.get("arch")
    if arch not in TRANSFORMER_ARCHS:
        raise FairseqUnsupported(
            f"{path}: fairseq architecture {arch!r} is not supported; headcount reads the transformer "
            f"architectures ({', '.join(sorted(TRANSFORMER_ARCHS))}). BART, mBART and FSMT models: use their "
            f"transformers conversion (`pretrained:` with a HuggingFace directory)")

    def get(name, default=None):
        value = args.get(name)
        return default if value is None else value

    for flag in ("adaptive_input", "no_cross_attention", "cross_self_attention", "no_token_positional_embeddings",
                 "tie_adaptive_weights", "merge_src_tgt_embed"):
        if get(flag, False):
            raise _refuse(path, flag, True, "retrain without it or convert the model yourself")
    if get("adaptive_softmax_cutoff"):
        raise _refuse(path, "adaptive_softmax_cutoff", args["adaptive_softmax_cutoff"], "only a full softmax is read")
    for side in ("encoder", "decoder"):
        if get(f"{side}_layers_to_keep"):
            raise _refuse(path, f"{side}_layers_to_keep", args[f"{side}_layers_to_keep"], "prune the layers first")
    pairs = [("encoder_embed_dim", "decoder_embed_dim"), ("encoder_attention_heads", "decoder_attention_heads"),
             ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
             ("encoder_normalize_before", "decoder_normalize_before"),
             ("encoder_learned_pos", "decoder_learned_pos")]
    for a, b in pairs:
        if bool(get(a, False)) != bool(get(b, False)) if "normalize" in a or "learned" in a else get(a) != get(b):
            raise FairseqUnsupported(f"{path}: {a}={get(a)!r} but {b}={get(b)!r}; headcount's Transformer has one "
                                     f"setting for both sides")
    d = int(get("encoder_embed_dim"))
    for name in ("decoder_output_dim", "decoder_input_dim"):
        if get(name, d) != d:
            raise _refuse(path, name, get(name), f"it must equal the embedding size {d}")
    activation = get("activation_fn", "relu")
    if activation not in ("relu", "gelu"):
        raise _refuse(path, "activation_fn", activation, "headcount's Transformer has relu and gelu")
    pre = bool(get("encoder_normalize_before", False))
    if pre and get("no_decoder_final_norm", False):
        raise _refuse(path, "no_decoder_final_norm", True, "pre-LN models are read with the final LayerNorm")
    learned = bool(get("encoder_learned_pos", False))
    pad = FAIRSEQ_SPECIAL.pad
    if learned:
        rows = weights["encoder.embed_positions.weight"].shape[0]
        max_len = min(rows, weights["decoder.embed_positions.weight"].shape[0]) - pad - 1
    else:
        max_len = int(min(get("max_source_positions", 1024), get("max_target_positions", 1024)))
    src_vocab = weights["encoder.embed_tokens.weight"].shape[0]
    tgt_vocab = weights["decoder.embed_tokens.weight"].shape[0]
    share_all = bool(get("share_all_embeddings", False))
    tied = share_all or bool(get("share_decoder_input_output_embed", False))
    return ModelConfig(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=int(get("encoder_attention_heads")),
        d_ff=int(get("encoder_ffn_embed_dim")), enc_layers=int(get("encoder_layers")),
        dec_layers=int(get("decoder_layers")), dropout=float(get("dropout", 0.1)),
        attn_dropout=float(get("attention_dropout", 0.0)),
        relu_dropout=float(get("activation_dropout", get("relu_dropout", 0.0))),
        tie_target_embeddings=tied, max_len=max_len, norm="pre" if pre else "post",
        positions="learned" if learned else "fairseq_sinusoidal",
        scale_embeddings=not get("no_scale_embedding", False),
        layernorm_embedding=bool(get("layernorm_embedding", False)), activation=activation,
        share_all_embeddings=share_all, pad_id=FAIRSEQ_SPECIAL.pad, bos_id=FAIRSEQ_SPECIAL.bos,
        eos_id=FAIRSEQ_SPECIAL.eos, unk_id=FAIRSEQ_SPECIAL.unk)


# --------------------------------------------------------------------------------------------
# The weights

# fairseq's module names -> headcount's, per layer and for the rest.
_LAYER_PARTS = {
    "self_attn.": "self_attn.", "encoder_attn.": "cross_attn.", "self_attn_layer_norm.": "self_attn_norm.",
    "encoder_attn_layer_norm.": "cross_attn_norm.", "final_layer_norm.": "ffn_norm.", "fc1.": "ffn.w_in.",
    "fc2.": "ffn.w_out.",
}
_TOP = {
    "encoder.embed_tokens.weight": "src_embed.weight", "decoder.embed_tokens.weight": "tgt_embed.weight",
    "decoder.output_projection.weight": "generator.weight", "encoder.embed_positions.weight": "src_positions.weight",
    "decoder.embed_positions.weight": "tgt_positions.weight", "encoder.layernorm_embedding.weight":
    "src_embed_norm.weight", "encoder.layernorm_embedding.bias": "src_embed_norm.bias",
    "decoder.layernorm_embedding.weight": "tgt_embed_norm.weight", "decoder.layernorm_embedding.bias":
    "tgt_embed_norm.bias", "encoder.layer_norm.weight": "encoder_norm.weight", "encoder.layer_norm.bias":
    "encoder_norm.bias", "decoder.layer_norm.weight": "decoder_norm.weight", "decoder.layer_norm.bias":
    "decoder_norm.bias",
}
_IGNORED = re.compile(r"(encoder|decoder)\.(version|embed_positions\._float_tensor)$")


def _upgrade(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """What fairseq's own upgrade_state_dict does for old checkpoints: one in_proj per attention
    split into q/k/v, and layer_norms.0/1 renamed."""
    out = {}
    for key, value in weights.items():
        match = re.match(r"(.*)\.in_proj_(weight|bias)$", key)
        if match:
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[f"{match.group(1)}.{name}.{match.group(2)}"] = part
            continue
        match = re.match(r"((?:encoder|decoder)\.layers\.\d+)\.layer_norms\.([01])\.(.*)$", key)
        if match:
            name = "self_attn_layer_norm" if match.group(2) == "0" else "final_layer_norm"
            out[f"{match.group(1)}.{name}.{match.group(3)}"] = value
            continue
        out[key] = value
    return out


def convert_weights(weights: dict[str, Tensor], path: str | os.PathLike = "checkpoint") -> dict[str, Tensor]:
    """A fairseq transformer's state dict -> headcount's Transformer's names; an unknown name is an error."""
    out = {}
    for key, value in _upgrade(weights).items():
        if _IGNORED.match(key):
            continue
        if key in _TOP:
            out[_TOP[key]] = value.float()
            continue
        match = re.match(r"(encoder|decoder)\.layers\.(\d+)\.(.*)$", key)
        part = next((p for p in _LAYER_PARTS if match and match.group(3).startswith(p)), None)
        if part is None:
            raise FairseqUnsupported(f"{path}: weight {key!r} belongs to no part of a fairseq transformer that "
                                     f"headcount reads")
        stack = "encoder_layers" if match.group(1) == "encoder" else "decoder_layers"
        rest = match.group(3)[len(part):]
        out[f"{stack}.{match.group(2)}.{_LAYER_PARTS[part]}{rest}"] = value.float()
    return out


def read_fairseq(checkpoint: str | os.PathLike) -> tuple[Transformer, dict]:
    """A fairseq transformer checkpoint -> (headcount Transformer in eval mode, its fairseq args)."""
    state = load_fairseq_checkpoint(checkpoint)
    args = model_args(state, checkpoint)
    weights = state["model"]
    cfg = fairseq_config(args, weights, checkpoint)
    model = Transformer(cfg)
    converted = convert_weights(weights, checkpoint)
    if "generator.weight" not in converted:  # tied: fairseq's older checkpoints store it once
        converted["generator.weight"] = converted["tgt_embed.weight"]
    if cfg.share_all_embeddings:
        converted["tgt_embed.weight"] = converted["src_embed.weight"]
    missing, unexpected = model.load_state_dict(converted, strict=False)
    missing = [k for k in missing if not k.endswith(".head_mask")]  # headcount's gates: all open
    if missing or unexpected:
        raise FairseqUnsupported(f"{checkpoint}: weights do not fit the architecture its args describe "
                                 f"(missing {missing}, unexpected {unexpected})")
    return model.eval(), args


def dictionary_paths(data: str | os.PathLike, args: dict) -> dict[str, Path]:
    """{"src", "tgt"}: the dictionaries in a data-bin directory, named by the checkpoint's languages,
    or, where it names none (fairseq-train without --source-lang), by the binarised files'
    names ({split}.{src}-{tgt}.{lang}.idx), as fairseq's translation task infers them."""
    data = Path(data)
    langs = {"src": args.get("source_lang"), "tgt": args.get("target_lang")}
    if langs["src"] is None or langs["tgt"] is None:
        pairs = {m.groups()[:2] for f in data.glob("*.idx")
                 if (m := re.match(r"[^.]+\.([^.-]+)-([^.-]+)\.([^.]+)\.idx$", f.name))}
        if len(pairs) != 1:
            raise FairseqUnsupported(
                f"{data}: the checkpoint names no source_lang/target_lang and the directory holds "
                f"{'no' if not pairs else 'more than one'} binarised language pair to infer them from (files "
                f"named like train.en-de.en.idx); put the model's binarised data there, or retrain with "
                f"--source-lang/--target-lang")
        langs = dict(zip(("src", "tgt"), pairs.pop()))
    paths = {}
    for side, lang in langs.items():
        path = data / f"dict.{lang}.txt"
        if not path.exists():
            raise FairseqUnsupported(f"{data}: no dictionary dict.{lang}.txt for the checkpoint's "
                                     f"{'source' if side == 'src' else 'target'} language {lang!r}")
        paths[side] = path
    return paths


def import_fairseq(checkpoint: str | os.PathLike, data: str | os.PathLike, sentencepiece: dict[str, str | None],
                   model_out: str | os.PathLike, tokenizer_dir: str | os.PathLike) -> tuple[Transformer, dict]:
    """What the workflow's import stage does for a fairseq model: a headcount checkpoint at
    model_out (read back by loading.load_model) and the tokenizer files in tokenizer_dir (read back
    by loading.open_tokenizer). sentencepiece: {"src", "tgt"} model paths, or None for text already
    segmented into the dictionary's symbols."""
    from headcount.data.fairseq_dictionary import FairseqTokenizer, write_tokenizer_dir

    model, args = read_fairseq(checkpoint)
    dicts = dictionary_paths(data, args)
    for side, vocab in (("src", model.cfg.src_vocab), ("tgt", model.cfg.tgt_vocab)):
        size = len(FairseqTokenizer(dicts[side]))
        if size > vocab:  # fairseq pads vocabularies to a multiple of 8, so fewer symbols is normal
            raise FairseqUnsupported(f"{dicts[side]}: {size} symbols, but the checkpoint's "
                                     f"{'encoder' if side == 'src' else 'decoder'} embeds only {vocab}: "
                                     f"not this model's dictionary")
    write_tokenizer_dir(tokenizer_dir, {k: str(v) for k, v in dicts.items()}, sentencepiece)
    model.save(model_out, extra={"pretrained": {"source": str(checkpoint), "family": "fairseq",
                                                "arch": args.get("arch")}})
    return model, args
