from pathlib import Path

import pandas as pd
from _common import job

from headcount.report.plots import head_heatmap

with job(snakemake) as log:
    table = pd.read_parquet(snakemake.input[0])
    folder = Path(snakemake.output[0])
    folder.mkdir(parents=True, exist_ok=True)
    drawn = 0
    for score, kind in snakemake.params.figures:
        # A language model has one attention type, and no lrp column until its LRP exists.
        if score not in table or not (table["type"] == kind).any():
            log(f"no {score} heatmap of {kind}: the score table has no such column or heads")
            continue
        head_heatmap(table, score, kind, folder / f"{score}.{kind}.png")
        drawn += 1
    log(f"{drawn} heatmaps in {folder}")
