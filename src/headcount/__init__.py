"""headcount: which attention heads of a Transformer matter, what they do, how many can go.

The package in layers, bottom to top; a module imports only its own layer and those below it, and
no two modules import each other, even through others (tests/test_layers.py checks both):

- base: io, progress, signals, provenance (anything may import them);
- data/: corpora, subwords (headcount's own token ids), special (SpecialIds, the Tokenizer
  protocol), batching (always given a model's ids), token_corpus, parses, synthetic_language;
- config: the experiment configuration (read by the workflow's rule files, torch-free);
- models/: the contract (seq2seq), checkpoint (the one place checkpoints are written and read),
  loading (the one load_model and open_tokenizer), device, the families (transformer, hf), their
  LRP passes (transformer_lrp, hf_lrp) over the LRP rules they share (lrp), gates (Hard Concrete);
- training/: the loop, schedules (pure learning-rate functions), decode, evaluate;
- analysis/: measures (the registry) over importance, relevance (LRP head relevance) and tables,
  correlations, roles, specialisation statistics;
- pruning/: methods (the settings and the registry of pruning methods), hard_concrete, ranked,
  removal;
- report/: plots, claims (with seed_statistics, intervals over seeds), pruning_report,
  positive_control;
- pipeline/: the stage drivers the workflow's scripts call;
- api (and this package's `analyse`, `prune`, `heads`, `load_pretrained`): the Python API on a
  model in memory, over the same pipeline functions as the workflow, and per-head access
  (analysis.head_access) over the workflow's ablation path (docs/api.md).

Two cuts differ from the first sketch: the LRP rules live in models/ (every family's
`lrp_forward` is written with them, so analysis/ above holds only the relevance measure), and
config sits between data/ and models/ (it reads the synthetic language's piece length, and the
rule files import it without torch). Nothing here knows Snakemake.
"""

from headcount.version import __version__

_API = ("analyse", "prune", "heads", "load_pretrained", "Analysis", "Pruning", "HeadAccess", "HeadCache", "Measurement",
        "ArgumentError")


def __getattr__(name: str):
    """headcount.analyse and the rest of the API, imported on first use: the workflow's rule files
    import headcount's config without torch, and so does `import headcount`."""
    if name in _API:
        from headcount import api

        return getattr(api, name)
    raise AttributeError(f"module 'headcount' has no attribute {name!r}")


__all__ = ["__version__", *_API]
