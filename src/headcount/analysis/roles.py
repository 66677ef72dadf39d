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

Positional statistics stay on subword tokens. The share of an offset k counts only the queries for
which q + k is a valid key (inside the sentence, not EOS, not padding): a head that always attends
to the previous token has no valid target at the first token, and would otherwise score
1 - 1/length instead of 1.0. The paper's reading (every query in the denominator) is kept beside it.
The same shares are also reported per piece kind (PIECE_KINDS): over the word-initial pieces only
and over the continuation pieces only (`continuation_offset`, `continuation_fraction`, ...), with
pieces marked the sentencepiece way (WORD_START opens a word, as in headcount's and Marian's
vocabularies; a WordPiece "##" vocabulary would need its own mask). They
do not decide the positional role; they show a head that joins subwords into words, which the
pooled share mixes with whatever the head does at the other kind of piece.

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
rarest" always holds). Words are counted and looked up through one function, `frequency_words`
(headcount.parses.simple_tokenize, lowercased when the model's data are): the analysed words of a
sentence are that function's words, and a surface token handed in from elsewhere (a treebank's
"didn't", "U.S.", "--") is split by it before the lookup and is as frequent as its rarest part, so
no token is missing from the table only because of how it was split. Ties in frequency count as
equally rare: a hit on "the rarest" is any word of the minimum frequency, on "one of the two
rarest" any word whose frequency is at most the second smallest.
"""

from __future__ import annotations

import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np
import pandas as pd
import torch

from headcount.data.batching import source_tensor
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
WORD_START = "\u2581"  # sentencepiece's word-start marker
# Query tokens by their place in the word: its first subword, or one that continues it. A head that
# joins a word's pieces (-1 from a continuation piece, +1 from an initial one) need not look at any
# neighbour from the other kind, so its pooled positional share can stay low.
PIECE_KINDS = ("initial", "continuation")


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
    that could not be placed at all (nothing matched in the whole sentence), and SPECIAL_PIECE
    (a language tag, which stands for no text).
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
    special = np.array([p == SPECIAL_PIECE for p in pieces])
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
    piece_word[special] = -1  # a language tag is no part of any word
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


def source_lengths(src: torch.Tensor, pad: int) -> torch.Tensor:
    """(B, S) source ids -> (B,) number of real tokens, EOS included; `pad`: the model's padding id."""
    return src.ne(pad).sum(dim=1)


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

    def __init__(self, exclude_last: bool = True):
        self.exclude_last = exclude_last
        self.counts: np.ndarray | None = None  # (L, H, 2R + 1), offset -R..R
        self.valid = np.zeros(1, dtype=np.int64)  # (2R + 1,): queries q for which q + k is a valid key
        self.radius = 0
        self.n_queries = 0

    def update(self, probs, lengths, queries=None) -> None:
        """probs: per-layer [(B, H, S, S)] or (L, B, H, S, S); lengths (B,) real tokens incl. EOS;
        queries: optional (B, S) bool, the query tokens to count (default: every real one)."""
        probs = _stack_layers(probs)
        L, B, H, S, _ = probs.shape
        lengths = torch.as_tensor(lengths, device=probs.device).reshape(B)
        pos = torch.arange(S, device=probs.device)
        n_real = lengths - int(self.exclude_last)  # (B,) valid keys and queries per sentence
        real = pos[None, :] < n_real[:, None]  # (B, S) keys and queries
        counted = real if queries is None else real & torch.as_tensor(queries, device=probs.device)[:, :S]
        scores = probs.masked_fill(~real[None, :, None, None, :], float("-inf"))
        offsets = scores.argmax(dim=-1) - pos  # (L, B, H, S)
        bins = 2 * S - 1
        head_index = torch.arange(L * H, device=probs.device).view(L, 1, H, 1)
        flat = head_index * bins + offsets + (S - 1)
        keep = counted[None, :, None, :].expand_as(flat)
        counts = torch.bincount(flat[keep], minlength=L * H * bins).view(L, H, bins)
        # Offset k is valid for a counted query q when q + k is a real key.
        k = torch.arange(-(S - 1), S, device=probs.device)
        target = pos[None, :, None] + k[None, None, :]  # (1, S, 2S - 1)
        inside = (target >= 0) & (target < n_real[:, None, None])  # (B, S, 2S - 1)
        valid = (inside & counted[:, :, None]).sum(dim=(0, 1))
        self._add(counts.cpu().numpy(), valid.cpu().numpy().astype(np.int64), S - 1)
        self.n_queries += int(counted.sum())

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
# One role per head


# The roles, one registry. A role says which per-head columns it takes from the statistics tables
# ({"positional", "syntactic", "rare"}: PositionalStats, SyntacticStats, RareStats), how a head
# qualifies (is_<role>; the paper's rule as written beside it, is_<role>_paper, where the project's
# differs), the column holding the number behind it, and how figures show it. assign_roles, the
# pruning table's role_<role> counts and the figures iterate ROLES: a new role is one Role here.


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


ROLES: dict[str, Role] = {}  # in the tables' and figures' order
NO_ROLE, NO_ROLE_LABEL, NO_ROLE_COLOUR = "none", "other", "#bdbdbd"


def register_role(role: Role) -> Role:
    ROLES[role.name] = role
    return role


def role_names() -> list[str]:
    """Every role a head can get, the registry's then "none"."""
    return [*ROLES, NO_ROLE]


def role_precedence() -> tuple[str, ...]:
    return tuple(sorted(ROLES, key=lambda name: ROLES[name].precedence))


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
    "positional", "positional", "#7b3fa0", 2, _positional_columns, _positional,
    lambda rules: "positional_fraction_paper" if rules["positional_share"] == "all" else "positional_fraction",
    qualifies_paper=_positional_paper))
register_role(Role(
    "syntactic", "syntactic", "#2e8b57", 1, _syntactic_columns,
    lambda table, rules: table["syntactic_margin"].fillna(-np.inf) >= rules["syntactic_margin"] - 1e-12,
    lambda rules: "syntactic_margin", fill=(("syntactic_all", ""),)))
register_role(Role("rare", "rare tokens", "#f28e1c", 0, _rare_columns, _rare, lambda rules: "rate_two_rarest",
                   qualifies_paper=_rare_paper))


def assign_roles(positional: pd.DataFrame, syntactic: pd.DataFrame, rare: pd.DataFrame,
                 positional_threshold: float = 0.9, syntactic_margin: float = 0.10,
                 rare_threshold: float = 0.5, min_instances: int = 10,
                 precedence: Sequence[str] | None = None, rare_margin: float | None = None,
                 positional_share: str = "valid") -> pd.DataFrame:
    """One role per head from the three statistics tables, by the registered roles (ROLES).

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
    margin, or fraction).

    The paper's reading is kept beside the project's wherever they differ: is_positional_paper
    (share over all queries), is_rare_paper (plain "> rare_threshold", no margin), and role_paper,
    the role those flags and is_syntactic (the same rule in both) give.
    """
    if positional_share not in ("valid", "all"):
        raise ValueError(f"positional_share must be 'valid' or 'all', not {positional_share!r}")
    rules = {"positional_threshold": positional_threshold, "syntactic_margin": syntactic_margin,
             "rare_threshold": rare_threshold, "min_instances": min_instances, "rare_margin": rare_margin,
             "positional_share": positional_share}
    statistics = {"positional": positional, "syntactic": syntactic, "rare": rare}
    precedence = role_precedence() if precedence is None else tuple(precedence)
    table = None
    for role in ROLES.values():
        part = role.columns(statistics, rules)
        table = part if table is None else table.merge(part, on=["layer", "head"], how="outer")
    table = table.sort_values(["layer", "head"], ignore_index=True)
    for role in ROLES.values():
        for column, value in role.fill:
            table[column] = table[column].fillna(value)
    for role in ROLES.values():
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


# --------------------------------------------------------------------------------------------
# Driver: a model, a segmenter, a parse table -> the three statistics tables


def _encoder_attention(model, segmenter, texts: Sequence[str], keep: Sequence[int], batch_size: int, device):
    """Encode the sentences `keep` of the (already lowercased if need be) `texts` in batches: yields
    (sentence indices, (L, B, H, S, S) encoder self-attention, lengths incl. EOS)."""
    ids = segmenter.encode([texts[i] for i in keep])
    for start in range(0, len(keep), batch_size):
        chunk = list(keep[start:start + batch_size])
        src = source_tensor(ids[start:start + batch_size], model.special).to(device)  # (B, S): pieces, EOS, padding
        lengths = source_lengths(src, model.special.pad).tolist()
        _, _, probs = model.encode(src, need_weights=True)
        yield chunk, torch.stack(probs), lengths


def _fitting(segmenter, texts: Sequence[str], model, max_pieces: int | None) -> tuple[list[int], int, int]:
    """Indices of the sentences the analysis keeps: at most `max_pieces` subwords (if given) and
    within the model's positions; and how many were too long for each reason."""
    lengths = [len(x) for x in segmenter.encode(list(texts))]
    too_long = {i for i, n in enumerate(lengths) if max_pieces is not None and n > max_pieces}
    no_room = {i for i, n in enumerate(lengths) if n + 1 > model.max_positions} - too_long
    return [i for i in range(len(texts)) if i not in too_long | no_room], len(too_long), len(no_room)


@torch.no_grad()
def text_statistics(model, segmenter, texts: Sequence[str], frequencies: Counter, lowercase: bool,
                    batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                    log=print) -> dict[str, pd.DataFrame]:
    """Positional and rare-token encoder-head statistics of running text (the experiment's own
    analysis set; they need no parse): {"positional", "rare"} DataFrames.

    Each line (lowercased when the model's data are) is segmented, EOS appended, and encoded in
    batches; lines longer than the model's max_len are skipped. The rare-token words of a line are
    its `frequency_words`, the words `frequencies` (count_words) were counted as.
    """
    model.eval().to(device)
    texts = [t.lower() if lowercase else t for t in texts]
    keep, _, no_room = _fitting(segmenter, texts, model, None)
    positional, rare = PositionalStats(), RareStats(frequencies, top_k, lowercase)
    by_kind = {kind: PositionalStats() for kind in PIECE_KINDS}
    unplaced = total_words = 0
    for chunk, probs, lengths in _encoder_attention(model, segmenter, texts, keep, batch_size, device):
        pieces = [segmenter.pieces(texts[i]) for i in chunk]
        positional.update(probs, lengths)
        for kind, mask in piece_kind_masks(pieces, probs.shape[-1]).items():
            by_kind[kind].update(probs, lengths, mask)
        for row, i in enumerate(chunk):
            words = frequency_words(texts[i], lowercase)
            piece_to_word = align_pieces(words, pieces[row])
            wa = word_attention(probs[:, row, :, :lengths[row], :lengths[row]], piece_to_word, len(words))
            total_words += len(words)
            unplaced += int((~aligned_words(wa)).sum())
            rare.update(wa, words, np.bincount(piece_to_word[piece_to_word >= 0], minlength=len(words)))
    log(f"positional and rare-token statistics: {len(keep)} of {len(texts)} sentences ({no_room} longer than "
        f"the model's positions), {unplaced} of {total_words} words without pieces, {rare.n_sentences} "
        f"eligible for rare tokens")
    if rare.n_uniform:
        log(f"rare tokens: a head attending uniformly over subwords would point to one of the two rarest "
            f"words in {rare.uniform_two_rarest / rare.n_uniform:.0%} of the eligible sentences")
    return {"positional": with_piece_kinds(positional.table(), by_kind), "rare": rare.table()}


@torch.no_grad()
def syntactic_statistics(model, segmenter, table: pd.DataFrame, lowercase: bool, batch_size: int = 32,
                         device: str | torch.device = "cpu", max_pieces: int | None = None,
                         log=print) -> dict[str, pd.DataFrame]:
    """Syntactic encoder-head statistics of parsed sentences (a headcount.parses table):
    {"syntactic", "table1"} DataFrames.

    Each sentence's `text` (lowercased when the model's data are) is segmented and encoded; the
    words are the table's surface tokens. Sentences of more than `max_pieces` subwords (e.g. the
    longest training sentence, for treebank text) or longer than the model's max_len are left out
    and counted in the log.
    """
    model.eval().to(device)
    sentences = [s for _, s in table.groupby("sentence", sort=True)]
    texts = [s["text"].iloc[0] for s in sentences]
    texts = [t.lower() if lowercase else t for t in texts]
    keep, too_long, no_room = _fitting(segmenter, texts, model, max_pieces)
    syntactic = SyntacticStats()
    unplaced = total_words = 0
    for chunk, probs, lengths in _encoder_attention(model, segmenter, texts, keep, batch_size, device):
        for row, i in enumerate(chunk):
            words = sentence_tokens(sentences[i])
            piece_to_word = align_pieces(words, segmenter.pieces(texts[i]))
            wa = word_attention(probs[:, row, :, :lengths[row], :lengths[row]], piece_to_word, len(words))
            total_words += len(words)
            unplaced += int((~aligned_words(wa)).sum())
            syntactic.update(wa, relation_pairs(sentences[i]))
    limit = f"{too_long} longer than {max_pieces} subwords, " if max_pieces is not None else ""
    log(f"syntactic statistics: {len(keep)} of {len(sentences)} parsed sentences ({limit}{no_room} longer than "
        f"the model's positions left out), {unplaced} of {total_words} words without pieces")
    syn = syntactic.table()
    return {"syntactic": syn, "table1": syntactic_table(syn)}


def encoder_head_statistics(model, segmenter, table: pd.DataFrame, frequencies: Counter, lowercase: bool,
                            batch_size: int = 32, device: str | torch.device = "cpu", top_k: int = 500,
                            texts: Sequence[str] | None = None, max_pieces: int | None = None,
                            log=print) -> dict[str, pd.DataFrame]:
    """All encoder self-attention head statistics: {"positional", "rare"} from `text_statistics`
    on `texts` (default: the parse table's sentences), {"syntactic", "table1"} from
    `syntactic_statistics` on `table` (sentences over `max_pieces` subwords left out)."""
    if texts is None:
        texts = table.groupby("sentence", sort=True)["text"].first().tolist()
    stats = text_statistics(model, segmenter, texts, frequencies, lowercase, batch_size, device, top_k, log)
    return {**stats, **syntactic_statistics(model, segmenter, table, lowercase, batch_size, device, max_pieces,
                                            log)}


def longest_sentence(segmenter, lines: Iterable[str], lowercase: bool) -> int:
    """The number of subwords of the longest line (the training maximum for treebank text)."""
    lines = [line.lower() if lowercase else line for line in lines]
    return max((len(x) for x in segmenter.encode(lines)), default=0)
