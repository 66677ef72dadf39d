"""Pretrained encoder-decoder models from HuggingFace transformers, as `Seq2SeqWithHeads` (seq2seq.py).

`HFSeq2Seq` wraps a transformers model so that every headcount analysis runs on it: MarianMT
(Helsinki-NLP's opus-mt models, the architecture of Voita et al. 2019), BART/mBART, M2M100/NLLB and
T5/mT5. The transformers model runs as it is (its own forward pass, eager attention so that it can
return attention probabilities); the adapter only replaces each attention's output projection by
`HeadGates`, which receives the concatenated per-head contexts (B, T, H * Dh) and applies, per head,
the `head_context` hook, the fixed 0/1 `head_mask` and the Hard Concrete gates before the original
projection: MultiHead = Concat_i(g_i head_i) W^O (Voita et al. 2019, eq. 2).

Loading: `load_pretrained(name_or_dir)` reads a hub id or a local directory written by
`save_pretrained` / `hf download`; `load_tokenizers(name_or_dir)` gives the source and target
`Tokenizer`s. A workflow stage calls `import_pretrained(name_or_dir, model_out, tokenizer_dir)` once:
it writes a headcount checkpoint (family = the transformers model type; loading.load_model reads it
back, pruned heads and gates included) and the tokenizer's files, which `loading.open_tokenizer(dir, side)`
opens for the later stages. `write_tiny_marian` writes an opus-mt-shaped directory with a tokenizer
trained on given lines, for tests and dry runs where the hub is out of reach.

What differs between families (`Family` below): module names, how logits are formed (Marian and
BART add `final_logits_bias`; T5 scales the hidden state by d_model^-0.5 where its saved config tied
the embeddings, mT5 never: `Family.output_scale`), what the decoder starts from (Marian, T5 and
mT5: their pad id; BART, mBART, M2M100: EOS), and
what the LRP forward pass must re-create (hf_lrp.py). T5's relative position bias is computed once,
in the first layer, for all heads of every layer: a T5 layer whose heads were removed adds the
bias of its remaining heads and passes on the bias of all of them (`_slice_position_bias`).
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
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headcount.data.special import SPECIAL_PIECE, SpecialIds
from headcount.io import HeadcountError
from headcount.models.checkpoint import save_checkpoint
from headcount.models.seq2seq import ATTENTION_TYPES, register_family

# --------------------------------------------------------------------------------------------
# Gate slots on an attention's output projection


class HeadGates(nn.Module):
    """An attention module's output projection with per-head gates in front; satisfies `HeadSlots`.

    Replaces the transformers attention's output projection (out_proj, or T5's o). Its input is the
    concatenation of the head contexts, (B, T, H * Dh); the original projection is `proj`.
    """

    def __init__(self, attention: nn.Module, family: Family):
        super().__init__()
        self.proj = getattr(attention, family.out_name)
        self.family = family.name
        self.n_heads = int(getattr(attention, family.heads_attr))
        self.head_dim = int(getattr(attention, family.head_dim_attr))
        self.register_buffer("head_mask", torch.ones(self.n_heads))
        self.kept = list(range(self.n_heads))  # the original index of each remaining head
        self.original_heads = self.n_heads
        self.hard_concrete = None  # HardConcreteGates while pruning (gates.attach_gates)
        self.head_context = nn.Identity()  # hook point: (B, H, T, Dh), before the gates
        # The attention this projection belongs to, kept out of the module tree (no cycle).
        self._owner = [attention, family]

    @property
    def attention(self) -> nn.Module:
        return self._owner[0]

    @property
    def out_proj(self) -> nn.Linear:
        """The output projection, under the name headcount's own attention uses (hard_concrete.fold_gates)."""
        return self.proj

    def gates(self) -> Tensor:
        """(H,): the fixed 0/1 mask, times the Hard Concrete gates if any."""
        if self.hard_concrete is None:
            return self.head_mask
        return self.head_mask * self.hard_concrete()

    def forward(self, x: Tensor) -> Tensor:  # x (B, T, H * Dh)
        B, T, _ = x.shape
        ctx = self.head_context(x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2))  # (B, H, T, Dh)
        ctx = ctx * self.gates().to(ctx.dtype).view(1, -1, 1, 1)
        return self.proj(ctx.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def keep_heads(self, heads: list[int]) -> None:
        """Remove every other head physically: rows of Q, K, V and columns of W^O."""
        attention, family = self._owner
        heads = sorted(int(h) for h in heads)
        if any(h < 0 or h >= self.n_heads for h in heads) or len(set(heads)) != len(heads):
            raise ValueError(f"keep_heads: {heads} are not distinct heads of 0..{self.n_heads - 1}")
        Dh = self.head_dim
        idx = torch.tensor([h * Dh + d for h in heads for d in range(Dh)], dtype=torch.long,
                           device=self.proj.weight.device)
        for name in family.qkv_names:
            setattr(attention, name, _linear_rows(getattr(attention, name), idx))
        self.proj = _linear_columns(self.proj, idx)
        keep = torch.tensor(heads, dtype=torch.long, device=self.head_mask.device)
        self.head_mask = self.head_mask[keep].clone()
        if self.hard_concrete is not None:
            self.hard_concrete.log_alpha = nn.Parameter(self.hard_concrete.log_alpha.detach()[keep].clone(),
                                                        requires_grad=self.hard_concrete.log_alpha.requires_grad)
        self.n_heads = len(heads)
        self.kept = [self.kept[h] for h in heads]
        setattr(attention, family.heads_attr, len(heads))
        if family.t5_layout:
            attention.inner_dim = len(heads) * Dh
            _slice_position_bias(attention, self)
        if len(heads) == 0:
            _silence(attention, self)

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}"


def _linear_rows(layer: nn.Linear, idx: Tensor) -> nn.Linear:
    new = nn.Linear(layer.in_features, len(idx), bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(layer.weight[idx])
        if layer.bias is not None:
            new.bias.copy_(layer.bias[idx])
    return new


def _linear_columns(layer: nn.Linear, idx: Tensor) -> nn.Linear:
    new = nn.Linear(len(idx), layer.out_features, bias=layer.bias is not None,
                    device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(layer.weight[:, idx])
        if layer.bias is not None:
            new.bias.copy_(layer.bias)
    return new


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


# --------------------------------------------------------------------------------------------
# Families


@dataclass(frozen=True)
class Family:
    """Where a transformers family keeps what the adapter needs."""

    name: str  # transformers' model_type
    out_name: str = "out_proj"
    qkv_names: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")
    heads_attr: str = "num_heads"
    head_dim_attr: str = "head_dim"
    pre_norm: bool = False  # LayerNorm before each block (mBART, M2M100) or after (Marian, BART)
    # T5's layout (T5, mT5): blocks of sublayers, q/k/v/o, a relative position bias, RMSNorm, no
    # position embeddings, the hidden state scaled before the output layer (output_scale).
    t5_layout: bool = False
    scales_output: bool = False  # T5 only: see output_scale

    def output_scale(self, config) -> float:
        """What transformers multiplies the decoder's last hidden state by before the output layer:
        T5 d_model^-0.5 where its config says so (`scale_decoder_outputs`, which transformers 5
        sets from the saved `tie_word_embeddings` and then ties the weights anyway), mT5 and the
        other families 1."""
        if self.scales_output and getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
            return float(config.d_model) ** -0.5
        return 1.0

    def stacks(self, hf: nn.Module) -> tuple[nn.Module, nn.Module]:
        if self.t5_layout:
            return hf.encoder, hf.decoder
        return hf.model.encoder, hf.model.decoder

    def attentions(self, hf: nn.Module) -> dict[str, list[nn.Module]]:
        encoder, decoder = self.stacks(hf)
        if self.t5_layout:
            return {"enc_self": [b.layer[0].SelfAttention for b in encoder.block],
                    "dec_self": [b.layer[0].SelfAttention for b in decoder.block],
                    "dec_enc": [b.layer[1].EncDecAttention for b in decoder.block]}
        return {"enc_self": [layer.self_attn for layer in encoder.layers],
                "dec_self": [layer.self_attn for layer in decoder.layers],
                "dec_enc": [layer.encoder_attn for layer in decoder.layers]}


FAMILIES = {
    "marian": Family("marian"),
    "bart": Family("bart"),
    "mbart": Family("mbart", pre_norm=True),
    "m2m_100": Family("m2m_100", pre_norm=True),  # NLLB checkpoints use this architecture too
    "t5": Family("t5", out_name="o", qkv_names=("q", "k", "v"), heads_attr="n_heads",
                 head_dim_attr="key_value_proj_dim", pre_norm=True, t5_layout=True,
                 scales_output=True),
}
# Multilingual T5: T5's architecture; transformers' mT5 never scales the decoder's output.
FAMILIES["mt5"] = dataclasses.replace(FAMILIES["t5"], name="mt5", scales_output=False)


def family_of(config) -> Family:
    try:
        return FAMILIES[config.model_type]
    except KeyError:
        raise HeadcountError(
            f"transformers model type {config.model_type!r} is not supported; headcount supports "
            f"{', '.join(sorted(FAMILIES))} (encoder-decoder models)"
        ) from None


# --------------------------------------------------------------------------------------------
# The adapter


class HFSeq2Seq(nn.Module):
    """A transformers encoder-decoder model as `Seq2SeqWithHeads`."""

    def __init__(self, hf: nn.Module, forced: tuple[int, ...] | None = None):
        """forced: what search forces after the start token (SpecialIds.forced; import_pretrained
        takes it from the target side's tokenizer); None: the model's own forced_bos_token_id."""
        super().__init__()
        self.family = family_of(hf.config)
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
        logits = self.hf.lm_head(hidden)
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

    def set_head_mask(self, masks: dict[str, Tensor]) -> None:
        """Fix the 0/1 gates, masks[type] of shape (layers, H); types left out stay as they are. After
        physical pruning H is the widest layer's head count and each layer reads its first heads."""
        modules = self.attention_modules()
        for kind, mask in masks.items():
            mask = torch.as_tensor(mask, dtype=torch.float32)
            width = max(m.n_heads for m in modules[kind])
            if mask.dim() != 2 or mask.shape != (len(modules[kind]), width) or any(
                    row[m.n_heads:].any() for m, row in zip(modules[kind], mask)):
                raise ValueError(f"head mask for {kind} has shape {tuple(mask.shape)}, expected "
                                 f"({len(modules[kind])}, {width}) (after physical pruning: zeros beyond a "
                                 f"layer's remaining heads, as head_mask() gives)")
            for module, row in zip(modules[kind], mask):
                module.head_mask.copy_(row[: module.n_heads])

    def head_mask(self) -> dict[str, Tensor]:
        """{type: (layers, H)}; after physical pruning, rows are padded with zeros to the widest layer."""
        out = {}
        for kind, modules in self.attention_modules().items():
            width = max(m.n_heads for m in modules)
            rows = [torch.cat([m.head_mask, m.head_mask.new_zeros(width - m.n_heads)]) for m in modules]
            out[kind] = torch.stack(rows)
        return out

    def head_counts(self) -> dict[str, list[int]]:
        return {kind: [m.n_heads for m in modules] for kind, modules in self.attention_modules().items()}

    def dims(self) -> dict[str, int]:
        """The sizes a from-scratch headcount Transformer needs to match this model."""
        c = self.config
        if self.family.t5_layout:
            return dict(d_model=c.d_model, n_heads=c.num_heads, d_ff=c.d_ff, enc_layers=c.num_layers,
                        dec_layers=c.num_decoder_layers, src_vocab=c.vocab_size, tgt_vocab=c.vocab_size)
        return dict(d_model=c.d_model, n_heads=c.encoder_attention_heads, d_ff=c.encoder_ffn_dim,
                    enc_layers=c.encoder_layers, dec_layers=c.decoder_layers, src_vocab=c.vocab_size,
                    tgt_vocab=getattr(c, "decoder_vocab_size", None) or c.vocab_size)

    def encoder_parameters(self):
        """The source side: token embeddings, encoder layers, the encoder's norms. Where the model
        shares one embedding between source, target and output layer (opus-mt, BART, T5), that
        embedding is among them, so encoder-only training also moves the target side's embedding."""
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
        from transformers import AutoConfig, AutoModelForSeq2SeqLM

        config_dict = json.loads(state["model_config"])
        config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
        config._attn_implementation = "eager"
        model = cls(AutoModelForSeq2SeqLM.from_config(config), forced=state.get("forced"))
        weights = state["model"]
        kept = state.get("kept_heads") or {kind: [list(range(n)) for n in counts]
                                             for kind, counts in state["head_counts"].items()}
        for kind, modules in model.attention_modules().items():
            for module, heads in zip(modules, kept[kind]):
                if len(heads) != module.n_heads:
                    module.keep_heads(heads)
                if f"{_module_name(model, module)}.hard_concrete.log_alpha" in weights:
                    from headcount.models.gates import HardConcreteGates

                    module.hard_concrete = HardConcreteGates(module.n_heads)
        dtype = next(iter(v for v in weights.values() if v.is_floating_point())).dtype
        model.to(dtype)
        model.load_state_dict(weights)
        return model.eval()


def _generation_setting(hf: nn.Module, name: str) -> int | None:
    """A token id generate reads: the generation config (read with a pretrained model) first, then
    the model config; None where neither sets it."""
    for config in (getattr(hf, "generation_config", None), hf.config):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def _decoder_start(hf: nn.Module, eos: int) -> int:
    """What the decoder input starts with: Marian and T5 their pad id, BART and M2M100 EOS. mBART
    leaves it unset and starts from EOS followed by a language code."""
    start = _generation_setting(hf, "decoder_start_token_id")
    if start is not None:
        return start
    return int(hf.config.pad_token_id) if family_of(hf.config).t5_layout else int(eos)


def _forced_bos(hf: nn.Module) -> tuple[int, ...]:
    """The token transformers' generate forces after the start token, if the model names one:
    BART's <s>, a one-language model's tag."""
    token = _generation_setting(hf, "forced_bos_token_id")
    return () if token is None else (token,)


def _module_name(root: nn.Module, target: nn.Module) -> str:
    for name, module in root.named_modules():
        if module is target:
            return name
    raise KeyError("module not found")


for _name in FAMILIES:
    register_family(_name)(HFSeq2Seq.from_checkpoint)


# --------------------------------------------------------------------------------------------
# Tokenizers


class HFTokenizer:
    """One side (source or target) of a transformers tokenizer as headcount's `Tokenizer`: the
    ids the tokenizer gives with its special tokens, less the EOS at the end (batching adds EOS).
    So a multilingual model's language tag comes first (mBART-50, M2M100, NLLB: the source
    language on the source side, the target language on the target side, which search then
    forces: SpecialIds.forced), BART's <s> too, and Marian and T5 get the text alone."""

    def __init__(self, tokenizer, side: str):
        if side not in ("source", "target"):
            raise ValueError(f"side must be 'source' or 'target', not {side!r}")
        self.tokenizer, self.side = tokenizer, side
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
        unk = self.tokenizer.unk_token_id
        if unk is not None and unk in prefix:  # NLLB's tokenizer maps an unknown language code to <unk>
            lang = getattr(self.tokenizer, "src_lang" if self.side == "source" else "tgt_lang", None)
            raise HeadcountError(f"{type(self.tokenizer).__name__}: the {self.side} language code {lang!r} is not "
                                 f"one of this tokenizer's (it becomes <unk>); use the model's own codes")
        if suffix not in ([], [self.tokenizer.eos_token_id]):
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
        """The subword strings, one per id of encode([line])[0] (SPECIAL_PIECE for the prefix)."""
        tok = self.tokenizer
        prefix = [SPECIAL_PIECE] * len(self.prefix)
        if self.side == "target" and hasattr(tok, "_switch_to_target_mode"):
            tok._switch_to_target_mode()  # Marian: the target side has its own sentencepiece model
            try:
                return prefix + tok.tokenize(line)
            finally:
                tok._switch_to_input_mode()
        return prefix + tok.tokenize(line)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Text of each id list, less the prefix (a language tag, which some tokenizers would
        write out as text) and the special tokens."""
        rows = [list(map(int, x)) for x in ids]
        n = len(self.prefix)
        rows = [row[n:] if n and row[:n] == self.prefix else row for row in rows]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)


# --------------------------------------------------------------------------------------------
# Loading pretrained models


class PretrainedModelUnavailable(HeadcountError):
    pass


def _unavailable(name: str, error: Exception | None) -> PretrainedModelUnavailable:
    base = Path(str(name)).name or "model"
    reason = f" ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})" if error else ""
    return PretrainedModelUnavailable(
        f"pretrained model {name!r} cannot be loaded{reason}. If it is a hub id, this machine may have no "
        f"access to the HuggingFace hub: on a machine with network, download it with "
        f"`hf download {name} --local-dir models/{base}` (older huggingface_hub: `huggingface-cli download "
        f"{name} --local-dir models/{base}`), or in Python `AutoModelForSeq2SeqLM.from_pretrained({name!r})"
        f".save_pretrained(dir)` and the same with AutoTokenizer; copy that directory here and set "
        f"`pretrained:` to it."
    )


def _resolve(name_or_dir: str | os.PathLike, offline: bool | None) -> tuple[str, bool]:
    """-> (what to pass to from_pretrained, local_files_only)."""
    name = str(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path), True
    if name.startswith((".", "/", "~")) or path.exists():
        raise PretrainedModelUnavailable(f"pretrained model directory {name!r} does not exist (or is not a directory)")
    if offline is None:
        offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                      for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return name, offline


def load_pretrained(name_or_dir: str | os.PathLike, offline: bool | None = None,
                    dtype: torch.dtype = torch.float32) -> HFSeq2Seq:
    """A hub id (e.g. Helsinki-NLP/opus-mt-en-de) or a local directory -> the adapter, in eval mode.

    offline: True reads only local files (a directory, or the HuggingFace cache); None: True when
    HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set.
    """
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    name, local_only = _resolve(name_or_dir, offline)
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=local_only)
        family_of(config)
        hf = AutoModelForSeq2SeqLM.from_pretrained(name, local_files_only=local_only, dtype=dtype,
                                                   attn_implementation="eager")
    except (OSError, ValueError) as error:
        raise _unavailable(str(name_or_dir), error) from None
    return HFSeq2Seq(hf).eval()


def load_tokenizers(name_or_dir: str | os.PathLike, offline: bool | None = None, src_lang: str | None = None,
                    tgt_lang: str | None = None) -> tuple[HFTokenizer, HFTokenizer]:
    """The model's tokenizer -> (source side, target side). src_lang/tgt_lang for multilingual
    tokenizers (mBART, M2M100, NLLB)."""
    from transformers import AutoTokenizer

    name, local_only = _resolve(name_or_dir, offline)
    kwargs = {k: v for k, v in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if v is not None}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only, **kwargs)
    except KeyError as error:
        raise HeadcountError(f"{name_or_dir}: its tokenizer has no language code {error} (asked for "
                             f"src_lang {src_lang!r}, tgt_lang {tgt_lang!r}); use the model's own codes") from None
    except (OSError, ValueError) as error:
        raise _unavailable(str(name_or_dir), error) from None
    return HFTokenizer(tokenizer, "source"), HFTokenizer(tokenizer, "target")


def import_pretrained(name_or_dir: str | os.PathLike, model_out: str | os.PathLike,
                      tokenizer_dir: str | os.PathLike | None = None, offline: bool | None = None,
                      src_lang: str | None = None, tgt_lang: str | None = None) -> HFSeq2Seq:
    """What a workflow stage calls for `pretrained:`: load the model (and its tokenizer), write a
    headcount checkpoint to `model_out` (loading.load_model reads it, like a trained baseline) and
    the tokenizer's files to `tokenizer_dir` (loading.open_tokenizer reads them), so that later stages
    need neither the hub nor the original directory."""
    model = load_pretrained(name_or_dir, offline=offline)
    if tokenizer_dir is not None:
        source, target = load_tokenizers(name_or_dir, offline=offline, src_lang=src_lang, tgt_lang=tgt_lang)
        default = getattr(source.tokenizer, "src_lang", None)
        if default is not None and (src_lang is None or tgt_lang is None):
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


__all__ = ["ATTENTION_TYPES", "FAMILIES", "HFSeq2Seq", "HFTokenizer", "HeadGates", "PretrainedModelUnavailable",
           "import_pretrained", "load_pretrained", "load_tokenizers", "write_tiny_marian"]
