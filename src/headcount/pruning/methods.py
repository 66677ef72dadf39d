"""The pruning settings and the registry of pruning methods (torch-free: the workflow's rule files
read the settings when Snakemake parses them).

A setting says which attention types a run prunes: "enc" encoder self-attention only, "all" all
three. A method says how heads go: a trained method fine-tunes the model with gates (Voita et al.
2019's Hard Concrete, pruning.hard_concrete); a ranked method removes heads, without training, in
order of one column of the head score table, ranked globally over the setting's types (Michel et
al. 2019: their importance, pruning.ranked).

A new ranked method is one `register_method` here naming its score column (and its test): the
workflow's `ranked_curve` rule computes its curve per setting (results/{exp}/prune/{setting}/
{name}.tsv and {name}_translations.jsonl, each point `prune.michel_step` apart), the pruning table
sets every gated run against it at the nearest head count with a paired bootstrap interval
(columns d_{name}, d_{name}_low, d_{name}_high, {name}_heads, {name}_bleu), the encoder-only table
has its two columns and Figure 7 draws its curve, under its label, legend and reference
(tests/test_ranked_methods.py). The score column must be one the head score table
(heads/scores.parquet) has: a registered measure's (analysis.measures), lowest first; nothing
checks that before the curve's job reads the table.

A new trained method is not one registration: the registration only names it, and nothing
dispatches on a trained method. The fine-tuning rule (`prune_heads`, results/{exp}/prune/{setting}/
lambda_{lam}/), its driver (pipeline.pruning_runs.prune_heads), its grid (`prune.lambdas`) and
recipe keys, the gate table it writes (gates.json, which
the pruning report, the claims and Figures 7 to 10 read; the from-scratch twin reads the pruned
model's mask) and the report's rows are all Hard Concrete's. A second trained method needs its
training code beside pruning.hard_concrete, a driver writing the same files (model.pt with its
head mask, gates.json's `heads`/`retained` records), a rule and output folder of its own (or a
method wildcard in the prune/ paths, which today's paths and published results do not have), its
config keys in the schema and config/README.md, and a pruning report that tells its rows from
Hard Concrete's (a `method` column, and Table 2 and Figure 7 drawing each trained method).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headcount.models.seq2seq import ATTENTION_TYPES, MODEL_KINDS

SETTINGS = {"enc": ("enc_self",), "all": ATTENTION_TYPES}  # in the tables' and figures' order

# How the L0 penalty is stated (prune.penalty_scale): "authors", the mean over gated layers of the
# expected open heads (a gate's pressure is lambda / layers: lambda values compare with the
# authors'); "per_head", their sum (a gate's pressure is lambda, on a 6-layer as on a 30-layer model).
PENALTY_SCALES = ("authors", "per_head")
# A target head count (prune.targets, headcount.prune's target): heads kept, or a share of the gated
# heads kept (rounded to whole heads).
TARGET_KINDS = ("heads", "fraction")


def target_problem(target) -> str | None:
    """What is wrong with a target ({"heads": N} or {"fraction": f}), or None."""
    if not isinstance(target, dict) or len(target) != 1 or next(iter(target)) not in TARGET_KINDS:
        return f"{target!r} is not one of {{heads: N}} (heads kept) or {{fraction: f}} (share of heads kept)"
    kind, value = next(iter(target.items()))
    if kind == "heads" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        return f"heads: {value!r} is not a whole number of heads >= 0"
    if kind == "fraction" and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1):
        return f"fraction: {value!r} is not a share of heads between 0 and 1"
    return None


def target_heads(target: dict, gated: int) -> int:
    """The number of heads a target keeps, of `gated` gated heads: a fraction rounds to whole heads
    (a non-integer target would leave one gate half open)."""
    problem = target_problem(target)
    if problem:
        raise ValueError(f"pruning target {problem}")
    kind, value = next(iter(target.items()))
    heads = int(value) if kind == "heads" else int(round(value * gated))
    if heads > gated:
        raise ValueError(f"pruning target of {heads} heads, but only {gated} heads are gated")
    return heads


def target_label(target: dict) -> str:
    """A target as it appears in paths: heads_30, fraction_0.5."""
    kind, value = next(iter(target.items()))
    return f"{kind}_{value:g}"


def target_dirs(prune: dict, settings) -> list[str]:
    """The folders of an experiment's prune.targets runs, prune/{setting}/target_{label}, for the
    settings its model has."""
    targets = prune.get("targets") or {}
    return [f"prune/{setting}/target_{target_label(t)}" for setting in settings for t in targets.get(setting, [])]


def target_from_label(label: str) -> dict:
    """The target a path's label names (target_label's inverse)."""
    kind, _, value = label.partition("_")
    if kind not in TARGET_KINDS:
        raise ValueError(f"pruning target label {label!r}: expected heads_<N> or fraction_<f>")
    return {kind: int(value) if kind == "heads" else float(value)}


def setting_types(setting: str, model_kind: str = "encoder_decoder") -> tuple[str, ...]:
    """The attention types a setting gates, of those a model of `model_kind` has."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown pruning setting {setting!r}; expected one of {sorted(SETTINGS)}")
    if setting not in kind_settings(model_kind):
        raise ValueError(f"pruning setting {setting!r} is not one of a {model_kind} model's: "
                         f"{', '.join(kind_settings(model_kind))}")
    return tuple(t for t in SETTINGS[setting] if t in MODEL_KINDS[model_kind].attention_types)


def kind_settings(model_kind: str) -> tuple[str, ...]:
    """The settings that differ for a model kind: a model with one attention type has only "all"
    (an encoder's "enc" would gate the same heads)."""
    return tuple(SETTINGS) if len(MODEL_KINDS[model_kind].attention_types) > 1 else ("all",)


def lm_settings() -> tuple[str, ...]:
    """The settings of a language model, causal or masked alike (the workflow plans them before it
    knows which): those of both kinds, "all"."""
    return tuple(s for s in kind_settings("decoder_only") if s in kind_settings("encoder_only"))


def settings_pattern() -> str:
    """The settings as a regular expression (the workflow's `setting` wildcard)."""
    return "|".join(SETTINGS)


def is_control(lam: float) -> bool:
    """lambda = 0 is the control: the same fine-tuning with gates that cannot close."""
    return float(lam) == 0.0


@dataclass(frozen=True)
class PruningMethod:
    name: str
    kind: str  # "trained" (fine-tuning with gates) or "ranked" (heads removed in order of a score)
    score: str | None = None  # ranked: the score-table column; the lowest scores go first
    description: str = ""
    # How the report names a ranked method (empty: made from the name and score). label: the
    # tables' "<label> ranking (heads)" and "pruned - <label>"; legend: Figure 7's "<legend>, no
    # retraining"; reference: the encoder table's note, "(<reference>; no retraining)".
    label: str = ""
    legend: str = ""
    reference: str = ""

    def __post_init__(self):
        label = self.label or self.name
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "legend", self.legend or f"{label} ranking")
        object.__setattr__(self, "reference", self.reference or f"lowest {self.score} first")


METHODS: dict[str, PruningMethod] = {}
KINDS = ("trained", "ranked")
# A name is part of file names, columns (d_<name>, <name>_heads, <name>_bleu) and a wildcard's
# pattern; none may be one of the pruning table's other comparisons.
NAME = re.compile(r"[a-z][a-z0-9_]*")
RESERVED = ("baseline", "control", "scratch_baseline", "pruned_scratch")


def register_method(method: PruningMethod) -> PruningMethod:
    if not NAME.fullmatch(method.name) or method.name in RESERVED:
        raise ValueError(f"pruning method {method.name!r}: a name is lower case letters, digits and _, "
                         f"and none of {RESERVED}")
    if method.kind not in KINDS:
        raise ValueError(f"pruning method {method.name!r}: kind {method.kind!r}; use one of {KINDS}")
    if (method.kind == "ranked") != (method.score is not None):
        raise ValueError(f"pruning method {method.name!r}: a ranked method names its score column, a trained one none")
    METHODS[method.name] = method
    return method


def ranked_methods() -> list[str]:
    return [name for name, method in METHODS.items() if method.kind == "ranked"]


def ranked_pattern() -> str:
    """The ranked methods as a regular expression (the workflow's `method` wildcard); one that
    matches nothing when there are none."""
    return "|".join(re.escape(name) for name in ranked_methods()) or "(?!)"


def ranked_method(name: str) -> PruningMethod:
    if name not in ranked_methods():
        raise ValueError(f"unknown ranked pruning method {name!r}; known: {ranked_methods()}")
    return METHODS[name]


register_method(PruningMethod("hard_concrete", "trained",
                              description="fine-tuning with a Hard Concrete gate per head and an L0 penalty "
                                          "(Voita et al. 2019, section 6)"))
register_method(PruningMethod("l0_target", "trained",
                              description="the same gates trained to a named head count by a Lagrangian controller "
                                          "(Wang, Wohlwend and Lei 2020; pruning.lagrangian)"))
register_method(PruningMethod("michel", "ranked", score="michel",
                              description="heads removed by their layer-normalised importance (Michel et al. 2019)",
                              label="Michel", legend="Michel et al. ranking", reference="Michel et al., 2019"))
