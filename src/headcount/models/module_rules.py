"""LRP rules given to a transformers model's own modules for one forward pass, as lxt applies
AttnLRP: what hf_lm_lrp.py (language models) and hf_lrp.py (encoder-decoders) share.

`_module_rules(lrp_forward, rules, layers)` is a context manager inside which transformers' own
forward runs with the rule object's (lrp.DingRules / lrp.AttnLRPRules) forward on each module;
everything is put back on leaving, and the graph built needs none of it. The modules get:

- norms: LayerNorm `rules.layer_norm`; RMSNorm (Llama, Qwen, T5) passed through (ding) or with
  its root mean square held constant (attnlrp), in float32 as transformers computes each;
- linear maps (nn.Linear, Conv1D): the epsilon rule on their output under AttnLRP (a hook);
- attention: an AttentionInterface function (`rules.attention` over the module's q, k, v; T5's
  relative position bias added to the scores as a constant), named by a config copy of each
  attention module; a module with no AttentionInterface (FSMT) gets its lrp_forward's forward;
- activations passed through (lrp.pass_through); a gated product's input with half its relevance;
- the residual sums that transformers adds inline: AttnLRP's epsilon rule where hooks reach them
  (_layer_with_rules).

The head contexts are read at each gate slot's `head_context` hook, the residual streams at the
first layer's input and each layer's output (batch-major: a time-major model's are transposed
views), the encoder memory at each decoder layer's input (a view of its own, as lrp.py's).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math

import torch
from torch import Tensor, nn

from headcount.models.lrp import half_gradient, pass_through
from headcount.models.recompute import checkpointed


def _rms_norm(rules, x: Tensor, norm: nn.Module) -> Tensor:
    """transformers' RMSNorm (Llama, Qwen): w * (x / rms(x)), the normalisation in float32."""
    inverse_rms = torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + norm.variance_epsilon)
    if rules.name == "ding":
        return pass_through(x, norm.weight * (x.to(torch.float32) * inverse_rms).to(x.dtype))
    return rules.stabilise(norm.weight * (x.to(torch.float32) * inverse_rms.detach()).to(x.dtype))


def _t5_rms_norm(rules, x: Tensor, norm: nn.Module) -> Tensor:
    """T5's RMSNorm: the mean square in float32, x itself in its own dtype (T5LayerNorm)."""
    inverse_rms = torch.rsqrt(x.to(torch.float32).pow(2).mean(dim=-1, keepdim=True) + norm.variance_epsilon)
    if rules.name == "ding":
        return pass_through(x, norm.weight * (x * inverse_rms))
    return rules.stabilise(norm.weight * (x * inverse_rms.detach()))  # a linear map once rms is constant


def _norm_rule(rules, norm: nn.Module):
    """The rule's forward for a LayerNorm or an RMSNorm (None for any other module)."""
    if isinstance(norm, nn.LayerNorm):
        return lambda x: rules.layer_norm(x, norm)
    if hasattr(norm, "variance_epsilon") and hasattr(norm, "weight"):
        if type(norm).__name__.endswith("T5LayerNorm"):
            return lambda x: _t5_rms_norm(rules, x, norm)
        return lambda x: _rms_norm(rules, x, norm)
    return None


def _is_linear(module: nn.Module) -> bool:
    """An nn.Linear or transformers' Conv1D (GPT-2's fused QKV and feed-forward)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


LRP_ATTENTION = "headcount_lrp_attention"


def _allowed(attention_mask, causal: bool, Tq: int, Tk: int, device) -> Tensor:
    """Where a query may attend, from eager's additive mask (0 where the key is seen)."""
    if attention_mask is not None:
        return attention_mask == 0
    if causal:  # transformers may leave out a mask that masks nothing but the future
        return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril(Tk - Tq)[None, None]
    return torch.ones(1, 1, 1, Tk, dtype=torch.bool, device=device)


def _lrp_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling: float,
                   position_bias: Tensor | None = None, **kwargs):
    """An AttentionInterface function (transformers' eager one's signature): the rule's attention
    (lrp.*Rules.attention, in the model's dtype) over the module's q (B, H, Tq, Dh) after any
    rotary and k, v (B, KV, Tk, Dh); each query head reads its KV head by `kv_of`. The scores are
    scaled by `scaling` (the rules divide by sqrt(Dh): q is multiplied by the constant ratio where
    it differs, a linear map both rules pass exactly). T5's `position_bias` (a constant) is added
    to the scores. -> ((B, Tq, H, Dh), None)."""
    rules, slot, causal = module._headcount_lrp
    allowed = _allowed(attention_mask, causal, query.shape[2], key.shape[2], query.device)
    if position_bias is not None:
        return _biased_attention(rules, query, key, value, allowed, scaling, position_bias).transpose(1, 2), None
    kv_of = getattr(slot, "kv_of", None)
    if kv_of is not None:  # grouped-query attention: each query head reads its KV head
        index = torch.tensor(kv_of, dtype=torch.long, device=key.device)
        key, value = key.index_select(1, index), value.index_select(1, index)  # (B, H, Tk, Dh)
    ratio = scaling * math.sqrt(query.shape[-1])
    if not math.isclose(ratio, 1.0, rel_tol=1e-12):  # (Dh^-0.5 * sqrt(Dh) may round off 1)
        query = query * ratio
    return rules.attention(query, key, value, allowed).transpose(1, 2).contiguous(), None


def _biased_attention(rules, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scaling: float, bias: Tensor):
    """lrp.py's attention rules with a constant added to the scores (T5's relative position bias),
    the scores scaled by `scaling` after the product's rule. -> (B, H, Tq, Dh)."""
    raw = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    if rules.name == "attnlrp":
        raw = rules.stabilise(half_gradient(raw))
    probs = (raw * scaling + bias.detach()).masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return probs.detach() @ v if rules.name == "ding" else rules.stabilise(half_gradient(probs @ v))


def _epsilon_factor(z: Tensor, eps: float) -> Tensor:
    """The epsilon rule's z / (z + eps sign z), a constant."""
    sign = torch.where(z >= 0, 1.0, -1.0).to(z.dtype)
    return (z / (z + eps * sign)).detach()


def _set_forward(module: nn.Module, forward, undo: list) -> None:
    own = module.__dict__.get("forward")
    module.forward = forward
    undo.append(lambda: module.__dict__.pop("forward") if own is None else setattr(module, "forward", own))


def _set_attribute(obj, name: str, value, undo: list) -> None:
    """obj.name = value (not a submodule) until undone."""
    had, old = name in obj.__dict__, obj.__dict__.get(name)
    object.__setattr__(obj, name, value)
    undo.append(lambda: object.__setattr__(obj, name, old) if had else obj.__dict__.pop(name))


def _give_rules(modules, rules, undo: list) -> None:
    """Norms their rule's forward; under AttnLRP the epsilon rule on each linear map's output."""
    for module in modules:
        forward = _norm_rule(rules, module)
        if forward is not None:
            _set_forward(module, forward, undo)
        elif _is_linear(module) and rules.name != "ding":
            undo.append(module.register_forward_hook(lambda m, args, out: rules.stabilise(out)).remove)


@contextlib.contextmanager
def _module_rules(lrp_forward, rules, layers=None):
    """lrp_forward's model with the rule on its modules, inside the block (transformers' own forward
    is run in it); yields {"streams": [first layer's input, each layer's output], "contexts":
    [each attention's head contexts, in call order], "kinds": {attention type: its contexts},
    "memories": [each decoder layer's view of the encoder memory]}, filled by the forward pass.
    Everything is put back on leaving; the graph built needs nothing of it.

    layers: [(layer, [(slot, attention type, causal), ...])]; by default lrp_forward._layers()
    with lrp_forward.slots, one self-attention each ("dec_self", causal = lrp_forward.causal).
    Outside the layers (lrp_forward._outside()): norms and linear maps (_give_rules). Each layer's
    forward is wrapped, and recomputed in the backward pass where lrp_forward.recompute is set
    (within it, everything of the layer's, again): _layer_with_rules."""
    from transformers import AttentionInterface

    if LRP_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(LRP_ATTENTION, _lrp_attention)
    if layers is None:
        layers = [(layer, [(slot, "dec_self", lrp_forward.causal)])
                  for layer, slot in zip(lrp_forward._layers(), lrp_forward.slots)]
    found, undo = {"streams": [], "contexts": [], "kinds": {}, "memories": []}, []
    recording = [True]  # False once the pass is over: a layer recomputed in the backward pass records nothing
    try:
        _give_rules(lrp_forward._outside(), rules, undo)
        for layer, slots in layers:
            run = _layer_with_rules(lrp_forward, layer, slots, layer.forward, rules, found, recording)
            _set_forward(layer, run, undo)
        yield found
    finally:
        recording[0] = False
        for fn in reversed(undo):
            fn()


def _give_attention(lrp_forward, layer: nn.Module, slots, rules, undo: list) -> None:
    """Each attention module of the layer its slot's rule: a config copy naming _lrp_attention (as
    hf_lm._group_explicitly gives one), or lrp_forward._attention_forward's forward where the
    module calls no attention function (FSMT)."""
    own_forward = getattr(lrp_forward, "_attention_forward", None)
    for slot, _kind, causal in slots:
        if own_forward is not None:
            _set_forward(slot.attention, own_forward(slot, rules, causal), undo)
    if own_forward is not None:
        return
    for module in layer.modules():
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "_attn_implementation"):
            continue
        mine = [s for s in slots if any(m is s[0] for m in module.modules())]
        if not mine and len(slots) == 1:  # an LM layer's one attention (BERT's W^O sits outside it)
            mine = slots
        if len(mine) != 1:
            continue
        slot, _kind, causal = mine[0]
        config = copy.copy(config)
        config._attn_implementation = LRP_ATTENTION
        _set_attribute(module, "config", config, undo)
        _set_attribute(module, "_headcount_lrp", (rules, slot, causal), undo)
        if getattr(module, "reorder_and_upcast_attn", False):  # GPT-2's float32 path: eager's own
            _set_attribute(module, "reorder_and_upcast_attn", False, undo)


def _layer_with_rules(lrp_forward, layer: nn.Module, slots, forward, rules, found: dict, recording: list):
    """The layer's own `forward` with the rule on its modules: its norms and linear maps
    (_give_rules); its attention modules (_give_attention); the activations passed through
    (lrp.pass_through); the input of lrp_forward._product(layer) (SwiGLU's gated product) with its
    relevance halved, half to each factor; the head contexts read at the gates' `head_context`
    hook; and the residual sums (lrp_forward._residual(layer)), which transformers' layer adds in
    its forward, out of a hook's reach, under AttnLRP's epsilon rule:

    - "pre" (pre-LN, sequential): each sum s_k = s_(k-1) + branch but the last is stabilised where
      the norm named reads it (a pre-hook), the output y = s_n as a whole; each s_k's own factor
      f_k is put on the gradient s_k gets through the later sums by a term of value zero,
      D_k = D_(k-1) f_k + (s_k - s_k) (f_k - 1), added to the next norm's input (times its f) and
      to the output (times f_y);
    - "parallel" (GPT-NeoX): y = mlp + attn + x, one sum: the output stabilised;
    - "post" (post-LN): each sum is the input of the norms named, stabilised there (pre-hooks).

    A layer returning a tuple (T5, FSMT) has the rules on its first element; a time-major layer
    (lrp_forward.time_major) has its streams recorded as batch-major views; a decoder layer
    (lrp_forward._memory_index: the encoder memory's place among its positional arguments after
    the hidden states) reads the memory through a view of its own, recorded."""
    attnlrp, residual = rules.name != "ding", lrp_forward._residual(layer)
    time_major = getattr(lrp_forward, "time_major", False)
    memory_index = getattr(lrp_forward, "_memory_index", lambda layer: None)(layer)

    def run(hidden_states, *args, **kwargs):
        undo, state = [], {"terms": None}
        try:
            _give_rules(layer.modules(), rules, undo)
            _give_attention(lrp_forward, layer, slots, rules, undo)
            for owner, name in lrp_forward._activations(layer):
                act = getattr(owner, name)
                if isinstance(act, nn.Module):
                    _set_forward(act, lambda x, act=act.forward: pass_through(x, act(x)), undo)
                else:
                    _set_attribute(owner, name, lambda x, act=act: pass_through(x, act(x)), undo)
            product = lrp_forward._product(layer)
            if product is not None:
                undo.append(product.register_forward_pre_hook(lambda m, args: (half_gradient(args[0]),)).remove)
            if recording[0]:
                for slot, kind, _causal in slots:
                    def record(m, args, out, kind=kind):
                        found["contexts"].append(out)
                        found["kinds"].setdefault(kind, []).append(out)

                    undo.append(slot.head_context.register_forward_hook(record).remove)
            if attnlrp and residual[0] != "parallel":
                def stabilised(m, args):
                    s = args[0]
                    f = _epsilon_factor(s, rules.eps)
                    stable = s.detach() + (s - s.detach()) * f
                    if residual[0] == "pre":
                        if state["terms"] is not None:
                            stable = stable + state["terms"].reshape(s.shape) * f
                        own = (s - s.detach()) * (f - 1)
                        state["terms"] = own if state["terms"] is None else state["terms"].reshape(s.shape) * f + own
                    return (stable, *args[1:])

                for norm in residual[1:]:
                    undo.append(norm.register_forward_pre_hook(stabilised).remove)
            out = forward(hidden_states, *args, **kwargs)
        finally:
            for fn in reversed(undo):
                fn()
        y = out[0] if isinstance(out, tuple) else out
        if attnlrp and residual[0] != "post":
            f_y = _epsilon_factor(y, rules.eps)
            stable = y.detach() + (y - y.detach()) * f_y
            if state["terms"] is not None:
                stable = stable + state["terms"].reshape(y.shape) * f_y  # OPT's norm reads it flattened
            y = stable
        return (y, *out[1:]) if isinstance(out, tuple) else y

    def batch_major(x: Tensor, own: bool = False) -> tuple[Tensor, Tensor]:
        """(what is recorded, what the layer gets): x batch-major, a view of its own where `own`."""
        if time_major:
            view = x.transpose(0, 1)
            return view, view.transpose(0, 1)
        return (x.view_as(x),) * 2 if own else (x, x)

    def with_rules(hidden_states, *args, **kwargs):
        if recording[0] and not found["streams"]:
            first, hidden_states = batch_major(hidden_states)
            found["streams"].append(first)  # the first layer's input: the embeddings
        if memory_index is not None:
            args = list(args)
            memory, args[memory_index] = batch_major(args[memory_index], own=True)
            if recording[0]:
                found["memories"].append(memory)
        out = checkpointed(functools.partial(run, **kwargs), hidden_states, *args, layer=layer,
                           recompute=lrp_forward.recompute)
        if recording[0]:
            y = out[0] if isinstance(out, tuple) else out
            stream, y = batch_major(y)
            found["streams"].append(stream)
            out = (y, *out[1:]) if isinstance(out, tuple) else y
        return out

    return with_rules
