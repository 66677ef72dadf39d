"""Head relevance by layer-wise relevance propagation (LRP), SPEC.md section 1.4 and section 2.

Voita et al. (2019, section 4.2) measure how much each attention head contributes to the top-1
logit: relevance starts at 1 on the top-1 logit of a target step, is propagated back to the
neurons of each head's context vector (before concatenation and W^O), summed per head in absolute
value, normalised over the heads of a layer, and averaged over all generation steps.

How it is computed. Every LRP rule used here can be written as "Gradient x Input" through a
forward pass whose backward pass has been modified (Ancona et al. 2018; Achtibat et al. 2024): if
the gradient arriving at a neuron z is c_z = R_z / z, then x * dz/dx-propagated gradient is the
rule's relevance at the inputs x. So each architecture's forward pass is re-implemented from the
model's own weights (its `lrp_forward()`, seq2seq.LRPForward: transformer_lrp.py for headcount's
Transformer) with this module's rules: `detach` tricks that give each operation its rule's
backward, while leaving every forward value unchanged:

- "ding" (the paper's rule, default): linear maps plain (the z-rule, LRP-0, biases absorb their
  share); ReLU and residual sums plain (ReLU passes relevance through; sums split in proportion
  to the summands); LayerNorm passes relevance through unchanged, neuron by neuron (its backward
  is replaced by dy * y / x); attention probabilities are detached, so relevance reaches the
  values only. The only element-wise products left are with constants (the head gates, the
  sqrt(d_model) embedding scale), which are linear maps, so the "split in proportion to the
  factors" rule for products of two neurons never applies to this architecture once the
  probabilities are held constant.
- "attnlrp" (Achtibat et al. 2024): the epsilon rule on linear maps and residual sums (the
  arriving gradient is scaled by z / (z + eps sign z)); LayerNorm with its standard deviation
  held constant (centering is a linear map, the gain/bias an epsilon-rule affine map); the softmax
  keeps its true gradient, which is exactly their softmax rule R_x = x (R - s sum R); the two
  bilinear products of attention (Q K^T and P V) pass half of their relevance to each operand
  (gradient halved), with the epsilon rule on their outputs.

Speed: `head_relevance` runs headcount's own models under "ding" through a hand-written backward
pass (transformer_lrp.ding_step_relevance: the same numbers, 2.8x one forward+backward on the trained
default model's analysis sentences, against a floor of 2.3x for any exact implementation; see
benchmarks/RESULTS.md). The autograd path below serves every rule and architecture: per chunk of
`max_seeds` target steps, a decoder forward pass over the prefix those steps
can see (the decoder is causal) and one vmapped backward pass (`is_grads_batched`), over only the
sentences that have those steps; the encoder pass is shared by the chunks until that set grows.
Each seed starts relevance 1 at the top-1 logit of one step in every such sentence at once
(sentences do not interact in evaluation mode). No Python loop over tokens. Each step still needs
its own backward pass (|R| is taken per step, so steps cannot be summed into one), and each of
them runs through the whole encoder: the cost per sentence grows with the square of its length,
one forward+backward's only linearly. The matrix products are most of the time, so this is close
to the floor for the method: see benchmarks/RESULTS.md.

Language models (seq2seq.MODEL_KINDS; hf_lm_lrp.py for the transformers adapters). A decoder-only
model's LRP forward has an empty `encode` (src is (B, 0): no contexts, no streams) and a `decode`
whose trace holds "dec_self" contexts only; step_relevance reads the attention types a trace holds,
so the prefix chunks above run unchanged and the cuts are the decoder's ("dec.l"). An encoder-only
(masked) LM has no decoder steps: its LRP forward offers `predict_masked` (the MLM head at every
source position) and masked_step_relevance seeds the masked positions, one shared forward pass, steps
indexed by source position; its cuts are "enc.l". For encoder-decoders nothing changes: the same
operations in the same order (results byte-identical).
The transformers language models are not re-implemented: hf_lm_lrp.py runs transformers' own forward
with these rules given to its modules (norms, linear maps, attention function, activations) for the pass.
So does hf_lrp.py for the encoder-decoders (module_rules.py holds what the two share); only headcount's
own Transformer (transformer_lrp.py) is re-implemented.

Shapes: B batch, S source length, T target length, D d_model, H heads, Dh head size, L layers,
N seeds (target steps) in a chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headcount.io import HeadcountError
from headcount.models.recompute import wants_recompute
from headcount.models.seq2seq import ATTENTION_TYPES, Seq2SeqWithHeads, kind_of

RULES = ("ding", "attnlrp")


class LRPNotImplemented(HeadcountError, NotImplementedError):
    """A configuration that an LRP forward pass does not reproduce (sliding-window attention, relative
    position embeddings): explaining it would explain another model."""


# --------------------------------------------------------------------------------------------
# Modified-gradient building blocks: forward value unchanged, backward = an LRP rule


def scale_gradient(z: Tensor, factor: Tensor) -> Tensor:
    """Identity in the forward pass; multiplies the gradient arriving at z by `factor` (constant)."""
    return z.detach() + (z - z.detach()) * factor.detach()


def epsilon_stabilise(z: Tensor, eps: float) -> Tensor:
    """The epsilon rule's denominator: turns the arriving R/z into R/(z + eps sign z)."""
    sign = torch.where(z >= 0, 1.0, -1.0).to(z.dtype)
    return scale_gradient(z, z / (z + eps * sign))


def pass_through(x: Tensor, y: Tensor, tiny: float = 1e-30) -> Tensor:
    """Returns y, but the backward makes R_x = R_y neuron by neuron (element-wise maps ignored)."""
    x_safe = torch.where(x.abs() < tiny, torch.full_like(x, tiny), x)
    return y.detach() + (x - x.detach()) * (y / x_safe).detach()


def half_gradient(z: Tensor) -> Tensor:
    """A bilinear product's uniform rule: each operand receives half of the relevance."""
    return 0.5 * z + 0.5 * z.detach()


class DingRules:
    """LRP as in Ding et al. (2017) / Voita et al. (2019): z-rule, non-linearities ignored."""

    name = "ding"

    def stabilise(self, z: Tensor) -> Tensor:
        return z  # LRP-0: no stabiliser

    def linear(self, x: Tensor, layer: nn.Linear, weight: Tensor | None = None) -> Tensor:
        """layer applied to x, optionally with `weight` in place of layer.weight."""
        return F.linear(x, layer.weight if weight is None else weight, layer.bias)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return a + b

    def layer_norm(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return pass_through(x, F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps))

    def attention(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        """Attention probabilities held constant: relevance reaches V only."""
        probs = _probabilities(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), allowed)
        return probs.detach() @ v  # (B, H, Tq, Dh)


class AttnLRPRules(DingRules):
    """AttnLRP (Achtibat et al. 2024) with the epsilon rule on linear maps."""

    name = "attnlrp"

    def __init__(self, eps: float = 1e-6):
        self.eps = eps

    def stabilise(self, z: Tensor) -> Tensor:
        return epsilon_stabilise(z, self.eps)

    def linear(self, x: Tensor, layer: nn.Linear, weight: Tensor | None = None) -> Tensor:
        return self.stabilise(super().linear(x, layer, weight))

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self.stabilise(a + b)

    def layer_norm(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """Standard deviation held constant; centering z-rule, gain and bias epsilon rule."""
        centred = x - x.mean(dim=-1, keepdim=True)
        std = (centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt().detach()
        return self.stabilise(centred / std * norm.weight + norm.bias)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor) -> Tensor:
        scores = self.stabilise(half_gradient(q @ k.transpose(-2, -1))) / math.sqrt(q.shape[-1])
        probs = _probabilities(scores, allowed)  # softmax rule = its true gradient
        return self.stabilise(half_gradient(probs @ v))


def make_rules(rule: str, eps: float = 1e-6) -> DingRules:
    if rule == "ding":
        return DingRules()
    if rule == "attnlrp":
        return AttnLRPRules(eps)
    raise ValueError(f"unknown LRP rule {rule!r}; expected one of {RULES}")


def _probabilities(scores: Tensor, allowed: Tensor) -> Tensor:
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


# --------------------------------------------------------------------------------------------
# What an architecture's LRP forward pass returns (seq2seq.LRPForward; transformer_lrp.py for
# headcount's own Transformer)


@dataclass
class EncoderTrace:
    """The encoder's half of the LRP forward pass, shared by every decoder prefix."""

    memory: Tensor  # (B, S, D) after the final encoder LayerNorm
    allowed: Tensor  # (B, 1, 1, S) True at real source positions
    contexts: list[Tensor]  # per layer (B, H, S, Dh), before the gates
    inputs: list[Tensor]  # L_enc + 1 residual streams (B, S, D); the last before the final norm


@dataclass
class Trace:
    """The tensors whose relevance is read after the backward pass."""

    top_logit: Tensor  # (B, T) the top-1 logit of each target step
    target: Tensor  # (B, T) the token whose logit that is
    contexts: dict[str, list[Tensor]]  # type -> per layer (B, H, Tq, Dh), before the gates
    enc_inputs: list[Tensor]  # L_enc + 1 residual streams (B, S, D); the last before the final norm
    dec_inputs: list[Tensor]  # L_dec + 1 residual streams (B, T, D)
    memories: list[Tensor]  # per decoder layer, its own view of the encoder output (B, S, D)


def top1_targets(logits_of, hidden: Tensor, tgt_in: Tensor, target: Tensor | None, special) -> Tensor:
    """The token whose logit each step explains, (B, T): `target` where it is >= 0, elsewhere the
    top-1 token of logits_of(hidden) (B, T, D) -> (..., V), never one of special.never_generated()
    (as in greedy search). Only the missing steps are projected onto the vocabulary."""
    target = torch.full_like(tgt_in, -1) if target is None else target
    missing = target < 0  # (B, T) steps whose top-1 token is not known yet
    if missing.any():
        with torch.no_grad():
            logits = logits_of(hidden[missing])  # (M, V)
            logits[:, list(special.never_generated())] = float("-inf")
            target = target.masked_scatter(missing, logits.argmax(dim=-1))
    return target


def lrp_forward(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor, rules, target: Tensor | None = None) -> Trace:
    """Teacher-forced forward pass with LRP backward rules (the model's own `lrp_forward()`); the
    top-1 logit of every step. An encoder-only model's steps are its source positions (tgt_in is
    empty): the MLM head's top-1 logit at each."""
    forward = model.lrp_forward()
    if kind_of(model).name == "encoder_only":
        return forward.predict_masked(forward.encode(src, rules), src, rules, target)
    return forward.decode(forward.encode(src, rules), tgt_in, rules, target)


# --------------------------------------------------------------------------------------------
# Relevance per head and step


@dataclass
class StepRelevance:
    """LRP results for one batch, one entry per (generation step, sentence)."""

    heads: dict[str, Tensor]  # type -> (T, B, L, H) sum of |R| over a head's context neurons; the model's own types
    valid: Tensor  # (T, B) True where step t exists in sentence b (encoder-only: T = S, True at masked positions)
    cuts: dict[str, Tensor]  # cut name -> (T, B) total relevance crossing it (start value 1)

    def normalised(self) -> dict[str, Tensor]:
        """Head relevance normalised to sum 1 over the heads of each layer: type -> (T, B, L, H)."""
        return {kind: _normalise_layers(r) for kind, r in self.heads.items()}


def _normalise_layers(r: Tensor) -> Tensor:
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), torch.zeros_like(r))


def _relevance(tensor: Tensor, grad: Tensor) -> Tensor:
    """Gradient x Input with a leading seed dimension: (N, *shape)."""
    return tensor.unsqueeze(0) * grad


@torch.enable_grad()
def step_relevance(
    model: Seq2SeqWithHeads,
    src: Tensor,  # (B, S) subwords + EOS, padded
    tgt_in: Tensor,  # (B, T) BOS + the translation being explained, padded
    rule: str = "ding",
    eps: float = 1e-6,
    max_seeds: int = 8,
    target: Tensor | None = None,
    recompute: bool | None = None,
) -> StepRelevance:
    """LRP head relevance of every generation step of a batch, batched over steps by vmap.

    Each target step t is one seed: relevance 1 on its top-1 logit, in every sentence at once.
    `max_seeds` steps share one vmapped backward pass (memory grows with it). A decoder-only model
    (src (B, 0)) runs the same way: its LRP forward's `encode` is empty and its trace holds dec_self
    only. An encoder-only model has no decoder steps: masked_step_relevance explains its masked
    positions instead (tgt_in is empty, so target, if given, is (B, S)).

    Long inputs: a pass over rows longer than recompute.RECOMPUTE_ABOVE positions (the encoder's
    over the source; a chunk's decoder pass over its prefix and the source), or every pass with
    `recompute=True`, has its layers recomputed in the backward pass (models.recompute): memory
    holds one layer's activations, not every layer's, for about one more forward pass per chunk;
    the same numbers. An architecture whose LRP forward has no `recompute` switch runs as it is.
    """
    if kind_of(model).name == "encoder_only":
        return masked_step_relevance(model, src, rule, eps, max_seeds, target, recompute)
    rules = make_rules(rule, eps)
    forward = model.lrp_forward()
    pad = model.special.pad
    B, T = tgt_in.shape
    valid = model.special.decoder_positions(tgt_in).T  # (T, B)
    steps_per_sentence, src_lengths = valid.sum(dim=0), src.ne(pad).sum(dim=1)  # (B,), (B,)
    top1 = torch.full_like(tgt_in, -1) if target is None else target.clone()  # (B, T); -1: not known yet
    was_training = model.training
    model.eval()
    all_heads = totals = trace = None
    encoded, encoded_rows = None, None
    try:
        # Longest prefix first: its top-1 tokens serve every shorter prefix (no vocabulary projection
        # again), and the sentences taking part only grow from one chunk to the next.
        for first in reversed(range(0, int(steps_per_sentence.max()), max_seeds)):
            last = min(T, first + max_seeds)
            # Only the sentences that have step `first` take part, and only as much of their
            # source as the longest of them needs: in a batch of mixed lengths the long tail of
            # steps belongs to a few sentences (on the trained model's dev batches, half of the
            # step x source work was padding). Their encoder pass is rebuilt when the set grows.
            rows = (steps_per_sentence > first).nonzero().squeeze(1)  # (B',)
            if encoded_rows is None or not torch.equal(rows, encoded_rows):
                S = int(src_lengths[rows].max())
                forward.recompute = wants_recompute(recompute, S)
                encoded = forward.encode(src[rows, :S], rules)
                encoded_rows = rows
            # Steps first..last-1 only reach decoder positions < last: decode that prefix alone, so
            # the backward passes skip the later positions (half the decoder's work on average).
            forward.recompute = wants_recompute(recompute, encoded.memory.shape[1], last)
            trace = forward.decode(encoded, tgt_in[rows, :last], rules, top1[rows, :last])
            top1[rows, :last] = trace.target
            steps = torch.arange(first, last, device=src.device)  # (N,)
            heads, stream_totals = _seeded_backward(trace, steps, valid[steps][:, rows])
            with torch.no_grad():
                if all_heads is None:  # sentences without these steps keep zeros, as a zero seed gives
                    all_heads = heads.new_zeros(T, B, *heads.shape[2:])  # (T, B, all layers, H)
                    totals = stream_totals.new_zeros(T, B, stream_totals.shape[-1])  # (T, B, K)
                all_heads[first:last, rows] = heads
                totals[first:last, rows] = stream_totals
    finally:
        model.train(was_training)

    return StepRelevance(_split_types(trace, all_heads), valid,
                         cut_totals(totals, len(trace.enc_inputs), len(trace.dec_inputs)))


def _context_list(trace: Trace) -> list[Tensor]:
    """The head contexts of the model's own attention types (a language model's trace holds one
    type), in ATTENTION_TYPES' order, layers in order."""
    return [c for kind in ATTENTION_TYPES if kind in trace.contexts for c in trace.contexts[kind]]


def _split_types(trace: Trace, all_heads: Tensor) -> dict[str, Tensor]:
    """(T, B, all layers, H) -> type -> (T, B, L, H), the trace's own types only."""
    heads, offset = {}, 0
    for kind in ATTENTION_TYPES:
        if kind not in trace.contexts:
            continue
        n = len(trace.contexts[kind])
        heads[kind] = all_heads[:, :, offset : offset + n]
        offset += n
    return heads


def _seeded_backward(trace: Trace, steps: Tensor, seeded: Tensor) -> tuple[Tensor, Tensor]:
    """One vmapped backward pass, seed n starting relevance 1 at the top-1 logit of step steps[n]
    in every sentence b where seeded[n, b] (N, B'): -> head sums of |R| (N, B', all layers, H) and
    each stream's total relevance (N, B', K), streams enc_inputs + dec_inputs + memories."""
    ctx_list = _context_list(trace)
    streams = trace.enc_inputs + trace.dec_inputs + trace.memories
    top = trace.top_logit.detach()  # (B', T')
    seed = torch.zeros(len(steps), *top.shape, dtype=top.dtype, device=top.device)  # (N, B', T')
    start = 1.0 / torch.where(top == 0, torch.ones_like(top), top)  # gradient seed for R = 1
    seed[torch.arange(len(steps)), :, steps] = start[:, steps].T * seeded
    grads = torch.autograd.grad(trace.top_logit, ctx_list + streams, seed, retain_graph=True,
                                is_grads_batched=True, allow_unused=True)
    with torch.no_grad():  # reading relevance off needs no graph
        heads = torch.stack([_relevance(c, g).abs().sum(dim=(3, 4))  # (N, B', H) per layer
                             for c, g in zip(ctx_list, grads)], dim=2)  # (N, B', all layers, H)
        # A stream's total relevance, sum over (t, d) of input x gradient, as one contraction.
        stream_totals = torch.stack([torch.einsum("btd,nbtd->nb", s, g)
                                     for s, g in zip(streams, grads[len(ctx_list):])], dim=-1)  # (N, B', K)
    return heads, stream_totals


@torch.enable_grad()
def masked_step_relevance(
    model: Seq2SeqWithHeads,
    src: Tensor,  # (B, S) BOS + x' + EOS, `special.mask` at the masked positions, padded
    rule: str = "ding",
    eps: float = 1e-6,
    max_seeds: int = 8,
    target: Tensor | None = None,
    recompute: bool | None = None,
) -> StepRelevance:
    """step_relevance for an encoder-only (masked) LM: one step per masked position, relevance 1
    on the top-1 logit of the MLM head there. Steps are indexed by source position: heads
    (S, B, L, H), valid (S, B) True at the masked positions. The encoder is bidirectional, so one
    forward pass serves every chunk of `max_seeds` positions (each seeded in every sentence masked
    there); the LRP forward's `predict_masked` gives the trace (hf_lm_lrp.MaskedLMLRPForward).
    target (B, S): the token explained at each masked position, -1 (default) for the top-1 one.
    `recompute` as step_relevance's: recomputed, each chunk's backward pass runs the encoder again."""
    rules = make_rules(rule, eps)
    forward = model.lrp_forward()
    forward.recompute = wants_recompute(recompute, src.shape[1])
    B, S = src.shape
    masked = src.eq(model.special.mask)  # (B, S)
    wanted = torch.full_like(src, -1) if target is None else target.clone()
    # Unmasked positions are never seeded: any token will do there (no vocabulary projection).
    wanted = torch.where(masked, wanted, torch.full_like(src, model.special.pad))
    valid = masked.T  # (S, B)
    was_training = model.training
    model.eval()
    try:
        trace = forward.predict_masked(forward.encode(src, rules), src, rules, wanted)
        n_layers = sum(len(c) for c in trace.contexts.values())
        H = max((c.shape[1] for c in _context_list(trace)), default=0)
        all_heads = trace.top_logit.new_zeros(S, B, n_layers, H)  # (S, B, L, H)
        totals = trace.top_logit.new_zeros(S, B, len(trace.enc_inputs))  # (S, B, K)
        positions = masked.any(dim=0).nonzero().squeeze(1)  # (P,) masked in some sentence
        for chunk in positions.split(max_seeds):
            heads, stream_totals = _seeded_backward(trace, chunk, valid[chunk])
            all_heads[chunk], totals[chunk] = heads.detach(), stream_totals.detach()
    finally:
        model.train(was_training)
    return StepRelevance(_split_types(trace, all_heads), valid, cut_totals(totals, len(trace.enc_inputs), 0))


def cut_totals(totals: Tensor, n_enc: int, n_dec: int) -> dict[str, Tensor]:
    """Total relevance across each horizontal cut of the network, (T, B) per cut, top first.

    "dec.l" is the residual stream entering decoder layer l (l = L_dec: leaving the last layer,
    before the final LayerNorm) plus what layers >= l sent to the encoder memory; "enc.l" is the
    encoder stream entering layer l plus the decoder's input embeddings. Under a conservative
    rule with no biases every cut holds exactly the start value 1.
    """
    enc, dec, mem = totals[..., :n_enc], totals[..., n_enc : n_enc + n_dec], totals[..., n_enc + n_dec :]
    cuts = {}
    for layer in range(n_dec - 1, -1, -1):
        cuts[f"dec.{layer}"] = dec[..., layer] + mem[..., layer:].sum(dim=-1)
    for layer in range(n_enc - 1, -1, -1):  # an encoder-only model: no decoder inputs to add
        cuts[f"enc.{layer}"] = enc[..., layer] + dec[..., 0] if n_dec else enc[..., layer]
    return cuts
