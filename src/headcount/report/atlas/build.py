"""The atlas stage over files: an experiment's tables and model -> results/<exp>/atlas/index.html.
What workflow/scripts/build_atlas.py calls."""

from __future__ import annotations

from collections.abc import Sequence

from ...io import read_lines
from .data import clean, gather_tables, read_table
from .page import write_page


def _table(path):
    return read_table(path) if path else None


def build_atlas(out_html: str, head_scores: str, model: str | None = None, src_spm: str | None = None,
                tgt_spm: str | None = None, analysis_src: str | None = None, analysis_tgt: str | None = None,
                analysis_sentences: int | None = None, roles: str | None = None, positional: str | None = None,
                syntactic: str | None = None, rare: str | None = None, parses: str | None = None,
                train_src: str | None = None, role_settings: dict | None = None, pruning: str | None = None,
                gates: Sequence[str] = (), trajectories: Sequence[str] = (),
                planted: str | None = None, sentences: Sequence[int] = (0, 1, 2), best_sentences: int = 2,
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
    data = gather_tables(read_table(head_scores), roles=role_table, positional=_table(positional),
                         syntactic=_table(syntactic), rare=_table(rare), role_settings=role_settings,
                         pruning=_table(pruning), runs=runs, planted=_table(planted),
                         experiment=experiment, description=description)
    log(f"atlas: {len(data['heads'])} heads of {', '.join(data['layout'])}; "
        f"{sum(len(r) for r in data['pruning']['settings'].values())} pruning runs")
    if model:
        from ...analysis.roles.statistics import count_words
        from ...models.device import pick_device
        from ...models.loading import load_model, open_tokenizer

        sources = read_lines(analysis_src)[:analysis_sentences]
        targets = read_lines(analysis_tgt)[:analysis_sentences]
        role_of = {h["key"]: h for h in data["heads"] if h.get("role") is not None}
        frequencies = count_words(read_lines(train_src), lowercase=lowercase) if train_src and role_table is not None \
            else None
        from .examples import gather_examples

        data.update(gather_examples(
            load_model(model), open_tokenizer(src_spm, "source"), open_tokenizer(tgt_spm, "target"), sources,
            targets, role_of, chosen=sentences, best=best_sentences,
            parses=_table(parses) if parses and role_table is not None else None, frequencies=frequencies,
            role_settings=role_settings, lowercase=lowercase, device=pick_device(device), log=log))
    data = clean(data)
    path = write_page(data, out_html)
    log(f"atlas: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return data
