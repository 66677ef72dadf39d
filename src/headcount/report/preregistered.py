"""The verdict rules of the powered design (config/powered.yaml), fixed before it ran.

docs/method.md, "The powered design: rules fixed before it ran" and "The powered design: the
amendment", states each rule in words with these values (and the date each was fixed);
tests/test_preregistered.py checks that the two agree and that the claims code and the config use
exactly these. Changing a value after the design has started running is a forking path: add a dated
rule beside the old one and publish both readings.
"""

from __future__ import annotations

DATE = "2026-11-27"

# --- what a verdict compares against
# The paper's own largest cost at the sparsity each finding names, in BLEU (encoder only: 4-10 of
# 48 heads for 0.15-0.25; all types: 26-36 of 144 for 0.13-0.70).
NO_LOSS_MARGIN = {"enc": 0.25, "all": 0.70}
# The head counts at which seeds are compared (each seed's curve read off by interpolation): the
# paper's counts for each setting and a quarter of the heads.
MATCHED_HEADS = {"enc": (4, 10, 12), "all": (26, 28, 36)}
INTERVAL_LEVEL = 0.95  # two-sided intervals
ALPHA = 0.05  # one-sided tests (head counts, layers, type order), after the correction below
CORRECTION = "holm"  # within a finding, across its runs (lambdas); findings are reported one by one
BOOTSTRAP_SAMPLES = 1000  # sacrebleu's paired bootstrap and the two-level bootstrap over seeds
MONTE_CARLO_DRAWS = 20_000  # tests against heads kept at random

# --- the experiment's design
SEEDS = (1, 2, 3)
# Pooled held-out sets (Multi30k task 1): every test set with references, 3,532 sentences.
POOLED_TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")

# --- a converged baseline: dev loss (nats per target token) at every evaluation
PLATEAU_PATIENCE = 3  # evaluations
PLATEAU_MIN_DELTA = 0.01  # nats: the best of the last PATIENCE evaluations must beat the best before by more

# --- gates that decide
GATE_UNDECIDED = (0.1, 0.9)  # P(gate open) strictly inside this band at the end of gate training
MAX_UNDECIDED_SHARE = 0.05  # of a run's gated heads: above it the run's gates have not decided
COUNTING_RULES_AGREE = 2  # heads: headcount's rule (evaluation gate 0) and the paper's (log alpha < 0)
# The gate-training budget: the fewest gated steps, in these steps, at which every one of seed 1's runs
# is at or below MAX_UNDECIDED_SHARE, at most the cap (docs/method.md's prose of the same date).
GATE_BUDGET_STEP = 250
GATE_BUDGET_CAP = 2000

# --- the single-head ablation reference
ABLATION_MIN_RESOLVED_HEADS = 10  # heads whose paired interval excludes 0, for a correlation to be read

# --- LRP concentration ("a few heads carry most relevance")
LRP_TOP_HEADS = 2  # the top heads of a layer
LRP_TOP_SHARE = 0.5  # hold more than this share of the layer's relevance ...
LRP_LAYER_SHARE = 0.5  # ... in more than this share of the layers, on the mean over seeds


# --- the amendment (docs/method.md, "The powered design: the amendment"): fine-tuning from a single
# iterate of the baseline compared every pruned model with a noisy point.
AMENDMENT_DATE = "2026-11-28"
AVERAGED_SNAPSHOTS = 3  # the baseline's model.pt: the mean of this many snapshots, 500 steps apart
WEIGHT_LR_SCALE = 0.1  # the weights' fine-tuning rate, of the baseline's last; the gates' stays 10x it
# The pilot's rule: seed 1's encoder lambda 0.05 under WEIGHT_LR_SCALE must decide (at most
# MAX_UNDECIDED_SHARE undecided at GATE_BUDGET_CAP gated steps); if it does not, the weights go back
# to the full rate (scale 1) and both readings are published.
PILOT = ("enc", 0.05)
# `training.precision: auto`, resolved once per seed at its baseline (bf16 where the CPU has
# AVX512-BF16 or AMX); its pruning runs and twins train as the baseline did, whatever machine runs them.
TRAINING_PRECISION = "auto"


def amendment() -> dict[str, object]:
    """The amendment's values by the name docs/method.md's second table gives them."""
    return {"date": AMENDMENT_DATE, "baseline: snapshots averaged": AVERAGED_SNAPSHOTS,
            "fine-tuning: weights' rate (of the baseline's last)": WEIGHT_LR_SCALE,
            "pilot: setting, lambda": PILOT,
            "training precision (a seed's runs all take its baseline's)": TRAINING_PRECISION}


def rules() -> dict[str, object]:
    """Every value above by the name docs/method.md's table gives it."""
    return {
        "date": DATE, "margin enc (BLEU)": NO_LOSS_MARGIN["enc"], "margin all (BLEU)": NO_LOSS_MARGIN["all"],
        "matched heads enc": MATCHED_HEADS["enc"], "matched heads all": MATCHED_HEADS["all"],
        "interval level": INTERVAL_LEVEL, "alpha (one-sided)": ALPHA, "correction": CORRECTION,
        "bootstrap samples": BOOTSTRAP_SAMPLES, "monte carlo draws": MONTE_CARLO_DRAWS, "seeds": SEEDS,
        "pooled test sets": POOLED_TEST_SETS, "plateau patience (evaluations)": PLATEAU_PATIENCE,
        "plateau min delta (nats)": PLATEAU_MIN_DELTA, "undecided gate band": GATE_UNDECIDED,
        "max undecided share": MAX_UNDECIDED_SHARE, "counting rules agree within (heads)": COUNTING_RULES_AGREE,
        "ablation: resolved heads for a correlation": ABLATION_MIN_RESOLVED_HEADS,
        "lrp: top heads": LRP_TOP_HEADS, "lrp: top share": LRP_TOP_SHARE, "lrp: share of layers": LRP_LAYER_SHARE,
    }


# --- heads at matched counts, against random heads, and the causal tests of roles: fixed before
# any of these runs was scored (docs/method.md, "Matched head counts and causal roles: rules fixed
# before they ran"). The language models and encoders are judged by these; the translation default
# keeps MATCHED_HEADS above.
MATCHED_DATE = "2026-11-29"
MATCHED_FRACTIONS_REMOVED = (0.25, 0.5, 0.75)  # of every head, for the language models and encoders
RANDOM_DRAWS = 20  # random head sets per matched count, and per causal test
RANDOM_BAND = (5, 95)  # percentiles of the random draws' losses, shown as the band
# "No loss": the most a pruned model may add to the unpruned one's loss, in the metric's units.
NO_LOSS_NATS = 0.05  # nats per token (a language model)
NO_LOSS_COSINE = 0.01  # cosine distance to the unpruned embedding (a sentence encoder)
# An arm beats random at a count only when (1) its loss lies below the band's lower edge (the
# RANDOM_BAND[0] percentile of the draws) and (2) the one-sided paired bootstrap test of its loss
# against the draw at that edge rejects "no lower" at ALPHA (the 95% paired interval's upper end
# below 0), over the evaluation windows. Each arm is also compared with the next arm above it.
BEATS_RANDOM_EDGE = RANDOM_BAND[0]
# A role is causal when the effect of ablating its heads exceeds this percentile of the effects of
# RANDOM_DRAWS layer-matched random sets of as many heads (and its paired interval against the
# unablated model excludes 0).
CAUSAL_PERCENTILE = 95
WINDOW_TOKENS = 512  # held-out running text, in the model's tokens, at most
ICL_POSITIONS = (50, 500)  # Olsson et al.'s in-context learning score: loss at token 500 minus at token 50
REPEATED_HALF = 50  # repeated random tokens: a sequence of this many tokens, then the same again
# The translation default over its seeds: a verdict at a count (beats random, no loss) holds when it
# holds on this many of SEEDS, each seed judged on its own baseline; otherwise it is given as k of them.
SEEDS_FOR_A_VERDICT = len(SEEDS)


def matched_rules() -> dict[str, object]:
    """The matched-count and causal rules by the name docs/method.md's table gives them."""
    return {"date": MATCHED_DATE, "fractions of heads removed": MATCHED_FRACTIONS_REMOVED,
            "random draws": RANDOM_DRAWS, "random band (percentiles)": RANDOM_BAND,
            "no loss (nats per token)": NO_LOSS_NATS, "no loss (cosine distance)": NO_LOSS_COSINE,
            "beats random: below this percentile": BEATS_RANDOM_EDGE, "alpha (one-sided)": ALPHA,
            "causal: above this percentile": CAUSAL_PERCENTILE, "window (tokens)": WINDOW_TOKENS,
            "icl positions": ICL_POSITIONS, "repeated half (tokens)": REPEATED_HALF,
            "translation: a verdict holds on this many seeds": SEEDS_FOR_A_VERDICT}
