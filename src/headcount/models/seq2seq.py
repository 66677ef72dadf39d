"""What every analysis needs from a model: an encoder-decoder Transformer with heads.

Confidence, LRP, Michel importance, ablation, head roles, Hard Concrete gates, the Michel curve,
beam search and physical pruning see a model only through this interface, so they run on any
model that implements it: headcount's own Transformer (transformer.py) and adapters over pretrained
models (hf.py). Nothing here knows a model's module names, its layout or its token ids.

Shapes: B batch, S source length, T target length, D model width, H heads, Dh head size,
V target vocabulary.

The contract, in short (a model is also a torch nn.Module: parameters, state_dict, train/eval, to):

- `special`: the ids an analysis needs (padding, the decoder's start token, end of sentence).
  Source tensors are subword ids followed by EOS, padded with `special.pad`; decoder inputs start
  with `special.bos` (Marian starts from its pad id: so tell padding from the start token with
  `special.decoder_positions(tgt_in)`, never with `tgt_in != pad`).
- `encode(src, need_weights)` -> (memory (B, S, D), src_pad (B, S) True at padding,
  [per encoder layer (B, H, S, S) or None]).
- `decode(tgt_in, memory, src_pad, need_weights, cache, start)` -> (hidden (B, T, D),
  [per layer self probs (B, H, T, T)], [per layer cross probs (B, H, T, S)]); with a cache from
  `new_cache()`, tgt_in holds only the new tokens and `start` is the position of the first.
- `logits(hidden)` -> (B, T, V), every bias included.
- `forward(src, tgt_in, need_weights)` -> (logits, {attention type: [per layer probs]} or None).
- `reorder_cache(cache, rows)` keeps the given batch rows of a cache, in place (beam search).
- `attention_modules()` -> {attention type: [one `HeadSlots` per layer]}, in layer order.
- `set_head_mask` / `head_mask`: the fixed 0/1 gates, {type: (layers, H)}.
- `max_positions`: the longest sequence the model accepts; `d_model`: its width D (learning-rate
  schedules scale with it); `cfg`: its configuration, `cfg.to_dict()` a JSON-able dict (the
  training loop records it in checkpoints and run fingerprints).
- `encoder_parameters()`: the parameters of the source side (embeddings, encoder layers, final
  encoder norm): what the encoder-only pruning setting trains.
- `lrp_forward()`: the `LRPForward` that re-runs this architecture with LRP rules (lrp.py).
- `save(path, extra)` writes a checkpoint, {"family", "model" (state dict), "model_config", **extra},
  that `load_model` reads back, whatever the family. A checkpoint without "family" (written before
  families existed) is headcount's own.

Four kinds of model (`MODEL_KINDS`, `model.model_kind`), one batch layout. A batch is always the
triple (src, tgt_in, tgt_out) and `forward(src, tgt_in)` gives logits aligned with tgt_out, so
every loss is cross-entropy of those logits against tgt_out at its non-padding positions:

- encoder_decoder (translation): src = subwords + EOS (B, S); tgt_in = BOS + y (B, T);
  tgt_out = y + EOS (B, T). Attention types enc_self, dec_self, dec_enc.
- decoder_only (causal_lm): src is empty (B, 0); tgt_in = BOS + x[:-1] and tgt_out = x (B, T):
  every token of the text is predicted from BOS and the tokens before it (no EOS target, so a
  model without a padding token may pad with its EOS id). `encode` returns an empty memory
  (B, 0, D) and no attention; `decode` runs the language model (the cross-attention list is
  empty). Attention type dec_self: probabilities (B, H, T, T), zero above the diagonal.
- encoder_only (masked_lm): src = BOS + x' + EOS (BERT: [CLS] x' [SEP]) where x' is x with the
  masked positions replaced by `special.mask`; tgt_in is empty (B, 0); tgt_out (B, S) holds the
  original id at the masked positions and `special.pad` elsewhere. `encode` is the encoder,
  `logits(hidden)` the masked-LM head, `decode` is not available. Attention type enc_self.
- sentence_encoder (sentence_embedding): src = BOS + x + EOS ([CLS] x [SEP]), unmasked; tgt_in is
  empty (B, 0); tgt_out (B, 1) holds one non-padding id per sentence: a sentence is one scored unit,
  its pooled embedding. There is no cross-entropy: the loss is the embedding's cosine distance to
  the same model's with every head open and no gates (models.sentence_embedding), and `forward`
  gives the embedding (B, 1, D) where the others give logits. Attention type enc_self, in
  encoder_only's layout (`ModelKind.layout`: roles, confidence and examples read it as BERT's).

`attention_modules()`, `head_mask()` and `set_head_mask()` hold the model's own attention types
only; data.batching makes the batches of each objective.

Every `HeadSlots` (one attention module) multiplies head i's context by `gates()[i]` before the
output projection (Voita et al. 2019, eq. 2), passes the contexts (B, H, Tq, Dh) through the
`head_context` identity module first (hook point for Michel importance), has a fixed 0/1
`head_mask` buffer (H,), an optional `hard_concrete` gate module (gates.attach_gates), its output
projection `out_proj` (gate folding scales each head's input columns), and `keep_heads(indices)`
to remove the other heads physically.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from headcount.data.special import SpecialIds
from headcount.io import HeadcountError

if TYPE_CHECKING:  # annotations only: the workflow's rule files import this module, torch-free
    from torch import Tensor, nn

# The three kinds of attention the paper analyses and prunes; defined here once.
ATTENTION_TYPES = ("enc_self", "dec_self", "dec_enc")


@dataclass(frozen=True)
class ModelKind:
    """What a model is made of and what it is trained to do. Every analysis and pruning step runs
    on `attention_types` (in ATTENTION_TYPES' order); `objective` says what a batch's targets are
    and how quality is measured (translation: BLEU/chrF; causal_lm: next-token NLL and perplexity;
    masked_lm: NLL of a fixed, seeded masking; sentence_embedding: the pooled embedding's cosine
    distance to the unpruned model's)."""

    name: str
    attention_types: tuple[str, ...]
    objective: str
    # The kind whose inputs and attention maps this kind's are (the roles, confidence masks and
    # atlas examples read a model's maps by it); its own name where empty.
    layout: str = ""
    # Whether pruning trains the Hard Concrete gates alone, the weights frozen: where the loss is a
    # distance to the model's own unpruned output, trained weights would move that reference.
    gates_only: bool = False

    def __post_init__(self):
        object.__setattr__(self, "layout", self.layout or self.name)


# A sentence encoder's objective (models.sentence_embedding computes its loss), named once.
SENTENCE_EMBEDDING = "sentence_embedding"

# The kinds of Transformer headcount analyses; defined here once. A model says its own in
# `model_kind` (a name below); one that says none is an encoder-decoder (older code, checkpoints).
MODEL_KINDS = {kind.name: kind for kind in (
    ModelKind("encoder_decoder", ATTENTION_TYPES, "translation"),
    ModelKind("decoder_only", ("dec_self",), "causal_lm"),
    ModelKind("encoder_only", ("enc_self",), "masked_lm"),
    ModelKind("sentence_encoder", ("enc_self",), SENTENCE_EMBEDDING, layout="encoder_only", gates_only=True),
)}


class NotAvailableForKind(HeadcountError):
    """An interface method the model's kind has no use for (a masked LM has no decoder)."""


def kind_with_types(types) -> ModelKind:
    """The kind whose attention types are exactly `types` (a score table's, say): encoder_decoder
    for all three, decoder_only for dec_self alone, encoder_only for enc_self alone (a sentence
    encoder's table reads the same: its layout is encoder_only's)."""
    wanted = set(types)
    for kind in MODEL_KINDS.values():
        if set(kind.attention_types) == wanted:
            return kind
    raise ValueError(f"no model kind has exactly the attention types {sorted(wanted)}")


def kind_of(model) -> ModelKind:
    """The model's ModelKind (encoder_decoder where it declares none)."""
    return MODEL_KINDS[getattr(model, "model_kind", "encoder_decoder")]


def heads_per_layer(model) -> dict[str, list[int]]:
    """type -> each layer's head count (after physical pruning they differ)."""
    return {kind: [m.n_heads for m in modules] for kind, modules in model.attention_modules().items()}


@runtime_checkable
class HeadSlots(Protocol):
    """One attention module as the analyses see it."""

    n_heads: int
    head_dim: int
    out_proj: nn.Linear  # W^O: head i owns its input columns i*Dh:(i+1)*Dh (hard_concrete.fold_gates scales them)
    head_mask: Tensor  # (H,) fixed 0/1 gates
    hard_concrete: nn.Module | None  # HardConcreteGates while pruning
    head_context: nn.Module  # identity on (B, H, Tq, Dh), before the gates

    def gates(self) -> Tensor: ...  # (H,) head_mask times the Hard Concrete gates, if any

    def keep_heads(self, heads: list[int]) -> None: ...  # physical pruning


@runtime_checkable
class Seq2SeqWithHeads(Protocol):
    special: SpecialIds
    max_positions: int
    d_model: int
    cfg: Any  # the model's configuration; training.loop.train records cfg.to_dict() in checkpoints and fingerprints

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor, list]: ...

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor, need_weights: bool = False,
               cache: Any = None, start: int = 0) -> tuple[Tensor, list, list]: ...

    def logits(self, hidden: Tensor) -> Tensor: ...

    def forward(self, src: Tensor, tgt_in: Tensor, need_weights: bool = False) -> tuple[Tensor, dict | None]: ...

    def new_cache(self) -> Any: ...  # an empty incremental-decoding state for `decode`

    def reorder_cache(self, cache: Any, rows: Tensor) -> None: ...

    def attention_modules(self) -> dict[str, list[HeadSlots]]: ...

    def set_head_mask(self, masks: dict[str, Tensor]) -> None: ...

    def head_mask(self) -> dict[str, Tensor]: ...

    def encoder_parameters(self) -> Iterator[nn.Parameter]: ...

    def lrp_forward(self) -> LRPForward: ...

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None: ...


class LRPForward(Protocol):
    """An architecture's forward pass re-written with LRP rules (see lrp.py for the rules and for
    the traces returned; lrp.py drives the backward passes). Evaluation mode, no cache.

    `decode`'s target (B, T): the token whose logit each step explains; where it is -1 the top-1
    token, never one of `special.never_generated()` (lrp.top1_targets does this).
    transformer_lrp.py is headcount's own implementation. A decoder-only model's `encode` is
    empty; an encoder-only model's `decode` raises and `predict_masked(encoded, src, rules, target)`
    gives the trace of its MLM head over the source positions (hf_lm_lrp.py, lrp.py)."""

    def encode(self, src: Tensor, rules) -> Any: ...  # -> lrp.EncoderTrace

    def decode(self, encoded: Any, tgt_in: Tensor, rules, target: Tensor | None = None) -> Any: ...  # -> lrp.Trace


# Model families: a checkpoint names its family; the family's loader builds the model from the
# checkpoint (the dict `save` wrote) with its weights loaded.
MODEL_FAMILIES: dict[str, Callable[[dict], Seq2SeqWithHeads]] = {}


def register_family(name: str):
    def register(loader: Callable[[dict], Seq2SeqWithHeads]):
        MODEL_FAMILIES[name] = loader
        return loader

    return register
