"""Every transformers architecture headcount adapts, in one table: `FAMILIES`, keyed by the config's
`model_type` (the name a checkpoint records as its family), and `family_of`, the one lookup.

Each entry says its kind (`model_kind`, a name of seq2seq.MODEL_KINDS), which picks the adapter:
"encoder_decoder" (MarianMT, BART, mBART, M2M100/NLLB, T5, mT5, FSMT) -> hf.HFSeq2Seq;
"decoder_only" (GPT-2, GPT-NeoX, OPT, Llama, Qwen2, Qwen3) -> hf_lm.HFCausalLM; "encoder_only"
(BERT, RoBERTa) -> hf_lm.HFMaskedLM. The rest of an entry says where the architecture keeps what
its adapter needs. The two adapters ask different things, so an entry is one of two small
dataclasses with disjoint fields: `EncoderDecoderFamily` (attribute names on each attention, T5's
and FSMT's layouts; hf.py) and `LMFamily` (dotted module paths under the base model or the
attention, a fused Q/K/V projection's order, the LRP layout; hf_lm.py). The adapters, the LRP
forward passes, the transformers export (pruning/transformers_export.py), the loaders and the API's
messages read this table; nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headcount.io import HeadcountError

if TYPE_CHECKING:
    from torch import nn

ENCODER_DECODER, DECODER_ONLY, ENCODER_ONLY = "encoder_decoder", "decoder_only", "encoder_only"
KINDS = (ENCODER_DECODER, DECODER_ONLY, ENCODER_ONLY)
LANGUAGE_MODELS = (DECODER_ONLY, ENCODER_ONLY)  # hf_lm.py's kinds


@dataclass(frozen=True)
class EncoderDecoderFamily:
    """Where a transformers encoder-decoder keeps what hf.HFSeq2Seq needs."""

    name: str  # transformers' model_type
    out_name: str = "out_proj"
    qkv_names: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")
    heads_attr: str = "num_heads"
    head_dim_attr: str = "head_dim"
    pre_norm: bool = False  # LayerNorm before each block (mBART, M2M100) or after (Marian, BART, FSMT)
    # T5's layout (T5, mT5): blocks of sublayers, q/k/v/o, a relative position bias, RMSNorm, no
    # position embeddings, the hidden state scaled before the output layer (output_scale).
    t5_layout: bool = False
    scales_output: bool = False  # T5 only: see output_scale
    # FSMT (fairseq's port): attention on (T, B, D), the decoder called with positional masks and
    # ending in the output layer (hf._fsmt_decoder), fixed sinusoidal positions.
    time_major: bool = False
    output_layer_path: str = "lm_head"  # the output layer (D -> V), a module path in the transformers model
    model_kind: str = field(default=ENCODER_DECODER, init=False)

    def output_layer(self, hf: nn.Module) -> nn.Linear:
        return hf.get_submodule(self.output_layer_path)

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


@dataclass(frozen=True)
class LMFamily:
    """A transformers language-model architecture: its kind and where it keeps its attentions, as
    module and attribute paths (dotted, under the base model or the attention); hf_lm.py reads it."""

    name: str  # transformers' model_type (the checkpoint's family)
    model_kind: str  # "decoder_only" or "encoder_only" (seq2seq.MODEL_KINDS)
    layout: str  # the architecture's pattern: "gpt2", "gpt_neox", "opt", "llama" (Qwen too) or "bert"
    layers: str  # the layer list, under the base model
    attention: str  # each layer's attention module (what `attentions` returns), under the layer
    out_proj: str  # W^O under the attention: LMHeadGates replaces it
    qkv: tuple[str, ...]  # Q, K, V under the attention; one path: a fused projection, ordered as `fused`
    fused: str | None = None  # "blocks" (Q | K | V, each H * Dh) or "per_head" (per head: q, k, v, each Dh)
    head_dim: str = "head_dim"  # the attention attribute holding the head size
    n_heads_attr: str | None = None  # the attention attribute holding the head count, where it reshapes by it
    width_attr: str | None = None  # the attention attribute holding H * Dh, where it reshapes by it
    head_path: str = "lm_head"  # the output layer (D -> V, the MLM head for BERT), a module path
    # Where LRP's rules go in transformers' own forward (hf_lm_lrp.py, module_rules.py):
    outside: tuple[str, ...] = ()  # modules outside the layers, under the base model (an absent one skipped)
    activation: str = ""  # the feed-forward's activation under a layer: "module.attribute" (or the layer's own)
    product: str | None = None  # under a layer, a module whose input is a product of two neurons (SwiGLU)
    # the residual sums of a layer: "pre <norm between the sums>", "post <norm after attention> <norm
    # after the feed-forward>" or "parallel" (one sum); with residual_if, a layer attribute choosing
    # residual[0] (true) or residual[1] (false)
    residual: tuple[str, ...] = ()
    residual_if: str | None = None

    def attentions(self, hf: nn.Module) -> list[nn.Module]:
        """The attention module of each layer, in order (the module whose W^O gets the gates)."""
        return [layer.get_submodule(self.attention) for layer in hf.base_model.get_submodule(self.layers)]


_T5 = EncoderDecoderFamily("t5", out_name="o", qkv_names=("q", "k", "v"), heads_attr="n_heads",
                           head_dim_attr="key_value_proj_dim", pre_norm=True, t5_layout=True, scales_output=True)
_LLAMA = dict(layers="layers", attention="self_attn", out_proj="o_proj", qkv=("q_proj", "k_proj", "v_proj"),
              outside=("norm",), activation="mlp.act_fn", product="mlp.down_proj",
              residual=("pre post_attention_layernorm",))
_BERT = dict(layers="encoder.layer", attention="attention", out_proj="output.dense",
             qkv=("self.query", "self.key", "self.value"), head_dim="self.attention_head_size",
             n_heads_attr="self.num_attention_heads", width_attr="self.all_head_size",
             outside=("embeddings.LayerNorm",), activation="intermediate.intermediate_act_fn",
             residual=("post attention.output.LayerNorm output.LayerNorm",))

FAMILIES: dict[str, EncoderDecoderFamily | LMFamily] = {f.name: f for f in (
    EncoderDecoderFamily("marian"),
    EncoderDecoderFamily("bart"),
    EncoderDecoderFamily("mbart", pre_norm=True),
    EncoderDecoderFamily("m2m_100", pre_norm=True),  # NLLB checkpoints use this architecture too
    _T5,
    # Multilingual T5: T5's architecture; transformers' mT5 never scales the decoder's output.
    dataclasses.replace(_T5, name="mt5", scales_output=False),
    # fairseq's WMT19 models (facebook/wmt19-en-ru, -ru-en, -en-de, -de-en): post-LN, like BART's modules.
    EncoderDecoderFamily("fsmt", time_major=True, output_layer_path="model.decoder.output_projection"),
    LMFamily("gpt2", DECODER_ONLY, "gpt2", layers="h", attention="attn", out_proj="c_proj", qkv=("c_attn",),
             fused="blocks", n_heads_attr="num_heads", width_attr="split_size", outside=("ln_f",),
             activation="mlp.act", residual=("pre ln_2",)),
    LMFamily("gpt_neox", DECODER_ONLY, "gpt_neox", layers="layers", attention="attention", out_proj="dense",
             qkv=("query_key_value",), fused="per_head", head_dim="head_size", outside=("final_layer_norm",),
             activation="mlp.act", residual=("parallel", "pre post_attention_layernorm"),
             residual_if="use_parallel_residual"),
    LMFamily("opt", DECODER_ONLY, "opt", layers="decoder.layers", attention="self_attn", out_proj="out_proj",
             qkv=("q_proj", "k_proj", "v_proj"), n_heads_attr="num_heads",
             outside=("decoder.project_in", "decoder.final_layer_norm", "decoder.project_out"),
             activation="activation_fn",
             residual=("pre final_layer_norm", "post self_attn_layer_norm final_layer_norm"),
             residual_if="do_layer_norm_before"),
    LMFamily("llama", DECODER_ONLY, "llama", **_LLAMA),
    LMFamily("qwen2", DECODER_ONLY, "llama", **_LLAMA),
    LMFamily("qwen3", DECODER_ONLY, "llama", **_LLAMA),
    LMFamily("bert", ENCODER_ONLY, "bert", **_BERT, head_path="cls"),
    LMFamily("roberta", ENCODER_ONLY, "bert", **_BERT),
)}


def names(*kinds: str) -> list[str]:
    """The model types of the given kinds (every kind where none is given), sorted."""
    return sorted(name for name, f in FAMILIES.items() if not kinds or f.model_kind in kinds)


def supported(kinds: tuple[str, ...] = KINDS) -> str:
    """The model types of `kinds` by kind, for messages: "encoder-decoder: bart, ...; decoder-only: ..."."""
    return "; ".join(f"{kind.replace('_', '-')}: {', '.join(names(kind))}" for kind in kinds)


def family_of(config, kinds: tuple[str, ...] = KINDS) -> EncoderDecoderFamily | LMFamily:
    """The family of a transformers config (by its model_type), which must be of one of `kinds`;
    otherwise an error listing what headcount supports."""
    family = FAMILIES.get(config.model_type)
    if family is not None and family.model_kind in kinds:
        return family
    if set(kinds) == set(KINDS):
        problem = "is not supported"
    else:
        wanted = "language model" if set(kinds) == set(LANGUAGE_MODELS) else \
            " or ".join(k.replace("_", "-") for k in kinds) + " model"
        problem = f"is not a supported {wanted}"
        if family is not None:
            problem += f" (it is {family.model_kind.replace('_', '-')})"
    raise HeadcountError(f"transformers model type {config.model_type!r} {problem}; headcount supports "
                         f"{supported()}")


__all__ = ["DECODER_ONLY", "ENCODER_DECODER", "ENCODER_ONLY", "FAMILIES", "KINDS", "LANGUAGE_MODELS",
           "EncoderDecoderFamily", "LMFamily", "family_of", "names", "supported"]
