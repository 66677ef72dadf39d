"""Head roles of Voita et al. (2019), section 5: positional, syntactic and rare-token heads.

The decisions are SPEC section 2's; where SPEC is silent the choice is written here.

EOS and padding. A source row is `pieces + [EOS] + padding`. "Excluding EOS" means the EOS
query row is not counted and the EOS key column is left out of every argmax (no
renormalisation); padding never counts.

Word level (Clark et al. 2019, "What does BERT look at?"). Syntactic and rare-token statistics are
computed on words: attention TO a word is the sum of the attention to its pieces, attention FROM a
word is the mean of its pieces' rows. The "words" here are the sentence's surface tokens (the
`token_form` column of a parse table, headcount.parses), because the model reads surface text; the
syntactic words of a multiword token ("du" = "de le") share that token, and a relation inside one
token is not scored. EOS keeps its own row and column (the last), so it can be left out.

Positional statistics stay on subword tokens.

Indices: `layer` and `head` are 0-based, as in the model's tensors; word/token indices inside this
module are 0-based positions in the sentence.

Syntactic directions. For a dependency arc head -> dependent, "head->dep" means the query is the
head word and the head's attention should point at the dependent: nsubj "v->s" (the verb attends
to its subject), obj "v->o", amod "noun->adj", advmod "v->adv". "dep->head" is the reverse
(s->v, o->v, adj->noun, adv->v). The paper's names assume verbal/nominal heads; the arcs are
selected by relation only (UD puts the copula's subject under a noun or adjective: it counts).
One scored instance is one (query word, relation, direction); it is correct if the head's argmax
word is any word related to the query that way (a verb with two adverbs is one v->adv instance
with two acceptable answers). The baseline adds, for each instance, one count per acceptable
relative position; its accuracy is the top count over the instances, which is exactly the accuracy
of always answering that relative position.

Rare tokens. Sentences are eligible if their least frequent word is not among the `top_k` (500)
most frequent training words and they have at least 3 aligned words (with 2, "one of the two
rarest" always holds). Frequencies are looked up as counted by `count_words` (the same tokenizer
as headcount.parses.simple_tokenize; lowercased when the model's data are). Ties in frequency count
as equally rare: a hit on "the rarest" is any word of the minimum frequency, on "one of the two
rarest" any word whose frequency is at most the second smallest.
"""

from __future__ import annotations

import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from difflib import SequenceMatcher

import numpy as np
import pandas as pd
import torch

from .batching import source_tensor
from .model import PAD_ID
from .parses import simple_tokenize

RELATIONS = ("nsubj", "obj", "amod", "advmod")
DIRECTIONS = ("head->dep", "dep->head")
# The paper's names (Table 1); UD obj is the paper's dobj.
DIRECTION_NAMES = {
    ("nsubj", "head->dep"): "v->s", ("nsubj", "dep->head"): "s->v",
    ("obj", "head->dep"): "v->o", ("obj", "dep->head"): "o->v",
    ("amod", "head->dep"): "noun->adj", ("amod", "dep->head"): "adj->noun",
    ("advmod", "head->dep"): "v->adv", ("advmod", "dep->head"): "adv->v",
}
ROLE_PRECEDENCE = ("rare", "syntactic", "positional")
WORD_START = "\u2581"  # sentencepiece's word-start marker


# --------------------------------------------------------------------------------------------
# Pieces -> words


def _normalised_chars(strings: Sequence[str]) -> tuple[str, np.ndarray]:
    """The strings' characters, NFKC-normalised and lowercased one by one, without whitespace or
    the word-start marker, and the index of the string each character came from.

    Both sides of the alignment go through this so that sentencepiece's own normalisation
    (nmt_nfkc) and an optional lowercasing of the model's input do not look like mismatches.
    """
    chars, owner = [], []
    for i, s in enumerate(strings):
        for ch in s:
            for c in unicodedata.normalize("NFKC", ch).lower():
                if not c.isspace() and c != WORD_START:
                    chars.append(c)
                    owner.append(i)
    return "".join(chars), np.asarray(owner, dtype=np.int64)


def align_pieces(words: Sequence[str], pieces: Sequence[str]) -> np.ndarray:
    """Map each sentencepiece piece to the word it belongs to: int array (n_pieces,), 0-based.

    Pieces and words are matched character by character (after `_normalised_chars`). A piece
    belongs to the word of its first character. Mismatches (characters sentencepiece changed or
    dropped, <unk> pieces) are bridged by a longest-common-subsequence match (difflib); a piece
    none of whose characters match joins the previous piece's word (the next one's at the start),
    and a piece that is only the marker '▁' joins the word it opens (the next piece's). A word
    that receives no piece (it was merged into a piece that starts in the previous word, or it is
    missing from the text) has no attention row and is left out by the analyses. A piece that
    straddles two words ("▁don" over "do" + "n't") counts wholly for the first. -1 marks a piece
    that could not be placed at all (nothing matched in the whole sentence).
    """
    n = len(pieces)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    word_chars, word_of_char = _normalised_chars(words)
    piece_chars, piece_of_char = _normalised_chars(pieces)
    char_word = np.full(len(piece_chars), -1, dtype=np.int64)  # word of each piece character
    if piece_chars == word_chars:
        char_word[:] = word_of_char
    else:
        matcher = SequenceMatcher(None, piece_chars, word_chars, autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            char_word[a:a + size] = word_of_char[b:b + size]
    piece_word = np.full(n, -1, dtype=np.int64)
    has_chars = np.zeros(n, dtype=bool)
    has_chars[np.unique(piece_of_char)] = True
    for c in range(len(piece_chars) - 1, -1, -1):  # backwards: the first matched character wins
        if char_word[c] >= 0:
            piece_word[piece_of_char[c]] = char_word[c]
    for i in range(n - 2, -1, -1):  # a lone '▁' opens the next word
        if piece_word[i] < 0 and not has_chars[i]:
            piece_word[i] = piece_word[i + 1]
    for i in range(1, n):  # unmatched characters stay with the word before them
        if piece_word[i] < 0:
            piece_word[i] = piece_word[i - 1]
    for i in range(n - 2, -1, -1):  # ... or, at the start, with the word after them
        if piece_word[i] < 0:
            piece_word[i] = piece_word[i + 1]
    return piece_word


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def word_attention(attn, piece_to_word: Sequence[int], n_words: int) -> np.ndarray:
    """Subword attention (..., S, S) -> word attention (..., W + 1, W + 1), EOS last.

    `attn` holds the pieces at 0..P-1 (P = len(piece_to_word)), EOS at P and padding after it
    (ignored). Attention to a word sums its pieces' columns; attention from a word averages its
    pieces' rows. A word without pieces gets a NaN row and a zero column. Leading dimensions
    (layers, heads) are kept.
    """
    a = _numpy(attn)
    S, P, W = a.shape[-1], len(piece_to_word), n_words
    if P + 1 > S:
        raise ValueError(f"{P} pieces + EOS do not fit an attention map of size {S}")
    ptw = np.asarray(piece_to_word, dtype=np.int64)
    placed = ptw >= 0
    member = np.zeros((S, W + 1))  # member[s, w] = 1 if position s belongs to word w (EOS -> W)
    member[np.flatnonzero(placed), ptw[placed]] = 1.0
    member[P, W] = 1.0
    to_words = a @ member  # (..., S, W + 1): keys summed per word
    counts = member.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_rows = member / counts  # NaN columns for words without pieces
    return np.einsum("sw,...sv->...wv", mean_rows, to_words)


def aligned_words(word_attn: np.ndarray) -> np.ndarray:
    """Boolean (W,): which words have an attention row (received at least one piece)."""
    return ~np.isnan(word_attn.reshape(-1, *word_attn.shape[-2:])[0, :-1, 0])


def sentence_tokens(sentence: pd.DataFrame) -> list[str]:
    """The surface tokens of one sentence of a parse table, in order."""
    return sentence.drop_duplicates("token").sort_values("token")["token_form"].tolist()


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


def source_lengths(src: torch.Tensor) -> torch.Tensor:
    """(B, S) source ids -> (B,) number of real tokens, EOS included."""
    return src.ne(PAD_ID).sum(dim=1)


class PositionalStats:
    """Counts, per head, the relative position of the argmax key of every query token.

    Pooled over all query tokens of the set. With `exclude_last` (the source: the last real token
    is EOS) the EOS row and column are left out; padding never counts.
    """

    def __init__(self, exclude_last: bool = True):
        self.exclude_last = exclude_last
        self.counts: np.ndarray | None = None  # (L, H, 2R + 1), offset -R..R
        self.radius = 0
        self.n_queries = 0

    def update(self, probs, lengths) -> None:
        """probs: per-layer [(B, H, S, S)] or (L, B, H, S, S); lengths (B,) real tokens incl. EOS."""
        probs = _stack_layers(probs)
        L, B, H, S, _ = probs.shape
        lengths = torch.as_tensor(lengths, device=probs.device).reshape(B)
        pos = torch.arange(S, device=probs.device)
        real = pos[None, :] < (lengths - int(self.exclude_last))[:, None]  # (B, S) keys and queries
        scores = probs.masked_fill(~real[None, :, None, None, :], float("-inf"))
        offsets = scores.argmax(dim=-1) - pos  # (L, B, H, S)
        bins = 2 * S - 1
        head_index = torch.arange(L * H, device=probs.device).view(L, 1, H, 1)
        flat = head_index * bins + offsets + (S - 1)
        keep = real[None, :, None, :].expand_as(flat)
        counts = torch.bincount(flat[keep], minlength=L * H * bins).view(L, H, bins)
        self._add(counts.cpu().numpy(), S - 1)
        self.n_queries += int(real.sum())

    def _add(self, counts: np.ndarray, radius: int) -> None:
        if self.counts is None:
            self.counts, self.radius = np.zeros((*counts.shape[:2], 1), dtype=np.int64), 0
        if counts.shape[:2] != self.counts.shape[:2]:
            raise ValueError(f"layers/heads changed from {self.counts.shape[:2]} to {counts.shape[:2]}")
        new_radius = max(self.radius, radius)
        merged = np.zeros((*counts.shape[:2], 2 * new_radius + 1), dtype=np.int64)
        merged[..., new_radius - self.radius:new_radius + self.radius + 1] += self.counts
        merged[..., new_radius - radius:new_radius + radius + 1] += counts
        self.counts, self.radius = merged, new_radius

    def table(self) -> pd.DataFrame:
        """One row per head: its most frequent offset, the fraction of queries on it, second best."""
        cols = ["layer", "head", "offset", "fraction", "second_offset", "second_fraction", "n_queries"]
        if self.counts is None or self.n_queries == 0:
            return pd.DataFrame(columns=cols)
        order = np.argsort(-self.counts, axis=-1, kind="stable")
        rows = []
        for layer in range(self.counts.shape[0]):
            for head in range(self.counts.shape[1]):
                c, o = self.counts[layer, head], order[layer, head]
                second = o[1] if len(o) > 1 else o[0]
                rows.append({"layer": layer, "head": head, "offset": int(o[0]) - self.radius,
                             "fraction": c[o[0]] / self.n_queries, "second_offset": int(second) - self.radius,
                             "second_fraction": c[second] / self.n_queries if len(o) > 1 else 0.0,
                             "n_queries": self.n_queries})
        return pd.DataFrame(rows, columns=cols)


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
    word, and the relative positions of the related words (for the positional baseline)."""

    def __init__(self, relations: Sequence[str] = RELATIONS):
        self.keys = [(r, d) for r in relations for d in DIRECTIONS]
        self.correct: dict[tuple[str, str], np.ndarray] = {}
        self.n = Counter()
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
                "baseline_accuracy"]
        if self.shape is None:
            return pd.DataFrame(columns=cols)
        rows = []
        for key in self.keys:
            offset, base = self.baseline(key)
            n = self.n[key]
            for layer in range(self.shape[0]):
                for head in range(self.shape[1]):
                    rows.append({"relation": key[0], "direction": key[1], "name": DIRECTION_NAMES.get(key, ""),
                                 "layer": layer, "head": head,
                                 "accuracy": self.correct[key][layer, head] / n if n else np.nan,
                                 "n": n, "baseline_offset": offset, "baseline_accuracy": base})
        return pd.DataFrame(rows, columns=cols)


def syntactic_table(syntactic: pd.DataFrame) -> pd.DataFrame:
    """Table 1 of the paper: per relation and direction, the best head's accuracy beside the
    positional baseline (fractions, not percent)."""
    cols = ["relation", "direction", "name", "n", "best_layer", "best_head", "best_accuracy",
            "baseline_offset", "baseline_accuracy"]
    rows = []
    for (rel, direction), group in syntactic.groupby(["relation", "direction"], sort=False):
        scored = group.dropna(subset=["accuracy"])
        best = scored.loc[scored["accuracy"].idxmax()] if len(scored) else group.iloc[0]
        rows.append({"relation": rel, "direction": direction, "name": best["name"], "n": int(best["n"]),
                     "best_layer": int(best["layer"]) if len(scored) else -1,
                     "best_head": int(best["head"]) if len(scored) else -1,
                     "best_accuracy": best["accuracy"], "baseline_offset": best["baseline_offset"],
                     "baseline_accuracy": best["baseline_accuracy"]})
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------------------------
# Rare-token heads (word level)


def count_words(lines: Iterable[str], lowercase: bool = True) -> Counter:
    """Word frequencies of the training source side, words as headcount.parses.simple_tokenize
    splits them (so they match stanza-parsed and, closely, UD words)."""
    counts = Counter()
    for line in lines:
        counts.update(simple_tokenize(line.lower() if lowercase else line))
    return counts


class RareStats:
    """How often each head points to the rarest / one of the two rarest words of a sentence.

    "Points to" is the argmax word (EOS excluded) of the head's word-level attention averaged over
    the sentence's query words (EOS row excluded).

    Reference rates: with `pieces_per_word` given, the rates of a head that attends uniformly over
    the subwords are counted too (`uniform_rate_*`). Attention to a word being the sum over its
    pieces, such a head points at the word with the most pieces, and rare words are split into
    more pieces: diffuse heads can pass the 50% threshold without doing anything rare-specific.
    """

    def __init__(self, frequencies: Counter, top_k: int = 500, lowercase: bool = True, min_words: int = 3):
        self.frequencies = frequencies
        self.top = {w for w, _ in frequencies.most_common(top_k)}
        self.lowercase, self.min_words = lowercase, min_words
        self.rarest: np.ndarray | None = None
        self.two_rarest: np.ndarray | None = None
        self.uniform_rarest = self.uniform_two_rarest = self.n_uniform = 0
        self.n_sentences = 0
        self.n_seen = 0

    def _key(self, word: str) -> str:
        return word.lower() if self.lowercase else word

    def update(self, word_attn: np.ndarray, words: Sequence[str], pieces_per_word: Sequence[int] | None = None) -> bool:
        """word_attn (L, H, W + 1, W + 1) of one sentence, words its W tokens, pieces_per_word (W,)
        for the uniform reference (optional); True if the sentence was eligible."""
        L, H = word_attn.shape[:2]
        W = len(words)
        if self.rarest is None:
            self.rarest, self.two_rarest = np.zeros((L, H), np.int64), np.zeros((L, H), np.int64)
        self.n_seen += 1
        idx = np.flatnonzero(aligned_words(word_attn))
        if len(idx) < self.min_words:
            return False
        freq = np.full(W, np.inf)
        freq[idx] = [self.frequencies.get(self._key(words[i]), 0) for i in idx]
        if self._key(words[idx[np.argmin(freq[idx])]]) in self.top:
            return False
        mean_to = word_attn[:, :, idx, :W].mean(axis=2)  # (L, H, W): averaged over query words
        mean_to[..., ~np.isfinite(freq)] = -np.inf
        pointed = freq[np.argmax(mean_to, axis=-1)]  # (L, H) frequency of the word pointed to
        lowest = np.sort(freq[idx])
        self.rarest += pointed <= lowest[0]
        self.two_rarest += pointed <= lowest[1]
        self.n_sentences += 1
        if pieces_per_word is not None:
            uniform = freq[np.argmax(np.where(np.isfinite(freq), np.asarray(pieces_per_word, float), -1.0))]
            self.uniform_rarest += uniform <= lowest[0]
            self.uniform_two_rarest += uniform <= lowest[1]
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
# One role per head


def _best_syntactic(syntactic: pd.DataFrame, min_instances: int) -> pd.DataFrame:
    """Per head, the relation and direction with the largest margin over its baseline."""
    scored = syntactic[(syntactic["n"] >= min_instances) & syntactic["accuracy"].notna()].copy()
    scored["margin"] = scored["accuracy"] - scored["baseline_accuracy"]
    scored = scored.sort_values(["layer", "head", "margin"], ascending=[True, True, False], kind="stable")
    return scored


def assign_roles(positional: pd.DataFrame, syntactic: pd.DataFrame, rare: pd.DataFrame,
                 positional_threshold: float = 0.9, syntactic_margin: float = 0.10,
                 rare_threshold: float = 0.5, min_instances: int = 10,
                 precedence: Sequence[str] = ROLE_PRECEDENCE, rare_margin: float | None = None) -> pd.DataFrame:
    """One role per head from the three statistics tables.

    positional: fraction on one offset >= positional_threshold (subword level, EOS excluded);
    syntactic: accuracy >= baseline + syntactic_margin (absolute) for some relation and direction
    scored on >= min_instances instances; rare: points to one of the two rarest words in more
    than rare_threshold of >= min_instances eligible sentences, and, if `rare_margin` is given
    (not in the paper), by at least that much more often than a uniform head would
    (RareStats' uniform reference; see there why diffuse heads can pass 50%).

    A head that qualifies for several roles gets the first in `precedence`, by default rare >
    syntactic > positional: the content-based functions are the rarer and more specific ones (a
    head that beats the positional baseline by 10 points is doing more than attending to a fixed
    offset), and the flags is_positional / is_syntactic / is_rare keep every qualification.
    `statistic` is the number behind the role (two-rarest rate, accuracy margin, or fraction).
    """
    heads = positional[["layer", "head", "offset", "fraction"]].rename(
        columns={"offset": "positional_offset", "fraction": "positional_fraction"})
    best = _best_syntactic(syntactic, min_instances)
    qualified = best[best["margin"] >= syntactic_margin - 1e-12]
    lists = (qualified.assign(label=qualified["relation"] + " " + qualified["name"])
             .groupby(["layer", "head"])["label"].agg(", ".join).rename("syntactic_all").reset_index())
    top = best.drop_duplicates(["layer", "head"])[["layer", "head", "relation", "direction", "name", "accuracy",
                                                   "baseline_accuracy", "margin"]]
    top = top.rename(columns={"relation": "syntactic_relation", "direction": "syntactic_direction",
                              "name": "syntactic_name", "accuracy": "syntactic_accuracy",
                              "baseline_accuracy": "syntactic_baseline", "margin": "syntactic_margin"})
    rare_cols = ["layer", "head", "rate_rarest", "rate_two_rarest", "n_sentences", "uniform_rate_two_rarest"]
    rare = rare[[c for c in rare_cols if c in rare.columns]].rename(
        columns={"n_sentences": "rare_sentences", "uniform_rate_two_rarest": "rare_uniform_two_rarest"})
    table = heads.merge(top, on=["layer", "head"], how="outer").merge(lists, on=["layer", "head"], how="left")
    table = table.merge(rare, on=["layer", "head"], how="outer").sort_values(["layer", "head"], ignore_index=True)
    table["syntactic_all"] = table["syntactic_all"].fillna("")
    table["is_positional"] = table["positional_fraction"].fillna(0) >= positional_threshold
    table["is_syntactic"] = table["syntactic_margin"].fillna(-np.inf) >= syntactic_margin - 1e-12
    table["is_rare"] = (table["rate_two_rarest"].fillna(0) > rare_threshold) & (
        table["rare_sentences"].fillna(0) >= min_instances)
    if rare_margin is not None:
        reference = table.get("rare_uniform_two_rarest", pd.Series(np.nan, index=table.index)).astype(float)
        table["is_rare"] &= table["rate_two_rarest"].fillna(0) >= reference.fillna(0) + rare_margin - 1e-12
    statistic_of = {"positional": "positional_fraction", "syntactic": "syntactic_margin", "rare": "rate_two_rarest"}
    hits = [table[f"is_{role}"].to_numpy(bool) for role in precedence]
    table["role"] = np.select(hits, list(precedence), default="none")
    values = [pd.to_numeric(table[statistic_of[role]], errors="coerce").to_numpy(float) for role in precedence]
    table["statistic"] = np.select(hits, values, default=np.nan)
    first = ["layer", "head", "role", "statistic"]
    return table[first + [c for c in table.columns if c not in first]]


# --------------------------------------------------------------------------------------------
# Driver: a model, a segmenter, a parse table -> the three statistics tables


@torch.no_grad()
def encoder_head_statistics(model, segmenter, table: pd.DataFrame, frequencies: Counter, lowercase: bool,
                            batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                            log=print) -> dict[str, pd.DataFrame]:
    """Run the encoder over the parsed sentences and collect the encoder self-attention head
    statistics: {"positional", "syntactic", "rare", "table1"} DataFrames.

    Each sentence's `text` (lowercased when the model's data are) is segmented, EOS appended, and
    encoded in batches; sentences longer than the model's max_len are skipped. Words without
    pieces are counted in the log line.
    """
    model.eval().to(device)
    positional, syntactic, rare = PositionalStats(), SyntacticStats(), RareStats(frequencies, top_k, lowercase)
    sentences = [s for _, s in table.groupby("sentence", sort=True)]
    texts = [s["text"].iloc[0] for s in sentences]
    texts = [t.lower() if lowercase else t for t in texts]
    ids = segmenter.encode(texts)
    keep = [i for i in range(len(sentences)) if len(ids[i]) + 1 <= model.cfg.max_len]
    unplaced = total_words = 0
    for start in range(0, len(keep), batch_size):
        chunk = keep[start:start + batch_size]
        src = source_tensor([ids[i] for i in chunk]).to(device)  # (B, S): pieces, EOS, padding
        lengths = source_lengths(src).tolist()
        _, _, probs = model.encode(src, need_weights=True)
        probs = torch.stack(probs)  # (L, B, H, S, S)
        positional.update(probs, lengths)
        for row, i in enumerate(chunk):
            words = sentence_tokens(sentences[i])
            piece_to_word = align_pieces(words, segmenter.pieces(texts[i]))
            wa = word_attention(probs[:, row, :, :lengths[row], :lengths[row]], piece_to_word, len(words))
            total_words += len(words)
            unplaced += int((~aligned_words(wa)).sum())
            syntactic.update(wa, relation_pairs(sentences[i]))
            rare.update(wa, words, np.bincount(piece_to_word[piece_to_word >= 0], minlength=len(words)))
    log(f"head statistics: {len(keep)} of {len(sentences)} sentences, {unplaced} of {total_words} words "
        f"without pieces, {rare.n_sentences} eligible for rare tokens")
    if rare.n_uniform:
        log(f"rare tokens: a head attending uniformly over subwords would point to one of the two rarest "
            f"words in {rare.uniform_two_rarest / rare.n_uniform:.0%} of the eligible sentences")
    syn = syntactic.table()
    return {"positional": positional.table(), "syntactic": syn, "rare": rare.table(), "table1": syntactic_table(syn)}

