from pathlib import Path

import pandas as pd
from _common import job

from headcount.report.plots import head_heatmap

with job(snakemake) as log:
    table = pd.read_parquet(snakemake.input[0])
    folder = Path(snakemake.output[0])
    folder.mkdir(parents=True, exist_ok=True)
    for score, kind in snakemake.params.figures:
        head_heatmap(table, score, kind, folder / f"{score}.{kind}.png")
    log(f"{len(snakemake.params.figures)} heatmaps in {folder}")
