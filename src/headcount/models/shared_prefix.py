"""Copies of a batch that share the layers below a point: run the batch once up to a layer, copy
its rows there, and run only the layers from there on over the copies.

Single-head ablation (analysis.importance.masked_sentence_losses) runs k copies of a dev batch in
one forward pass, copy i with head i masked. A copy's layers below its masked head compute what the
unmasked model computes, so all k copies can share them: the batch (B rows) runs once through the
layers below the lowest of the pass's heads, and each tensor a layer from there on receives with B
rows is repeated k times (copy i: rows i*B:(i+1)*B, as importance._replicated lays them out).

One mechanism for every family: a forward pre-hook on each layer module at and above the start,
so nothing needs a family's layer loop. The layers are found through `attention_modules()`: a
head's layer is the outermost ancestor of its HeadSlots module that is an element of an
nn.ModuleList (T5's blocks hold a ModuleList of sublayers, so the innermost would be a sublayer).
What a layer receives is whatever its family's loop passes it (hidden states, padding or causal
masks built once for the model, rotary cos/sin, memory); a tensor is taken for a batch tensor when
it has at least 2 dimensions and B rows first. 1-dimensional tensors (transformers' cache_position
(T,)) are left alone, and a (1, ...) tensor that broadcasts over the batch (position ids, rotary
tables, T5's position bias) is repeated only when B is 1, which keeps it broadcasting.

Where this cannot be relied on, `layer_stacks` returns None and the caller replicates the inputs
up front as before: time-major families (FSMT: hidden states (T, B, D) but masks (B, S) and a
causal mask (T, T), so "B rows first" could pick the wrong tensors when T == B), and any model
whose heads do not map one to one onto the elements of one ModuleList per side.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import Tensor, nn

# The order in which a model's attention types run: the encoder's layers before the decoder's;
# decoder self- and cross-attention of one layer share that layer.
STAGES = {"enc_self": 0, "dec_self": 1, "dec_enc": 1}


def head_position(head: tuple[str, int, int]) -> tuple[int, int]:
    """Where a head's layer runs in the forward pass: (stage, layer), ordered as they run."""
    kind, layer, _ = head
    return STAGES[kind], layer


def layer_stacks(model: nn.Module) -> dict[str, list[nn.Module]] | None:
    """{attention type: the layer module of each layer}, in layer order, or None where the layers
    cannot be shared this way (see the module docstring: time-major attention; heads that do not
    sit one per element of one ModuleList per side, in layer order)."""
    modules = model.attention_modules()
    names = {id(module): name for name, module in model.named_modules()}
    lists = {name: module for name, module in model.named_modules() if isinstance(module, nn.ModuleList)}
    stacks: dict[str, list[nn.Module]] = {}
    for kind, heads in modules.items():
        if kind not in STAGES or any(getattr(m, "time_major", False) for m in heads):
            return None
        layers, owners = [], set()
        for index, module in enumerate(heads):
            parts = names.get(id(module), "").split(".")
            outer = next((i for i in range(1, len(parts)) if ".".join(parts[:i]) in lists and parts[i].isdigit()),
                         None)
            if outer is None or int(parts[outer]) != index:
                return None
            owners.add(".".join(parts[:outer]))
            layers.append(lists[".".join(parts[:outer])][index])
        if len(owners) != 1:
            return None
        stacks[kind] = layers
    for kind, layers in stacks.items():  # one stack per stage, and a stage's types share its layers
        for other, others in stacks.items():
            same_stage = STAGES[kind] == STAGES[other]
            shared = [a is b for a, b in zip(layers, others)]
            if (same_stage and not all(shared)) or (not same_stage and any(shared)):
                return None
    return stacks


@contextmanager
def copies_from(model: nn.Module, start: tuple[int, int], rows: int, copies: int) -> Iterator[bool]:
    """While open, the layers at and after `start` ((stage, layer), head_position) of that stage
    receive `copies` copies of every batch tensor of `rows` rows; the layers before it run on the
    batch as given. Yields False (nothing hooked) where `layer_stacks` is None: the caller then
    replicates the model's inputs itself.

    The stage's output then has copies * rows rows; a later stage (the decoder after encoder
    copies) is not hooked: its caller passes it inputs of as many rows (importance._output_states).
    """
    stacks = layer_stacks(model) if copies > 1 else None
    stage, first = start
    layers = next((layers for kind, layers in (stacks or {}).items() if STAGES[kind] == stage), None)
    if layers is None:
        yield False
        return
    done: dict[int, tuple[Tensor, Tensor]] = {}  # id -> (tensor, its copies): masks are passed to every layer

    def copied(x):
        if isinstance(x, Tensor) and x.dim() >= 2 and x.shape[0] == rows:
            if id(x) not in done:  # the tensor is kept with its copies, so its id is not reused meanwhile
                done[id(x)] = (x, x.repeat(copies, *([1] * (x.dim() - 1))))
            return done[id(x)][1]
        if isinstance(x, (tuple, list)):  # rotary (cos, sin)
            return type(x)(copied(v) for v in x)
        return x

    def hook(module, args, kwargs):
        return tuple(copied(a) for a in args), {name: copied(v) for name, v in kwargs.items()}

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in layers[first:]]
    try:
        yield True
    finally:
        for handle in handles:
            handle.remove()
