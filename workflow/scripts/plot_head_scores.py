import pandas as pd
from _common import job

from headcount.plots import head_heatmap

with job(snakemake) as log:
    table = pd.read_parquet(snakemake.input[0])
    head_heatmap(table, snakemake.wildcards.score, snakemake.wildcards.kind, snakemake.output[0])
