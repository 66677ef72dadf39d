import pandas as pd
from _common import job

from headcount.report.claims import runs_over_seeds
from headcount.report.plots import runs_over_seeds_figure

with job(snakemake) as log:
    prunings = {seed: pd.read_csv(path, sep="\t")
                for seed, path in zip(snakemake.params.seeds, snakemake.input.pruning)}
    runs = runs_over_seeds(prunings)
    runs_over_seeds_figure(runs, snakemake.output[0], f"{snakemake.params.experiment}: the runs over "
                                                      f"{len(prunings)} seeds")
    log(f"{len(runs)} runs drawn ({runs['setting'].nunique()} settings) -> {snakemake.output[0]}")
