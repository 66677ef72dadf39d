"""Pretrained decoder-only and encoder-only models from HuggingFace transformers as headcount models.

`HFCausalLM` (model_kind "decoder_only") wraps GPT-2, GPT-NeoX (Pythia), OPT, Llama, Qwen2 and Qwen3
causal language models; `HFMaskedLM` (model_kind "encoder_only") wraps BERT and RoBERTa masked language
models. The batch layout of each kind is seq2seq.py's: a causal LM reads `tgt_in` (src is empty), a masked LM
reads `src` (tgt_in is empty). As in hf.py, the transformers model runs its own forward pass with
eager attention (the only implementation that returns probabilities); the adapter replaces each
attention's output projection by `LMHeadGates` (head_gates.GatedProjection: the `head_context` hook,
the fixed 0/1 `head_mask` and the Hard Concrete gates in front of W^O, Voita et al. 2019, eq. 2).

What differs between architectures is data in the family's `LMFamily` entry (families.FAMILIES):
where the layers and their attentions are, which modules are Q, K, V and W^O, how a fused Q/K/V
projection orders its outputs, and which attention attributes count heads (transformers reshapes by
them). Gates, keep_heads, the transformers export (pruning/transformers_export.py) and the tests
read the entry, so a family whose attention is one of these shapes is one entry:
- one fused projection, `fused="blocks"` (GPT-2's `c_attn`, a transformers Conv1D: output columns
  Q | K | V, each H * Dh wide) or `fused="per_head"` (GPT-NeoX's `query_key_value`, an nn.Linear:
  head 0's q, k, v (Dh each), then head 1's, ...: transformers views its output as (H, 3 * Dh));
  keep_heads keeps each remaining head's features of it. A Conv1D W^O (GPT-2's `c_proj`, weight
  (in, out)) becomes the nn.Linear it computes (weight (out, in): head i owns input columns
  i*Dh:(i+1)*Dh, which gate folding scales);
- separate q, k, v projections (Llama, Qwen2, Qwen3, OPT, BERT, RoBERTa). Where the attention has
  grouped-query attention (`num_key_value_groups`: Llama, Qwen) H query heads share KV heads in
  groups of H / KV. Gates are per query head. keep_heads removes query heads and removes a KV head
  only when every query head that shares it is removed; the remaining query heads then no longer
  come in equal groups, so a pruned attention maps each query head to its KV head explicitly
  (`_grouped_eager`, transformers' own eager attention with the keys and values gathered per query
  head; attention modules keep the model's config otherwise).
Positions are the model's own and unchanged by pruning: learned (GPT-2; OPT's counted from the
attention mask, offset 2; BERT, RoBERTa), rotary per head (Llama, Qwen; GPT-NeoX on the first
`partial_rotary_factor` of each head's features). GPT-NeoX adds attention and feed-forward to the
residual in parallel (`use_parallel_residual`), which the gates in front of W^O do not see.
`layout` names the LRP forward (hf_lm_lrp.py) and, "bert", the post-LN encoder whose self-attention
module (not the W^O module) a layer without heads replaces. Masked-LM logits come from the model's
MLM head (BERT `cls`, RoBERTa `lm_head`).
An attention with no heads left outputs W^O's bias (transformers cannot run zero heads), writing
one all-zero KV head to a decoder's cache so that the cache's length stays the number of tokens.

Token ids: a causal LM starts from its BOS (GPT-2, GPT-NeoX, Qwen: <|endoftext|>; Llama: <s>; OPT: </s>,
which its tokenizer prepends to every text as Llama's does <s>) and pads with its
pad id or, where it has none, its EOS id (no EOS is ever a target in decoder_only batches); a masked
LM's src is [CLS] x [SEP] (RoBERTa <s> x </s>) with [MASK]/<mask> at the masked positions. Where the
pad id is also a text token (GPT-2 and Qwen pad with <|endoftext|>), that token is masked as padding
wherever it appears after position 0 (`special.decoder_positions`), so batch texts without it inside
(the TransformerLens cross-check found this: such a text differs from TransformerLens' unmasked
forward pass). The ids come from the tokenizer where there is one (`import_pretrained_lm`,
`load_pretrained_lm`) and are saved in the checkpoint.

Tokenizers (hf_lm_tokenizer.py): `LMTokenizer`, one tokenizer for both sides, its pieces spelled the
sentencepiece way.

`import_pretrained_lm` writes a headcount checkpoint and the tokenizer's files (with a manifest that
loading.open_tokenizer recognises). headcount.testing.tiny_lm writes small random models of each
family with tokenizers trained on given lines, for tests and dry runs without the hub.

Shapes: B batch, T length (target or source), D hidden size, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headcount.data.special import SpecialIds
from headcount.io import HeadcountError
from headcount.models.checkpoint import PickleRefusal, refused_pickle, save_checkpoint
from headcount.models.families import LANGUAGE_MODELS, LMFamily, family_of, names
from headcount.models.head_gates import GatedProjection, HeadMasks, linear_rows, load_weights_with_heads
from headcount.models.hf import _cache_argument
from headcount.models.hf_lm_tokenizer import LM_TOKENIZER_MANIFEST, LMTokenizer, load_lm_tokenizer
from headcount.models.hf_source import (
    PretrainedModelUnavailable,
    check_loading_report,
    gguf_read_once,
    resolve_source,
    unavailable,
)
from headcount.models.lrp import LRPNotImplemented  # noqa: F401 (part of this module's __all__: what its lrp_forward raises)
from headcount.models.seq2seq import NotAvailableForKind, register_family

# --------------------------------------------------------------------------------------------
# Module paths and fused Q/K/V features (where a family's entry, families.LMFamily, points)


def attribute(obj, path: str):
    """The attribute at a dotted path ("self.query")."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def set_attribute(obj, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    setattr(attribute(obj, parent) if parent else obj, name, value)


def head_features(heads: list[int], head_dim: int, device=None) -> Tensor:
    """(len(heads) * head_dim,): the features of the given heads in a concatenation of heads."""
    return torch.tensor([h * head_dim + d for h in heads for d in range(head_dim)], dtype=torch.long, device=device)


def fused_features(fused: str, heads: list[int], head_dim: int, n_heads: int, device=None) -> Tensor:
    """The output features of a fused Q/K/V projection over `n_heads` heads that belong to `heads`:
    "blocks" (Q | K | V, each n_heads * head_dim wide) or "per_head" (head h's q, k, v at
    h * 3 * head_dim onwards)."""
    if fused == "blocks":
        idx, width = head_features(heads, head_dim, device), n_heads * head_dim
        return torch.cat([idx, idx + width, idx + 2 * width])
    if fused == "per_head":
        return head_features(heads, 3 * head_dim, device)
    raise ValueError(f"unknown fused Q/K/V arrangement {fused!r}; expected 'blocks' or 'per_head'")


# --------------------------------------------------------------------------------------------
# Gate slots and physical pruning, as the family entry says


class LMHeadGates(GatedProjection):
    """The gated W^O of one language-model attention; satisfies seq2seq.HeadSlots."""

    def __init__(self, attention: nn.Module, family: LMFamily):
        original = attribute(attention, family.out_proj)
        proj, head_dim = _conv1d_to_linear(original), int(attribute(attention, family.head_dim))
        super().__init__(proj, proj.in_features // head_dim, head_dim)
        self.family = family.name
        self.transposed = proj is not original  # W^O was a Conv1D (weight (in, out)): the export writes one back
        # The attention this projection belongs to, kept out of the module tree (no cycle).
        self._owner = [attention, family]
        if hasattr(attention, "num_key_value_groups"):  # grouped-query: which KV head each query head reads
            groups = attention.num_key_value_groups
            self.kv_of = [h // groups for h in range(self.n_heads)]

    @property
    def attention(self) -> nn.Module:
        return self._owner[0]

    @property
    def n_kv_heads(self) -> int:
        """The key/value heads the remaining query heads read (grouped-query attention shares
        them); what a decoder's cache holds per token and layer. A layer without heads counts 0,
        though transformers' cache still gets one placeholder head from it (_silence)."""
        return len(set(self.kv_of)) if hasattr(self, "kv_of") else self.n_heads

    def keep_heads(self, heads: list[int]) -> None:
        """Remove every other head physically: its Q, K, V features (GQA: a KV head goes with the
        last query head that reads it) and W^O's columns."""
        attention, family = self._owner
        heads = self._checked(heads)
        previous_kv, before = getattr(self, "kv_of", None), self.n_heads
        idx = self._drop_heads(heads)  # (H' * Dh,) the kept query features
        Dh = self.head_dim
        if family.fused is not None:
            path = family.qkv[0]
            kept = fused_features(family.fused, heads, Dh, before, idx.device)
            set_attribute(attention, path, _output_features(attribute(attention, path), kept))
        else:
            kv_idx = idx
            if previous_kv is not None:
                kept_kv = sorted({previous_kv[h] for h in heads})
                kv_idx = head_features(kept_kv, Dh, idx.device)
                self.kv_of = [kept_kv.index(previous_kv[h]) for h in heads]
            for path, rows in zip(family.qkv, (idx, kv_idx, kv_idx)):
                set_attribute(attention, path, _output_features(attribute(attention, path), rows))
            if previous_kv is not None:
                _group_explicitly(attention, self)
        if family.n_heads_attr:
            set_attribute(attention, family.n_heads_attr, len(heads))
        if family.width_attr:
            set_attribute(attention, family.width_attr, len(heads) * Dh)
        if not heads:
            _silence(attention, self, family)


def _output_features(layer: nn.Module, idx: Tensor) -> nn.Module:
    """A copy of an nn.Linear or a transformers Conv1D with only the output features `idx`."""
    return linear_rows(layer, idx) if isinstance(layer, nn.Linear) else _conv1d_columns(layer, idx)


def _conv1d_to_linear(conv: nn.Module) -> nn.Linear:
    """transformers' Conv1D (weight (in, out)) as the nn.Linear (weight (out, in)) it computes."""
    if isinstance(conv, nn.Linear):
        return conv
    linear = nn.Linear(conv.nx, conv.nf, device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.t())
        linear.bias.copy_(conv.bias)
    return linear


def _conv1d_columns(conv: nn.Module, idx: Tensor) -> nn.Module:
    """A copy of a transformers Conv1D with only the output features `idx`."""
    new = type(conv)(len(idx), conv.nx).to(device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(conv.weight[:, idx])
        new.bias.copy_(conv.bias[idx])
    return new


GROUPED_EAGER = "headcount_grouped_eager"


def _grouped_eager(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
    """transformers' eager attention of the module's own architecture, after gathering the keys and
    values of each query head's KV head: query (B, H', T, Dh), key/value (B, KV', Tk, Dh)."""
    index = torch.tensor(module.out_proj_gates.kv_of, dtype=torch.long, device=key.device)
    eager = sys.modules[type(module).__module__].eager_attention_forward
    return eager(module, query, key.index_select(1, index), value.index_select(1, index), attention_mask, **kwargs)


def _group_explicitly(attention: nn.Module, gates: LMHeadGates) -> None:
    """A GQA attention after keep_heads: query heads read their KV head through `gates.kv_of`.
    The module gets a config copy naming `_grouped_eager` (the model's mask, built from the model's
    config, stays eager's); num_key_value_groups 1 makes transformers' repeat_kv a no-op."""
    from transformers import AttentionInterface

    if GROUPED_EAGER not in AttentionInterface._global_mapping:
        AttentionInterface.register(GROUPED_EAGER, _grouped_eager)
    if attention.config._attn_implementation != GROUPED_EAGER:
        attention.config = copy.copy(attention.config)
        attention.config._attn_implementation = GROUPED_EAGER
    attention.num_key_value_groups = 1
    object.__setattr__(attention, "out_proj_gates", gates)  # not a submodule: o_proj is already


def _silence(attention: nn.Module, gates: LMHeadGates, family: LMFamily) -> None:
    """An attention with no heads left: its output is W^O's bias. transformers cannot run it (no head
    count to reshape a (B, T, 0) projection to). A decoder's cache still gets one all-zero KV head
    per token: transformers reads the number of tokens seen off the cache."""
    if family.layout == "bert":
        def self_attention(hidden_states, *args, **kwargs):  # BertSelfAttention: contexts, probs
            B, T, _ = hidden_states.shape
            return hidden_states.new_zeros(B, T, 0), hidden_states.new_zeros(B, 0, T, T)

        attention.self.forward = self_attention
        return

    def forward(hidden_states, *args, **kwargs):
        B, T, _ = hidden_states.shape
        # transformers' name for the cache: `cache` (5.24 on), `past_key_values`, GPT-NeoX's `layer_past`
        cache = next((kwargs[name] for name in ("cache", "past_key_values", "layer_past")
                      if kwargs.get(name) is not None), None)
        Tk = T
        if cache is not None:
            dummy = hidden_states.new_zeros(B, 1, T, gates.head_dim)
            keys, _ = cache.update(dummy, dummy, attention.layer_idx)
            Tk = keys.shape[2]
        return gates(hidden_states.new_zeros(B, T, 0)), hidden_states.new_zeros(B, 0, T, Tk)

    attention.forward = forward


def _install_gates(hf: nn.Module, family: LMFamily) -> None:
    for attention in family.attentions(hf):
        if not isinstance(attribute(attention, family.out_proj), LMHeadGates):
            set_attribute(attention, family.out_proj, LMHeadGates(attention, family))


def _gates_of(attention: nn.Module, family: LMFamily) -> LMHeadGates:
    return attribute(attention, family.out_proj)


# --------------------------------------------------------------------------------------------
# The adapters


def _first(value) -> int | None:
    return int(value[0]) if isinstance(value, (list, tuple)) else (None if value is None else int(value))


def special_ids_of(config, tokenizer=None) -> SpecialIds:
    """The ids an analysis needs, from the tokenizer where given, else from the config. Causal LM:
    bos = BOS (or EOS where the model names no BOS: Qwen), pad = the pad id or else EOS. Masked LM:
    bos = [CLS]/<s>, eos = [SEP]/</s>, mask = [MASK]/<mask>."""
    family = family_of(config, LANGUAGE_MODELS)

    def pick(tokenizer_attr: str, config_attr: str) -> int | None:
        value = getattr(tokenizer, tokenizer_attr, None) if tokenizer is not None else None
        return _first(value) if value is not None else _first(getattr(config, config_attr, None))

    if family.model_kind == "decoder_only":
        eos = pick("eos_token_id", "eos_token_id")
        bos = pick("bos_token_id", "bos_token_id")
        bos = eos if bos is None else bos
        pad = pick("pad_token_id", "pad_token_id")
        pad = eos if pad is None else pad
        unk = pick("unk_token_id", "unk_token_id")
        if eos is None:
            raise HeadcountError(f"{family.name} model: neither its tokenizer nor its config names an EOS id; "
                                 f"set eos_token_id in its config.json")
        return SpecialIds(pad=pad, bos=bos, eos=eos, unk=unk)
    bos, eos = pick("cls_token_id", "bos_token_id"), pick("sep_token_id", "eos_token_id")
    pad, mask, unk = pick("pad_token_id", "pad_token_id"), pick("mask_token_id", "mask_token_id"), \
        pick("unk_token_id", "unk_token_id")
    if None in (bos, eos, pad):
        raise HeadcountError(f"{family.name} model: cannot tell its [CLS]/[SEP]/[PAD] ids (got {bos}, {eos}, {pad}) "
                             f"without its tokenizer; load it from a directory that holds the tokenizer too")
    return SpecialIds(pad=pad, bos=bos, eos=eos, unk=unk, mask=mask)


class _HFLanguageModel(HeadMasks, nn.Module):
    """What the two adapters share: gates, head masks, checkpoints."""

    model_kind = "decoder_only"
    # eager attention returns each layer's map without output_attentions (attention_stream.py)
    maps_without_weights = True
    family_kind: str | None = None  # the families' kind it wraps, where not its own (hf_sentence's: encoder_only)

    def __init__(self, hf: nn.Module, special: SpecialIds | None = None):
        super().__init__()
        self.family = family_of(hf.config, LANGUAGE_MODELS)
        if self.family.model_kind != (self.family_kind or self.model_kind):
            raise HeadcountError(f"a {self.family.name} model is {self.family.model_kind}; wrap it in "
                                 f"{'HFCausalLM' if self.family.model_kind == 'decoder_only' else 'HFMaskedLM'}")
        if hasattr(hf, "set_attn_implementation"):
            hf.set_attn_implementation("eager")  # the only one that returns probabilities
        else:  # pragma: no cover - older transformers
            hf.config._attn_implementation = "eager"
        self.hf = hf
        self.special = special if special is not None else special_ids_of(hf.config)
        config = hf.config
        positions = int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 512))
        if self.family.name == "roberta":  # positions count from padding_idx + 1
            positions -= int(config.pad_token_id) + 1
        self.max_positions = positions
        self.d_model = int(config.hidden_size)
        _install_gates(hf, self.family)

    @property
    def config(self):
        return self.hf.config

    @property
    def cfg(self):
        """The transformers config (training.loop.train records `cfg.to_dict()`)."""
        return self.hf.config

    def _check_length(self, n: int) -> None:
        if n > self.max_positions:
            raise ValueError(f"sequence of {n} tokens exceeds the model's {self.max_positions} positions")

    def logits(self, hidden: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, V): the model's own output layer (the MLM head for a masked LM)."""
        return self.hf.get_submodule(self.family.head_path)(hidden)

    # ---------------------------------------------------------------- heads

    def attention_modules(self) -> dict[str, list[LMHeadGates]]:
        kind = "dec_self" if self.model_kind == "decoder_only" else "enc_self"
        return {kind: [_gates_of(a, self.family) for a in self.family.attentions(self.hf)]}

    def lrp_forward(self):
        """This architecture re-run with LRP rules (hf_lm_lrp.py, imported only when LRP runs)."""
        from headcount.models.hf_lm_lrp import lrp_forward_of

        return lrp_forward_of(self)

    # ---------------------------------------------------------------- checkpoints

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """A headcount checkpoint: weights (gates and pruned heads included), the transformers
        config, which original heads remain, the special ids."""
        state = dict(extra or {})
        state.update({
            "family": self.family.name,
            "model_kind": self.model_kind,
            "model": self.state_dict(),
            "model_config": self.config.to_json_string(use_diff=False),
            "head_counts": self.head_counts(),
            "kept_heads": {kind: [list(m.kept) for m in modules] for kind, modules in self.attention_modules().items()},
            "special": dataclasses.asdict(self.special),
        })
        save_checkpoint(path, state)

    @staticmethod
    def from_checkpoint(state: dict) -> _HFLanguageModel:
        from headcount.models.hf_source import rebuilt_config

        config = rebuilt_config(state)
        family = family_of(config, LANGUAGE_MODELS)
        cls = HFCausalLM if family.model_kind == "decoder_only" else HFMaskedLM
        special = state["special"]
        special = SpecialIds(**{**special, "forced": tuple(special.get("forced", ()))})
        model = cls(_auto_class(family).from_config(config, trust_remote_code=False), special=special)
        return load_weights_with_heads(model, state["kept_heads"], state["model"])


def _auto_class(family: LMFamily):
    import transformers

    if family.model_kind == "decoder_only":
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForMaskedLM


class HFCausalLM(_HFLanguageModel):
    """A transformers causal LM (GPT-2, GPT-NeoX, OPT, Llama, Qwen2, Qwen3) as a decoder_only headcount model:
    src is empty, tgt_in = BOS + x[:-1], logits are aligned with tgt_out = x."""

    model_kind = "decoder_only"

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list]:
        """An empty memory (B, 0, D), an empty padding mask (B, 0) and no attention: there is no encoder."""
        B = src.shape[0]
        weight = self.hf.get_input_embeddings().weight
        return (weight.new_zeros(B, 0, self.d_model), torch.zeros(B, 0, dtype=torch.bool, device=weight.device), [])

    def decode(self, tgt_in: Tensor, memory: Tensor | None = None, src_pad: Tensor | None = None,
               need_weights: bool = False, cache: Any = None, start: int = 0) -> tuple[Tensor, list, list]:
        """The language model over tgt_in (B, T) -> hidden (B, T, D), per layer self-attention probs
        (B, H, T, start + T) (or None), [] (no cross-attention). memory and src_pad are ignored.

        Without a cache, padding (`special.decoder_positions`) is masked as a key; with a cache
        (new_cache()), tgt_in holds only new tokens, all real (search feeds one per hypothesis), and
        `start` must be the number of tokens the cache holds."""
        if cache is not None:
            held = cache.get_seq_length()
            if held != start:
                raise ValueError(f"decode: start={start} but the cache holds {held} tokens")
            mask = None
        elif start != 0:
            raise ValueError("decode: without a cache the text must start at position 0")
        else:
            mask = self.special.decoder_positions(tgt_in).long()
        self._check_length(start + tgt_in.shape[1])
        base = self.hf.base_model
        out = base(input_ids=tgt_in, attention_mask=mask, **{_cache_argument(type(base)): cache},
                   use_cache=cache is not None, output_attentions=need_weights)
        n = len(self.family.attentions(self.hf))
        return out.last_hidden_state, list(out.attentions) if need_weights else [None] * n, []

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> tuple[Tensor, dict | None]:
        """src (B, 0) (ignored), tgt_in (B, T) -> logits (B, T, V), {"dec_self": [...]} or None."""
        hidden, probs, _ = self.decode(tgt_in, need_weights=need_weights)
        return self.logits(hidden), ({"dec_self": probs} if need_weights else None)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def reorder_cache(self, cache, rows: Tensor) -> None:
        """Keep the given batch rows of the cache (beam search), in place."""
        cache.reorder_cache(rows)

    def encoder_parameters(self):
        raise NotAvailableForKind(f"a {self.family.name} model is decoder-only: it has no encoder, so the "
                                  f"encoder-only pruning setting does not apply; prune all its heads (dec_self)")


class HFMaskedLM(_HFLanguageModel):
    """A transformers masked LM (BERT, RoBERTa) as an encoder_only headcount model: src = BOS + x'
    + EOS, tgt_in empty, logits (B, S, V) aligned with src (and tgt_out)."""

    model_kind = "encoder_only"

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list]:
        """src (B, S) -> hidden (B, S, D), padding mask (B, S) True at padding, per layer probs
        (B, H, S, S) or None."""
        self._check_length(src.shape[1])
        src_pad = src.eq(self.special.pad)
        out = self.hf.base_model(input_ids=src, attention_mask=(~src_pad).long(), output_attentions=need_weights)
        n = len(self.family.attentions(self.hf))
        return out.last_hidden_state, src_pad, list(out.attentions) if need_weights else [None] * n

    def decode(self, *args, **kwargs):
        raise NotAvailableForKind(f"a {self.family.name} model is encoder-only (masked LM): it has no decoder; "
                                  f"use encode and logits (search and decoder analyses do not apply)")

    def new_cache(self):
        raise NotAvailableForKind(f"a {self.family.name} model is encoder-only: it decodes nothing, so it has no cache")

    def reorder_cache(self, cache, rows: Tensor) -> None:
        self.new_cache()

    def forward(self, src: Tensor, tgt_in: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, dict | None]:
        """src (B, S) -> logits (B, S, V), {"enc_self": [...]} or None; tgt_in (B, 0) is ignored."""
        hidden, _, probs = self.encode(src, need_weights)
        return self.logits(hidden), ({"enc_self": probs} if need_weights else None)

    def encoder_parameters(self):
        """The embeddings and the encoder layers (the base model; BERT's pooler where present); not
        the MLM head's own transform. The head's output layer is tied to the word embeddings, which
        are among these."""
        return self.hf.base_model.parameters()


for _name in names(*LANGUAGE_MODELS):
    register_family(_name)(_HFLanguageModel.from_checkpoint)


# --------------------------------------------------------------------------------------------
# Loading and importing


def is_language_model(name_or_dir: str | os.PathLike, offline: bool | None = None) -> bool:
    """Whether the pretrained model's config is a language model's architecture (families.FAMILIES)."""
    from transformers import AutoConfig

    source = resolve_source(name_or_dir, offline)
    try:
        config = AutoConfig.from_pretrained(source.name, **source.kwargs)
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None
    return config.model_type in names(*LANGUAGE_MODELS)


def dequantised(hf: nn.Module) -> nn.Module:
    """A model transformers dequantised on loading (a GGUF file) as the plain model it now is: the
    quantisation record dropped from its config and the model (in place; returns it). Kept, it
    stops save_pretrained ("quantized with gguf and is not serializable"), the config's rebuild
    (AutoConfig.for_model) and headcount's checkpoints (the record holds a QuantizationMethod
    object, which the safe loader refuses). A model that is still quantised (its weights are not
    plain floating-point tensors) is refused: headcount gates and trains plain weights."""
    quantizer = getattr(hf, "hf_quantizer", None)
    record = getattr(hf.config, "quantization_config", None)
    method = record.get("quant_method") if isinstance(record, dict) else getattr(record, "quant_method", None)
    method = getattr(method, "value", method)
    if quantizer is None and method is None:
        return hf
    if method not in (None, "gguf") or any(not p.is_floating_point() for p in hf.parameters()):
        raise HeadcountError(f"model: quantised with {method or type(quantizer).__name__}, whose weights are not plain "
                             f"floating-point tensors; load it unquantised (transformers' from_pretrained without "
                             f"a quantization_config), or from a GGUF file, which transformers dequantises")
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    hf.hf_quantizer, hf.is_quantized = None, False
    return hf


@gguf_read_once()
def load_transformers_lm(name_or_dir: str | os.PathLike, offline: bool | None = None,
                         dtype: torch.dtype = torch.float32, allow_weights: dict | None = None):
    """A hub id, a local directory or a GGUF file -> (the transformers model, in eval mode, its
    tokenizer or None, its config): a plain transformers model that save_pretrained writes (a
    GGUF's dequantised weights without the quantisation record, `dequantised`). A checkpoint
    missing weights of the model (e.g. a sentence encoder without the masked-LM head) or holding
    weights it does not use is refused unless `allow_weights` names them
    (hf_source.check_loading_report)."""
    from transformers import AutoConfig, AutoTokenizer

    source = resolve_source(name_or_dir, offline)
    try:
        config = AutoConfig.from_pretrained(source.name, **source.kwargs)
        family = family_of(config, LANGUAGE_MODELS)
        hf, report = _auto_class(family).from_pretrained(source.name, **source.kwargs, dtype=dtype,
                                                         attn_implementation="eager", output_loading_info=True)
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None
    except PickleRefusal as error:  # a pytorch_model.bin that pickles code: refused, with the safe way forward
        raise refused_pickle(name_or_dir, error) from None
    check_loading_report(source.label, type(hf).__name__, report, allow_weights)
    if source.gguf_file is not None:
        dequantised(hf)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.name, **source.kwargs)
    except (OSError, ValueError):
        tokenizer = None  # ids from the config alone
    return hf.eval(), tokenizer, config


def load_pretrained_lm(name_or_dir: str | os.PathLike, offline: bool | None = None,
                       dtype: torch.dtype = torch.float32,
                       allow_weights: dict | None = None) -> HFCausalLM | HFMaskedLM:
    """A hub id, a local directory or a GGUF file -> the adapter of its kind, in eval mode, over
    load_transformers_lm's model; special ids from its tokenizer where it has one. A sentence
    encoder (an encoder analysed through its pooled embedding) is hf_sentence.load_sentence_encoder's."""
    hf, tokenizer, config = load_transformers_lm(name_or_dir, offline=offline, dtype=dtype,
                                                 allow_weights=allow_weights)
    cls = HFCausalLM if family_of(config, LANGUAGE_MODELS).model_kind == "decoder_only" else HFMaskedLM
    return cls(hf, special=special_ids_of(config, tokenizer)).eval()


def import_pretrained_lm(name_or_dir: str | os.PathLike, model_out: str | os.PathLike,
                         tokenizer_dir: str | os.PathLike | None = None, offline: bool | None = None,
                         allow_weights: dict | None = None, model: nn.Module | None = None) -> HFCausalLM | HFMaskedLM:
    """What a workflow stage calls for a pretrained language model: write a headcount checkpoint
    (loading.load_model reads it) and the tokenizer's files with LM_TOKENIZER_MANIFEST (so that
    loading.open_tokenizer(tokenizer_dir, "source" or "target") gives its one tokenizer). `model`:
    the adapter already loaded (a sentence encoder, loading.import_pretrained), else
    load_pretrained_lm's; the checkpoint records its kind."""
    if model is None:
        model = load_pretrained_lm(name_or_dir, offline=offline, allow_weights=allow_weights)
    if tokenizer_dir is not None:
        tokenizer = load_lm_tokenizer(name_or_dir, offline=offline)
        Path(tokenizer_dir).mkdir(parents=True, exist_ok=True)
        tokenizer.tokenizer.save_pretrained(str(tokenizer_dir))
        (Path(tokenizer_dir) / LM_TOKENIZER_MANIFEST).write_text(json.dumps(
            {"family": model.family.name, "model_kind": model.model_kind, "source": str(name_or_dir)}) + "\n",
            encoding="utf-8")
    model.save(model_out, extra={"pretrained": {"source": str(name_or_dir), "family": model.family.name}})
    return model


__all__ = ["HFCausalLM", "HFMaskedLM", "LMHeadGates", "LMTokenizer", "LM_TOKENIZER_MANIFEST",
           "NotAvailableForKind", "LRPNotImplemented", "PretrainedModelUnavailable", "import_pretrained_lm",
           "dequantised", "is_language_model", "load_lm_tokenizer", "load_pretrained_lm", "load_transformers_lm",
           "special_ids_of"]
