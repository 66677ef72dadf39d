"""The atlas stage over files: an experiment's tables and model -> results/<exp>/atlas/index.html.
What workflow/scripts/build_atlas.py calls."""

from __future__ import annotations

from collections.abc import Sequence

from ...io import read_lines
from ...settings import AtlasSettings
from .data import clean, gather_tables, read_table
from .page import write_page

ATLAS = AtlasSettings()


def _table(path):
    return read_table(path) if path else None


def build_atlas(out_html: str, head_scores: str, model: str | None = None, src_spm: str | None = None,
                tgt_spm: str | None = None, analysis_src: str | None = None, analysis_tgt: str | None = None,
                analysis_sentences: int | None = None, roles: str | None = None, positional: str | None = None,
                syntactic: str | None = None, rare: str | None = None, parses: str | None = None,
                train_src: str | None = None, role_settings: dict | None = None, pruning: str | None = None,
                gates: Sequence[str] = (), trajectories: Sequence[str] = (),
                planted: str | None = None, sentences: Sequence[int] = ATLAS.sentences,
                best_sentences: int = ATLAS.best_sentences,
                lowercase: bool = False, device: str = "auto", experiment: str = "", description: str = "",
                log=print) -> dict:
    """Gather the experiment's tables (atlas.data), run the model on its analysis sentences for
    the attention examples and offset histograms (atlas.examples; skipped without a model), and
    write the page. `gates` and `trajectories`: one gates.json and trajectory.csv per pruning run,
    in the same order. `sentences`: analysis line numbers (0-based) shown for every head;
    `best_sentences`: how many more per head show its role. Returns the page's data."""
    if trajectories and len(trajectories) != len(gates):
        raise ValueError(f"{len(gates)} gate files but {len(trajectories)} trajectories")
    runs = list(zip(gates, trajectories or [None] * len(gates)))
    role_table = _table(roles)
    examples = {}
    if model:
        from ...models.device import pick_device
        from ...models.loading import load_model, open_tokenizer

        examples = {"model": load_model(model), "src_tokenizer": open_tokenizer(src_spm, "source"),
                    "tgt_tokenizer": open_tokenizer(tgt_spm, "target"),
                    "sources": read_lines(analysis_src)[:analysis_sentences],
                    "targets": read_lines(analysis_tgt)[:analysis_sentences],
                    "parses": _table(parses) if parses and role_table is not None else None,
                    "frequency_texts": read_lines(train_src) if train_src and role_table is not None else None,
                    "device": pick_device(device)}
    return write_atlas(out_html, read_table(head_scores), roles=role_table, positional=_table(positional),
                       syntactic=_table(syntactic), rare=_table(rare), role_settings=role_settings,
                       pruning=_table(pruning), runs=runs, planted=_table(planted), experiment=experiment,
                       description=description, sentences=sentences, best_sentences=best_sentences,
                       lowercase=lowercase, log=log, data_out=True, **examples)

def write_atlas(out_html: str, scores, roles=None, positional=None, syntactic=None, rare=None,
                role_settings: dict | None = None, pruning=None, runs: Sequence = (), planted=None,
                experiment: str = "", description: str = "", model=None, src_tokenizer=None, tgt_tokenizer=None,
                sources: Sequence[str] = (), targets: Sequence[str] = (), parses=None,
                frequency_texts: Sequence[str] | None = None, sentences: Sequence[int] = ATLAS.sentences,
                best_sentences: int = ATLAS.best_sentences, lowercase: bool = False, device="cpu", log=print,
                data_out: bool = False):
    """The atlas from tables in memory (DataFrames) and, where `model` is given (a headcount model
    with its tokenizers), its attention examples on `sources`/`targets` and offset histograms
    (atlas.examples). build_atlas and headcount.api.analyse both call this. -> the page's path, or
    with `data_out` its data."""
    data = gather_tables(scores, roles=roles, positional=positional, syntactic=syntactic, rare=rare,
                         role_settings=role_settings, pruning=pruning, runs=runs, planted=planted,
                         experiment=experiment, description=description)
    log(f"atlas: {len(data['heads'])} heads of {', '.join(data['layout'])}; "
        f"{sum(len(r) for r in data['pruning']['settings'].values())} pruning runs")
    if model is not None:
        from ...analysis.roles.statistics import count_words
        from .examples import gather_examples

        role_of = {h["key"]: h for h in data["heads"] if h.get("role") is not None}
        frequencies = count_words(frequency_texts, lowercase=lowercase) if frequency_texts is not None else None
        data.update(gather_examples(
            model, src_tokenizer, tgt_tokenizer, list(sources), list(targets), role_of, chosen=sentences,
            best=best_sentences, parses=parses, frequencies=frequencies, role_settings=role_settings,
            lowercase=lowercase, device=device, log=log))
    data = clean(data)
    path = write_page(data, out_html)
    log(f"atlas: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return data if data_out else path
