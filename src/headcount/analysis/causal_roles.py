"""Causal tests of head roles: does ablating the heads a role names do what the role says, more
than ablating random heads of as many does? (report.preregistered, "heads at matched counts ...
causal tests of roles".)

Every test compares the named set with RANDOM_DRAWS layer-matched random sets of the same size
(HeadAccess.matched_random: as many heads from each of the named heads' layers, none of them
named) and gives a `CausalTest`: the named set's effect, signed so that the role predicts a
positive one; the random sets' effects and their CAUSAL_PERCENTILE-th percentile; the named set's
paired bootstrap interval against the unablated model (training.perplexity.paired_bootstrap_nll,
the 95% interval INTERVAL_LEVEL fixes, resampling texts); and `causal`: the effect is above the
random percentile and the interval lies above 0.

- `induction_test`: ablating induction heads raises the loss on the second copy of repeated random
  tokens (`repeated_random_tokens`).
- `copying_scores`: Olsson et al.'s (2022) copying, measured: does a head's output, through its
  slice of W^O and the unembedding, raise the logit of the token it attends to?
- `icl_scores`: Olsson et al.'s in-context learning score (loss late in a window minus loss early
  in it) under head sets.
- `composition_test`: ablating the previous-token heads of layers before the induction heads
  lowers the induction heads' prefix matching (K-composition).
- `sink_test`: ablating the sink heads raises the loss on running text.
- `syntactic_tests`: ablating the best head of a dependency relation raises the loss of the token
  each query word of that relation predicts (`relation_positions`), more than other heads of its
  layer do.

Heads are named as everywhere in the per-head API: "layer.head" from 1 or (layer, head) from 0;
tables have `layer` and `head` from 0 and `name` from 1. Repeated sequences are token-id lists
x = prefix + r + r; the model reads BOS + x[:-1] and predicts x, so the loss at target t and the
query at input position t both belong to token t of x as predicted from token t - 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.analysis.head_access import ArgumentError, HeadAccess
from headcount.models.seq2seq import kind_of
from headcount.report.preregistered import CAUSAL_PERCENTILE, ICL_POSITIONS, RANDOM_DRAWS, REPEATED_HALF
from headcount.training.evaluate import bootstrap_indices, bootstrap_interval
from headcount.training.perplexity import paired_bootstrap_nll

NAMED = "named"  # the set under test, among the random sets ("random 1", ...) in one measurement
ICL_RADIUS = 5  # the ICL score averages the loss over positions p - 5 .. p + 5 around each of ICL_POSITIONS


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class CausalTest:
    """One causal test of a role: the named heads' effect against random sets of as many heads."""

    test: str  # "induction", "composition" or "sink"
    heads: list[str]  # the named set (names counted from 1)
    effect: float  # what ablating them does, signed so that the role predicts > 0
    low: float  # the effect's paired bootstrap interval against the unablated model
    high: float
    p_value: float
    random_sets: dict[str, list[str]]
    random_effects: dict[str, float]
    percentile: float = CAUSAL_PERCENTILE
    note: str = ""  # how the random sets were drawn where not layer-matched, heads left out
    per_head: pd.DataFrame | None = None  # composition: each earlier previous-token head ablated alone
    left_out: list[str] = field(default_factory=list)  # composition: previous-token heads not before induction

    @property
    def random_percentile(self) -> float:
        """The CAUSAL_PERCENTILE-th percentile of the random sets' effects."""
        return float(np.percentile(list(self.random_effects.values()), self.percentile))

    @property
    def causal(self) -> bool:
        """The effect is above the random sets' percentile and its interval excludes 0 on the side
        the role predicts."""
        return bool(self.effect > self.random_percentile and self.low > 0)

    @property
    def table(self) -> pd.DataFrame:
        """One row: the set, its effect and interval, the random sets' mean and percentile, causal."""
        effects = list(self.random_effects.values())
        return pd.DataFrame([{
            "test": self.test, "heads": " ".join(self.heads), "n_heads": len(self.heads), "effect": self.effect,
            "low": self.low, "high": self.high, "p_value": self.p_value, "random_mean": float(np.mean(effects)),
            "random_percentile": self.random_percentile, "percentile": self.percentile, "draws": len(effects),
            "causal": self.causal, "note": self.note}])


# --------------------------------------------------------------------------------------------
# Arguments


def _whole(value, argument: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ArgumentError(f"{argument}: a whole number of at least {least}, not {value!r}")
    return int(value)


def _causal_lm(h: HeadAccess, what: str) -> None:
    """`what` reads next-token predictions: refuse other models by their objective."""
    objective = kind_of(h.model).objective
    if objective != "causal_lm":
        raise ArgumentError(f"h: {what} reads a causal language model's next-token predictions; this model's "
                            f"objective is {objective}")


def special_ids(h: HeadAccess) -> set[int]:
    """The model's special ids (padding, BOS, EOS, unknown, mask): what repeated random tokens avoid."""
    s = h.model.special
    return {int(i) for i in (s.pad, s.bos, s.eos, s.unk, getattr(s, "mask", None), *s.forced) if i is not None}


def repeated_random_tokens(vocab_size: int, n: int, half: int = REPEATED_HALF, seed: int = 0, low: int = 0,
                           prefix: int | Sequence[int] | None = None, avoid: Iterable[int] = ()) -> list[list[int]]:
    """`n` token-id sequences r + r: r `half` random ids from low .. vocab_size - 1, none in `avoid`
    (give `special_ids(h)`: a padding id inside a text would not count as a token), distinct where
    the vocabulary allows (so each token of the second copy has one earlier occurrence); `prefix`
    (an id or ids, a BOS say) first. The same sequences for the same seed."""
    vocab_size, n = _whole(vocab_size, "vocab_size", 2), _whole(n, "n", 1)
    half, low = _whole(half, "half", 2), _whole(low, "low", 0)
    seed = _whole(seed, "seed", 0)
    start = [] if prefix is None else [int(prefix)] if isinstance(prefix, (int, np.integer)) else [
        int(i) for i in prefix]
    avoid = {int(i) for i in avoid}
    candidates = np.array([i for i in range(low, vocab_size) if i not in avoid])
    if len(candidates) < 2:
        raise ArgumentError(f"vocab_size: ids {low}..{vocab_size - 1} less `avoid` leave {len(candidates)} to draw "
                            f"from; random sequences need at least 2")
    rng = np.random.default_rng(seed)
    runs = [rng.choice(candidates, size=half, replace=len(candidates) < half).tolist() for _ in range(n)]
    return [start + r + r for r in runs]


@dataclass(frozen=True)
class Repeat:
    """Where a sequence prefix + r + r repeats: the first copy's start and the copies' length."""

    start: int
    half: int

    def copied(self) -> np.ndarray:
        """The positions t whose token the first copy predicts: the second copy but its first token
        (as targets: the loss at t; as queries of BOS + x[:-1]: position t holds token t - 1)."""
        return np.arange(self.start + self.half + 1, self.start + 2 * self.half)

    def prefix_keys(self) -> np.ndarray:
        """For each copied position's query, the key after the earlier occurrence of its token."""
        return self.copied() - self.half + 1


def _repeats(h: HeadAccess, sequences, argument: str = "sequences") -> list[Repeat]:
    """Each sequence's Repeat (the longest repeat that ends it), refusing what is not one."""
    if isinstance(sequences, (str, Tensor)) or not isinstance(sequences, Sequence) or not sequences:
        raise ArgumentError(f"{argument}: a non-empty list of token-id lists (repeated_random_tokens), not "
                            f"{type(sequences).__name__}")
    special = special_ids(h)
    found = []
    for i, x in enumerate(sequences):
        if isinstance(x, str) or not isinstance(x, Sequence) or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in x):
            raise ArgumentError(f"{argument}[{i}]: a list of token ids, not {x!r:.60}")
        x = [int(t) for t in x]
        L = len(x)
        half = next((k for k in range(L // 2, 1, -1) if x[L - 2 * k:L - k] == x[L - k:]), None)
        if half is None:
            raise ArgumentError(f"{argument}[{i}]: not some tokens followed by the same tokens again (at least 2); "
                                f"make sequences with repeated_random_tokens")
        if special & set(x):
            raise ArgumentError(f"{argument}[{i}]: holds the model's special ids {sorted(special & set(x))}; draw "
                                f"without them (repeated_random_tokens(..., avoid=special_ids(h)))")
        found.append(Repeat(L - 2 * half, half))
    return found


# --------------------------------------------------------------------------------------------
# Random sets


def random_sets(h: HeadAccess, heads, draws: int = RANDOM_DRAWS, seed: int = 0, layers: Iterable[int] | None = None,
                argument: str = "heads") -> tuple[dict[str, list[str]], str]:
    """The random sets a named set is tested against -> ({"random 1": [names], ...}, note):
    h.matched_random's layer-matched sets where every layer of `heads` has as many other heads as
    are named there. Where one has fewer, each set takes all the other heads it can from the named
    heads' layers and the rest from every head that is not named (of `layers`, where given), and
    the note says so."""
    draws, seed = _whole(draws, "draws", 1), _whole(seed, "seed", 0)
    keys = h.names.keys(heads, argument)
    per_layer: dict[tuple[str, int], int] = {}
    for kind, layer, _ in keys:
        per_layer[(kind, layer)] = per_layer.get((kind, layer), 0) + 1
    short = sorted(layer for (kind, layer), n in per_layer.items() if h.names.widths[kind][layer] - n < n)
    if not short:
        return h.matched_random(keys, draws, seed), ""
    allowed = None if layers is None else {int(layer) for layer in layers}
    pool = [(kind, layer, head) for kind in sorted({k for k, _ in per_layer})
            for layer, width in enumerate(h.names.widths[kind]) for head in range(width)
            if (kind, layer, head) not in keys and (allowed is None or layer in allowed)]
    where = "" if allowed is None else f" of layers {sorted(allowed)}"
    if len(pool) < len(keys):
        raise ArgumentError(f"{argument}: {len(keys)} heads named and only {len(pool)} other heads{where}; no random "
                            f"set of as many can be drawn")
    rng = np.random.default_rng(seed)
    sets = {}
    for i in range(draws):
        chosen = []
        for (kind, layer), n in per_layer.items():
            own = [k for k in pool if k[:2] == (kind, layer)]
            chosen += [own[j] for j in rng.choice(len(own), min(n, len(own)), replace=False)]
        rest = [k for k in pool if k not in chosen]
        chosen += [rest[j] for j in rng.choice(len(rest), len(keys) - len(chosen), replace=False)]
        sets[f"random {i + 1}"] = [h.names.name(k) for k in sorted(chosen)]
    note = (f"layer(s) {short} (from 0) have fewer other heads than are named there: each random set takes what "
            f"it can from the named heads' layers and the rest from the {len(pool)} other heads{where}")
    return sets, note


def _verdict(test: str, named: list[str], effect_sums: Mapping[str, np.ndarray], units: np.ndarray,
             randoms: dict[str, list[str]], note: str = "", **extra) -> CausalTest:
    """A CausalTest from each set's per-text summed effect against the unablated model (same
    texts, same units): the named set's with its paired interval, the random sets' as numbers."""
    zero = np.zeros_like(units)
    found = paired_bootstrap_nll(effect_sums[NAMED], zero, units)
    random_effects = {name: float(effect_sums[name].sum() / max(units.sum(), 1)) for name in randoms}
    return CausalTest(test, named, found["difference"], found["low"], found["high"], found["p_value"], randoms,
                      random_effects, note=note, **extra)


# --------------------------------------------------------------------------------------------
# Induction


def _copied_losses(h: HeadAccess, sequences, repeats: list[Repeat],
                   sets: Mapping[str, list[str]]) -> tuple[dict[str, np.ndarray], np.ndarray, str]:
    """Each set's next-token loss summed per sequence over its copied positions, the number of
    those positions, and the name of the unablated model's set."""
    measured = h.measure(sequences, sets, per_token=True)
    units = np.array([len(r.copied()) for r in repeats], dtype=float)
    sums = {}
    for name in measured.sets:
        per_text = measured.tokens[name]
        for i, (tokens, x) in enumerate(zip(per_text, sequences)):
            if len(tokens) != len(x):  # a token the batching took for padding
                raise ArgumentError(f"sequences[{i}]: {len(x)} tokens, {len(tokens)} scored; leave the model's "
                                    f"special ids out")
        sums[name] = np.array([tokens[r.copied()].sum() for tokens, r in zip(per_text, repeats)])
    return sums, units, measured.baseline


def induction_test(h: HeadAccess, heads, sequences, draws: int = RANDOM_DRAWS, seed: int = 0) -> CausalTest:
    """Ablating `heads` (zeroed) raises the next-token loss on the copied positions of repeated
    random tokens (`sequences`: r + r, `repeated_random_tokens`; the second copy but its first
    token, which nothing earlier predicts) more than layer-matched random sets of as many heads.
    effect: nats per copied token, ablated minus unablated."""
    _causal_lm(h, "induction_test")
    keys = h.names.keys(heads, "heads")
    repeats = _repeats(h, sequences)
    randoms, note = random_sets(h, keys, draws, seed)
    named = [h.names.name(k) for k in keys]
    sums, units, baseline = _copied_losses(h, sequences, repeats, {NAMED: named, **randoms})
    effects = {name: sums[name] - sums[baseline] for name in sums}
    return _verdict("induction", named, effects, units, randoms, note)


def prefix_matching(h: HeadAccess, sequences, heads, edit=None) -> tuple[np.ndarray, np.ndarray]:
    """The heads' prefix matching on repeated sequences: per sequence, the attention from each
    copied position to the key after its token's earlier occurrence, summed over those positions
    and the heads, and how many (position, head) pairs that sums over. `edit`: a head set ablated
    (or an Intervention) while the patterns are read."""
    keys = h.names.keys(heads, "heads")
    repeats = _repeats(h, sequences)
    cache = h.cache(sequences, heads=keys, outputs=False, edit=edit or None)
    sums = np.zeros(len(repeats))
    for i, r in enumerate(repeats):
        queries, targets = torch.as_tensor(r.copied()), torch.as_tensor(r.prefix_keys())
        sums[i] = sum(float(cache.patterns[(kind, layer)][i][head][queries, targets].double().sum())
                      for kind, layer, head in keys)
    return sums, np.array([len(r.copied()) * len(keys) for r in repeats], dtype=float)


# --------------------------------------------------------------------------------------------
# Copying


def _readout(model) -> tuple[Tensor, Tensor, bool]:
    """The unembedding (V, D), the final norm's elementwise weight (D,) and whether that norm
    centres (LayerNorm) or only scales (RMSNorm), for the families whose logits are that."""
    family = getattr(model, "family", None)
    layout = getattr(family, "layout", None)
    if getattr(model, "model_kind", None) != "decoder_only" or layout not in ("gpt2", "llama"):
        name = getattr(family, "name", type(model).__name__)
        raise ArgumentError(f"h: copying scores read W^O, the final norm and the unembedding of a transformers "
                            f"causal LM (GPT-2, Llama, Qwen2, Qwen3); {name} does not expose its logits as those")
    base = model.hf.base_model
    norm = base.ln_f if layout == "gpt2" else base.norm
    unembed = model.hf.get_output_embeddings().weight
    return unembed.detach().double().cpu(), norm.weight.detach().double().cpu(), layout == "gpt2"


def _head_w_o(model, key) -> Tensor:
    """A head's slice of W^O, (D, Dh), times its gate (1 for a model that was not pruned)."""
    kind, layer, head = key
    module = model.attention_modules()[kind][layer]
    Dh = module.head_dim
    columns = module.proj.weight[:, head * Dh:(head + 1) * Dh] * module.gates()[head]
    return columns.detach().double().cpu()


def attended_raise(output: Tensor, pattern: Tensor, ids: Sequence[int], w_o: Tensor, norm_weight: Tensor,
                   centre: bool, unembed: Tensor) -> Tensor:
    """Per query (Q,): how much the head's output (Q, Dh) raises, through W^O (D, Dh), the final
    norm's weight and the unembedding (V, D), the logit of each key's token over the mean logit,
    weighted by the head's attention to that key (pattern (Q, Tk); ids: the tokens at the key
    positions). The start token's key (position 0) is left out: attending to it is a sink, not a
    copy. What is approximated: the head's direct path alone, and of the final norm its elementwise
    weight (and LayerNorm's centring), not its division by the residual stream's scale, which
    differs by position and depends on every other head (a positive factor: the sign is exact)."""
    direct = (output.double() @ w_o.T) * norm_weight  # (Q, D)
    if centre:
        direct = direct - direct.mean(dim=-1, keepdim=True)
    keys = torch.as_tensor(list(ids[1:pattern.shape[1]]), dtype=torch.long)
    # only the attended tokens' logits and the mean logit: (Q, Tk) and (Q,), not the (Q, V) logits
    raised = direct @ unembed[keys].T - (direct @ unembed.mean(dim=0))[:, None]
    return (pattern[:, 1:].double() * raised).sum(dim=-1)


def copying_scores(h: HeadAccess, sequences, heads=None) -> pd.DataFrame:
    """Olsson et al.'s copying, measured on the copied positions of repeated sequences (r + r): per
    head (default every head), `copying_score` the mean over positions of `attended_raise` (in
    logits, the attention-weighted raise of the attended tokens' logits over the mean logit) and
    `positive_share` the share of positions where it is positive."""
    _causal_lm(h, "copying_scores")
    unembed, norm_weight, centre = _readout(h.model)
    keys = h.names.keys(heads, "heads") if heads is not None else [
        (kind, layer, head) for kind, widths in h.names.widths.items() for layer, n in enumerate(widths)
        for head in range(n)]
    repeats = _repeats(h, sequences)
    cache = h.cache(sequences, heads=keys)
    inputs = [[h.model.special.bos] + [int(t) for t in x[:-1]] for x in sequences]  # what the model reads
    rows = []
    for kind, layer, head in keys:
        w_o = _head_w_o(h.model, (kind, layer, head))
        raised = torch.cat([attended_raise(cache.outputs[(kind, layer)][i][head][r.copied()],
                                           cache.patterns[(kind, layer)][i][head][r.copied()], ids, w_o,
                                           norm_weight, centre, unembed)
                            for i, (ids, r) in enumerate(zip(inputs, repeats))])
        rows.append({"type": kind, "layer": layer, "head": head, "name": h.names.name((kind, layer, head)),
                     "copying_score": float(raised.mean()), "positive_share": float((raised > 0).double().mean()),
                     "positions": len(raised)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# In-context learning


def _token_counts(h: HeadAccess, windows) -> list[int]:
    """Each window's length in the model's tokens (token-id lists as they are)."""
    if isinstance(windows, str) or not isinstance(windows, Sequence) or not windows:
        raise ArgumentError(f"windows: a non-empty list of texts or token-id lists, not {type(windows).__name__}")
    strings = [i for i, w in enumerate(windows) if isinstance(w, str)]
    encoded = dict(zip(strings, h.tgt_tokenizer.encode([windows[i] for i in strings]))) if strings else {}
    return [len(encoded[i]) if i in encoded else len(w) for i, w in enumerate(windows)]


def icl_scores(h: HeadAccess, windows, sets: Mapping[str, object], positions: tuple[int, int] = ICL_POSITIONS,
               radius: int = ICL_RADIUS) -> pd.DataFrame:
    """Olsson et al.'s in-context learning score under each head set of `sets` ({name: heads}, as
    HeadAccess.measure takes them; the unablated model is added as "none" where no set is empty):
    per window of running text, the mean next-token loss over tokens positions[1] +- radius minus
    that over positions[0] +- radius (tokens counted from 0 in the window; the average over a
    neighbourhood steadies a single token's loss), then averaged over the windows. Negative: the
    model predicts later tokens better, from the context. Columns: the score with its bootstrap
    interval over windows, and its difference from the unablated model's with the paired interval
    (positive: the set's ablation takes in-context learning away)."""
    _causal_lm(h, "icl_scores")
    radius = _whole(radius, "radius", 0)
    if not (isinstance(positions, (tuple, list)) and len(positions) == 2):
        raise ArgumentError(f"positions: (early, late) token positions, not {positions!r}")
    early, late = (_whole(p, "positions", radius) for p in positions)
    if late - radius <= early + radius:
        raise ArgumentError(f"positions: {positions!r} with radius {radius} overlap; the late position must come after "
                            f"the early one by more than 2 * radius")
    counts = _token_counts(h, windows)
    short = [i for i, n in enumerate(counts) if n <= late + radius]
    if short:
        raise ArgumentError(f"windows[{short[0]}]: {counts[short[0]]} tokens; the score reads the loss up to token "
                            f"{late + radius} (from 0): give windows of at least {late + radius + 1} tokens")
    measured = h.measure(windows, sets, per_token=True)

    def score(tokens: np.ndarray) -> float:
        return float(tokens[late - radius:late + radius + 1].mean() - tokens[early - radius:early + radius + 1].mean())

    scores = {name: np.array([score(t) for t in measured.tokens[name]]) for name in measured.sets}
    base = scores[measured.baseline]
    ones = np.ones(len(base))
    resamples = bootstrap_indices(len(base))
    rows = []
    for name, values in scores.items():
        low, high = bootstrap_interval(values[resamples].mean(axis=1))
        versus = paired_bootstrap_nll(values, base, ones)
        rows.append({"set": name, "heads": " ".join(measured.heads[name]), "icl_score": float(values.mean()),
                     "low": low, "high": high, "difference": versus["difference"], "difference_low": versus["low"],
                     "difference_high": versus["high"], "p_value": versus["p_value"], "windows": len(values),
                     "early": early, "late": late, "radius": radius})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Composition


def composition_test(h: HeadAccess, previous_heads, induction_heads, sequences, draws: int = RANDOM_DRAWS,
                     seed: int = 0) -> CausalTest:
    """Ablating the previous-token heads of layers before the earliest induction head's lowers the
    induction heads' prefix matching on repeated sequences (`prefix_matching`, read from patterns
    cached under the ablation) more than random sets drawn from the same earlier layers. effect:
    the drop (unablated minus ablated) in the induction heads' mean attention to the token after
    the earlier occurrence. `per_head`: each earlier previous-token head ablated alone, its drop
    with its interval; `left_out`: previous-token heads at or after the earliest induction layer,
    which cannot feed it."""
    _causal_lm(h, "composition_test")
    previous = h.names.keys(previous_heads, "previous_heads")
    induction = h.names.keys(induction_heads, "induction_heads")
    if not induction:
        raise ArgumentError("induction_heads: no heads; name the induction heads whose prefix matching is tested")
    both = sorted(set(previous) & set(induction))
    if both:
        raise ArgumentError(f"previous_heads: {[h.names.name(k) for k in both]} also among induction_heads; a head "
                            f"is tested in one role")
    first = min(layer for _, layer, _ in induction)
    earlier = [k for k in previous if k[1] < first]
    left_out = [h.names.name(k) for k in previous if k[1] >= first]
    randoms, note = random_sets(h, earlier, draws, seed, layers=range(first), argument="previous_heads")
    if left_out:
        note = "; ".join(filter(None, [note, f"left out, not before layer {first + 1} (from 1): {' '.join(left_out)}"]))
    named = [h.names.name(k) for k in earlier]
    base, units = prefix_matching(h, sequences, induction)
    matched: dict[frozenset, np.ndarray] = {}  # random draws repeat sets: each set's patterns once

    def drop(heads: list[str]) -> np.ndarray:
        key = frozenset(heads)
        if key not in matched:
            matched[key] = base - prefix_matching(h, sequences, induction, edit=list(heads))[0]
        return matched[key]

    drops = {name: drop(heads) for name, heads in {NAMED: named, **randoms}.items()}
    per_head = []
    for key in earlier:
        alone = paired_bootstrap_nll(drop([h.names.name(key)]), np.zeros_like(units), units)
        per_head.append({"layer": key[1], "head": key[2], "name": h.names.name(key), "drop": alone["difference"],
                         "low": alone["low"], "high": alone["high"], "p_value": alone["p_value"]})
    table = pd.DataFrame(per_head, columns=["layer", "head", "name", "drop", "low", "high", "p_value"])
    return _verdict("composition", named, drops, units, randoms, note, per_head=table, left_out=left_out)


# --------------------------------------------------------------------------------------------
# Sinks


def sink_test(h: HeadAccess, sink_heads, texts, draws: int = RANDOM_DRAWS, seed: int = 0) -> CausalTest:
    """Ablating every sink head (zeroed) raises the loss on running text (`texts`) more than random
    sets of as many heads: layer-matched where each layer has enough heads that are not sinks,
    else (the note says so) completed from every head that is not named. effect: nats per token,
    ablated minus unablated."""
    keys = h.names.keys(sink_heads, "sink_heads")
    every = [(k, la, hd) for k, widths in h.names.widths.items() for la, n in enumerate(widths) for hd in range(n)]
    if len(every) - len(keys) < len(keys):
        # most heads are sinks (SmolLM2: 189 of 270): no set of as many other heads exists, so each
        # random set is drawn from every head, sinks included, and the note says so
        rng = np.random.default_rng(_whole(seed, "seed", 0))
        randoms = {f"random {i + 1}": [h.names.name(every[j]) for j in sorted(rng.choice(len(every), len(keys),
                                                                                        replace=False))]
                   for i in range(_whole(draws, "draws", 1))}
        note = (f"{len(keys)} of {len(every)} heads are named, more than the other heads: each random set is "
                f"{len(keys)} heads drawn from every head, named ones included")
    else:
        randoms, note = random_sets(h, keys, draws, seed, argument="sink_heads")
    named = [h.names.name(k) for k in keys]
    measured = h.measure(texts, {NAMED: named, **randoms})
    sums = {name: measured.sums[measured.sets.index(name)] for name in measured.sets}
    effects = {name: sums[name] - sums[measured.baseline] for name in sums}
    return _verdict("sink", named, effects, measured.units, randoms, note)


# --------------------------------------------------------------------------------------------
# Syntactic heads


def relation_positions(h: HeadAccess, sentences: Sequence[pd.DataFrame], relation: str,
                       direction: str) -> tuple[list[list[int]], list[list[int]]]:
    """Where a syntactic head of a causal LM does its work -> (token ids of each sentence, the
    positions of x whose loss it feeds). `sentences`: one parse table each (data.parses); an
    instance of (relation, direction: "head->dep" or "dep->head") counts where a related word comes
    before the query word, as a causal head can only look back (SyntacticStats' causal rule). The
    head reads the related word at the query word's last piece q, whose output predicts x[q + 1]:
    that loss is the one read (none where q ends the sentence). Sentences whose pieces the
    tokenizer does not spell one per id, or that have no instance, get no positions."""
    from headcount.analysis.roles.alignment import align_pieces, sentence_tokens
    from headcount.analysis.roles.statistics import relation_pairs

    _causal_lm(h, "relation_positions")
    texts, positions = [], []
    for sentence in sentences:
        text = str(sentence["text"].iloc[0])
        ids, pieces = h.src_tokenizer.encode([text])[0], h.src_tokenizer.pieces(text)
        found: set[int] = set()
        if len(ids) == len(pieces):
            word_of = align_pieces(sentence_tokens(sentence), pieces)
            for _, d, query, target in relation_pairs(sentence, (relation,)):
                last = np.flatnonzero(word_of == query)
                if d == direction and target < query and len(last) and np.any(word_of == target) \
                        and last[-1] + 1 < len(ids):
                    found.add(int(last[-1]) + 1)
        texts.append(list(ids))
        positions.append(sorted(found))
    return texts, positions


def syntactic_tests(h: HeadAccess, tests: Mapping[str, tuple[object, list[list[int]]]], texts,
                    draws: int = RANDOM_DRAWS, seed: int = 0) -> list[CausalTest]:
    """For each test {label: (head, positions per text)} (`relation_positions`): does zeroing the
    head raise the next-token loss at its positions more than layer-matched random single heads
    (other heads of its layer, drawn as `random_sets` draws them)? effect: nats per position,
    ablated minus unablated. Every distinct head is ablated once, in one measurement over `texts`;
    a test reads its positions' losses from it, so tests that share a head or a draw cost nothing
    more."""
    _causal_lm(h, "syntactic_tests")
    plans = {}
    for label, (head, positions) in tests.items():
        if len(positions) != len(texts):
            raise ArgumentError(f"tests[{label!r}]: positions for {len(positions)} texts, {len(texts)} texts given")
        if not any(positions):  # refused before any forward pass
            raise ArgumentError(f"tests[{label!r}]: no position to read in any text")
        named = h.names.name(h.names.key(head, f"tests[{label!r}]"))
        randoms, note = random_sets(h, [named], draws, seed)
        plans[label] = (named, positions, randoms, note)
    singles = sorted({name for named, _, randoms, _ in plans.values() for name in [named, *(
        heads[0] for heads in randoms.values())]}, key=lambda n: h.names.key(n))
    measured = h.measure(texts, {name: [name] for name in singles}, per_token=True)
    def at_positions(name: str, positions: list[list[int]]) -> np.ndarray:  # (texts,) summed losses
        return np.array([float(np.sum(tokens[p])) if p else 0.0 for tokens, p in zip(measured.tokens[name], positions)])

    found = []
    for label, (named, positions, randoms, note) in plans.items():
        units = np.array([len(p) for p in positions], dtype=float)
        read = units > 0  # a text without positions says nothing (and would be 0 / 0 in a resample)
        base = at_positions(measured.baseline, positions)
        effects = {NAMED: (at_positions(named, positions) - base)[read],
                   **{draw: (at_positions(heads[0], positions) - base)[read] for draw, heads in randoms.items()}}
        found.append(_verdict(f"syntactic {label}", [named], effects, units[read], randoms, note))
    return found


__all__ = ["CausalTest", "ICL_RADIUS", "Repeat", "attended_raise", "composition_test", "copying_scores",
           "icl_scores", "induction_test", "prefix_matching", "random_sets", "relation_positions",
           "repeated_random_tokens", "sink_test", "special_ids", "syntactic_tests"]
