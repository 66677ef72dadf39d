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
        # A language model has one attention type, no lrp column until its LRP exists, and no
        # delta_bleu (an all-NaN column).
        if score not in table or not table.loc[table["type"] == kind, score].notna().any():
            log(f"no {score} heatmap of {kind}: the score table has no value of it there")
            continue
        head_heatmap(table, score, kind, folder / f"{score}.{kind}.png")
        drawn += 1
    log(f"{drawn} heatmaps in {folder}")
