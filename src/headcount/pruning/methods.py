"""The pruning settings and the registry of pruning methods (torch-free: the workflow's rule files
read the settings when Snakemake parses them).

A setting says which attention types a run prunes: "enc" encoder self-attention only, "all" all
three. A method says how heads go: a trained method fine-tunes the model with gates (Voita et al.
2019's Hard Concrete, pruning.hard_concrete); a ranked method removes heads, without training, in
order of one column of the head score table, ranked globally over the setting's types (Michel et
al. 2019: their importance, pruning.ranked). A new ranked method is one `register_method` here
naming its score column.
"""

from __future__ import annotations

from dataclasses import dataclass

from headcount.models.seq2seq import ATTENTION_TYPES

SETTINGS = {"enc": ("enc_self",), "all": ATTENTION_TYPES}  # in the tables' and figures' order


def setting_types(setting: str) -> tuple[str, ...]:
    if setting not in SETTINGS:
        raise ValueError(f"unknown pruning setting {setting!r}; expected one of {sorted(SETTINGS)}")
    return SETTINGS[setting]


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


METHODS: dict[str, PruningMethod] = {}
KINDS = ("trained", "ranked")


def register_method(method: PruningMethod) -> PruningMethod:
    if method.kind not in KINDS:
        raise ValueError(f"pruning method {method.name!r}: kind {method.kind!r}; use one of {KINDS}")
    if (method.kind == "ranked") != (method.score is not None):
        raise ValueError(f"pruning method {method.name!r}: a ranked method names its score column, a trained one none")
    METHODS[method.name] = method
    return method


def ranked_methods() -> list[str]:
    return [name for name, method in METHODS.items() if method.kind == "ranked"]


def ranked_method(name: str) -> PruningMethod:
    if name not in ranked_methods():
        raise ValueError(f"unknown ranked pruning method {name!r}; known: {ranked_methods()}")
    return METHODS[name]


register_method(PruningMethod("hard_concrete", "trained",
                              description="fine-tuning with a Hard Concrete gate per head and an L0 penalty "
                                          "(Voita et al. 2019, section 6)"))
register_method(PruningMethod("michel", "ranked", score="michel",
                              description="heads removed by their layer-normalised importance (Michel et al. 2019)"))
