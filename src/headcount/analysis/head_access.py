"""Per-head access on any model headcount supports: read every head's attention pattern and output
(its context before W^O), and ablate (zero or mean), scale or patch any set of heads, across layers
and attention types, while measuring the loss or any metric, with paired bootstrap intervals
between head sets. headcount.api.heads opens it on a transformers model (docs/api.md).

One path with the workflow's single-head ablation: a head set is an importance.HeadEdit, and
`HeadAccess.measure` scores every set on copies of each batch in one forward pass through
importance.edited_scores, the function under importance.head_ablation (copies sharing the layers
below their lowest edited head, models.shared_prefix; edits through gates.row_head_edits at each
attention's head_context hook). So what is checked of one (tests/test_batched_ablation.py,
tests/test_shared_prefix.py, against transformers' own forward in tests/test_hf_models.py) holds
for the other.

Head names say their base. A head is named the way the published tables print it, "layer.head"
counted from 1 ("19.7": layer 18, head 6 of the tensors), with its attention type in front where
a model has several ("dec_enc:3.2"); a tuple (layer, head) or (type, layer, head) counts from 0,
as the tables' `layer` and `head` columns and the model's tensors do. Every table here has both:
`layer` and `head` from 0 and `name` from 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headcount.analysis.importance import HEADS_PER_PASS, HeadEdit, HeadKey, Metric, edited_scores, row_edits
from headcount.data.batching import check_lengths, make_batches, objective_tensors
from headcount.data.special import SpecialIds
from headcount.io import HeadcountError
from headcount.models.attention_stream import stream_attention
from headcount.models.seq2seq import kind_of
from headcount.training.perplexity import paired_bootstrap_nll

HOWS = ("zero", "mean", "scale", "patch")  # what an Intervention does to its heads' contexts


class ArgumentError(HeadcountError, ValueError):
    """A bad argument to an API function (headcount.api, and the per-head API here): the message
    names the argument and the fix."""


# --------------------------------------------------------------------------------------------
# Names


def head_name(key: HeadKey, several_types: bool = False) -> str:
    """A head's name as the published tables print it (report.head_label): "layer.head", both
    counted from 1, with "type:" in front where the model has several attention types."""
    kind, layer, head = key
    return f"{kind + ':' if several_types else ''}{int(layer) + 1}.{int(head) + 1}"


_NAME = re.compile(r"^(?:(\w+):)?(\d+)\.(\d+)$")


class HeadNames:
    """The heads of one model, and the names and keys that pick them."""

    def __init__(self, model):
        self.widths = {kind: [m.n_heads for m in modules] for kind, modules in model.attention_modules().items()}
        self.types = list(self.widths)

    @property
    def several_types(self) -> bool:
        return len(self.types) > 1

    def name(self, key: HeadKey) -> str:
        return head_name(key, self.several_types)

    def key(self, spec, argument: str = "heads") -> HeadKey:
        """One head from a name ("19.7", "dec_enc:3.2": counted from 1) or a tuple ((18, 6),
        ("dec_self", 18, 6): counted from 0) -> (type, layer, head) counted from 0."""
        if isinstance(spec, str):
            found = _NAME.match(spec.strip())
            if not found:
                raise ArgumentError(f"{argument}: {spec!r} is not a head name; name a head \"layer.head\" counted "
                                      f"from 1 (\"19.7\"), or give (layer, head) counted from 0")
            kind, layer, head = found.group(1), int(found.group(2)) - 1, int(found.group(3)) - 1
            if layer < 0 or head < 0:
                raise ArgumentError(f"{argument}: {spec!r}: names count layers and heads from 1; "
                                      f"(layer, head) tuples count from 0")
        elif isinstance(spec, (tuple, list)) and len(spec) in (2, 3) and all(
                isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in spec[-2:]):
            kind, layer, head = (None, *spec) if len(spec) == 2 else spec
            layer, head = int(layer), int(head)
        else:
            raise ArgumentError(f"{argument}: {spec!r} is not a head; give \"layer.head\" counted from 1 or "
                                  f"(layer, head) counted from 0")
        if kind is None:
            if self.several_types:
                first = self.types[0]
                raise ArgumentError(f"{argument}: {spec!r}: this model has attention types {self.types}; say which, "
                                    f"\"{first}:{layer + 1}.{head + 1}\" or ({first!r}, {layer}, {head})")
            kind = self.types[0]
        if kind not in self.widths:
            raise ArgumentError(f"{argument}: {spec!r}: no attention type {kind!r}; this model has {self.types}")
        layers = self.widths[kind]
        if not 0 <= layer < len(layers) or not 0 <= head < layers[layer]:
            raise ArgumentError(f"{argument}: {spec!r} is not a head of this model: {kind} has layers "
                                  f"1-{len(layers)} with {max(layers)} heads each (names count from 1, tuples from 0)")
        return kind, layer, head

    def keys(self, specs, argument: str = "heads") -> list[HeadKey]:
        """Several heads (a list of names or tuples); a single name or tuple is refused as such."""
        one_tuple = isinstance(specs, tuple) and specs and not isinstance(specs[0], (tuple, list, str))
        if isinstance(specs, str) or one_tuple:
            raise ArgumentError(f"{argument}: {specs!r} is one head, not a list of heads; write [{specs!r}]")
        if not isinstance(specs, Iterable):
            raise ArgumentError(f"{argument}: a list of heads, not {type(specs).__name__}")
        keys = [self.key(spec, argument) for spec in specs]
        if len(set(keys)) != len(keys):
            raise ArgumentError(f"{argument}: a head is named twice in {list(specs)!r}")
        return keys

    def layer_keys(self, layers, argument: str = "layers") -> list[HeadKey]:
        """Every head of the given layers, counted from 0 (a model with several types: (type, layer))."""
        if isinstance(layers, (str, int)) or not isinstance(layers, Iterable):
            raise ArgumentError(f"{argument}: a list of layers (counted from 0), not {layers!r}")
        keys = []
        for spec in layers:
            kind, layer = (spec if isinstance(spec, (tuple, list)) else (None, spec))
            kind = kind or (self.types[0] if not self.several_types else None)
            if kind not in self.widths or isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not (
                    0 <= layer < len(self.widths[kind])):
                raise ArgumentError(f"{argument}: {spec!r} is not a layer of this model (layers count from 0; "
                                      f"types {self.types}{', give (type, layer)' if self.several_types else ''})")
            keys += [(kind, int(layer), h) for h in range(self.widths[kind][layer])]
        return keys

    def table(self) -> pd.DataFrame:
        """Every head: type, layer, head (from 0) and name (from 1)."""
        rows = [(kind, layer, head) for kind, layers in self.widths.items() for layer, n in enumerate(layers)
                for head in range(n)]
        return pd.DataFrame([{"type": k, "layer": la, "head": h, "name": self.name((k, la, h))} for k, la, h in rows])


def _text_list(texts, argument: str, allow_none: bool = False) -> list[str] | None:
    """A list of non-empty strings; a single string is refused as such."""
    if texts is None and allow_none:
        return None
    if isinstance(texts, str):
        raise ArgumentError(f"{argument}: one string, not a list of texts; write [{texts[:40]!r}...]")
    if not isinstance(texts, Sequence) or not texts:
        raise ArgumentError(f"{argument}: a non-empty list of texts, not {texts!r:.60}")
    if _is_ids(texts[0]):  # already token ids (repeated random tokens, say)
        bad = [i for i, t in enumerate(texts) if not _is_ids(t)]
        if not bad:
            return [[int(i) for i in t] for t in texts]
    else:
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ArgumentError(f"{argument}[{bad[0]}]: {texts[bad[0]]!r} is neither a non-empty string nor a list of "
                            f"token ids; give every text one way")
    return list(texts)


def _is_ids(text) -> bool:
    """Whether a text is given as token ids: a non-empty list, tuple or 1-d tensor of whole numbers."""
    sequence = isinstance(text, (list, tuple)) or (isinstance(text, Tensor) and text.dim() == 1)
    return sequence and len(text) > 0 and all(
        isinstance(i, (int, np.integer)) or (isinstance(i, Tensor) and i.dim() == 0) for i in text)


# --------------------------------------------------------------------------------------------
# Texts as batches that remember their texts


@dataclass
class TextBatches:
    """Texts encoded as the model's objective reads them, in batches (importance.dev_batches'
    batching), each with the indices of its texts."""

    batches: list[tuple[Tensor, Tensor, Tensor]]
    indices: list[list[int]]
    texts: list[str]
    targets: list[str] | None
    special: SpecialIds

    def real(self, kind: str, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """(B, T) True at the batch's real query positions of an attention type."""
        src, tgt_in = batch[:2]
        return src.ne(self.special.pad) if kind == "enc_self" else self.special.decoder_positions(tgt_in)

    def lengths(self, kind: str) -> list[int]:
        """Each text's query length for an attention type (its real positions), in text order."""
        out = [0] * len(self.texts)
        for batch, rows in zip(self.batches, self.indices):
            real = self.real(kind, batch).sum(dim=1)
            for row, i in enumerate(rows):
                out[i] = int(real[row])
        return out


def encode_texts(model, src_tokenizer, tgt_tokenizer, texts: list[str], targets: list[str] | None,
                 max_tokens: int, device) -> TextBatches:
    """`texts` (and an encoder-decoder's `targets`), strings or token-id lists (without the special
    tokens the objective adds), -> TextBatches on `device`: a text that does not fit the model is
    refused by its index (batching.check_lengths) before anything runs."""
    objective = kind_of(model).objective

    def encoded(tokenizer, lines):  # strings through the tokenizer; token ids as they are
        return [list(x) for x in lines] if lines and not isinstance(lines[0], str) else tokenizer.encode(lines)

    src = encoded(src_tokenizer, texts)
    tgt = encoded(tgt_tokenizer, targets if targets is not None else texts)
    if getattr(model, "max_positions", None) is not None:
        check_lengths(src, tgt, model.max_positions, objective)
    indices = make_batches([len(s) + 1 for s in src], [len(t) + 1 for t in tgt], max_tokens, seed=0)
    batches = [tuple(x.to(device) for x in objective_tensors(objective, [src[i] for i in rows],
                                                             [tgt[i] for i in rows], model.special))
               for rows in indices]
    return TextBatches(batches, indices, list(texts), None if targets is None else list(targets), model.special)


# --------------------------------------------------------------------------------------------
# The cache


@dataclass
class HeadCache:
    """Every cached head's attention pattern and output on a set of texts, per text, without
    padding: patterns[(type, layer)][text] (H, Tq, Tk), outputs[(type, layer)][text] (H, Tq, Dh)
    (the head's context before W^O, gates and edits applied), labels[type][text] the query and
    key tokens."""

    names: HeadNames
    texts: list[str]
    patterns: dict[tuple[str, int], list[Tensor]] = field(default_factory=dict)
    outputs: dict[tuple[str, int], list[Tensor]] = field(default_factory=dict)
    labels: dict[str, list[tuple[list[str], list[str]]]] = field(default_factory=dict)

    def _text(self, text: int) -> int:
        if isinstance(text, bool) or not isinstance(text, (int, np.integer)) or not 0 <= text < len(self.texts):
            raise ArgumentError(f"text: {text!r} is not a text of the cache; give 0-{len(self.texts) - 1}")
        return int(text)

    def _layer(self, store: dict, head, what: str) -> tuple[HeadKey, list[Tensor]]:
        key = self.names.key(head, "head")
        if (key[0], key[1]) not in store:
            raise ArgumentError(f"head: {head!r}: the cache holds no {what} of layer {key[1]} ({key[0]}); "
                                  f"cache it (cache(..., layers=[...]) or heads=[...])")
        return key, store[(key[0], key[1])]

    def pattern(self, head, text: int = 0) -> pd.DataFrame:
        """The head's attention on one text: rows the query tokens, columns the key tokens."""
        key, per_text = self._layer(self.patterns, head, "patterns")
        text = self._text(text)
        queries, keys = self.labels[key[0]][text]
        frame = pd.DataFrame(per_text[text][key[2]].numpy(), index=queries, columns=keys)
        frame.attrs["head"] = self.names.name(key)
        return frame

    def output(self, head, text: int = 0) -> Tensor:
        """The head's output on one text, (Tq, Dh): its context before W^O."""
        key, per_text = self._layer(self.outputs, head, "outputs")
        return per_text[self._text(text)][key[2]]

    def mean_output(self, head) -> Tensor:
        """The head's output averaged over every real query position of every text, (Dh,): what a
        mean ablation puts in its place."""
        key, per_text = self._layer(self.outputs, head, "outputs")
        stacked = torch.cat([t[key[2]] for t in per_text])  # (positions, Dh)
        return stacked.double().mean(dim=0).to(stacked.dtype)


# --------------------------------------------------------------------------------------------
# Interventions


@dataclass(frozen=True)
class Intervention:
    """What a head set does in a forward pass: `how` "zero" (the head's output is 0: the
    workflow's ablation), "mean" (its mean output over `source`, a HeadCache; default the texts
    measured), "scale" (times `factor`) or "patch" (its output on `source`'s texts, text by text:
    activation patching; the texts must have the same lengths)."""

    heads: tuple[HeadKey, ...]
    how: str = "zero"
    factor: float = 0.0
    source: HeadCache | None = None

    def __post_init__(self):
        if self.how not in HOWS:
            raise ArgumentError(f"how: {self.how!r}; choose from {', '.join(HOWS)}")
        if self.how == "patch" and self.source is None:
            raise ArgumentError("source: patching needs the cache of the input to patch from (HeadAccess.cache)")


def _edit(interventions: Sequence[Intervention], batches: TextBatches,
          mean_of: Callable[[HeadKey], Tensor]) -> HeadEdit:
    """One copy's HeadEdit from its interventions, for these batches."""
    edit = HeadEdit()
    for part in interventions:
        for key in part.heads:
            if key in edit.heads():
                raise ArgumentError(f"sets: head {key} gets two interventions in one set; give each head one")
            if part.how in ("zero", "scale"):
                edit.factors[key] = 0.0 if part.how == "zero" else float(part.factor)
            elif part.how == "mean":
                edit.values[key] = part.source.mean_output(key) if part.source is not None else mean_of(key)
            else:
                edit.values[key] = _patch_values(part.source, key, batches)
    return edit


def _patch_values(source: HeadCache, key: HeadKey, batches: TextBatches) -> Callable[[int], Tensor]:
    """A function of a batch's number -> the head's outputs on `source`'s texts of that batch's
    rows, (B, T, Dh), zero-padded to the batch's length."""
    kind, layer, head = key
    if (kind, layer) not in source.outputs:
        raise ArgumentError(f"source: the cache holds no outputs of layer {layer} ({kind}); cache that layer")
    outputs = source.outputs[(kind, layer)]
    if len(outputs) != len(batches.texts):
        raise ArgumentError(f"source: a cache of {len(outputs)} texts patches {len(batches.texts)} texts; patch "
                            f"text by text, from a cache of as many texts")
    lengths = batches.lengths(kind)
    for i, (out, n) in enumerate(zip(outputs, lengths)):
        if out.shape[1] != n:
            raise ArgumentError(f"source: its text {i} has {out.shape[1]} positions, the text patched {n}; "
                                  f"patching needs texts of the same lengths")

    def values(number: int) -> Tensor:
        batch = batches.batches[number]
        T = (batch[0] if kind == "enc_self" else batch[1]).shape[1]
        rows = [outputs[i][head] for i in batches.indices[number]]
        out = rows[0].new_zeros(len(rows), T, rows[0].shape[-1])
        for r, x in enumerate(rows):
            out[r, : x.shape[0]] = x
        return out

    return values


# --------------------------------------------------------------------------------------------
# Measurements


@dataclass
class Measurement:
    """A metric on the same texts under several head sets. `sums` (sets, texts) and `units`
    (texts,): each text's summed metric and what it is summed over (real target tokens for the
    loss and per-token metrics, 1 for a per-text metric); `tokens[set][text]`: per-token values
    where the metric is per token."""

    sets: list[str]
    heads: dict[str, list[str]]  # each set's head names
    sums: np.ndarray
    units: np.ndarray
    tokens: dict[str, list[np.ndarray]] | None = None
    baseline: str | None = None

    def _index(self, name: str) -> int:
        if name not in self.sets:
            raise ArgumentError(f"set: {name!r} is not one of the sets measured, {self.sets}")
        return self.sets.index(name)

    def values(self, name: str) -> np.ndarray:
        """The metric per text (its sum over the text's units divided by them), in text order."""
        return self.sums[self._index(name)] / np.maximum(self.units, 1)

    def value(self, name: str) -> float:
        """The metric over all texts: per token (summed over texts, divided by their units)."""
        return float(self.sums[self._index(name)].sum() / max(self.units.sum(), 1))

    def compare(self, a: str, b: str) -> dict:
        """value(a) - value(b) with its 95% paired-bootstrap interval over the texts (each resample
        draws texts, both sets' values of the same texts together): training.perplexity's
        paired_bootstrap_nll, the interval single-head ablation reports."""
        found = paired_bootstrap_nll(self.sums[self._index(a)], self.sums[self._index(b)], self.units)
        return {"difference": found["difference"], "low": found["low"], "high": found["high"],
                "p_value": found["p_value"], "samples": found["samples"]}

    @property
    def table(self) -> pd.DataFrame:
        """One row per set: its heads, its value, and its difference from the baseline set (the
        model as it is) with the paired interval."""
        rows = []
        for name in self.sets:
            row = {"set": name, "heads": len(self.heads[name]), "names": " ".join(self.heads[name]),
                   "value": self.value(name)}
            if self.baseline is not None:
                d = self.compare(name, self.baseline)
                row.update(difference=d["difference"], low=d["low"], high=d["high"])
            rows.append(row)
        return pd.DataFrame(rows)


BASELINE = "none"  # the set name measure gives the model as it is


class HeadAccess:
    """Per-head access to a headcount model (models.loading.adapt_model's, or load_model's) with
    its tokenizers, on one device."""

    def __init__(self, model, src_tokenizer, tgt_tokenizer, device, max_tokens: int = 2000):
        self.model, self.src_tokenizer, self.tgt_tokenizer = model, src_tokenizer, tgt_tokenizer
        self.device, self.max_tokens = device, max_tokens
        self.names = HeadNames(model)
        self.translation = kind_of(model).objective == "translation"

    # ---------------------------------------------------------------- heads and sets

    @property
    def heads(self) -> pd.DataFrame:
        """Every head of the model: type, layer, head (from 0), name (from 1)."""
        return self.names.table()

    def ablate(self, heads, how: str = "zero", source: HeadCache | None = None) -> Intervention:
        """Remove `heads` (names or tuples): "zero" their outputs, or put their "mean" output in their
        place (over `source`, default the texts measured)."""
        if how not in ("zero", "mean"):
            raise ArgumentError(f"how: {how!r}; ablate with \"zero\" or \"mean\" (scale and patch have their own)")
        return Intervention(tuple(self.names.keys(heads)), how, source=source)

    def scale(self, heads, factor: float) -> Intervention:
        """Multiply `heads`' outputs by `factor`."""
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise ArgumentError(f"factor: a number, not {factor!r}")
        return Intervention(tuple(self.names.keys(heads)), "scale", factor=float(factor))

    def patch(self, heads, source: HeadCache) -> Intervention:
        """Put `heads`' outputs on `source`'s texts (a cache of other texts of the same lengths)
        in place of their outputs on the texts measured."""
        if not isinstance(source, HeadCache):
            raise ArgumentError(f"source: a HeadCache (HeadAccess.cache), not {type(source).__name__}")
        return Intervention(tuple(self.names.keys(heads)), "patch", source=source)

    def matched_random(self, heads, draws: int = 20, seed: int = 0) -> dict[str, list[str]]:
        """`draws` random head sets matched to `heads` layer by layer (as many heads from each of
        their layers, none of `heads` themselves): the baseline a named set is tested against.
        -> {"random 1": [names], ...}, the same sets for the same seed."""
        keys = self.names.keys(heads)
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
            raise ArgumentError(f"draws: a positive whole number, not {draws!r}")
        per_layer: dict[tuple[str, int], int] = {}
        for kind, layer, _ in keys:
            per_layer[(kind, layer)] = per_layer.get((kind, layer), 0) + 1
        pools = {}
        for (kind, layer), n in per_layer.items():
            pools[(kind, layer)] = [h for h in range(self.names.widths[kind][layer]) if (kind, layer, h) not in keys]
            if len(pools[(kind, layer)]) < n:
                raise ArgumentError(f"heads: layer {layer} ({kind}) has {len(pools[(kind, layer)])} other heads, "
                                    f"fewer than the {n} named there; no matched set can be drawn")
        rng = np.random.default_rng(seed)
        return {f"random {i + 1}": [self.names.name((kind, layer, int(h))) for (kind, layer), n in per_layer.items()
                                    for h in sorted(rng.choice(pools[(kind, layer)], n, replace=False))]
                for i in range(draws)}

    def _interventions(self, spec, argument: str) -> list[Intervention]:
        """A head set as given: None or [] (nothing), an Intervention, a list of Interventions, or a
        list of heads (zero ablation)."""
        if spec is None:
            return []
        if isinstance(spec, Intervention):
            return [spec]
        if isinstance(spec, str):
            raise ArgumentError(f"{argument}: {spec!r} is one head, not a set; write [{spec!r}]")
        spec = list(spec) if isinstance(spec, Iterable) else spec
        if isinstance(spec, list) and spec and all(isinstance(x, Intervention) for x in spec):
            return spec
        if isinstance(spec, list) and not any(isinstance(x, Intervention) for x in spec):
            return [Intervention(tuple(self.names.keys(spec, argument)))] if spec else []
        raise ArgumentError(f"{argument}: a list of heads, an intervention (ablate, scale, patch) or a list of "
                              f"interventions, not {spec!r}")

    def _batches(self, texts: list[str], targets: list[str] | None) -> TextBatches:
        texts, targets = _text_list(texts, "texts"), _text_list(targets, "targets", allow_none=True)
        if self.translation and (targets is None or len(targets) != len(texts)):
            raise ArgumentError("targets: an encoder-decoder reads each text with its reference translation; give "
                                "one per text")
        if not self.translation and targets is not None:
            raise ArgumentError("targets: this model reads its texts alone; leave targets out")
        return encode_texts(self.model, self.src_tokenizer, self.tgt_tokenizer, texts, targets, self.max_tokens,
                            self.device)

    # ---------------------------------------------------------------- the cache

    def cache(self, texts: list[str], targets: list[str] | None = None, *, layers=None, heads=None,
              patterns: bool = True, outputs: bool = True, edit=None) -> HeadCache:
        """Every head's pattern and output on `texts` (an encoder-decoder's with `targets`), or
        only those of `layers` (counted from 0) or of the layers of `heads`; `edit`: a head set
        applied while caching (what ablating some heads does to the others)."""
        wanted = None
        if layers is not None:
            wanted = {(k, la) for k, la, _ in self.names.layer_keys(layers)}
        if heads is not None:
            wanted = (wanted or set()) | {(k, la) for k, la, _ in self.names.keys(heads)}
        parts = self._interventions(edit, "edit")
        batches = self._batches(texts, targets)
        found = HeadCache(self.names, list(texts))
        modules = self.model.attention_modules()
        layers_of = [(kind, layer) for kind, mods in modules.items() for layer in range(len(mods))
                     if wanted is None or (kind, layer) in wanted]
        kept_patterns = {key: [None] * len(texts) for key in layers_of} if patterns else {}
        kept_outputs = {key: [None] * len(texts) for key in layers_of} if outputs else {}
        found.labels = {kind: [None] * len(texts) for kind in modules}
        edit_of = _edit(parts, batches, self._mean_outputs(parts, batches)) if parts else None
        self.model.eval()
        from headcount.models.gates import row_head_edits

        for number, ((src, tgt_in, _), rows) in enumerate(zip(batches.batches, batches.indices)):
            lengths = {"enc_self": src.ne(self.model.special.pad).sum(1).tolist(),
                       "dec": self.model.special.decoder_positions(tgt_in).sum(1).tolist()}

            def size(kind, row, lengths=lengths):
                q = lengths["enc_self" if kind == "enc_self" else "dec"][row]
                k = lengths["dec" if kind == "dec_self" else "enc_self"][row]
                return q, k

            def on_map(kind, layer, probs, rows=rows, size=size):
                if (kind, layer) in kept_patterns:
                    for r, i in enumerate(rows):
                        q, k = size(kind, r)
                        kept_patterns[(kind, layer)][i] = probs[r, :, :q, :k].detach().float().cpu()

            def keeper(kind, layer, rows=rows, size=size):
                def hook(module, inputs, ctx):
                    for r, i in enumerate(rows):
                        kept_outputs[(kind, layer)][i] = ctx[r, :, : size(kind, r)[0]].detach().float().cpu()

                return hook

            handles = [modules[kind][layer].head_context.register_forward_hook(keeper(kind, layer))
                       for kind, layer in kept_outputs]
            masks, values = (row_edits(self.model, [edit_of], number, len(rows), src.device) if edit_of is not None
                             else ({}, {}))
            try:
                with torch.no_grad(), row_head_edits(self.model, masks, values):
                    stream_attention(self.model, src, tgt_in, on_map,
                                     types=tuple(sorted({k for k, _ in layers_of})) or None)
            finally:
                for handle in handles:
                    handle.remove()
            for kind in modules:
                query_side, key_side = ("source" if kind == "enc_self" else "target",
                                        "target" if kind == "dec_self" else "source")
                sides = {"source": src, "target": tgt_in}
                for r, i in enumerate(rows):
                    q, k = size(kind, r)
                    found.labels[kind][i] = (self._labels(sides[query_side][r, :q], query_side),
                                             self._labels(sides[key_side][r, :k], key_side))
        found.patterns, found.outputs = kept_patterns, kept_outputs
        return found

    def _labels(self, ids: Tensor, side: str) -> list[str]:
        """Each position's token as its side's tokenizer spells it; special ids by name."""
        special = self.model.special
        names = {special.pad: "<pad>", special.eos: "<eos>", special.bos: "<bos>"}  # a causal LM's BOS may be its EOS
        if getattr(special, "mask", None) is not None:
            names[special.mask] = "<mask>"
        ids = [int(i) for i in ids]
        plain = [[i] for i in ids if i not in names]
        tokenizer = self.src_tokenizer if side == "source" else self.tgt_tokenizer
        decoded = iter(tokenizer.decode(plain) if plain else [])
        return [names[i] if i in names else next(decoded) for i in ids]

    def _mean_outputs(self, parts: Sequence[Intervention], batches: TextBatches) -> Callable[[HeadKey], Tensor]:
        """Mean outputs over the texts measured, for the mean ablations without a source (one
        cache pass over those heads' layers, only where there are such heads)."""
        keys = [key for part in parts if part.how == "mean" and part.source is None for key in part.heads]
        if not keys:
            return lambda key: None
        cached = self.cache(batches.texts, batches.targets, heads=[(k, la, h) for k, la, h in keys], patterns=False)
        return cached.mean_output

    # ---------------------------------------------------------------- measuring

    def measure(self, texts: list[str], sets: Mapping[str, object], targets: list[str] | None = None, *,
                metric: Metric | None = None, per_token: bool = False,
                sets_per_pass: int = HEADS_PER_PASS) -> Measurement:
        """The loss (or `metric`) on `texts` under each head set of `sets` ({name: heads}: a list of
        heads, zero-ablated together; an Intervention or a list of them; None or []: none), and
        under the model as it is ("none", added where no set is empty). Every set runs on copies
        of each batch in one forward pass (`sets_per_pass` copies at a time).

        metric: None (the objective's loss: next-token NLL in nats per token for a causal LM, the
        masked tokens' for a masked LM, the references' for an encoder-decoder, the embedding's
        cosine distance for a sentence encoder), or a function (logits (B, T, V), targets (B, T),
        real (B, T) bool) -> (B,) per text or (B, T) per token. per_token: keep each token's
        value (Measurement.tokens)."""
        if not isinstance(sets, Mapping) or not sets:
            raise ArgumentError(f"sets: a dict of named head sets, {{'induction': ['19.7', '18.4']}}, not {sets!r}")
        if metric is not None and not callable(metric):
            raise ArgumentError(f"metric: a function (logits, targets, real) -> (B,) or (B, T), not {metric!r}")
        if isinstance(sets_per_pass, bool) or not isinstance(sets_per_pass, int) or sets_per_pass < 1:
            raise ArgumentError(f"sets_per_pass: a positive whole number, not {sets_per_pass!r}")
        parts = {str(name): self._interventions(spec, f"sets[{name!r}]") for name, spec in sets.items()}
        baseline = next((name for name, p in parts.items() if not p), None)
        if baseline is None:
            parts = {BASELINE: [], **parts}
            baseline = BASELINE
        batches = self._batches(texts, targets)
        mean_of = self._mean_outputs([p for ps in parts.values() for p in ps], batches)
        edits = [_edit(p, batches, mean_of) if p else None for p in parts.values()]
        order = [i for rows in batches.indices for i in rows]  # the texts in the batches' order
        sums, units, tokens = [], None, []
        names = list(parts)
        for start in range(0, len(edits), sets_per_pass):
            try:
                found = edited_scores(self.model, batches.batches, edits[start:start + sets_per_pass], metric=metric,
                                      keep_tokens=per_token)
            except ValueError as error:  # the metric's shape, or a metric a sentence encoder does not take
                message = str(error)
                if message.startswith("metric:") or "sentence encoder" in message:
                    raise ArgumentError(message if message.startswith("metric:") else f"metric: {message}") from None
                raise
            sums.append(found.sums)
            units = found.units
            if found.tokens is not None:
                tokens += found.tokens
        back = np.argsort(order)  # batches' order -> text order
        sums = np.concatenate(sums)[:, back]
        measured = Measurement(names, {n: [self.names.name(k) for p in parts[n] for k in p.heads] for n in names},
                               sums, units[back], baseline=baseline)
        if per_token and tokens:
            measured.tokens = {n: [tokens[i][j] for j in back] for i, n in enumerate(names)}
        return measured
