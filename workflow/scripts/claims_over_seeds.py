import pandas as pd
from _common import job

from headcount.io import atomic_path
from headcount.report.claims import claims_over_seeds_markdown, runs_over_seeds_markdown


def read(path):
    return pd.read_csv(path, sep="\t")


with job(snakemake) as log:
    runs = {seed: (read(pruning), read(layers)) for seed, pruning, layers
            in zip(snakemake.params.seeds, snakemake.input.pruning, snakemake.input.layers)}
    control = snakemake.input.get("control_layers")
    text = (claims_over_seeds_markdown(snakemake.params.experiment, runs, read(control) if control else None)
            + "\n" + runs_over_seeds_markdown({seed: pruning for seed, (pruning, _) in runs.items()}))
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(text, encoding="utf-8")
    log(text)
