"""A transformers BERT-like encoder without a masked-LM head, as sentence-transformers ships one
(all-MiniLM-L6-v2), as a headcount `sentence_encoder` model (seq2seq.MODEL_KINDS): analysed through
its pooled sentence embedding (models.sentence_embedding) instead of logits it does not have.

`HFSentenceEncoder` is HFMaskedLM's sibling over transformers' AutoModel (BertModel, RobertaModel:
the base model, so the weights a sentence encoder has are exactly those the load report expects):
the same gated W^O per attention (hf_lm.LMHeadGates: head masks, Hard Concrete gates, the
`head_context` hook), the same batch source ([CLS] x [SEP]); its output is the pooled embedding
(the pooling its modules.json declares), its loss the cosine distance to the same weights' pooled
embedding with every head open and no gates (`reference_embedding`).

That reference must stay the unpruned model through pruning. Pruning trains the gates alone
(ModelKind.gates_only: the weights are frozen), and folding the gates afterwards scales W^O's
columns (pruning.hard_concrete.fold_gates); so the adapter keeps each layer's W^O as it was
imported (`reference_out_proj`, saved with the checkpoint) and the reference pass runs with it.
A physically pruned model (keep_heads removed Q, K, V rows) has no reference: score it before.

Dropout is off in training mode too: with frozen weights the only randomness the loss should see
is the gates' sampling (a gate pinned open then costs exactly 0).
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from headcount.data.special import SpecialIds
from headcount.io import HeadcountError
from headcount.models.checkpoint import refused_pickle
from headcount.models.families import LANGUAGE_MODELS, LMFamily, family_of
from headcount.models.gates import HardConcreteGates
from headcount.models.head_gates import load_weights_with_heads
from headcount.models.hf_lm import HFMaskedLM, special_ids_of
from headcount.models.hf_source import check_loading_report, resolve_source, unavailable
from headcount.models.lrp import LRPNotImplemented
from headcount.models.sentence_embedding import Pooling, pool, read_pooling
from headcount.models.seq2seq import NotAvailableForKind


class NotASentenceEncoder(HeadcountError):
    """objective: sentence_embedding asked of a model that is not an encoder."""


class HFSentenceEncoder(HFMaskedLM):
    """A transformers encoder (BERT, RoBERTa families) as a sentence_encoder headcount model: src =
    [CLS] x [SEP], tgt_in empty, output the pooled embedding (B, 1, D) aligned with tgt_out (B, 1)."""

    model_kind = "sentence_encoder"
    family_kind = "encoder_only"  # the transformers families it wraps are the masked LMs'

    def __init__(self, hf: nn.Module, special: SpecialIds | None = None, pooling: Pooling | None = None):
        super().__init__(hf, special)
        self.pooling = pooling if pooling is not None else Pooling()
        # (L, D, H * Dh): each layer's W^O as imported, the reference pass's (module docstring)
        self.register_buffer("reference_out_proj", torch.stack(
            [m.proj.weight.detach().clone() for m in self.attention_modules()["enc_self"]]))

    # ---------------------------------------------------------------- output

    def sentence_embedding(self, src: Tensor) -> Tensor:
        """src (B, S) -> (B, D): the pooled embedding of the model as it is (masks, gates, hooks)."""
        hidden, src_pad, _ = self.encode(src)
        return pool(hidden, ~src_pad, self.pooling)

    @torch.no_grad()
    def reference_embedding(self, src: Tensor) -> Tensor:
        """src (B, S) -> (B, D): the pooled embedding of the imported weights with every head open,
        no gates and no hooks on the heads (ablation's row masks, Michel's context keepers)."""
        self._check_length(src.shape[1])
        src_pad = src.eq(self.special.pad)
        with self._unpruned() as overrides:
            out = torch.func.functional_call(self.hf.base_model, overrides, (),
                                             {"input_ids": src, "attention_mask": (~src_pad).long()})
        return pool(out.last_hidden_state, ~src_pad, self.pooling)

    @contextmanager
    def _unpruned(self):
        """The W^O weights and head masks of the unpruned model, as functional_call overrides (the
        model's own tensors are not touched: a graph built on them stays valid), while the gates
        and the head_context hook points are set aside."""
        modules = self.attention_modules()["enc_self"]
        if any(m.n_heads != m.original_heads for m in modules):
            raise HeadcountError(f"a {self.family.name} sentence encoder with heads removed physically (export_pruned) "
                                 f"has no unpruned reference to measure its embedding against; score the pruned "
                                 f"model.pt (masked heads, the same outputs) instead")
        names = {id(m): name for name, m in self.hf.base_model.named_modules()}
        overrides = {}
        for module, weight in zip(modules, self.reference_out_proj):
            overrides[f"{names[id(module)]}.proj.weight"] = weight
            overrides[f"{names[id(module)]}.head_mask"] = torch.ones_like(module.head_mask)
        aside = [(m, m.hard_concrete, m.head_context) for m in modules]
        try:
            for module, _, _ in aside:
                module.hard_concrete, module.head_context = None, nn.Identity()
            yield overrides
        finally:
            for module, gates, context in aside:
                module.hard_concrete, module.head_context = gates, context

    def forward(self, src: Tensor, tgt_in: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, dict | None]:
        """src (B, S) -> the pooled embedding (B, 1, D) (one output per sentence, aligned with
        tgt_out), {"enc_self": [...]} or None; tgt_in (B, 0) is ignored."""
        hidden, src_pad, probs = self.encode(src, need_weights)
        embedding = pool(hidden, ~src_pad, self.pooling)[:, None, :]
        return embedding, ({"enc_self": probs} if need_weights else None)

    def logits(self, hidden: Tensor) -> Tensor:
        raise NotAvailableForKind(f"a {self.family.name} sentence encoder has no vocabulary output (no masked-LM "
                                  f"head): its output is the pooled embedding (sentence_embedding)")

    def lrp_forward(self):
        raise LRPNotImplemented(f"a {self.family.name} sentence encoder has no logits for LRP to explain: its output "
                                f"is a pooled embedding, and LRP here explains a token's logit")

    def train(self, mode: bool = True):
        """Training mode for the Hard Concrete gates (they sample) and for nothing else: no dropout
        (module docstring)."""
        super().train(mode)
        for module in self.hf.modules():
            if not isinstance(module, HardConcreteGates):
                module.training = False
        return self

    # ---------------------------------------------------------------- checkpoints

    def save(self, path: str | os.PathLike, extra: dict | None = None) -> None:
        super().save(path, {**(extra or {}), "pooling": dataclasses.asdict(self.pooling)})

    @staticmethod
    def from_checkpoint(state: dict) -> HFSentenceEncoder:
        from transformers import AutoModel

        from headcount.models.hf_source import rebuilt_config

        config = rebuilt_config(state)
        special = state["special"]
        special = SpecialIds(**{**special, "forced": tuple(special.get("forced", ()))})
        model = HFSentenceEncoder(AutoModel.from_config(config, trust_remote_code=False), special=special,
                                  pooling=Pooling(**state["pooling"]))
        return load_weights_with_heads(model, state["kept_heads"], state["model"])


def encoder_family(config, label: str) -> LMFamily:
    """The model's family, if a sentence encoder can be one of it (an encoder: BERT, RoBERTa)."""
    family = family_of(config, LANGUAGE_MODELS)
    if family.model_kind != HFSentenceEncoder.family_kind:
        raise NotASentenceEncoder(
            f"pretrained model {label!r} is a {family.name} ({family.model_kind}) model; objective: sentence_embedding "
            f"analyses an encoder's pooled embedding (BERT, RoBERTa families). Remove objective from the experiment "
            f"to analyse it as the {family.model_kind} model it is")
    return family


def load_sentence_encoder(name_or_dir: str | os.PathLike, offline: bool | None = None,
                          dtype: torch.dtype = torch.float32, allow_weights: dict | None = None) -> HFSentenceEncoder:
    """A local directory or hub id of an encoder (sentence-transformers' layout or a plain
    transformers one) -> HFSentenceEncoder in eval mode, its pooling from modules.json (the mean
    over real tokens where there is none). Loaded as transformers' AutoModel, so the load report
    (hf_source.check_loading_report) holds the weights such a model has, no MLM head among them."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from headcount.models.checkpoint import PickleRefusal

    source = resolve_source(name_or_dir, offline)
    try:
        config = AutoConfig.from_pretrained(source.name, **source.kwargs)
        encoder_family(config, source.label)
        hf, report = AutoModel.from_pretrained(source.name, **source.kwargs, dtype=dtype,
                                               attn_implementation="eager", output_loading_info=True)
    except (OSError, ValueError) as error:
        raise unavailable(source, error) from None
    except PickleRefusal as error:
        raise refused_pickle(name_or_dir, error) from None
    check_loading_report(source.label, type(hf).__name__, report, allow_weights)
    pooling = read_pooling(source.name) if source.is_local else Pooling()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.name, **source.kwargs)
    except (OSError, ValueError):
        tokenizer = None  # ids from the config alone
    return HFSentenceEncoder(hf, special=special_ids_of(config, tokenizer), pooling=pooling).eval()


__all__: list[Any] = ["HFSentenceEncoder", "NotASentenceEncoder", "encoder_family", "load_sentence_encoder"]
