"""Pretrained encoder-decoder models from HuggingFace transformers, as `Seq2SeqWithHeads` (seq2seq.py).

`HFSeq2Seq` wraps a transformers model so that every headcount analysis runs on it: MarianMT
(Helsinki-NLP's opus-mt models, the architecture of Voita et al. 2019), BART/mBART, M2M100/NLLB,
T5/mT5 and FSMT (fairseq's WMT19 models, facebook/wmt19-en-ru and its siblings). The transformers
model runs as it is (its own forward pass, eager attention so that it can return attention
probabilities); the adapter only replaces each attention's output projection by `HeadGates`, which
receives the concatenated per-head contexts (B, T, H * Dh; FSMT: T, B, H * Dh) and applies, per
head, the `head_context` hook, the fixed 0/1 `head_mask` and the Hard Concrete gates before the
original projection: MultiHead = Concat_i(g_i head_i) W^O (Voita et al. 2019, eq. 2).

Loading: `load_pretrained(name_or_dir)` reads a hub id or a local directory written by
`save_pretrained` / `hf download`; `load_tokenizers(name_or_dir)` gives the source and target
`Tokenizer`s. A workflow stage calls `import_pretrained(name_or_dir, model_out, tokenizer_dir)` once:
it writes a headcount checkpoint (family = the transformers model type; loading.load_model reads it
back, pruned heads and gates included) and the tokenizer's files, which `loading.open_tokenizer(dir, side)`
opens for the later stages. headcount.testing.tiny_seq2seq writes opus-mt- and wmt19-shaped
directories for tests and dry runs where the hub is out of reach.

What differs between families (each one's `EncoderDecoderFamily` entry in families.FAMILIES): module
names, how logits are formed (Marian and BART add `final_logits_bias`; T5 scales the hidden state by
d_model^-0.5 where its saved config tied the embeddings, mT5 never: `EncoderDecoderFamily.output_scale`;
FSMT's output layer is its decoder's `output_projection`, no bias), what the decoder starts from
(Marian, T5 and mT5: their pad id; BART, mBART, M2M100, FSMT: EOS), and what the LRP forward pass
must re-create (hf_lrp.py).
FSMT is transformers' port of fairseq's code: its attention works on time-major tensors (T, B, D)
(`HeadGates` sees them so; a pruned layer runs `_time_major_attention`), its decoder takes its
masks as positional arguments, builds no causal mask when a cache is in use (transformers' own full
forward pass is causal only with use_cache=False) and applies the output layer itself
(`_fsmt_decoder`), source and target have vocabularies of their own, and its sinusoidal positions
are an ordinary parameter, which the adapter freezes (fairseq's are constants). Its tokenizer
(Moses, then BPE) encodes with the source side's vocabulary and Moses language whatever the side;
`load_tokenizers` gives the target side a tokenizer with the two swapped (`_fsmt_sides`).
T5's relative position bias is computed once, in the first layer, for all heads of every layer: a
T5 layer whose heads were removed adds the bias of its remaining heads and passes on the bias of
all of them (`_slice_position_bias`).
Multilingual checkpoints (mBART-50, M2M100, NLLB) expect language tags: the source language's
tag before the source text, the target language's forced after the decoder's start token. The
tokenizer gives both (`HFTokenizer`: its special tokens before the text are part of the ids), and
`import_pretrained` makes the target side's into what search forces (`SpecialIds.forced`), so
search picks what transformers' generate picks with `forced_bos_token_id`. Tokenizers that put
the language code after EOS (mBART-cc25) are refused with a message.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh head size, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import inspect
import os
import re
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headcount.data.special import SPECIAL_PIECE, SpecialIds
from headcount.io import HeadcountError
from headcount.models.checkpoint import PickleRefusal, refused_pickle, save_checkpoint
from headcount.models.families import ENCODER_DECODER, EncoderDecoderFamily, family_of, names
from headcount.models.head_gates import GatedProjection, HeadMasks, linear_rows, load_weights_with_heads
from headcount.models.hf_source import PretrainedModelUnavailable, check_loading_report, resolve_source, unavailable
from headcount.models.seq2seq import ATTENTION_TYPES, register_family

# --------------------------------------------------------------------------------------------
# Gate slots on an attention's output projection (head_gates.py holds what the LM adapters share)


class HeadGates(GatedProjection):
    """An attention module's output projection with per-head gates in front; satisfies `HeadSlots`.

    Replaces the transformers attention's output projection (out_proj, or T5's o). Its input is the
    concatenation of the head contexts, (B, T, H * Dh), or (T, B, H * Dh) where the family is
    time-major (FSMT); the original projection is `proj`, given the input's layout.
    """

    def __init__(self, attention: nn.Module, family: EncoderDecoderFamily):
        super().__init__(getattr(attention, family.out_name), int(getattr(attention, family.heads_attr)),
                         int(getattr(attention, family.head_dim_attr)), time_major=family.time_major)
        self.family = family.name
        # The attention this projection belongs to, kept out of the module tree (no cycle).
        self._owner = [attention, family]

    @property
    def attention(self) -> nn.Module:
        return self._owner[0]

    def keep_heads(self, heads: list[int]) -> None:
        """Remove every other head physically: rows of Q, K, V and columns of W^O."""
        attention, family = self._owner
        heads = self._checked(heads)
        idx = self._drop_heads(heads)
        for name in family.qkv_names:
            setattr(attention, name, linear_rows(getattr(attention, name), idx))
        setattr(attention, family.heads_attr, len(heads))
        if family.t5_layout:
            attention.inner_dim = len(heads) * self.head_dim
            _slice_position_bias(attention, self)
        if family.time_major:
            # FSMT's forward reshapes the contexts to the model's width: it cannot run fewer heads.
            attention.forward = types.MethodType(_time_major_attention, attention)
        elif len(heads) == 0:
            _silence(attention, self)


@functools.cache
def _cache_argument(module_type: type) -> str:
    """The name a module class's forward takes the key/value cache under: `cache` from transformers
    5.24 on (the old name still works there, with a deprecation warning, until 5.40). Read once per
    class: decode calls it at every search step."""
    return "cache" if "cache" in inspect.signature(module_type.forward).parameters else "past_key_values"


def _full_position_bias(attention: nn.Module, gates: HeadGates, hidden_states: Tensor,
                        key_value_states: Tensor | None, position_bias: Tensor | None, cache: Any) -> Tensor:
    """T5: the relative position bias of all the layer stack's original heads, (1, H, T, Tk), as the
    unpruned model passes it from layer to layer: the one given, or the one this layer computes
    (the first self-attention layer has the bias table, read before the cache is updated; other
    layers start from zeros)."""
    if position_bias is not None:
        return position_bias
    T = hidden_states.shape[1]
    if attention.has_relative_attention_bias:
        past = cache.get_seq_length(attention.layer_idx) if cache is not None else 0
        return attention.compute_bias(T, past + T, device=hidden_states.device, past_seen_tokens=past)
    Tk = T if key_value_states is None else key_value_states.shape[1]
    if cache is not None and key_value_states is None:
        Tk = cache.get_seq_length(attention.layer_idx) + T
    return hidden_states.new_zeros(1, gates.original_heads, T, Tk)


def _slice_position_bias(attention: nn.Module, gates: HeadGates) -> None:
    """T5 after keep_heads: the layer adds the position bias of its remaining heads only, and hands
    the next layer the bias of all the original heads, as the unpruned layer would (transformers
    computes the bias once, in the first layer, for every head of every layer)."""
    if getattr(attention, "_headcount_sliced", False):
        return  # the wrapper reads gates.kept, which later keep_heads calls update
    original = attention.forward

    def forward(hidden_states, mask=None, key_value_states=None, position_bias=None, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        full = _full_position_bias(attention, gates, hidden_states, key_value_states, position_bias, cache)
        kept = torch.tensor(gates.kept, dtype=torch.long, device=full.device)
        out, _, weights = original(hidden_states, mask=mask, key_value_states=key_value_states,
                                   position_bias=full.index_select(1, kept), **kwargs)
        return out, full, weights

    attention.forward = forward
    attention._headcount_sliced = True


def _silence(attention: nn.Module, gates: HeadGates) -> None:
    """An attention with no heads left: its output is W^O's bias. transformers cannot run it (a
    (B, T, 0) projection has no head count to reshape to), so its forward is replaced. The
    self-attention cache still gets one all-zero head per step: transformers reads the decoded
    length off the first layer's cache."""

    t5 = gates._owner[1].t5_layout

    def forward(hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, **kwargs):
        # transformers 5.24 renamed the attention's `past_key_values` argument to `cache`.
        if past_key_values is None:
            past_key_values = kwargs.get("cache")
        if t5:  # T5 passes the mask as `mask` and the relative position bias along the layers
            bias = _full_position_bias(attention, gates, hidden_states, key_value_states,
                                       kwargs.get("position_bias"), past_key_values)
        B, T, D = hidden_states.shape
        out = hidden_states.new_zeros(B, T, D)
        if gates.proj.bias is not None:
            out = out + gates.proj.bias
        Tk = T if key_value_states is None else key_value_states.shape[1]
        if past_key_values is not None and key_value_states is None:
            layers = getattr(past_key_values, "self_attention_cache", past_key_values)
            dummy = hidden_states.new_zeros(B, 1, T, gates.head_dim)
            keys, _ = layers.update(dummy, dummy, attention.layer_idx)
            Tk = keys.shape[2]
        if t5:
            return out, bias, hidden_states.new_zeros(B, 0, T, Tk)
        return out, hidden_states.new_zeros(B, 0, T, Tk)

    attention.forward = forward


def _time_major_attention(self: nn.Module, query: Tensor, key: Tensor | None, key_padding_mask: Tensor | None = None,
                          layer_state: Any = None, attn_mask: Tensor | None = None, output_attentions: bool = False,
                          **kwargs) -> tuple[Tensor, Tensor | None]:
    """FSMT's attention after keep_heads (bound to the attention module: a deep copy keeps its own).

    The same computation as transformers' forward, on the heads that remain: query (T, B, D), key
    (Tk, B, D), key_padding_mask (B, Tk) True at padding, attn_mask added to the scores. The
    self-attention's keys and values are appended to the cache at each step; the cross-attention's
    are computed at the first step and reused. A layer with no heads left outputs W^O's bias and
    still writes one all-zero head to the cache: the decoder reads the number of decoded tokens
    (its positions) off the first layer's self-attention cache.
    """
    gates = self.out_proj
    H, Dh, layer = gates.n_heads, gates.head_dim, self.layer_idx
    T, B, _ = query.shape
    cross = self.encoder_decoder_attention
    store = None
    if layer_state is not None:
        store = getattr(layer_state, "cross_attention_cache" if cross else "self_attention_cache", layer_state)

    def split(z: Tensor) -> Tensor:  # (L, B, H * Dh) -> (B, H, L, Dh)
        return z.view(z.shape[0], B, H, Dh).permute(1, 2, 0, 3)

    if cross and store is not None and layer_state.is_updated.get(layer):
        k, v = store.layers[layer].keys[:, :H], store.layers[layer].values[:, :H]
    else:
        source = key if cross else query
        k, v = split(self.k_proj(source)), split(self.v_proj(source))  # (B, H, Tk, Dh)
        if store is not None:
            if H == 0:
                k = v = k.new_zeros(B, 1, k.shape[2], Dh)
            k, v = store.update(k, v, layer)
            k, v = k[:, :H], v[:, :H]
            if cross:
                layer_state.is_updated[layer] = True
    q = split(self.q_proj(query) * self.scaling)  # (B, H, T, Dh)
    scores = q @ k.transpose(-1, -2)  # (B, H, T, Tk)
    if attn_mask is not None:
        scores = scores + attn_mask
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], torch.finfo(scores.dtype).min)
    probs = scores.softmax(dim=-1)
    ctx = nn.functional.dropout(probs, p=self.dropout, training=self.training) @ v  # (B, H, T, Dh)
    out = self.out_proj(ctx.permute(2, 0, 1, 3).reshape(T, B, H * Dh))
    return out, probs if output_attentions else None


@contextmanager
def _without_output_layer(decoder: nn.Module):
    """FSMT's decoder applies the output layer itself; decode returns the hidden state before it
    (logits applies it), so the layer is bypassed for the call rather than computed twice."""
    projection = decoder.output_projection
    decoder.output_projection = nn.Identity()
    try:
        yield
    finally:
        decoder.output_projection = projection


def _fsmt_decoder(decoder: nn.Module, tgt_in: Tensor, memory: Tensor, src_pad: Tensor, cache: Any, start: int,
                  need_weights: bool):
    """FSMT's decoder over tgt_in (B, T), the cache holding `start` tokens. It takes its masks as
    positional arguments: the source's attention mask (1 at real tokens), no target padding mask
    (as the other families: padding follows the text, the causal mask keeps it from the real
    positions), and the causal mask (T, start + T), 0 where allowed and the dtype's minimum
    elsewhere, as transformers builds it; transformers gives none whenever a cache is in use."""
    T = tgt_in.shape[1]
    dtype = decoder.embed_tokens.weight.dtype
    future = torch.ones(T, start + T, dtype=torch.bool, device=tgt_in.device).triu(start + 1)
    causal = torch.zeros(T, start + T, dtype=dtype, device=tgt_in.device).masked_fill(future, torch.finfo(dtype).min)
    with _without_output_layer(decoder):
        return decoder(tgt_in, memory, (~src_pad).long(), None, causal, **{_cache_argument(type(decoder)): cache},
                       use_cache=cache is not None, output_attentions=need_weights)


# --------------------------------------------------------------------------------------------
# The adapter


class HFSeq2Seq(HeadMasks, nn.Module):
    """A transformers encoder-decoder model as `Seq2SeqWithHeads`."""

    def __init__(self, hf: nn.Module, forced: tuple[int, ...] | None = None):
        """forced: what search forces after the start token (SpecialIds.forced; import_pretrained
        takes it from the target side's tokenizer); None: the model's own forced_bos_token_id."""
        super().__init__()
        self.family = family_of(hf.config, (ENCODER_DECODER,))
        if hasattr(hf, "set_attn_implementation"):
            hf.set_attn_implementation("eager")  # the only one that returns probabilities
        else:  # pragma: no cover - older transformers
            hf.config._attn_implementation = "eager"
        self.hf = hf
        config = hf.config
        eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
        if forced is None:
            forced = _forced_bos(hf)
        self.special = SpecialIds(pad=config.pad_token_id, bos=_decoder_start(hf, eos), eos=eos,
                                  forced=tuple(int(t) for t in forced))
        self.max_positions = int(getattr(config, "max_position_embeddings", None)
                                 or getattr(config, "n_positions", None) or 512)
        self.d_model = int(config.d_model)
        if self.family.time_major:  # FSMT's sinusoids are a trainable parameter there, constants in fairseq
            for stack in self.family.stacks(hf):
                stack.embed_positions.weight.requires_grad_(False)
        for modules in self.family.attentions(hf).values():
            for attention in modules:
                if not isinstance(getattr(attention, self.family.out_name), HeadGates):
                    setattr(attention, self.family.out_name, HeadGates(attention, self.family))

    @property
    def config(self):
        return self.hf.config

    @property
    def cfg(self):
        """The transformers config: training.loop.train records `model.cfg.to_dict()` in its checkpoints
        and run fingerprints, as it does for headcount's ModelConfig."""
        return self.hf.config

    # ---------------------------------------------------------------- the forward pass

    def _check_length(self, n: int) -> None:
        if n > self.max_positions:
            raise ValueError(f"sequence of {n} tokens exceeds the model's {self.max_positions} positions")

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list]:
        """src (B, S) -> memory (B, S, D), padding mask (B, S), per layer probs (B, H, S, S) or None."""
        self._check_length(src.shape[1])
        src_pad = src.eq(self.special.pad)
        encoder, _ = self.family.stacks(self.hf)
        out = encoder(input_ids=src, attention_mask=(~src_pad).long(), output_attentions=need_weights)
        probs = list(out.attentions) if need_weights else [None] * len(self.family.attentions(self.hf)["enc_self"])
        return out.last_hidden_state, src_pad, probs

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor, need_weights: bool = False,
               cache: Any = None, start: int = 0) -> tuple[Tensor, list, list]:
        """-> hidden (B, T, D), per layer self probs (B, H, T, start + T), cross probs (B, H, T, S).

        With a cache (new_cache()), tgt_in holds only the new tokens; `start` must be the number of
        tokens the cache holds already (transformers takes the positions from the cache).
        """
        if cache is not None:
            held = cache.get_seq_length()
            if held != start:
                raise ValueError(f"decode: start={start} but the cache holds {held} tokens")
        elif start != 0:
            raise ValueError("decode: without a cache the target must start at position 0")
        self._check_length(start + tgt_in.shape[1])
        _, decoder = self.family.stacks(self.hf)
        if self.family.time_major:
            out = _fsmt_decoder(decoder, tgt_in, memory, src_pad, cache, start, need_weights)
        else:
            out = decoder(input_ids=tgt_in, encoder_hidden_states=memory, encoder_attention_mask=(~src_pad).long(),
                          **{_cache_argument(type(decoder)): cache}, use_cache=cache is not None,
                          output_attentions=need_weights)
        n = len(self.family.attentions(self.hf)["dec_self"])
        if need_weights:
            return out.last_hidden_state, list(out.attentions), list(out.cross_attentions)
        return out.last_hidden_state, [None] * n, [None] * n

    def logits(self, hidden: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, V), as the transformers model forms them (final_logits_bias included)."""
        scale = self.family.output_scale(self.config)
        if scale != 1.0:
            hidden = hidden * scale
        logits = self.family.output_layer(self.hf)(hidden)
        bias = getattr(self.hf, "final_logits_bias", None)
        return logits if bias is None else logits + bias.to(logits.dtype)

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> tuple[Tensor, dict | None]:
        memory, src_pad, enc = self.encode(src, need_weights)
        hidden, dec_self, dec_enc = self.decode(tgt_in, memory, src_pad, need_weights)
        attentions = {"enc_self": enc, "dec_self": dec_self, "dec_enc": dec_enc} if need_weights else None
        return self.logits(hidden), attentions

    def new_cache(self):
        from transformers import DynamicCache, EncoderDecoderCache

        return EncoderDecoderCache(DynamicCache(), DynamicCache())

    def reorder_cache(self, cache, rows: Tensor) -> None:
        """Keep the given batch rows of the cache (beam search), in place."""
        cache.reorder_cache(rows)

    # ---------------------------------------------------------------- heads

    def attention_modules(self) -> dict[str, list[HeadGates]]:
        """The gate slots by attention type, in layer order."""
        return {kind: [getattr(a, self.family.out_name) for a in modules]
                for kind, modules in self.family.attentions(self.hf).items()}

    def dims(self) -> dict[str, int]:
        """The sizes a from-scratch headcount Transformer needs to match this model."""
        c = self.config
        if self.family.t5_layout:
            return dict(d_model=c.d_model, n_heads=c.num_heads, d_ff=c.d_ff, enc_layers=c.num_layers,
                        dec_layers=c.num_decoder_layers, src_vocab=c.vocab_size, tgt_vocab=c.vocab_size)
        # FSMT: src_vocab_size and tgt_vocab_size (its vocab_size is the target's)
        return dict(d_model=c.d_model, n_heads=c.encoder_attention_heads, d_ff=c.encoder_ffn_dim,
                    enc_layers=c.encoder_layers, dec_layers=c.decoder_layers,
                    src_vocab=getattr(c, "src_vocab_size", None) or c.vocab_size,
                    tgt_vocab=getattr(c, "decoder_vocab_size", None) or c.vocab_size)

    def encoder_parameters(self):
        """The source side: token embeddings, encoder layers, the encoder's norms. Where the model
        shares one embedding between source, target and output layer (opus-mt, BART, T5), that
        embedding is among them, so encoder-only training also moves the target side's embedding
        (FSMT's source embedding is its own)."""
        encoder, _ = self.family.stacks(self.hf)
        return encoder.parameters()

    def lrp_forward(self):
        from headcount.models.hf_lrp import lrp_forward_of

        return lrp_forward_of(self)

    # ---------------------------------------------------------------- checkpoints

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        """A headcount checkpoint: the weights (gates and pruned heads included), the transformers config."""
        state = dict(extra or {})
        state.update({
            "family": self.family.name,
            "model": self.state_dict(),
            "model_config": self.config.to_json_string(use_diff=False),
            "head_counts": self.head_counts(),
            # Which original heads remain, not only how many: T5 slices its position bias by them.
            "kept_heads": {kind: [list(m.kept) for m in modules] for kind, modules in self.attention_modules().items()},
            "forced": list(self.special.forced),
        })
        save_checkpoint(path, state)

    @classmethod
    def from_checkpoint(cls, state: dict) -> HFSeq2Seq:
        from transformers import AutoModelForSeq2SeqLM

        from headcount.models.hf_source import rebuilt_config

        config = rebuilt_config(state)
        model = cls(AutoModelForSeq2SeqLM.from_config(config, trust_remote_code=False), forced=state.get("forced"))
        kept = state.get("kept_heads") or {kind: [list(range(n)) for n in counts]
                                             for kind, counts in state["head_counts"].items()}
        return load_weights_with_heads(model, kept, state["model"])


def _generation_setting(hf: nn.Module, name: str) -> int | None:
    """A token id generate reads: the generation config (read with a pretrained model) first, then
    the model config; None where neither sets it."""
    for config in (getattr(hf, "generation_config", None), hf.config):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def _decoder_start(hf: nn.Module, eos: int) -> int:
    """What the decoder input starts with: Marian and T5 their pad id, BART, M2M100 and FSMT EOS.
    mBART leaves it unset and starts from EOS followed by a language code."""
    start = _generation_setting(hf, "decoder_start_token_id")
    if start is not None:
        return start
    return int(hf.config.pad_token_id) if family_of(hf.config, (ENCODER_DECODER,)).t5_layout else int(eos)


def _forced_bos(hf: nn.Module) -> tuple[int, ...]:
    """The token transformers' generate forces after the start token, if the model names one:
    BART's <s>, a one-language model's tag."""
    token = _generation_setting(hf, "forced_bos_token_id")
    return () if token is None else (token,)


for _name in names(ENCODER_DECODER):
    register_family(_name)(HFSeq2Seq.from_checkpoint)


# --------------------------------------------------------------------------------------------
# Tokenizers


class HFTokenizer:
    """One side (source or target) of a transformers tokenizer as headcount's `Tokenizer`: the
    ids the tokenizer gives with its special tokens, less the EOS at the end (batching adds EOS).
    So a multilingual model's language tag comes first (mBART-50, M2M100, NLLB: the source
    language on the source side, the target language on the target side, which search then
    forces: SpecialIds.forced), BART's <s> too, and Marian, T5 and FSMT get the text alone.

    `decoding`: the tokenizer that turns this side's ids back into text, where it is not
    `tokenizer` (FSMT: each side's vocabulary and Moses language are those its tokenizer calls
    source, and the text of ids those it calls target; `_fsmt_sides`)."""

    def __init__(self, tokenizer, side: str, decoding=None):
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target', not {side!r}")
        self.tokenizer, self.side = tokenizer, side
        self.decoding = tokenizer if decoding is None else decoding
        self.prefix = self._prefix()

    def _ids(self, lines: list[str], special: bool) -> list[list[int]]:
        if self.side == "source":
            return self.tokenizer(list(lines), add_special_tokens=special)["input_ids"]
        return self.tokenizer(text_target=list(lines), add_special_tokens=special)["input_ids"]

    def _prefix(self) -> list[int]:
        """The ids the tokenizer puts before a text of this side; what it puts after must be EOS
        alone (or nothing), as batching ends every sentence with EOS."""
        probe = "a b c"
        full, text = self._ids([probe], True)[0], self._ids([probe], False)[0]
        starts = [k for k in range(len(full) - len(text) + 1) if full[k:k + len(text)] == text]
        if not text or not starts:
            raise HeadcountError(f"{type(self.tokenizer).__name__}: cannot tell its special tokens from the text "
                                 f"({full} with them, {text} without) on the {self.side} side")
        prefix, suffix = full[:starts[0]], full[starts[0] + len(text):]
        # FSMT's tokenizer ends a sentence with its separator </s> and names no EOS token.
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else self.tokenizer.sep_token_id
        unk = self.tokenizer.unk_token_id
        if unk is not None and unk in prefix:  # NLLB's tokenizer maps an unknown language code to <unk>
            lang = getattr(self.tokenizer, "src_lang" if self.side == "source" else "tgt_lang", None)
            raise HeadcountError(f"{type(self.tokenizer).__name__}: the {self.side} language code {lang!r} is not "
                                 f"one of this tokenizer's (it becomes <unk>); use the model's own codes")
        if suffix not in ([], [eos]):
            raise HeadcountError(
                f"{type(self.tokenizer).__name__} puts {self.tokenizer.convert_ids_to_tokens(suffix)} after a "
                f"{self.side} sentence; headcount ends every sentence with EOS alone, so a tokenizer that puts "
                f"a language code after EOS (mBART-cc25 and its fine-tuned models) is not supported: use a "
                f"model whose tokenizer puts the code first (mBART-50, M2M100, NLLB)")
        return prefix

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, lines: list[str]) -> list[list[int]]:
        return [self.prefix + ids for ids in self._ids(lines, False)]

    def pieces(self, line: str) -> list[str]:
        """The subword strings, one per id of encode([line])[0] (SPECIAL_PIECE for the prefix).
        BPE pieces that end a word with '</w>' (FSMT) are written as sentencepiece's are, the
        word-start marker before a word's first piece, Moses' escapes (&apos; ...) undone, so that
        they align with the text's words (roles.alignment)."""
        tok = self.tokenizer
        prefix = [SPECIAL_PIECE] * len(self.prefix)
        if self.side == "target" and hasattr(tok, "_switch_to_target_mode"):
            tok._switch_to_target_mode()  # Marian: the target side has its own sentencepiece model
            try:
                return prefix + tok.tokenize(line)
            finally:
                tok._switch_to_input_mode()
        return prefix + _word_end_pieces(tok.tokenize(line))

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Text of each id list, less the prefix (a language tag, which some tokenizers would
        write out as text) and the special tokens."""
        rows = [list(map(int, x)) for x in ids]
        n = len(self.prefix)
        rows = [row[n:] if n and row[:n] == self.prefix else row for row in rows]
        return self.decoding.batch_decode(rows, skip_special_tokens=True)


_WORD_END = "</w>"  # the end-of-word marker of XLM/FSMT's BPE


def _word_end_pieces(pieces: list[str]) -> list[str]:
    """BPE pieces with end-of-word markers ('cat</w>') -> sentencepiece's spelling ('▁cat'),
    Moses' XML escapes undone ('&apos;s</w>' -> "▁'s"); pieces without the marker are returned
    as they are. An escape split over several pieces is its character in the first of them and a
    zero-width space in the others (never the empty string, which is SPECIAL_PIECE): a character
    no word has, so that alignment puts them in the word of the one before."""
    if not any(p.endswith(_WORD_END) for p in pieces):
        return pieces
    out, word = [], []
    for k, piece in enumerate(pieces):
        word.append(piece.removesuffix(_WORD_END))
        if not piece.endswith(_WORD_END) and k + 1 < len(pieces):
            continue
        owner = [i for i, p in enumerate(word) for _ in p]  # the piece of each character of the word
        texts = [""] * len(word)
        for match in re.finditer(r"&(?:#\d+|#x[0-9a-fA-F]+|\w+);|.", "".join(word), flags=re.S):
            texts[owner[match.start()]] += html.unescape(match.group())
        out += ["\u2581" + texts[0], *(text or "\u200b" for text in texts[1:])]
        word = []
    return out


# --------------------------------------------------------------------------------------------
# Loading pretrained models


def load_pretrained(name_or_dir: str | os.PathLike, offline: bool | None = None,
                    dtype: torch.dtype = torch.float32, allow_weights: dict | None = None) -> HFSeq2Seq:
    """A hub id (e.g. Helsinki-NLP/opus-mt-en-de) or a local directory -> the adapter, in eval mode.

    offline: True reads only local files (a directory, or the HuggingFace cache); None: True when
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set. A checkpoint missing weights of the model, or
    holding weights it does not use, is refused unless `allow_weights` names them
    (hf_source.check_loading_report).
    """
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    source = resolve_source(name_or_dir, offline)
    try:
        config = AutoConfig.from_pretrained(source.name, **source.kwargs)
        family_of(config, (ENCODER_DECODER,))
        hf, report = AutoModelForSeq2SeqLM.from_pretrained(source.name, **source.kwargs, dtype=dtype,
                                                           attn_implementation="eager", output_loading_info=True)
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None
    except PickleRefusal as error:  # a pytorch_model.bin that pickles code: refused, with the safe way forward
        raise refused_pickle(name_or_dir, error) from None
    check_loading_report(source.label, type(hf).__name__, report, allow_weights)
    return HFSeq2Seq(hf).eval()


def load_tokenizers(name_or_dir: str | os.PathLike, offline: bool | None = None, src_lang: str | None = None,
                    tgt_lang: str | None = None) -> tuple[HFTokenizer, HFTokenizer]:
    """The model's tokenizer -> (source side, target side). src_lang/tgt_lang for multilingual
    tokenizers (mBART, M2M100, NLLB); FSMT's translates one pair (`_fsmt_sides`)."""
    from transformers import AutoTokenizer

    source = resolve_source(name_or_dir, offline)
    kwargs = {k: v for k, v in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if v is not None}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.name, **source.kwargs, **kwargs)
    except KeyError as error:
        raise HeadcountError(f"{name_or_dir}: its tokenizer has no language code {error} (asked for "
                             f"src_lang {src_lang!r}, tgt_lang {tgt_lang!r}); use the model's own codes") from None
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None
    return tokenizer_sides(tokenizer, str(name_or_dir), src_lang, tgt_lang)


def tokenizer_sides(tokenizer, name: str, src_lang: str | None = None,
                    tgt_lang: str | None = None) -> tuple[HFTokenizer, HFTokenizer]:
    """A transformers tokenizer of an encoder-decoder (`name` names it in errors) -> its (source,
    target) sides; FSMT's translates one pair (`_fsmt_sides`)."""
    if _is_fsmt(tokenizer):
        return _fsmt_sides(tokenizer, name, src_lang, tgt_lang)
    return HFTokenizer(tokenizer, "source"), HFTokenizer(tokenizer, "target")


def _is_fsmt(tokenizer) -> bool:
    return type(tokenizer).__name__ == "FSMTTokenizer"


def _fsmt_sides(tokenizer, name: str, src_lang: str | None, tgt_lang: str | None) -> tuple[HFTokenizer, HFTokenizer]:
    """FSMT's tokenizer segments any text with the source language's Moses rules and gives ids in
    the source vocabulary (text_target included), and turns ids into text with the target
    vocabulary and the target language's detokenizer. The target side here is the same tokenizer
    with languages and vocabularies swapped (the BPE merges are one file for both sides, as in
    fairseq's WMT19 models), so that target text gets target ids; each side decodes with the
    tokenizer whose output vocabulary is its own."""
    pair = [tokenizer.src_lang, tokenizer.tgt_lang]
    asked = [src_lang or pair[0], tgt_lang or pair[1]]
    if asked != pair:
        raise HeadcountError(f"{name}: an FSMT model translates {pair[0]} -> {pair[1]} only (its tokenizer's "
                             f"langs), not {asked[0]} -> {asked[1]}; leave out pretrained_langs")
    swapped = type(tokenizer)(langs=pair[::-1], src_vocab_file=tokenizer.tgt_vocab_file,
                              tgt_vocab_file=tokenizer.src_vocab_file, merges_file=tokenizer.merges_file,
                              do_lower_case=tokenizer.do_lower_case, unk_token=tokenizer.unk_token,
                              bos_token=tokenizer.bos_token, sep_token=tokenizer.sep_token,
                              pad_token=tokenizer.pad_token)
    return HFTokenizer(tokenizer, "source", decoding=swapped), HFTokenizer(swapped, "target", decoding=tokenizer)


def import_pretrained(name_or_dir: str | os.PathLike, model_out: str | os.PathLike,
                      tokenizer_dir: str | os.PathLike | None = None, offline: bool | None = None,
                      src_lang: str | None = None, tgt_lang: str | None = None,
                      allow_weights: dict | None = None) -> HFSeq2Seq:
    """What a workflow stage calls for `pretrained:`: load the model (and its tokenizer), write a
    headcount checkpoint to `model_out` (loading.load_model reads it, like a trained baseline) and
    the tokenizer's files to `tokenizer_dir` (loading.open_tokenizer reads them), so that later stages
    need neither the hub nor the original directory."""
    model = load_pretrained(name_or_dir, offline=offline, allow_weights=allow_weights)
    if tokenizer_dir is not None:
        source, target = load_tokenizers(name_or_dir, offline=offline, src_lang=src_lang, tgt_lang=tgt_lang)
        default = getattr(source.tokenizer, "src_lang", None)  # FSMT's names its one pair: no choice there
        if default is not None and (src_lang is None or tgt_lang is None) and not _is_fsmt(source.tokenizer):
            raise HeadcountError(
                f"{name_or_dir}: its tokenizer is multilingual (source language {default!r} unless told "
                f"otherwise); set the experiment's `pretrained_langs: {{src: ..., tgt: ...}}` to this model's "
                f"codes (mBART-50: en_XX, de_DE; M2M100: en, de; NLLB: eng_Latn, deu_Latn)")
        # What the target side's tokenizer puts first (a language tag) is what search must force.
        model.special = dataclasses.replace(model.special, forced=tuple(target.prefix))
        Path(tokenizer_dir).mkdir(parents=True, exist_ok=True)
        source.tokenizer.save_pretrained(str(tokenizer_dir))
    model.save(model_out, extra={"pretrained": {"source": str(name_or_dir), "family": model.family.name,
                                                "src_lang": src_lang, "tgt_lang": tgt_lang}})
    return model


__all__ = ["ATTENTION_TYPES", "HFSeq2Seq", "HFTokenizer", "HeadGates", "PretrainedModelUnavailable",
           "import_pretrained", "load_pretrained", "load_tokenizers"]
