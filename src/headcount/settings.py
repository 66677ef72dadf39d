"""Every default setting that code reads, held once, as typed dataclasses: the training recipe, the
pruning recipe and its fine-tuning, head scoring, the role thresholds, decoding's beam and the
atlas's sentences.

Each dataclass is one section of a configuration (`SECTION`, a dotted key under config/config.yaml's
`defaults`). A field is either a key of that file's `defaults`, where users read and edit it, or
`optional` (a key the file leaves out, whose default is the code's; the JSON schema,
workflow/schemas/config.schema.yaml, states it as that key's `default`). tests/test_settings.py
walks every field and holds config.yaml and the schema to these values. The Python API
(headcount.api), the training loop (training.loop.TrainConfig), the pruning runs and the config's
own functions take their defaults from here, so a notebook call and a workflow run "with the
defaults" train the same thing.

Imports nothing of headcount: every layer may read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

OPTIONAL = {"optional": True}  # a field's metadata: a key config.yaml's defaults leave out


def optional(default: Any) -> Any:
    """A field whose key config.yaml's `defaults` leave out (the schema states its default)."""
    return field(default=default, metadata=OPTIONAL)


@dataclass
class TrainingSettings:
    """`training`: a baseline's training (training.loop.TrainConfig is this with its methods)."""

    SECTION: ClassVar[str] = "training"

    max_tokens: int = 1600  # per batch: sentences * longest side, padding included
    max_steps: int = 2400
    warmup_steps: int = 800
    lr_scale: float = 1.0  # the "scale" of the Noam schedule
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    log_interval: int = 50
    eval_interval: int = 500
    checkpoint_interval: int = 250
    checkpoint_minutes: float = 10.0  # also checkpoint after this much wall time (0: by steps only)
    snapshot_interval: int = 0  # keep the weights every this many steps in snapshots/ (0: none)
    dev_bleu_sentences: int = 1014  # dev sentences greedily decoded for dev BLEU at each eval
    select: str = "best_dev_bleu"  # which weights become the output: best_dev_bleu | last
    # the output: the mean of this many snapshots ending at the selected step
    average_snapshots: int = optional(1)
    seed: int = 1
    precision: str = "auto"  # auto | fp32 | bf16
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    # The step's forward pass: eager on each batch's own shape, or on a few padded shapes
    # (training.static_shapes: buckets | cudagraphs | inductor | aot_eager), which CUDA graphs need.
    compile_step: str = optional("eager")


@dataclass
class PruneRecipe:
    """`prune`: the fine-tuning recipe of a pruning run (config/README.md, docs/method.md
    "Fine-tuning recipes"; the authors' recipe is lr_schedule noam, heal_steps 0). The lambda grid
    and the from-scratch twins are each experiment's choice, not defaults code reads."""

    SECTION: ClassVar[str] = "prune"

    gate_lr_scale: float = 10.0
    log_alpha_init: float | None = None  # None: U(-0.61, 0.61), as in the authors' code
    lr_schedule: str = "constant"  # the baseline's last rate, held
    resume_optimizer: bool = False
    heal_steps: int = 200
    select: str = "last"
    weight_lr_scale: float = optional(1.0)
    penalty_scale: str = optional("authors")
    scratch_schedule: str = optional("noam")  # the from-scratch twins' schedule


@dataclass
class PruneTraining:
    """`prune.training`: a pruning run's own training settings, over the baseline's."""

    SECTION: ClassVar[str] = "prune.training"

    max_steps: int = 500
    warmup_steps: int = 100
    lr_scale: float = 0.5
    eval_interval: int = 250
    checkpoint_interval: int = 50


@dataclass
class HeadScoring:
    """`heads`: how every head is scored."""

    SECTION: ClassVar[str] = "heads"

    lrp_rule: str = "ding"
    max_tokens: int = 2000


@dataclass
class RoleThresholds:
    """`roles`: the thresholds by which a head earns a role."""

    SECTION: ClassVar[str] = "roles"

    top_k: int = 500
    positional_threshold: float = 0.9
    positional_share: str = "valid"
    syntactic_margin: float = 0.10
    rare_threshold: float = 0.5
    rare_margin: float | None = 0.1
    min_instances: int = 10
    max_sentences: int = 5000


@dataclass
class Decoding:
    """`decoding`: beam search."""

    SECTION: ClassVar[str] = "decoding"

    beam: int = 4


@dataclass
class AtlasSettings:
    """`atlas`: the head atlas's pages."""

    SECTION: ClassVar[str] = "atlas"

    sentences: tuple[int, ...] = (0, 1, 2)  # analysis lines (0-based) every head's card shows
    best_sentences: int = 3  # more per head, where it best shows its role


SECTIONS: tuple[type, ...] = (TrainingSettings, PruneRecipe, PruneTraining, HeadScoring, RoleThresholds, Decoding,
                              AtlasSettings)


def is_optional(f) -> bool:
    """Whether the dataclass field `f` is a key config.yaml's defaults leave out."""
    return bool(f.metadata.get("optional"))


def as_dict(settings, with_optional: bool = True) -> dict:
    """The settings as a dict; with_optional=False keeps the keys config.yaml's defaults have."""
    return {f.name: getattr(settings, f.name) for f in fields(settings) if with_optional or not is_optional(f)}


def with_defaults(section: type, given: dict) -> dict:
    """`given` over `section`'s defaults (every field, optional ones included)."""
    return {**as_dict(section()), **given}
