"""The statistics of head roles: positional (subword level), syntactic and rare-token (word level)
accumulators, each fed attention maps batch by batch."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import torch

from headcount.analysis.roles.alignment import WORD_START, aligned_words
from headcount.analysis.roles.registry import PIECE_KINDS
from headcount.data.parses import simple_tokenize
from headcount.data.special import SPECIAL_PIECE

RELATIONS = ("nsubj", "obj", "amod", "advmod")
DIRECTIONS = ("head->dep", "dep->head")
# The paper's names (Table 1); UD obj is the paper's dobj.
DIRECTION_NAMES = {
    ("nsubj", "head->dep"): "v->s", ("nsubj", "dep->head"): "s->v",
    ("obj", "head->dep"): "v->o", ("obj", "dep->head"): "o->v",
    ("amod", "head->dep"): "noun->adj", ("amod", "dep->head"): "adj->noun",
    ("advmod", "head->dep"): "v->adv", ("advmod", "dep->head"): "adv->v",
}


# --------------------------------------------------------------------------------------------
# Positional heads (subword level)


def _stack_layers(probs) -> torch.Tensor:
    """A list of per-layer (B, H, S, S) maps, or one (L, B, H, S, S) tensor -> (L, B, H, S, S)."""
    if isinstance(probs, (list, tuple)):
        probs = torch.stack([torch.as_tensor(p) for p in probs])
    probs = torch.as_tensor(probs)
    if probs.dim() != 5:
        raise ValueError(f"attention must be (layers, batch, heads, S, S), got {tuple(probs.shape)}")
    return probs


def source_lengths(src: torch.Tensor, pad: int) -> torch.Tensor:
    """(B, S) source ids -> (B,) number of real tokens, EOS included; `pad`: the model's padding id."""
    return src.ne(pad).sum(dim=1)


def sentence_offset_counts(probs, lengths, queries=None, exclude_last: bool = True):
    """Per sentence of a batch, how many query tokens have their argmax key at each relative offset,
    and for how many queries each offset is a valid key: PositionalStats' counts, not yet pooled.

    probs, lengths, queries as in PositionalStats.update. Returns (counts (B, L, H, 2S - 1),
    valid (B, 2S - 1), n_queries (B,)) as tensors, offsets -(S - 1)..S - 1 along the last axis.
    """
    probs = _stack_layers(probs)
    L, B, H, S, _ = probs.shape
    lengths = torch.as_tensor(lengths, device=probs.device).reshape(B)
    pos = torch.arange(S, device=probs.device)
    n_real = lengths - int(exclude_last)  # (B,) valid keys and queries per sentence
    real = pos[None, :] < n_real[:, None]  # (B, S) keys and queries
    counted = real if queries is None else real & torch.as_tensor(queries, device=probs.device)[:, :S]
    scores = probs.masked_fill(~real[None, :, None, None, :], float("-inf"))
    offsets = scores.argmax(dim=-1) - pos  # (L, B, H, S)
    bins = 2 * S - 1
    # one bin range per (sentence, layer, head)
    cell = (torch.arange(B, device=probs.device).view(1, B, 1, 1) * (L * H)
            + torch.arange(L, device=probs.device).view(L, 1, 1, 1) * H
            + torch.arange(H, device=probs.device).view(1, 1, H, 1))
    flat = cell * bins + offsets + (S - 1)
    keep = counted[None, :, None, :].expand_as(flat)
    counts = torch.bincount(flat[keep], minlength=B * L * H * bins).view(B, L, H, bins)
    # Offset k is valid for a counted query q when q + k is a real key.
    k = torch.arange(-(S - 1), S, device=probs.device)
    target = pos[None, :, None] + k[None, None, :]  # (1, S, 2S - 1)
    inside = (target >= 0) & (target < n_real[:, None, None])  # (B, S, 2S - 1)
    valid = (inside & counted[:, :, None]).sum(dim=1)  # (B, 2S - 1)
    return counts, valid, counted.sum(dim=1)


class PositionalStats:
    """Counts, per head, the relative position of the argmax key of every query token.

    Usable on its own: feed it attention maps batch by batch with `update`, read `table()`.
    Inputs of `update`: `probs`, the attention probabilities of L layers as a list of (B, H, S, S)
    tensors or one (L, B, H, S, S) tensor (rows are queries, columns keys, each row summing to 1);
    `lengths` (B,), the number of real tokens of each row, EOS included, padding after them.
    Pooled over all query tokens of the set. With `exclude_last` (the source: the last real token
    is EOS) the EOS row and column are left out; padding never counts.

    Shares (module docstring): `fraction` of an offset k is the number of queries whose argmax is
    q + k over the number of queries for which q + k is a valid key, so a perfect +-k head scores
    1.0 whatever the sentence lengths; `fraction_paper` divides by every query (the paper's rule as
    written, which a perfect -1 head fails on 9-token sentences).
    """

    def __init__(self, exclude_last: bool = True, per_sentence: bool = False):
        self.exclude_last = exclude_last
        # With `per_sentence`, each sentence's counts too (in the order fed), for resampling sentences.
        self.sentences: list[tuple[np.ndarray, np.ndarray, int]] | None = [] if per_sentence else None
        self.counts: np.ndarray | None = None  # (L, H, 2R + 1), offset -R..R
        self.valid = np.zeros(1, dtype=np.int64)  # (2R + 1,): queries q for which q + k is a valid key
        self.radius = 0
        self.n_queries = 0

    def update(self, probs, lengths, queries=None) -> None:
        """probs: per-layer [(B, H, S, S)] or (L, B, H, S, S); lengths (B,) real tokens incl. EOS;
        queries: optional (B, S) bool, the query tokens to count (default: every real one)."""
        counts, valid, n_queries = sentence_offset_counts(probs, lengths, queries, self.exclude_last)
        radius = (counts.shape[-1] - 1) // 2
        counts, valid = counts.cpu().numpy(), valid.cpu().numpy().astype(np.int64)
        if self.sentences is not None:
            self.sentences += [(counts[b], valid[b], radius) for b in range(counts.shape[0])]
        self._add(counts.sum(axis=0), valid.sum(axis=0), radius)
        self.n_queries += int(n_queries.sum())

    def _add(self, counts: np.ndarray, valid: np.ndarray, radius: int) -> None:
        if self.counts is None:
            self.counts, self.radius = np.zeros((*counts.shape[:2], 1), dtype=np.int64), 0
        if counts.shape[:2] != self.counts.shape[:2]:
            raise ValueError(f"layers/heads changed from {self.counts.shape[:2]} to {counts.shape[:2]}")
        new_radius = max(self.radius, radius)
        merged = np.zeros((*counts.shape[:2], 2 * new_radius + 1), dtype=np.int64)
        merged[..., new_radius - self.radius:new_radius + self.radius + 1] += self.counts
        merged[..., new_radius - radius:new_radius + radius + 1] += counts
        merged_valid = np.zeros(2 * new_radius + 1, dtype=np.int64)
        merged_valid[new_radius - self.radius:new_radius + self.radius + 1] += self.valid
        merged_valid[new_radius - radius:new_radius + radius + 1] += valid
        self.counts, self.valid, self.radius = merged, merged_valid, new_radius

    def shares(self) -> np.ndarray:
        """(L, H, 2R + 1): the share of each offset -R..R among the queries where it is valid."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.valid > 0, self.counts / np.maximum(self.valid, 1), 0.0)

    def best_offsets(self) -> np.ndarray:
        """(L, H): each head's most frequent offset, the `offset` of `table()`."""
        return np.argmax(self.counts, axis=-1) - self.radius  # the first on a tie, as table()'s stable sort

    def sentence_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per sentence fed (with `per_sentence`), at each head's most frequent offset over all of
        them (`best_offsets`): the queries whose argmax key is there (hits) and the queries for which
        that offset is a valid key, each (N, L, H). Summed over the sentences they give `table()`'s
        `fraction` (hits / valid), so a resample of sentences gives that share of the resample."""
        if self.sentences is None:
            raise ValueError("sentence_counts needs PositionalStats(per_sentence=True)")
        if self.counts is None:
            return np.zeros((0, 0, 0), np.int64), np.zeros((0, 0, 0), np.int64)
        best = self.best_offsets()
        L, H = best.shape
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        hits = np.zeros((len(self.sentences), L, H), np.int64)
        valid = np.zeros_like(hits)
        for i, (counts, sentence_valid, radius) in enumerate(self.sentences):
            inside = np.abs(best) <= radius  # an offset beyond a short sentence: neither hit nor valid
            index = np.where(inside, best + radius, 0)
            hits[i] = np.where(inside, counts[layer, head, index], 0)
            valid[i] = np.where(inside, sentence_valid[index], 0)
        return hits, valid

    def table(self) -> pd.DataFrame:
        """One row per head: its most frequent offset, that offset's share among the queries where
        it is valid (`fraction`) and among all queries (`fraction_paper`), the second best offset."""
        cols = ["layer", "head", "offset", "fraction", "fraction_paper", "second_offset", "second_fraction",
                "n_valid", "n_queries"]
        if self.counts is None or self.n_queries == 0:
            return pd.DataFrame(columns=cols)
        order = np.argsort(-self.counts, axis=-1, kind="stable")  # offsets by count, most frequent first
        shares = self.shares()
        rows = []
        for layer in range(self.counts.shape[0]):
            for head in range(self.counts.shape[1]):
                c, o = self.counts[layer, head], order[layer, head]
                second = o[1] if len(o) > 1 else o[0]
                rows.append({"layer": layer, "head": head, "offset": int(o[0]) - self.radius,
                             "fraction": shares[layer, head, o[0]], "fraction_paper": c[o[0]] / self.n_queries,
                             "second_offset": int(second) - self.radius,
                             "second_fraction": shares[layer, head, second] if len(o) > 1 else 0.0,
                             "n_valid": int(self.valid[o[0]]), "n_queries": self.n_queries})
        return pd.DataFrame(rows, columns=cols)


def piece_kind_masks(pieces: Sequence[Sequence[str]], width: int) -> dict[str, torch.Tensor]:
    """{kind: (B, width) bool} for PIECE_KINDS: "initial" at the pieces that start a word (with the
    word-start marker), "continuation" at those that continue one; neither at a language tag
    (SPECIAL_PIECE) or past each sentence's pieces (EOS, padding)."""
    masks = {kind: torch.zeros(len(pieces), width, dtype=torch.bool) for kind in PIECE_KINDS}
    for row, sentence in enumerate(pieces):
        for i, p in enumerate(sentence[:width]):
            if p != SPECIAL_PIECE:
                masks["initial" if p.startswith(WORD_START) else "continuation"][row, i] = True
    return masks


def with_piece_kinds(table: pd.DataFrame, by_kind: dict[str, PositionalStats]) -> pd.DataFrame:
    """The pooled positional table with each piece kind's best offset, its share among that kind's
    queries where it is valid, and the number of queries of that kind: `{kind}_offset`,
    `{kind}_fraction`, `{kind}_queries`."""
    for kind in PIECE_KINDS:
        part = by_kind[kind].table()
        if part.empty:  # no piece of this kind in the text
            table = table.assign(**{f"{kind}_offset": pd.NA, f"{kind}_fraction": np.nan, f"{kind}_queries": 0})
            continue
        part = part[["layer", "head", "offset", "fraction", "n_queries"]].rename(
            columns={"offset": f"{kind}_offset", "fraction": f"{kind}_fraction", "n_queries": f"{kind}_queries"})
        table = table.merge(part, on=["layer", "head"], how="left")
    return table


# --------------------------------------------------------------------------------------------
# Syntactic heads (word level)


def relation_pairs(sentence: pd.DataFrame, relations: Sequence[str] = RELATIONS) -> list[tuple[str, str, int, int]]:
    """(relation, direction, query token, target token) for the arcs of one sentence's parse
    table, tokens 0-based; arcs inside one surface token are dropped."""
    token_of = dict(zip(sentence["word"].tolist(), sentence["token"].tolist()))
    pairs = []
    for rel, word_head, token in zip(sentence["relation"], sentence["head"], sentence["token"]):
        if rel not in relations or word_head == 0:
            continue
        dep, head = int(token) - 1, token_of[int(word_head)] - 1
        if dep != head:
            pairs.append((rel, "head->dep", head, dep))
            pairs.append((rel, "dep->head", dep, head))
    return pairs


class SyntacticStats:
    """Per relation and direction: how often each head's argmax word (EOS excluded) is a related
    word, and the relative positions of the related words (for the positional baseline).

    `causal` (a decoder-only model's heads, which see only the past): an instance counts only with
    its backward answers (related words before the query; a relation never links a word to itself,
    so the baseline is the most frequent offset < 0), and an instance with none is left out, counted
    in `n_unanswerable` (a table column then). Counting it as wrong would charge every head and the
    baseline alike with what no causal head can do, pulling accuracies and margins towards 0 by the
    share of forward arcs (most s->v instances in English): the roles compare what a head does where
    it could answer, as a bidirectional head is compared where it can.
    """

    def __init__(self, relations: Sequence[str] = RELATIONS, causal: bool = False):
        self.keys = [(r, d) for r in relations for d in DIRECTIONS]
        self.causal = causal
        self.correct: dict[tuple[str, str], np.ndarray] = {}
        self.n = Counter()
        self.unanswerable = Counter()
        self.offsets: dict[tuple[str, str], Counter] = defaultdict(Counter)
        self.shape: tuple[int, int] | None = None

    def update(self, word_attn: np.ndarray, pairs: Iterable[tuple[str, str, int, int]]) -> None:
        """word_attn (L, H, W + 1, W + 1) of one sentence (`word_attention`), pairs from
        `relation_pairs`. Pairs touching a word without pieces are skipped."""
        L, H = word_attn.shape[:2]
        if self.shape is None:
            self.shape = (L, H)
            self.correct = {k: np.zeros((L, H), dtype=np.int64) for k in self.keys}
        W = word_attn.shape[-1] - 1
        aligned = aligned_words(word_attn)
        pointed = np.argmax(np.nan_to_num(word_attn[..., :W], nan=-1.0), axis=-1)  # (L, H, W + 1)
        targets: dict[tuple[str, str, int], set[int]] = defaultdict(set)
        for rel, direction, q, t in pairs:
            if (rel, direction) in self.correct and aligned[q] and aligned[t]:
                targets[(rel, direction, q)].add(t)
        for (rel, direction, q), ts in targets.items():
            key = (rel, direction)
            if self.causal:
                ts = {t for t in ts if t < q}
                if not ts:
                    self.unanswerable[key] += 1
                    continue
            self.correct[key] += np.isin(pointed[:, :, q], list(ts))
            self.n[key] += 1
            self.offsets[key].update(t - q for t in ts)

    def baseline(self, key: tuple[str, str]) -> tuple[float, float]:
        """(offset, accuracy) of always pointing at the most frequent relative position."""
        if not self.n[key]:
            return np.nan, np.nan
        offset, count = max(self.offsets[key].items(), key=lambda kv: (kv[1], -abs(kv[0]), kv[0]))
        return offset, count / self.n[key]

    def table(self) -> pd.DataFrame:
        """One row per (relation, direction, layer, head): accuracy, n, baseline offset/accuracy."""
        cols = ["relation", "direction", "name", "layer", "head", "accuracy", "n", "baseline_offset",
                "baseline_accuracy"] + (["n_unanswerable"] if self.causal else [])
        if self.shape is None:
            return pd.DataFrame(columns=cols)
        rows = []
        for key in self.keys:
            offset, base = self.baseline(key)
            n = self.n[key]
            causal = {"n_unanswerable": self.unanswerable[key]} if self.causal else {}
            for layer in range(self.shape[0]):
                for head in range(self.shape[1]):
                    rows.append({"relation": key[0], "direction": key[1], "name": DIRECTION_NAMES.get(key, ""),
                                 "layer": layer, "head": head,
                                 "accuracy": self.correct[key][layer, head] / n if n else np.nan,
                                 "n": n, "baseline_offset": offset, "baseline_accuracy": base, **causal})
        return pd.DataFrame(rows, columns=cols)


def syntactic_table(syntactic: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the paper: per relation and direction, the best head's accuracy beside the
    positional baseline (fractions, not percent), over `n` instances (a causal model's: those it
    can answer, with `n_unanswerable` beside them; SyntacticStats). A direction without instances
    keeps its row, with best head -1 and NaN accuracies."""
    causal = "n_unanswerable" in syntactic.columns
    cols = ["relation", "direction", "name", "n", *(["n_unanswerable"] if causal else []), "best_layer",
            "best_head", "best_accuracy", "baseline_offset", "baseline_accuracy"]
    rows = []
    for (rel, direction), group in syntactic.groupby(["relation", "direction"], sort=False):
        scored = group.dropna(subset=["accuracy"])
        best = scored.loc[scored["accuracy"].idxmax()] if len(scored) else group.iloc[0]
        rows.append({"relation": rel, "direction": direction, "name": best["name"], "n": int(best["n"]),
                     **({"n_unanswerable": int(best["n_unanswerable"])} if causal else {}),
                     "best_layer": int(best["layer"]) if len(scored) else -1,
                     "best_head": int(best["head"]) if len(scored) else -1,
                     "best_accuracy": best["accuracy"], "baseline_offset": best["baseline_offset"],
                     "baseline_accuracy": best["baseline_accuracy"]})
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------
# Rare-token heads (word level)


def frequency_words(text: str, lowercase: bool = True) -> list[str]:
    """The words of running text as rare-token statistics count and look them up: the one splitter
    for both (headcount.parses.simple_tokenize), lowercased when the model's data are."""
    return simple_tokenize(text.lower() if lowercase else text)


def count_words(lines: Iterable[str], lowercase: bool = True) -> Counter:
    """Word frequencies of the training source side, words as `frequency_words` splits them."""
    counts = Counter()
    for line in lines:
        counts.update(frequency_words(line, lowercase))
    return counts


class RareStats:
    """How often each head points to the rarest / one of the two rarest words of a sentence.

    "Points to" is the argmax word (EOS excluded) of the head's word-level attention averaged over
    the sentence's query words (EOS row excluded).

    Reference rates: with `pieces_per_word` given, the rates of a head that attends uniformly over
    the subwords are counted too (`uniform_rate_*`). Attention to a word being the sum over its
    pieces, such a head points at the word with the most pieces, and rare words are split into
    more pieces: diffuse heads can pass the 50% threshold without doing anything rare-specific.
    Words tied for the most pieces share the uniform head's pointing equally.
    """

    def __init__(self, frequencies: Counter, top_k: int = 500, lowercase: bool = True, min_words: int = 3):
        self.frequencies = frequencies  # from count_words, with the same `lowercase`
        self.top = {w for w, _ in frequencies.most_common(top_k)}
        self.lowercase, self.min_words = lowercase, min_words
        self.rarest: np.ndarray | None = None
        self.two_rarest: np.ndarray | None = None
        self.uniform_rarest = self.uniform_two_rarest = 0.0  # expected hits, summed over sentences
        self.n_uniform = 0
        self.n_sentences = 0
        self.n_seen = 0

    def _parts(self, token: str) -> list[str]:
        """A surface token as `frequency_words` splits it (a token it keeps whole is its own part)."""
        return frequency_words(token, self.lowercase) or [token.lower() if self.lowercase else token]

    def frequency(self, token: str) -> int:
        """Training frequency of a surface token: that of its rarest part ("didn't" -> did, n't)."""
        return min(self.frequencies.get(part, 0) for part in self._parts(token))

    def is_common(self, token: str) -> bool:
        """Whether every part of the token is among the `top_k` most frequent training words."""
        return all(part in self.top for part in self._parts(token))

    def update(self, word_attn: np.ndarray, words: Sequence[str], pieces_per_word: Sequence[int] | None = None) -> bool:
        """word_attn (L, H, W + 1, W + 1) of one sentence, words its W surface tokens (best the
        sentence's `frequency_words`; any other token is looked up by its parts, `frequency`),
        pieces_per_word (W,) for the uniform reference (optional); True if the sentence was eligible."""
        L, H = word_attn.shape[:2]
        W = len(words)
        if self.rarest is None:
            self.rarest, self.two_rarest = np.zeros((L, H), np.int64), np.zeros((L, H), np.int64)
        self.n_seen += 1
        idx = np.flatnonzero(aligned_words(word_attn))
        if len(idx) < self.min_words:
            return False
        freq = np.full(W, np.inf)
        freq[idx] = [self.frequency(words[i]) for i in idx]
        if self.is_common(words[idx[np.argmin(freq[idx])]]):
            return False
        mean_to = word_attn[:, :, idx, :W].mean(axis=2)  # (L, H, W): averaged over query words
        mean_to[..., ~np.isfinite(freq)] = -np.inf
        pointed = freq[np.argmax(mean_to, axis=-1)]  # (L, H) frequency of the word pointed to
        lowest = np.sort(freq[idx])
        self.rarest += pointed <= lowest[0]
        self.two_rarest += pointed <= lowest[1]
        self.n_sentences += 1
        if pieces_per_word is not None:
            # A uniform head points at a word with the most pieces; where several tie, at each of
            # them equally often (not at the first: with all words one piece that would be word 0).
            pieces = np.where(np.isfinite(freq), np.asarray(pieces_per_word, float), -1.0)
            tied = freq[pieces == pieces.max()]
            self.uniform_rarest += np.mean(tied <= lowest[0])
            self.uniform_two_rarest += np.mean(tied <= lowest[1])
            self.n_uniform += 1
        return True

    def table(self) -> pd.DataFrame:
        cols = ["layer", "head", "rate_rarest", "rate_two_rarest", "n_sentences", "uniform_rate_rarest",
                "uniform_rate_two_rarest"]
        if self.rarest is None:
            return pd.DataFrame(columns=cols)
        L, H = self.rarest.shape
        n, nu = self.n_sentences, self.n_uniform
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                             "rate_rarest": (self.rarest / n).ravel() if n else np.nan,
                             "rate_two_rarest": (self.two_rarest / n).ravel() if n else np.nan,
                             "n_sentences": n,
                             "uniform_rate_rarest": self.uniform_rarest / nu if nu else np.nan,
                             "uniform_rate_two_rarest": self.uniform_two_rarest / nu if nu else np.nan},
                            columns=cols)


# --------------------------------------------------------------------------------------------
# Attention sinks and induction heads (the language-model literature)


class SinkStats:
    """Per head, the mean share of attention on the sink: the no-op slot the maps hold where the
    source's EOS is (collect puts a causal model's BOS there, and an encoder-only model's [CLS]
    and [SEP] together), averaged over the queries (the sink's own row and padding left out).

    Inputs of `update` as PositionalStats': probs (L, B, H, S, S) or a per-layer list, lengths (B,)
    real tokens with the sink, the sink last.
    """

    def __init__(self):
        self.total: np.ndarray | None = None  # (L, H) summed sink shares
        self.n_queries = 0

    def update(self, probs, lengths) -> None:
        probs = _stack_layers(probs)
        L, B, H, S, _ = probs.shape
        lengths = torch.as_tensor(lengths, device=probs.device).reshape(B)
        sink = (lengths - 1).view(1, B, 1, 1, 1).expand(L, B, H, S, 1)
        share = probs.gather(-1, sink).squeeze(-1)  # (L, B, H, S)
        counted = torch.arange(S, device=probs.device)[None, :] < (lengths - 1)[:, None]  # (B, S)
        total = (share * counted[None, :, None, :]).sum(dim=(1, 3)).double().cpu().numpy()
        self.total = total if self.total is None else self.total + total
        self.n_queries += int(counted.sum())

    def table(self) -> pd.DataFrame:
        cols = ["layer", "head", "sink_share", "n_queries"]
        if self.total is None or self.n_queries == 0:
            return pd.DataFrame(columns=cols)
        L, H = self.total.shape
        layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
        return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                             "sink_share": (self.total / self.n_queries).ravel(), "n_queries": self.n_queries},
                            columns=cols)


def repeated_sequences(vocab_size: int, special, length: int, count: int, seed: int = 0) -> torch.Tensor:
    """(count, 2 * length + 1) token ids BOS + r + r, each row its own r of `length` random ids,
    none a special id of the model (`special`, a SpecialIds). r has no repeated id where the
    vocabulary allows, so every token of the second copy has exactly one earlier occurrence."""
    specials = {special.pad, special.bos, special.eos, special.unk, special.mask, *special.forced} - {None}
    candidates = np.array([i for i in range(vocab_size) if i not in specials])
    rng = np.random.default_rng(seed)
    rows = [rng.choice(candidates, size=length, replace=len(candidates) < length) for _ in range(count)]
    return torch.tensor([[special.bos, *r, *r] for r in rows], dtype=torch.long)


def repeated_sequence_scores(probs, length: int) -> pd.DataFrame:
    """Per head, on maps of BOS + r + r sequences (`repeated_sequences`; probs (L, B, H, T, T) or a
    per-layer list, T = 2 * length + 1), the mean attention over the second copy's queries p
    (length + 1 .. 2 * length) to: p - length + 1, the token after the first occurrence of p's token
    (`induction_score`, Olsson et al. 2022; TransformerLens' prefix matching); p - length, that
    occurrence itself (`duplicate_score`); p - 1 (`previous_score`); p - length + 2, one further
    (`shifted_induction_score`: a head that matches the token two back and copies the one before,
    as the decoder-only positive control learned, tools/train_lm_control.py; reported, not a role)."""
    probs = _stack_layers(probs)
    L, B, H, T, _ = probs.shape
    if T != 2 * length + 1:
        raise ValueError(f"maps of {T} positions are not BOS + two copies of {length} tokens")
    queries = torch.arange(length + 1, 2 * length + 1, device=probs.device)
    rows = probs[..., queries, :]  # (L, B, H, length, T)

    def score(targets):
        index = targets.view(1, 1, 1, length, 1).expand(L, B, H, length, 1)
        return rows.gather(-1, index).squeeze(-1).double().mean(dim=(1, 3)).cpu().numpy()  # (L, H)

    layer, head = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                         "induction_score": score(queries - length + 1).ravel(),
                         "duplicate_score": score(queries - length).ravel(),
                         "previous_score": score(queries - 1).ravel(),
                         "shifted_induction_score": score((queries - length + 2).clamp(max=T - 1)).ravel(),
                         "n_sequences": B, "length": length})
