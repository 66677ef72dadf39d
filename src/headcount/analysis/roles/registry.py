"""The roles, one registry: how a head qualifies for each, and assign_roles."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from headcount.models.seq2seq import MODEL_KINDS

# Query tokens by their place in the word: its first subword, or one that continues it. A head that
# joins a word's pieces (-1 from a continuation piece, +1 from an initial one) need not look at any
# neighbour from the other kind, so its pooled positional share can stay low.
# Defined here, not in statistics (which needs torch), so that report jobs need not load torch.
PIECE_KINDS = ("initial", "continuation")

# The attention type whose heads get roles, per model kind (models.seq2seq.MODEL_KINDS): the
# encoder's self-attention where a model has an encoder, the causal self-attention of a decoder-only
# model. Defined here once; collect, the stage and the figures read it.
ROLE_ATTENTION = {"encoder_decoder": "enc_self", "encoder_only": "enc_self", "decoder_only": "dec_self"}

# --------------------------------------------------------------------------------------------
# One role per head


# The roles, one registry. A role says which per-head columns it takes from the statistics tables
# ({"positional", "syntactic", "rare", "sink"}: PositionalStats, SyntacticStats, RareStats, SinkStats;
# "induction": repeated_sequence_scores), which kinds of model it is computed for, how a head
# qualifies (is_<role>; the paper's rule as written beside it, is_<role>_paper, where the project's
# differs), the column holding the number behind it, its own rules' defaults, and how figures show
# it. assign_roles, the pruning table's role_<role> counts and the figures iterate ROLES: a new role
# is one Role here.


@dataclass(frozen=True)
class Role:
    name: str
    label: str  # in figure legends
    colour: str
    precedence: int  # a head that qualifies for several roles gets the one with the lowest
    columns: Callable[[dict, dict], pd.DataFrame]  # (statistics tables, rules) -> layer, head, its columns
    qualifies: Callable[[pd.DataFrame, dict], pd.Series]  # (merged table, rules) -> is_<name>
    statistic: Callable[[dict], str]  # rules -> the column of the number behind the role
    qualifies_paper: Callable[[pd.DataFrame, dict], pd.Series] | None = None  # -> is_<name>_paper
    fill: tuple[tuple[str, object], ...] = ()  # (column, value) for heads its statistics do not list
    kinds: tuple[str, ...] = tuple(MODEL_KINDS)  # the model kinds whose heads can get it
    needs: tuple[str, ...] = ()  # the statistics tables it reads beyond the three of every kind
    rules: tuple[tuple[str, object], ...] = ()  # (rule, default) of its own, overridable in assign_roles


ROLES: dict[str, Role] = {}  # in the tables' and figures' order
NO_ROLE, NO_ROLE_LABEL, NO_ROLE_COLOUR = "none", "other", "#bdbdbd"


def register_role(role: Role) -> Role:
    ROLES[role.name] = role
    return role


def roles_for(kind: str = "encoder_decoder") -> list[Role]:
    """The registered roles a head of this kind of model can get, in the registry's order."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; one of {list(MODEL_KINDS)}")
    return [role for role in ROLES.values() if kind in role.kinds]


def role_names(kind: str = "encoder_decoder") -> list[str]:
    """Every role a head of this kind of model can get, the registry's then "none" (the default
    kind is that of a model which declares none, models.seq2seq.kind_of)."""
    return [*(role.name for role in roles_for(kind)), NO_ROLE]


def role_precedence(kind: str = "encoder_decoder") -> tuple[str, ...]:
    return tuple(role.name for role in sorted(roles_for(kind), key=lambda role: role.precedence))


def role_colour(name: str) -> str:
    return ROLES[name].colour if name in ROLES else NO_ROLE_COLOUR


def role_label(name: str) -> str:
    return ROLES[name].label if name in ROLES else NO_ROLE_LABEL


def _positional_columns(statistics: dict, rules: dict) -> pd.DataFrame:
    positional = statistics["positional"]
    if "fraction_paper" not in positional.columns:  # a table from elsewhere with one share only
        positional = positional.assign(fraction_paper=positional["fraction"])
    kinds = [f"{kind}_{column}" for kind in PIECE_KINDS for column in ("offset", "fraction")]
    return positional[["layer", "head", "offset", "fraction", "fraction_paper",
                       *[c for c in kinds if c in positional.columns]]].rename(
        columns={"offset": "positional_offset", "fraction": "positional_fraction",
                 "fraction_paper": "positional_fraction_paper", **{c: f"positional_{c}" for c in kinds}})


def _best_syntactic(syntactic: pd.DataFrame, min_instances: int) -> pd.DataFrame:
    """Per head, the relation and direction with the largest margin over its baseline."""
    scored = syntactic[(syntactic["n"] >= min_instances) & syntactic["accuracy"].notna()].copy()
    scored["margin"] = scored["accuracy"] - scored["baseline_accuracy"]
    scored = scored.sort_values(["layer", "head", "margin"], ascending=[True, True, False], kind="stable")
    return scored


def _syntactic_columns(statistics: dict, rules: dict) -> pd.DataFrame:
    best = _best_syntactic(statistics["syntactic"], rules["min_instances"])
    qualified = best[best["margin"] >= rules["syntactic_margin"] - 1e-12]
    lists = (qualified.assign(label=qualified["relation"] + " " + qualified["name"])
             .groupby(["layer", "head"])["label"].agg(", ".join).rename("syntactic_all").reset_index())
    top = best.drop_duplicates(["layer", "head"])[["layer", "head", "relation", "direction", "name", "accuracy",
                                                   "baseline_accuracy", "margin"]]
    top = top.rename(columns={"relation": "syntactic_relation", "direction": "syntactic_direction",
                              "name": "syntactic_name", "accuracy": "syntactic_accuracy",
                              "baseline_accuracy": "syntactic_baseline", "margin": "syntactic_margin"})
    return top.merge(lists, on=["layer", "head"], how="left")


def _rare_columns(statistics: dict, rules: dict) -> pd.DataFrame:
    rare = statistics["rare"]
    rare_cols = ["layer", "head", "rate_rarest", "rate_two_rarest", "n_sentences", "uniform_rate_two_rarest"]
    return rare[[c for c in rare_cols if c in rare.columns]].rename(
        columns={"n_sentences": "rare_sentences", "uniform_rate_two_rarest": "rare_uniform_two_rarest"})


def _positional_paper(table: pd.DataFrame, rules: dict) -> pd.Series:
    return table["positional_fraction_paper"].fillna(0) >= rules["positional_threshold"]


def _positional(table: pd.DataFrame, rules: dict) -> pd.Series:
    column = "positional_fraction_paper" if rules["positional_share"] == "all" else "positional_fraction"
    return table[column].fillna(0) >= rules["positional_threshold"]


def _rare_paper(table: pd.DataFrame, rules: dict) -> pd.Series:
    return (table["rate_two_rarest"].fillna(0) > rules["rare_threshold"]) & (
        table["rare_sentences"].fillna(0) >= rules["min_instances"])


def _rare(table: pd.DataFrame, rules: dict) -> pd.Series:
    qualified = _rare_paper(table, rules)
    if rules["rare_margin"] is not None:
        reference = table.get("rare_uniform_two_rarest", pd.Series(np.nan, index=table.index)).astype(float)
        qualified &= table["rate_two_rarest"].fillna(0) >= reference.fillna(0) + rules["rare_margin"] - 1e-12
    return qualified


register_role(Role(
    "positional", "positional", "#7b3fa0", 3, _positional_columns, _positional,
    lambda rules: "positional_fraction_paper" if rules["positional_share"] == "all" else "positional_fraction",
    qualifies_paper=_positional_paper))
register_role(Role(
    "syntactic", "syntactic", "#2e8b57", 1, _syntactic_columns,
    lambda table, rules: table["syntactic_margin"].fillna(-np.inf) >= rules["syntactic_margin"] - 1e-12,
    lambda rules: "syntactic_margin", fill=(("syntactic_all", ""),)))
register_role(Role("rare", "rare tokens", "#f28e1c", 0, _rare_columns, _rare, lambda rules: "rate_two_rarest",
                   qualifies_paper=_rare_paper))


# Induction heads (Olsson et al. 2022): on BOS + r + r (r random ids), the attention from each token
# of the second copy to the token after its first occurrence (TransformerLens' prefix matching).
# Threshold 0.4, the project's choice (neither Olsson et al. nor TransformerLens set one): about 20
# times what a head spread evenly over the visible tokens puts there (1/(n + j + 2) <= 0.02 at n = 50),
# and below one half because trained induction heads also park attention on the BOS sink. Causal
# models only: the mechanism predicts the next token from the past; a bidirectional encoder can read
# the answer from the second copy itself. First in precedence: the most specific of the roles (a
# random-token task at chance level ~1/n), which text statistics cannot show.
INDUCTION_THRESHOLD = 0.4


def _induction_columns(statistics: dict, rules: dict) -> pd.DataFrame:
    return statistics["induction"][["layer", "head", "induction_score", "duplicate_score", "previous_score",
                                     "shifted_induction_score"]]


register_role(Role(
    "induction", "induction", "#1f77b4", -1, _induction_columns,
    lambda table, rules: table["induction_score"].fillna(0) >= rules["induction_threshold"],
    lambda rules: "induction_score", kinds=("decoder_only",), needs=("induction",),
    rules=(("induction_threshold", INDUCTION_THRESHOLD),)))


# Attention sinks (Xiao et al. 2023): the share of a head's attention on the model's no-op token
# (SinkStats: BOS of a causal model, [CLS] and [SEP] together of an encoder-only one), averaged over
# the text's queries (the sink's own query, which in a causal model sees only itself, left out).
# Threshold 0.5: most of what the head adds to the residual stream is the sink's value, a near no-op,
# so the head does little else; looser cuts (Gu et al. 2024, "When attention sink emerges", count a
# head at a mean share of 0.3) keep heads that split between the sink and a real function.
# Precedence: above positional, below induction, rare-token and syntactic. The positional,
# syntactic and rare-token statistics take argmaxes with the sink left out (as Voita et al. leave
# out EOS), so they say where the rest of a head's attention peaks, not how much of it there is.
# Syntactic and rare-token roles are conditional functions, scored only on the words (or
# sentences) where they apply: a head that attends to the sink elsewhere and to the object of a
# verb from the verb is doing what Clark et al. (2019) describe, [SEP]/[CLS] as the no-op a head
# takes where its function does not apply, so those roles outrank the sink. The positional role
# is scored over every query, so a head with most of its mass on the sink puts a minority of it
# at the offset on a typical query (SmolLM2-135M's head 14.3: 94% on BOS, argmax beyond it at one
# offset): its output is the sink's value with a trace of the neighbour's, a sink head. Induction
# is measured as attention mass, not an argmax, and stays first.
SINK_THRESHOLD = 0.5


register_role(Role(
    "sink", "attention sink", "#8c564b", 2,
    lambda statistics, rules: statistics["sink"][["layer", "head", "sink_share"]],
    lambda table, rules: table["sink_share"].fillna(0) >= rules["sink_threshold"],
    lambda rules: "sink_share", kinds=("decoder_only", "encoder_only"), needs=("sink",),
    rules=(("sink_threshold", SINK_THRESHOLD),)))


def assign_roles(positional: pd.DataFrame, syntactic: pd.DataFrame, rare: pd.DataFrame,
                 positional_threshold: float = 0.9, syntactic_margin: float = 0.10,
                 rare_threshold: float = 0.5, min_instances: int = 10,
                 precedence: Sequence[str] | None = None, rare_margin: float | None = None,
                 positional_share: str = "valid", kind: str = "encoder_decoder",
                 statistics: dict[str, pd.DataFrame] | None = None,
                 rules: dict | None = None) -> pd.DataFrame:
    """One role per head from the statistics tables, by the registered roles (ROLES) a head of
    this `kind` of model can get (roles_for).

    `statistics`: the tables beyond the three that the kind's roles need (a Role's `needs`:
    "induction", "sink"); `rules`: values for the roles' own rules (a Role's `rules`, e.g.
    induction_threshold, sink_threshold), the registry's defaults otherwise.

    positional: share of one offset >= positional_threshold (subword level, EOS excluded), the
    share taken over the queries where that offset is valid (`positional_share="valid"`,
    PositionalStats' `fraction`) or over all queries ("all", the paper's rule, `fraction_paper`);
    syntactic: accuracy >= baseline + syntactic_margin (absolute) for some relation and direction
    scored on >= min_instances instances; rare: points to one of the two rarest words in more
    than rare_threshold of >= min_instances eligible sentences, and, if `rare_margin` is given
    (not in the paper), by at least that much more often than a uniform head would
    (RareStats' uniform reference; see there why diffuse heads can pass 50%).

    A head that qualifies for several roles gets the first in `precedence` (default: by the
    roles' precedence, rare > syntactic > positional): the content-based functions are the rarer
    and more specific ones (a head that beats the positional baseline by 10 points is doing more
    than attending to a fixed offset), and the flags is_positional / is_syntactic / is_rare keep
    every qualification. `statistic` is the number behind the role (two-rarest rate, accuracy
    margin, or fraction). Decoder-only models add induction (first) and sink (before positional),
    encoder-only ones sink: see their Roles for why there.

    The paper's reading is kept beside the project's wherever they differ: is_positional_paper
    (share over all queries), is_rare_paper (plain "> rare_threshold", no margin), and role_paper,
    the role those flags and is_syntactic (the same rule in both) give.
    """
    if positional_share not in ("valid", "all"):
        raise ValueError(f"positional_share must be 'valid' or 'all', not {positional_share!r}")
    roles = roles_for(kind)
    given = rules or {}
    rules = {**{rule: given.get(rule, value) for role in roles for rule, value in role.rules},
             "positional_threshold": positional_threshold, "syntactic_margin": syntactic_margin,
             "rare_threshold": rare_threshold, "min_instances": min_instances, "rare_margin": rare_margin,
             "positional_share": positional_share}
    statistics = {**(statistics or {}), "positional": positional, "syntactic": syntactic, "rare": rare}
    missing = sorted({need for role in roles for need in role.needs if statistics.get(need) is None})
    if missing:
        raise ValueError(f"the roles of a {kind} model need the statistics {missing}")
    precedence = role_precedence(kind) if precedence is None else tuple(precedence)
    table = None
    for role in roles:
        part = role.columns(statistics, rules)
        table = part if table is None else table.merge(part, on=["layer", "head"], how="outer")
    table = table.sort_values(["layer", "head"], ignore_index=True)
    for role in roles:
        for column, value in role.fill:
            table[column] = table[column].fillna(value)
    for role in roles:
        if role.qualifies_paper is not None:
            table[f"is_{role.name}_paper"] = role.qualifies_paper(table, rules)
        table[f"is_{role.name}"] = role.qualifies(table, rules)
    hits = [table[f"is_{name}"].to_numpy(bool) for name in precedence]
    table["role"] = np.select(hits, list(precedence), default=NO_ROLE)
    values = [pd.to_numeric(table[ROLES[name].statistic(rules)], errors="coerce").to_numpy(float)
              for name in precedence]
    table["statistic"] = np.select(hits, values, default=np.nan)
    paper = [table[f"is_{name}_paper" if ROLES[name].qualifies_paper else f"is_{name}"].to_numpy(bool)
             for name in precedence]
    table["role_paper"] = np.select(paper, list(precedence), default=NO_ROLE)
    first = ["layer", "head", "role", "statistic", "role_paper"]
    return table[first + [c for c in table.columns if c not in first]]
