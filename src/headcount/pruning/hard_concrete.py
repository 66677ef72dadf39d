"""Pruning heads by fine-tuning with Hard Concrete gates (Voita et al. 2019, section 6).

Two settings: "enc" gates encoder self-attention only and trains the source embeddings, the
encoder and the gates (decoder and target embeddings frozen); "all" gates all three attention
types and trains everything. After fine-tuning, the evaluation gates are folded into the output
projections, so a pruned model is a plain model with a fixed 0/1 head mask that translates
exactly as the gated model does in evaluation mode. Everything here goes through the
seq2seq.Seq2SeqWithHeads interface.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch
from torch import Tensor

from headcount.io import CheckpointError
from headcount.models.gates import attach_gates, l0_penalty, pin_open
from headcount.models.seq2seq import Seq2SeqWithHeads, kind_of
from headcount.pruning.methods import PENALTY_SCALES, setting_types

SELECTIONS = ("last", "best_dev_bleu")


def prepare_for_pruning(model: Seq2SeqWithHeads, setting: str, log_alpha_init: float | None,
                        gate_lr_scale: float, control: bool = False,
                        weight_lr_scale: float = 1.0, gates_only: bool = False) -> tuple[list, list[dict]]:
    """Attach Hard Concrete gates for a setting and freeze what it does not train.

    Returns the gates and the optimizer's param groups (gates get their own learning-rate scale).
    The schedule the groups train under is the weights' (the schedule's rate times
    `weight_lr_scale`), so the gates' group scale divides it out: the gates' rate stays the
    schedule's times `gate_lr_scale` whatever the weights' rate.
    With `control`, the gates are pinned open (gates.pin_open) and left out of the optimizer: the
    same weights train, on the same batches, at the same rates. A kind that prunes with its gates
    alone (ModelKind.gates_only: a sentence encoder), or any model with `gates_only` (a pretrained
    model pruned on frozen weights), has every weight frozen; its control then trains nothing (no
    groups).
    """
    kind = kind_of(model)
    gates = attach_gates(model, setting_types(setting, kind.name), init=log_alpha_init)
    if control:
        pin_open(gates)
    gate_params = {id(g.log_alpha) for g in gates}
    if setting == "enc":
        # The encoder's parameters include its gates; pinned ones (the control) stay frozen.
        pinned = {id(g.log_alpha) for g in gates if not g.log_alpha.requires_grad}
        trained = ({id(p) for p in model.encoder_parameters()} | gate_params) - pinned
        for p in model.parameters():
            p.requires_grad_(id(p) in trained)
    if kind.gates_only or gates_only:
        for p in model.parameters():
            p.requires_grad_(id(p) in gate_params and p.requires_grad)
    weights = [p for p in model.parameters() if id(p) not in gate_params and p.requires_grad]
    groups = [{"params": weights, "lr_scale": 1.0},
              {"params": [g.log_alpha for g in gates if g.log_alpha.requires_grad],
               "lr_scale": gate_lr_scale / weight_lr_scale}]
    return gates, [g for g in groups if g["params"]]


# --------------------------------------------------------------------------------------------
# Fine-tuning recipes: optimizer state (the learning rates are training.schedules')


def optimizer_state_loader(saved: dict, saved_params: list[Tensor], source: str) -> Callable:
    """An `init_optimizer` for the training loop that gives each parameter the Adam state it had
    in `saved` (an optimizer state_dict whose groups list `saved_params` in order). Parameters
    absent from `saved` (new gates) start fresh."""
    order = [i for group in saved["param_groups"] for i in group["params"]]
    if len(order) != len(saved_params):
        raise CheckpointError(f"{source}: its optimizer holds {len(order)} parameters, the model "
                              f"{len(saved_params)}; it is not this model's checkpoint. Retrain the baseline, "
                              f"or set prune.resume_optimizer: false")
    by_param = {}
    for param, index in zip(saved_params, order):
        state = saved["state"].get(index)
        if state is not None:
            if state["exp_avg"].shape != param.shape:
                raise CheckpointError(f"{source}: optimizer state of shape {tuple(state['exp_avg'].shape)} for a "
                                      f"parameter of shape {tuple(param.shape)}; not this model's checkpoint")
            by_param[id(param)] = state

    def init(optimizer: torch.optim.Optimizer) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in by_param:
                    optimizer.state[param] = {k: v.detach().clone() if k == "step" else v.to(param.device).clone()
                                              for k, v in by_param[id(param)].items()}

    return init


def penalty(gates: list, lam: float, scale: str = "authors"):
    """lambda * L_C, as a function of the model (the training loop's `extra_loss`). `scale`
    (pruning.methods.PENALTY_SCALES): "authors", L_C the mean over gated layers of the expected open
    heads (models.gates.l0_penalty), so each gate's pressure is lambda / layers; "per_head", L_C
    their sum over every gated head (the paper's formula), so each gate's pressure is lambda
    whatever the depth."""
    if scale == "authors":
        return lambda model: lam * l0_penalty(gates)
    if scale == "per_head":
        return lambda model: lam * torch.stack([g.p_open().sum() for g in gates]).sum()
    raise ValueError(f"penalty scale {scale!r}; use one of {', '.join(PENALTY_SCALES)}")


def gate_snapshot(model: Seq2SeqWithHeads) -> dict:
    """P(gate closed) per gated head, {type: [[p per head] per layer]}, for the trajectory."""
    out = {}
    for kind, modules in model.attention_modules().items():
        if modules and modules[0].hard_concrete is not None:
            out[kind] = [[round(float(p), 5) for p in 1 - m.hard_concrete.p_open().detach()] for m in modules]
    return {"p_closed": out}


@torch.no_grad()
def gate_table(model: Seq2SeqWithHeads) -> pd.DataFrame:
    """One row per head: its gate (if gated) and whether each rule prunes it.

    pruned: the evaluation gate is exactly 0 (the rule used for the pruned model);
    pruned_paper: log alpha < 0 (the paper's rule, reported beside it).
    """
    rows = []
    for kind, modules in model.attention_modules().items():
        for layer, module in enumerate(modules):
            gates = module.hard_concrete
            for head in range(module.n_heads):
                fixed = float(module.head_mask[head])
                row = {"type": kind, "layer": layer, "head": head, "gated": gates is not None}
                if gates is None:
                    row.update(log_alpha=float("nan"), eval_gate=fixed, p_open=fixed,
                               pruned=fixed == 0, pruned_paper=fixed == 0)
                else:
                    log_alpha = float(gates.log_alpha[head])
                    gate = float(gates.deterministic()[head]) * fixed
                    row.update(log_alpha=log_alpha, eval_gate=gate, p_open=float(gates.p_open()[head]),
                               pruned=gate == 0, pruned_paper=log_alpha < 0 or fixed == 0)
                rows.append(row)
    return pd.DataFrame(rows)


@torch.no_grad()
def fold_gates(model: Seq2SeqWithHeads) -> Seq2SeqWithHeads:
    """Replace Hard Concrete gates by their evaluation values, in place: each head's gate scales
    its columns of W^O, and the fixed mask is 0 where the gate is 0. Same outputs in eval mode."""
    for modules in model.attention_modules().values():
        for module in modules:
            if module.hard_concrete is None:
                continue
            gate = module.hard_concrete.deterministic()  # (H,)
            dh = module.head_dim
            # out_proj.weight is (D_out, H * Dh): head h owns the input columns h*Dh:(h+1)*Dh
            module.out_proj.weight.mul_(gate.repeat_interleave(dh)[None, :])
            module.head_mask.mul_((gate > 0).float())
            module.hard_concrete = None
    for p in model.parameters():
        p.requires_grad_(True)
    return model


