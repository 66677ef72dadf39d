"""The head atlas's attention on real sentences: what each head does on a few analysis sentences
the researcher chose and on the sentences where it best shows its role, over the real subwords.

A stored example is a window of the map: its first WINDOW (128) tokens on each axis, so that a page
of documents (2,048 tokens) stays the size of one of sentences; the statistics that choose the
examples read the whole text.

The model is run through the seq2seq interface (`forward(src, tgt_in, need_weights=True)`, which
headcount's own Transformer and the HuggingFace adapters implement) on the experiment's analysis
sentences, the reference translation teacher-forced: every attention type the model has comes
back, and a type it lacks is simply absent. Only a bounded number of sentences is stored per head:
the chosen ones (`chosen`, line numbers of the analysis set) and `best` more of its own.

"Best shows its role", per head (one sentence-level score, the largest first):

    positional (and encoder heads with no role)  the share of the sentence's queries whose argmax
                key is at the head's most frequent offset (positional.csv), among the queries for
                which that offset is a valid key (at least MIN_QUERIES of them)
    syntactic   on the parsed sentences (the parse table the roles came from; as many as the
                analysis set has, since a treebank can be long): the number of instances of
                the head's best relation and direction (roles.csv) whose argmax word is the
                related word, then the share of them
    rare tokens on the eligible analysis sentences (roles.RareStats): pointing at the rarest word,
                then at one of the two rarest
    decoder self-attention  as positional, at its own most frequent offset
    other types (decoder-encoder)  the sentence's mean over queries of the head's largest weight

The offset histograms are roles.PositionalStats over the same sentences (encoder: the analysis
sentences that fit the model, as in head_roles, so the encoder bars equal positional.csv); the
syntactic and rare-token statistics reuse roles.py's own counters sentence by sentence.

A matrix is stored as bytes (round(255 p)), base64: rows are queries, columns keys, of the
tokens `TYPE_AXES` names (source: pieces + EOS; target: BOS + pieces).

Language models (models.seq2seq.kind_of: decoder_only, encoder_only) have one attention type, the
one their roles are found for (registry.ROLE_ATTENTION): a decoder-only model's causal "dec_self"
over BOS + pieces (`model(src_empty, tgt_in)`, shown as the target side, BOS first) and an
encoder-only model's "enc_self" over [CLS] + pieces + [SEP] (`model.encode`, the source side). The
statistics that choose the sentences are taken in the role analysis's own layout (roles.collect:
pieces, then one sink slot), so the histograms equal positional.csv as the encoder's do; the stored
matrices are the model's own, its leading BOS / [CLS] included (marks shifted past it). There is no
target text and no decoder-encoder attention: `targets` is not read.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ...analysis.roles.alignment import align_pieces, sentence_tokens, word_attention
from ...analysis.roles.collect import _bos_last, _cls_into_sep, _role_batches, _sink_positions, is_causal
from ...analysis.roles.registry import ROLE_ATTENTION
from ...analysis.roles.statistics import (
    DIRECTION_NAMES,
    PositionalStats,
    RareStats,
    SyntacticStats,
    frequency_words,
    relation_pairs,
)
from ...data.batching import pad, source_tensor, target_tensors
from ...data.special import positions
from ...models.seq2seq import kind_of
from .data import ROLE_TYPE, head_key

# Which tokens a type's queries (rows) and keys (columns) are; a type not named here has no examples.
TYPE_AXES = {"enc_self": ("src", "src"), "dec_self": ("tgt", "tgt"), "dec_enc": ("tgt", "src")}
# Offsets kept in the histograms and the per-sentence shares: -RADIUS..RADIUS.
RADIUS = 8
MIN_QUERIES = 3  # a sentence shows an offset only with at least this many queries where it is valid
EOS_PIECE, BOS_PIECE = "</s>", "<s>"
CLS_PIECE, SEP_PIECE = "[CLS]", "[SEP]"  # an encoder-only model's, where its tokenizer names none
# The tokens of a stored example, on each axis: a document's first WINDOW (its rows and columns),
# so that a page of 2,048-token documents stays the size of one of sentences (a full map would be
# 4 MB per example and head); the label says how many tokens the text has.
WINDOW = 128
# A language model's statistics are taken in the role layout (pieces + sink, both axes "source").
ROLE_LAYOUT = ("src", "src")


def encode_matrix(probs: np.ndarray) -> str:
    """(rows, columns) probabilities -> base64 of round(255 p) bytes, row-major."""
    return base64.b64encode(np.clip(np.rint(np.asarray(probs) * 255), 0, 255).astype(np.uint8).tobytes()).decode()


def decode_matrix(text: str, rows: int, columns: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.uint8).reshape(rows, columns) / 255.0


def _window(counts: np.ndarray, radius: int) -> np.ndarray:
    """(..., 2R + 1) centred counts -> (..., 2 RADIUS + 1), zero-padded or cut."""
    out = np.zeros((*counts.shape[:-1], 2 * RADIUS + 1), dtype=counts.dtype)
    r = min(radius, RADIUS)
    out[..., RADIUS - r:RADIUS + r + 1] = counts[..., radius - r:radius + r + 1]
    return out


class _SentenceOffsets:
    """Per sentence, per head: how many queries point at each offset -RADIUS..RADIUS, and for how
    many queries that offset is a valid key (PositionalStats, one sentence at a time)."""

    def __init__(self):
        self.counts: dict[int, np.ndarray] = {}  # sentence -> (L, H, 2 RADIUS + 1)
        self.valid: dict[int, np.ndarray] = {}  # sentence -> (2 RADIUS + 1,)

    def update(self, sentence: int, probs: torch.Tensor, length: int, exclude_last: bool) -> None:
        stats = PositionalStats(exclude_last=exclude_last)
        stats.update(probs, [length])
        self.counts[sentence] = _window(stats.counts, stats.radius)
        self.valid[sentence] = _window(stats.valid, stats.radius)

    def share(self, sentence: int, offset: int) -> tuple[np.ndarray, int]:
        """(L, H) share of the sentence's queries at `offset` among those where it is valid, and that number."""
        if abs(offset) > RADIUS:
            return np.zeros(self.counts[sentence].shape[:2]), 0
        valid = int(self.valid[sentence][offset + RADIUS])
        return self.counts[sentence][..., offset + RADIUS] / max(valid, 1), valid


def _tensors(model, src_ids: Sequence[list[int]], tgt_ids: Sequence[list[int]] | None):
    special = model.special
    src = source_tensor(list(src_ids), special)
    if tgt_ids is None:
        return src, None
    tgt_in, _ = target_tensors(list(tgt_ids), special)
    return src, tgt_in


@torch.no_grad()
def _attention(model, src_ids, tgt_ids, batch_size: int, device):
    """Yields (batch indices, {type: (L, B, H, Tq, Tk) tensor}, source lengths incl. EOS, decoder
    lengths incl. BOS or None) for every sentence once, in batches of similar length (little
    padding); encoder only if `tgt_ids` is None."""
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i]) if tgt_ids else 0))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        src, tgt_in = _tensors(model, [src_ids[i] for i in rows], None if tgt_ids is None else
                               [tgt_ids[i] for i in rows])
        src = src.to(device)
        src_len = src.ne(model.special.pad).sum(dim=1).tolist()
        if tgt_in is None:
            _, _, probs = model.encode(src, need_weights=True)
            yield rows, {ROLE_TYPE: torch.stack(probs).float().cpu()}, src_len, None
            continue
        tgt_in = tgt_in.to(device)
        _, attention = model(src, tgt_in, need_weights=True)
        tgt_len = model.special.decoder_positions(tgt_in).sum(dim=1).tolist()
        yield rows, {t: torch.stack(p).float().cpu() for t, p in attention.items() if p}, src_len, tgt_len


@torch.no_grad()
def _lm_attention(model, ids: Sequence[list[int]], batch_size: int, device, role_layout: bool):
    """A language model's role-type attention, in `_attention`'s form: yields (batch indices,
    {role type: (L, B, H, T, T)}, source lengths, decoder lengths). role_layout: the maps over
    pieces + sink (roles.collect), lengths n + 1 on the source side; else the model's own maps,
    decoder-only over BOS + pieces (decoder lengths n + 1), encoder-only over [CLS] + pieces + [SEP]
    (source lengths n + 2)."""
    kind, special = kind_of(model).layout, model.special
    role_type = ROLE_ATTENTION[kind]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    for start, stop in _role_batches([len(ids[i]) for i in order], batch_size):  # documents one by one
        rows = order[start:stop]
        pieces = [ids[i] for i in rows]
        n_pieces = [len(x) for x in pieces]
        if kind == "decoder_only":
            tgt_in = pad([[special.bos, *x] for x in pieces], special.pad).to(device)
            _, attention = model(torch.zeros(len(rows), 0, dtype=torch.long, device=device), tgt_in,
                                 need_weights=True)
            probs = torch.stack(attention[role_type]).float().cpu()
            if role_layout:
                yield rows, {role_type: _bos_last(probs, n_pieces)}, [n + 1 for n in n_pieces], None
            else:
                yield rows, {role_type: probs}, None, [n + 1 for n in n_pieces]
        else:
            src = pad([[special.bos, *x, special.eos] for x in pieces], special.pad).to(device)
            _, _, probs = model.encode(src, need_weights=True)
            probs = torch.stack(probs).float().cpu()
            if role_layout:
                yield rows, {role_type: _cls_into_sep(probs, n_pieces)}, [n + 1 for n in n_pieces], None
            else:
                yield rows, {role_type: probs}, [n + 2 for n in n_pieces], None


def _special_piece(tokenizer, token_id: int, default: str) -> str:
    """How the tokenizer spells a special token (an LM tokenizer's own, e.g. <|endoftext|>), else `default`."""
    try:
        piece = tokenizer.tokenizer.convert_ids_to_tokens(int(token_id))
    except Exception:  # headcount's own segmenters name no special tokens
        return default
    return piece if isinstance(piece, str) and piece else default


def _lengths_for(kind: str, src_len: int, tgt_len: int | None, axes: dict | None = None) -> tuple[int, int]:
    rows, columns = (axes or TYPE_AXES)[kind]
    return (src_len if rows == "src" else tgt_len), (src_len if columns == "src" else tgt_len)


class Examples:
    """The sentences stored in the page and each head's examples on them."""

    def __init__(self):
        self.sentences: list[dict] = []
        self.index: dict[tuple[str, int], int] = {}  # (origin, number) -> position in `sentences`
        self.by_head: dict[str, list[dict]] = {}

    def sentence(self, origin: str, number: int, label: str, src: list[str], tgt: list[str] | None) -> int:
        if (origin, number) not in self.index:
            self.index[(origin, number)] = len(self.sentences)
            self.sentences.append({"label": label, "src": src, "tgt": tgt})
        return self.index[(origin, number)]

    def add(self, key: str, sentence: int, why: str, note: str, matrix: np.ndarray, marks: dict | None,
            order: tuple):
        """One example of a head; `order` places it among the head's: the chosen sentences first, in
        the researcher's order, then the head's own, best first."""
        self.by_head.setdefault(key, []).append({"s": sentence, "why": why, "note": note, "rows": matrix.shape[0],
                                                 "cols": matrix.shape[1], "m": encode_matrix(matrix),
                                                 **({"marks": marks} if marks else {}), "order": order})

    def ordered(self) -> dict[str, list[dict]]:
        return {key: [{k: v for k, v in e.items() if k != "order"} for e in sorted(found, key=lambda e: e["order"])]
                for key, found in self.by_head.items()}


def _marks_in_window(marks: dict | None) -> dict | None:
    """An example's marks within the stored window (a rare word's pieces past it are dropped)."""
    if not marks or "rare" not in marks:
        return marks
    inside = [p for p in marks["rare"] if p < WINDOW]
    return {**marks, "rare": inside} if inside else {k: v for k, v in marks.items() if k != "rare"} or None


def _pieces_of_word(piece_to_word: np.ndarray, word: int) -> list[int]:
    return np.flatnonzero(piece_to_word == word).tolist()


@torch.no_grad()
def gather_examples(model, src_tokenizer, tgt_tokenizer, sources: Sequence[str], targets: Sequence[str],
                    roles: dict[str, dict], chosen: Sequence[int] = (0, 1, 2), best: int = 2,
                    parses: pd.DataFrame | None = None, frequencies=None, role_settings: dict | None = None,
                    lowercase: bool = False, batch_size: int = 16, device="cpu", log=print) -> dict:
    """Attention examples and offset histograms for every head of `model`.

    sources, targets: the analysis set's lines (already cut to its size); roles: {head key: role
    record} (data.role_records); chosen: line numbers shown for every head; best: sentences per
    head where it best shows its role; parses: the parse table (syntactic examples); frequencies:
    roles.count_words of the training source (rare-token examples). Returns {"sentences",
    "examples" {head key: [example]}, "histograms" {type: {"offsets", "share" {head key: [...]}}},
    "axes"}.
    """
    settings = role_settings or {}
    model = model.eval().to(device)
    limit = model.max_positions
    model_kind = kind_of(model).layout
    role_type = ROLE_ATTENTION[model_kind]
    lm = model_kind != "encoder_decoder"
    texts_src = [s.lower() if lowercase else s for s in sources]
    src_ids = src_tokenizer.encode(list(texts_src))
    if lm:  # one text: no target side (module docstring)
        texts_tgt, tgt_ids = None, None
        keep = [i for i, ids in enumerate(src_ids) if len(ids) + _sink_positions(model) <= limit]
    else:
        texts_tgt = [t.lower() if lowercase else t for t in targets]
        tgt_ids = [ids[:limit - 1] for ids in tgt_tokenizer.encode(list(texts_tgt))]  # BOS + pieces fit
        keep = [i for i, ids in enumerate(src_ids) if positions(len(ids)) <= limit]  # as head_roles keeps them
    # The axes of pass 1's maps (a language model's: the role layout) and the leading tokens a
    # stored matrix has before the pieces (a language model's BOS or [CLS]).
    stat_axes = {role_type: ROLE_LAYOUT} if lm else TYPE_AXES
    lead = 1 if lm else 0

    def batches(lines, role_layout):
        if lm:
            return _lm_attention(model, [src_ids[i] for i in lines], batch_size, device, role_layout)
        return _attention(model, [src_ids[i] for i in lines], [tgt_ids[i] for i in lines], batch_size, device)

    log(f"atlas: {len(keep)} of {len(sources)} analysis sentences fit the model's {limit} positions")
    src_pieces = {i: src_tokenizer.pieces(texts_src[i]) for i in keep}

    # Pass 1: the statistics that choose each head's sentences.
    pooled: dict[str, PositionalStats] = {}
    offsets: dict[str, _SentenceOffsets] = {}
    confidence: dict[str, dict[int, np.ndarray]] = {}
    rare_stats = RareStats(frequencies, settings.get("top_k", 500), lowercase) if frequencies is not None else None
    rare_hits: dict[int, tuple[np.ndarray, list[int]]] = {}  # sentence -> ((L, H) 1 rarest / 0.5 two, rarest pieces)
    types: dict[str, tuple[int, int]] = {}
    for rows, attention, src_len, tgt_len in batches(keep, True):
        for kind, probs in attention.items():
            types[kind] = (probs.shape[0], probs.shape[2])
            if kind not in stat_axes:
                continue
            positional = stat_axes[kind][0] == stat_axes[kind][1]
            for b, row in enumerate(rows):
                i = keep[row]
                n_rows, n_cols = _lengths_for(kind, src_len[b], None if tgt_len is None else tgt_len[b], stat_axes)
                p = probs[:, b:b + 1, :, :n_rows, :n_cols]
                if positional:
                    exclude_last = stat_axes[kind][0] == "src"  # the source's last token is EOS (or the sink)
                    pooled.setdefault(kind, PositionalStats(exclude_last=exclude_last)).update(p, [n_rows])
                    offsets.setdefault(kind, _SentenceOffsets()).update(i, p, n_rows, exclude_last)
                # mean over queries of the largest weight (EOS key left out on the source side)
                keys = n_cols - 1 if stat_axes[kind][1] == "src" else n_cols
                confidence.setdefault(kind, {})[i] = p[:, 0, :, :, :keys].amax(dim=-1).mean(dim=-1).numpy()
            if kind == role_type and rare_stats is not None:
                for b, row in enumerate(rows):
                    i = keep[row]
                    words = frequency_words(texts_src[i], lowercase)
                    piece_to_word = align_pieces(words, src_pieces[i])
                    n = src_len[b]
                    wa = word_attention(probs[:, b, :, :n, :n], piece_to_word, len(words))
                    before = rare_stats.rarest.copy() if rare_stats.rarest is not None else 0
                    before_two = rare_stats.two_rarest.copy() if rare_stats.two_rarest is not None else 0
                    counts = np.bincount(piece_to_word[piece_to_word >= 0], minlength=len(words))
                    if rare_stats.update(wa, words, counts):
                        hits = (rare_stats.rarest - before) + 0.5 * (rare_stats.two_rarest - before_two)
                        freq = [rare_stats.frequency(words[w]) if counts[w] else np.inf for w in range(len(words))]
                        rare_hits[i] = (hits / 1.5, _pieces_of_word(piece_to_word, int(np.argmin(freq))))

    histograms = {}
    for kind, stats in pooled.items():
        shares = stats.shares() if settings.get("positional_share", "valid") != "all" else (
            stats.counts / max(stats.n_queries, 1))
        window = _window(shares, stats.radius)
        L, H = window.shape[:2]
        histograms[kind] = {"offsets": list(range(-RADIUS, RADIUS + 1)),
                            "rule": "all queries" if settings.get("positional_share") == "all" else
                            "queries where the offset is a valid key",
                            "share": {head_key(kind, layer, head): window[layer, head]
                                      for layer in range(L) for head in range(H)}}

    # Each head's choice of sentences.
    examples = Examples()
    wanted: dict[int, list[tuple[str, str, str, dict | None]]] = {}  # analysis line -> (key, why, note, marks)
    chosen = [i for i in chosen if i in src_pieces]
    for kind, (L, H) in types.items():
        if kind not in TYPE_AXES:
            log(f"atlas: no attention examples for {kind} (its tokens are not known to the atlas)")
            continue
        for layer in range(L):
            for head in range(H):
                key = head_key(kind, layer, head)
                for position, i in enumerate(chosen):
                    wanted.setdefault(i, []).append((key, "chosen", f"analysis line {i + 1}", None, (0, position)))
                if best <= 0:
                    continue
                record = roles.get(key, {})
                role = record.get("role")
                if role == "syntactic" and parses is not None:
                    continue  # below, on the parsed sentences
                if role == "rare" and rare_hits:
                    ranked = sorted(rare_hits, key=lambda i: (-rare_hits[i][0][layer, head], i))[:best]
                    for rank, i in enumerate(ranked):
                        hit = rare_hits[i][0][layer, head]
                        note = ("points to the rarest word" if hit == 1 else "points to one of the two rarest"
                                if hit > 0 else "misses the rarest words")
                        wanted.setdefault(i, []).append(
                            (key, "role", note, {"rare": [p + lead for p in rare_hits[i][1]]}, (1, rank)))
                    continue
                offset = None
                if kind in offsets:
                    if kind == role_type and record.get("positional", {}).get("offset") is not None:
                        offset = int(record["positional"]["offset"])
                    else:
                        offset = int(np.argmax(histograms[kind]["share"][key])) - RADIUS
                if offset is not None and abs(offset) <= RADIUS:
                    scored = []
                    for i in offsets[kind].counts:
                        share, valid = offsets[kind].share(i, offset)
                        if valid >= MIN_QUERIES:
                            scored.append((-share[layer, head], -valid, i))
                    for rank, (share, valid, i) in enumerate(sorted(scored)[:best]):
                        wanted.setdefault(i, []).append(
                            (key, "role", f"{-share:.0%} of {-valid} queries attend at offset {offset:+d}",
                             {"offset": offset}, (1, rank)))
                else:
                    ranked = sorted(confidence[kind], key=lambda i: (-confidence[kind][i][layer, head], i))[:best]
                    for rank, i in enumerate(ranked):
                        wanted.setdefault(i, []).append(
                            (key, "role", f"mean largest weight {confidence[kind][i][layer, head]:.2f}", None,
                             (1, rank)))

    # Pass 2: the matrices of the chosen and best analysis sentences.
    lines = sorted(wanted)
    for rows, attention, src_len, tgt_len in batches(lines, False):
        for b, row in enumerate(rows):
            i = lines[row]
            if lm:
                src, tgt = _lm_tokens(model, src_tokenizer, src_pieces[i])
            else:
                tgt = [BOS_PIECE] + tgt_tokenizer.pieces(texts_tgt[i])[:len(tgt_ids[i])]  # one piece per id
                src = src_pieces[i] + [EOS_PIECE]
            longest = max(len(src or []), len(tgt or []))
            label = f"analysis line {i + 1}"
            if longest > WINDOW:
                label += f" (its first {WINDOW} of {longest} tokens)"
            s = examples.sentence("analysis", i, label, None if src is None else src[:WINDOW],
                                  None if tgt is None else tgt[:WINDOW])
            for key, why, note, marks, order in wanted[i]:
                kind, layer, head = key.split("/")
                n_rows, n_cols = _lengths_for(kind, None if src_len is None else src_len[b],
                                              None if tgt_len is None else tgt_len[b])
                matrix = attention[kind][int(layer), b, int(head), :min(n_rows, WINDOW), :min(n_cols, WINDOW)].numpy()
                examples.add(key, s, why, note, matrix, _marks_in_window(marks), order)

    if best > 0 and parses is not None and len(parses):
        _syntactic_examples(model, src_tokenizer, parses, roles, best, lowercase, batch_size, device, examples,
                            max(len(sources), 1), log, role_type)
    stored = sum(len(v) for v in examples.by_head.values())
    log(f"atlas: {len(examples.sentences)} sentences and {stored} attention examples stored for "
        f"{len(examples.by_head)} heads")
    return {"sentences": examples.sentences, "examples": examples.ordered(), "histograms": histograms,
            "axes": {k: list(v) for k, v in TYPE_AXES.items() if k in types}}


def _lm_tokens(model, tokenizer, pieces: list[str]) -> tuple[list[str] | None, list[str] | None]:
    """A language model's sentence as the page's (source, target) tokens: decoder-only BOS + pieces
    on the target side, encoder-only [CLS] + pieces + [SEP] on the source side."""
    special = model.special
    if kind_of(model).layout == "decoder_only":
        return None, [_special_piece(tokenizer, special.bos, BOS_PIECE)] + pieces
    return [_special_piece(tokenizer, special.bos, CLS_PIECE)] + pieces + [
        _special_piece(tokenizer, special.eos, SEP_PIECE)], None


def _syntactic_examples(model, src_tokenizer, parses: pd.DataFrame, roles: dict, best: int, lowercase: bool,
                        batch_size: int, device, examples: Examples, max_parsed: int, log,
                        role_type: str = ROLE_TYPE) -> None:
    """The parsed sentences (the first `max_parsed` that fit the model) where each syntactic head
    most often points from a word to the word its best relation and direction relates it to; the
    arcs are marked (first pieces). A language model's statistics are taken in the role layout and
    its own maps stored (module docstring)."""
    heads = {key: (r["syntactic_best"]["relation"], r["syntactic_best"]["direction"])
             for key, r in roles.items() if r.get("role") == "syntactic" and r.get("syntactic_best")}
    if not heads:
        return
    sentences = [s for _, s in parses.groupby("sentence", sort=True)]
    texts = [s["text"].iloc[0] for s in sentences]
    texts = [t.lower() if lowercase else t for t in texts]
    ids = src_tokenizer.encode(texts)
    lm = kind_of(model).layout != "encoder_decoder"
    lead = 1 if lm else 0
    sinks = _sink_positions(model) if lm else None
    keep = [i for i, x in enumerate(ids) if (len(x) + sinks if lm else positions(len(x))) <= model.max_positions]
    keep = keep[:max_parsed]

    def batches(lines, role_layout):
        if lm:
            return _lm_attention(model, [ids[i] for i in lines], batch_size, device, role_layout)
        return _attention(model, [ids[i] for i in lines], None, batch_size, device)

    scores: dict[str, list[tuple[float, float, int]]] = {key: [] for key in heads}
    arcs: dict[tuple[int, str, str], list[tuple[int, int]]] = {}
    pieces_of: dict[int, tuple[list[str], np.ndarray]] = {}
    for rows, attention, src_len, _ in batches(keep, True):
        probs = attention[role_type]
        for b, row in enumerate(rows):
            i = keep[row]
            words = sentence_tokens(sentences[i])
            pieces = src_tokenizer.pieces(texts[i])
            piece_to_word = align_pieces(words, pieces)
            pieces_of[i] = (pieces, piece_to_word)
            n = src_len[b]
            wa = word_attention(probs[:, b, :, :n, :n], piece_to_word, len(words))
            pairs = relation_pairs(sentences[i])
            stats = SyntacticStats(causal=is_causal(model))
            stats.update(wa, pairs)
            for key, (relation, direction) in heads.items():
                n_instances = stats.n[(relation, direction)]
                if n_instances:
                    layer, head = map(int, key.split("/")[1:])
                    correct = int(stats.correct[(relation, direction)][layer, head])
                    scores[key].append((-correct, -correct / n_instances, i))
            for rel, direction, q, t in pairs:
                arcs.setdefault((i, rel, direction), []).append((q, t))
    picked: dict[int, list[tuple[str, str, int]]] = {}
    for key, ranked in scores.items():
        for rank, (correct, share, i) in enumerate(sorted(ranked)[:best]):
            picked.setdefault(i, []).append((key, f"{-correct} of the {heads[key][0]} {DIRECTION_NAMES[heads[key]]} "
                                                  f"instances ({-share:.0%}) point at the related word", rank))
    lines = sorted(picked)
    for rows, attention, src_len, tgt_len in batches(lines, False):
        for b, row in enumerate(rows):
            i = lines[row]
            pieces, piece_to_word = pieces_of[i]
            sent_id = sentences[i]["sent_id"].iloc[0] if "sent_id" in sentences[i] else None
            label = f"parsed sentence {i + 1}" + (f" ({sent_id})" if sent_id else "")
            src, tgt = _lm_tokens(model, src_tokenizer, pieces) if lm else (pieces + [EOS_PIECE], None)
            n = src_len[b] if src_len is not None else tgt_len[b]
            if n > WINDOW:
                label += f" (its first {WINDOW} of {n} tokens)"
            s = examples.sentence("parsed", i, label, None if src is None else src[:WINDOW],
                                  None if tgt is None else tgt[:WINDOW])
            for key, note, rank in picked[i]:
                layer, head = map(int, key.split("/")[1:])
                relation, direction = heads[key]
                marks = []
                for q, t in arcs.get((i, relation, direction), []):
                    qp, tp = _pieces_of_word(piece_to_word, q), _pieces_of_word(piece_to_word, t)
                    if qp and tp:
                        if max(qp[0], tp[0]) + lead < WINDOW:
                            marks.append([qp[0] + lead, tp[0] + lead])
                w = min(n, WINDOW)
                examples.add(key, s, "role", note, attention[role_type][layer, b, head, :w, :w].numpy(),
                             {"arcs": marks}, (1, rank))
    log(f"atlas: syntactic examples for {len(heads)} heads from {len(keep)} parsed sentences")
