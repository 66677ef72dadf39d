"""A pruned model that plain transformers loads: `save_pretrained` (safetensors), which
`from_pretrained` reads back with no headcount code and no trust_remote_code.

headcount's checkpoints (model.pt) hold its gate modules (`...o_proj.proj.weight`, `head_mask`
buffers, Hard Concrete log alphas), and the physical export (pruning.removal) gives layers
different head counts; transformers 5 has neither `prune_heads` nor head masks, and none of the
configs of the families headcount adapts can say that one layer has fewer heads than another:
MarianMT, BART, mBART, M2M100/NLLB and FSMT have one `encoder_attention_heads` and one
`decoder_attention_heads`, T5/mT5 one `num_heads`, GPT-2 one `n_head`, GPT-NeoX and OPT one
`num_attention_heads`, Llama, Qwen2 and Qwen3 one `num_attention_heads` and `num_key_value_heads`, BERT
and RoBERTa one `num_attention_heads` (the
4.x `pruned_heads` config entry that from_pretrained used to apply is gone). So every closed head
keeps its place with zero weights, which makes the export's outputs the gated model's:

- its input columns of W^O are zero. That alone suffices: the gate multiplies the head's context
  before W^O (Voita et al. 2019, eq. 2), so a gate of 0 and zero columns remove the same term;
- its Q, K and V rows (and biases) are zero too, so the head computes nothing that is kept. With
  grouped-query attention (Llama, Qwen) a key/value head is zeroed only when every query head
  that reads it is closed.

An open gate with a value other than 1 (Hard Concrete's evaluation gate, which fold_gates leaves
in W^O's columns with a head mask of 1, or a gate still attached) is multiplied into the head's
columns of W^O, so the export equals the gated model at its evaluation gates.

The parameter and KV-cache savings are the physical model.pt's (rule export_pruned writes both).
headcount's own Transformer and fairseq models have no transformers class: they have model.pt only
(`export_transformers` writes NOT_EXPORTED.txt saying so). GGUF is not written back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from headcount.io import HeadcountError
from headcount.models.loading import load_model
from headcount.models.seq2seq import kind_of

NOT_EXPORTED = "NOT_EXPORTED.txt"  # what an export directory holds for a model transformers has no class for


class NotExportable(HeadcountError):
    """A model whose gated layout cannot be written as a plain transformers model."""


def is_transformers_model(model) -> bool:
    """Whether the headcount model wraps a transformers model (hf.py, hf_lm.py, hf_sentence.py)."""
    from transformers import PreTrainedModel

    return isinstance(getattr(model, "hf", None), PreTrainedModel)


def evaluation_gates(slot) -> Tensor:
    """(H,): the gate each head has at evaluation, the fixed 0/1 mask times the Hard Concrete
    evaluation gate where gates are still attached (read whatever the module's training mode)."""
    gates = slot.head_mask.detach().float()
    if slot.hard_concrete is not None:
        gates = gates * slot.hard_concrete.deterministic().detach().float()
    return gates


def _features(heads: list[int], head_dim: int, device) -> Tensor:
    """The (len(heads) * head_dim,) feature indices of the given heads in a concatenation of heads."""
    return torch.tensor([h * head_dim + d for h in heads for d in range(head_dim)], dtype=torch.long, device=device)


def _zero_outputs(layer: nn.Module, idx: Tensor) -> None:
    """Zero the output features `idx` of an nn.Linear (weight rows) or a transformers Conv1D
    (GPT-2: weight (in, out), so columns), with their biases."""
    if isinstance(layer, nn.Linear):
        layer.weight[idx] = 0
    else:
        layer.weight[:, idx] = 0
    if layer.bias is not None:
        layer.bias[idx] = 0


def _query_key_value_outputs(slot, closed: list[int]) -> list[tuple[nn.Module, Tensor]]:
    """(projection, output features to zero) for the Q, K and V of the closed heads of one
    attention, where the family's entry (models.families.FAMILIES) says they are."""
    from headcount.models.families import ENCODER_DECODER, FAMILIES
    from headcount.models.hf_lm import attribute, fused_features

    attention, Dh, family = slot.attention, slot.head_dim, FAMILIES[slot.family]
    idx = _features(closed, Dh, slot.proj.weight.device)
    if family.model_kind == ENCODER_DECODER:  # separate q/k/v (T5: q, k, v)
        return [(getattr(attention, name), idx) for name in family.qkv_names]
    if family.fused is not None:  # one fused projection (GPT-2: Q | K | V blocks; GPT-NeoX: per head)
        return [(attribute(attention, family.qkv[0]),
                 fused_features(family.fused, closed, Dh, slot.n_heads, idx.device))]
    kv_idx = idx
    if hasattr(slot, "kv_of"):  # grouped-query: a KV head goes only when all its query heads are closed
        shut = set(closed)
        kv_closed = [k for k in sorted(set(slot.kv_of)) if all(h in shut for h, kv in enumerate(slot.kv_of) if kv == k)]
        kv_idx = _features(kv_closed, Dh, idx.device)
    return [(attribute(attention, path), rows) for path, rows in zip(family.qkv, (idx, kv_idx, kv_idx))]


def _plain_projection(slot) -> nn.Module:
    """The gate slot's W^O as the module transformers has there: GPT-2's Conv1D (weight (in, out),
    which the adapter turned into an nn.Linear: `slot.transposed`), else the nn.Linear itself."""
    linear = slot.proj
    if not getattr(slot, "transposed", False):
        return linear
    from transformers.pytorch_utils import Conv1D

    conv = Conv1D(linear.out_features, linear.in_features).to(device=linear.weight.device, dtype=linear.weight.dtype)
    conv.weight.copy_(linear.weight.t())
    conv.bias.copy_(linear.bias)
    return conv


@torch.no_grad()
def to_plain_transformers(model, source: str | os.PathLike = "the model") -> tuple[nn.Module, dict[str, list]]:
    """The transformers model inside a headcount adapter, in place, with every gate slot replaced
    by the plain W^O it wraps: open gates folded into W^O's columns, closed heads' W^O columns and
    Q, K, V rows zeroed (module docstring). -> (the transformers model, {type: [closed heads per
    layer]}). The adapter is spent afterwards: its gate slots are no longer in the model."""
    if not is_transformers_model(model):
        raise NotExportable(f"{source}: a {getattr(model, 'family', type(model).__name__)} model has no "
                            f"transformers class; it is exported as headcount's model.pt only")
    slots = model.attention_modules()
    if any(m.n_heads != m.original_heads for modules in slots.values() for m in modules):
        raise NotExportable(f"{source}: its heads were removed physically, so its layers differ in head count, "
                            f"which no transformers config of this family can express; export from the gated "
                            f"checkpoint (results/<exp>/prune/<setting>/lambda_<lam>/model.pt) instead")
    from headcount.models.head_gates import GatedProjection

    hf = model.hf
    names = {id(module): name for name, module in hf.named_modules()}
    closed_heads = {}
    for kind, modules in slots.items():
        closed_heads[kind] = []
        for slot in modules:
            gates = evaluation_gates(slot).to(slot.proj.weight.device)
            slot.proj.weight.mul_(gates.to(slot.proj.weight.dtype).repeat_interleave(slot.head_dim)[None, :])
            closed = [h for h in range(slot.n_heads) if gates[h] == 0]
            for layer, idx in _query_key_value_outputs(slot, closed):
                _zero_outputs(layer, idx)
            parent, _, attribute = names[id(slot)].rpartition(".")
            setattr(hf.get_submodule(parent), attribute, _plain_projection(slot))
            closed_heads[kind].append(closed)
    leftover = [name for name, module in hf.named_modules() if isinstance(module, GatedProjection)]
    if leftover:  # a family whose gate slots were not all found: refuse rather than write gate weights
        raise NotExportable(f"{source}: gate modules left at {leftover[:3]}; no transformers export written: "
                            f"the physical model.pt is this model's export (report the family)")
    return hf, closed_heads


def _copy_tokenizer(tokenizer_dir: Path, out: Path) -> list[str]:
    """The pretrained model's tokenizer files (as the import wrote them) beside the weights, so that
    AutoTokenizer.from_pretrained reads the export too; headcount's own manifest stays behind."""
    from headcount.models.hf_lm_tokenizer import LM_TOKENIZER_MANIFEST

    copied = []
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file() and path.name != LM_TOKENIZER_MANIFEST and not (out / path.name).exists():
            shutil.copyfile(path, out / path.name)
            copied.append(path.name)
    return copied


def export_transformers(model_path: str | os.PathLike, out_dir: str | os.PathLike,
                        tokenizer_dir: str | os.PathLike | None = None, log=print) -> dict:
    """Write the pruned model at `model_path` (headcount's gated checkpoint) to `out_dir` as plain
    transformers writes a pretrained model (save_transformers), with the tokenizer's files where
    `tokenizer_dir` is given. -> a record for the export summary."""
    record = save_transformers(load_model(model_path).eval(), out_dir, source=str(model_path), log=log)
    if record["exported"]:
        record["tokenizer_files"] = _copy_tokenizer(Path(tokenizer_dir), Path(out_dir)) if tokenizer_dir else []
    return record


def save_transformers(model, out_dir: str | os.PathLike, tokenizer=None, source: str = "the model",
                      log=print) -> dict:
    """Write the gated headcount `model` (in memory; spent afterwards, to_plain_transformers) to
    `out_dir` as plain transformers writes a pretrained model (save_pretrained, safetensors), with
    `tokenizer` (a transformers tokenizer) where given and, for a sentence encoder,
    sentence-transformers' pooling files. A model transformers has no class for gets
    NOT_EXPORTED.txt saying why. -> a record for the export summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not is_transformers_model(model):
        reason = (f"a {getattr(model, 'family', 'headcount')} model has no transformers class: the pruned model "
                  f"is headcount's model.pt (physical/model.pt beside this directory) only")
        (out / NOT_EXPORTED).write_text(reason + "\n", encoding="utf-8")
        log(f"no transformers export: {reason}")
        return {"exported": False, "reason": reason}
    pooling, dimension = getattr(model, "pooling", None), int(model.d_model)
    sentence_encoder = kind_of(model).name == "sentence_encoder"
    hf, closed = to_plain_transformers(model, source)
    hf.save_pretrained(str(out), safe_serialization=True)
    if sentence_encoder:
        from headcount.models.sentence_embedding import write_pooling

        write_pooling(out, pooling, dimension)
    tokenizer_files = []
    if tokenizer is not None:
        tokenizer_files = sorted(Path(f).name for f in tokenizer.save_pretrained(str(out)))
    zeroed = sum(len(heads) for layers in closed.values() for heads in layers)
    log(f"transformers export ({type(hf).__name__}, save_pretrained) in {out}: {zeroed} closed heads kept with "
        f"zero weights (the config has one head count for every layer), open gates folded into W^O")
    return {"exported": True, "class": type(hf).__name__, "directory": str(out), "closed_heads_zeroed": closed,
            "tokenizer_files": tokenizer_files}
