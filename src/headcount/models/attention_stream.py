"""Attention maps one layer at a time: what lets the analyses read documents, not only sentences.

`model(src, tgt_in, need_weights=True)` returns every layer's probabilities at once, L x (B, H,
T, T): for SmolLM2 (30 layers, 9 heads) at 2,048 tokens that is 4.5 GB in float32, for a 7B model
(32 x 32) 17 GB in bf16, before anything is reduced. `streamed_forward` runs the same pass with a
forward hook on every attention module that hands the layer's map to `on_map(type, layer, probs)`
the moment the layer has computed it and drops it from the module's output, so the model keeps
none: at any time only the layer being computed holds a map (H x T^2), and what the analysis keeps
is its own reduction (confidence sums, offset counts, sink shares).

Which pass gives the maps without keeping them:
- the transformers language models (hf_lm: GPT-2, Llama, Qwen, BERT, RoBERTa, sentence encoders)
  run eager attention, whose modules return their probabilities whether or not `output_attentions`
  is set; asked for them, transformers would also collect all of them. Their class says
  `maps_without_weights = True` and they run with need_weights=False: nothing is collected.
- every other model (headcount's own Transformer, fairseq's, the transformers encoder-decoders)
  computes the probabilities only when asked, need_weights=True; the hook replaces each module's
  map in its output by None, so the per-layer lists the model returns hold None. (transformers'
  encoder-decoders still collect them in their own output: streamed, but not smaller.)

Results are identical to reducing the all-at-once lists: the same tensors reach `on_map`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from headcount.models.seq2seq import kind_of

# on_map(attention type, layer, probs (B, H, Tq, Tk)): called once per layer and type, in the
# order the model computes them (encoder layers, then each decoder layer's self then cross).
MapCallback = Callable[[str, int, Tensor], None]


def map_modules(model) -> dict[str, list[torch.nn.Module]]:
    """The module whose output's second element is each layer's attention probabilities, by type:
    the gate slot's attention where the slot is a separate output projection (the transformers
    adapters' `attention`), else the slot itself (headcount's MultiHeadAttention)."""
    return {kind: [getattr(slot, "attention", slot) for slot in slots]
            for kind, slots in model.attention_modules().items()}


def stream_attention(model, src: Tensor, tgt_in: Tensor, on_map: MapCallback,
                     types: tuple[str, ...] | None = None) -> None:
    """Run the model over a batch, handing each layer's attention map of the `types` (default: all
    the model's) to `on_map` as it is computed and keeping it nowhere (module docstring). Runs
    what the types need and no more: the encoder alone for enc_self, else the encoder and the
    decoder, never the output layer (a document's logits, T x V, would outweigh a layer's maps).

    A model whose attention modules are not torch modules, or that names none (the tests' planted
    fakes), is run once
    with need_weights=True and its lists handed over layer by layer: the same calls, not streamed."""
    if not hasattr(model, "attention_modules"):
        kinds = kind_of(model).attention_types
        _all_at_once(model, src, tgt_in, on_map, [kind for kind in kinds if types is None or kind in types])
        return
    modules = map_modules(model)
    wanted = [kind for kind in modules if types is None or kind in types]
    if not all(isinstance(m, torch.nn.Module) for kind in wanted for m in modules[kind]):
        _all_at_once(model, src, tgt_in, on_map, wanted)
        return
    handles = [module.register_forward_hook(_hook(on_map, kind, layer))
               for kind in wanted for layer, module in enumerate(modules[kind])]
    need = not getattr(model, "maps_without_weights", False)
    try:
        memory, src_pad, _ = model.encode(src, need_weights=need and "enc_self" in wanted)
        if any(kind != "enc_self" for kind in wanted):
            model.decode(tgt_in, memory, src_pad, need_weights=need)
    finally:
        for handle in handles:
            handle.remove()


def _all_at_once(model, src: Tensor, tgt_in: Tensor, on_map: MapCallback, wanted: list[str]) -> None:
    if wanted == ["enc_self"] and hasattr(model, "encode"):
        maps = {"enc_self": model.encode(src, need_weights=True)[2]}
    else:
        maps = model(src, tgt_in, need_weights=True)[1]
    for kind in wanted:
        for layer, probs in enumerate(maps[kind]):
            on_map(kind, layer, probs)


def _hook(on_map: MapCallback, kind: str, layer: int):
    def hook(module, inputs, output):
        if isinstance(output, tuple) and len(output) > 1 and isinstance(output[1], Tensor):
            on_map(kind, layer, output[1])
            return (output[0], None, *output[2:])
        return None

    return hook
