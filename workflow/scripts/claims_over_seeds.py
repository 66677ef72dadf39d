import pandas as pd
from _common import job

from headcount.io import atomic_path
from headcount.report.claims import claims_over_seeds_markdown

with job(snakemake) as log:
    tables = {seed: pd.read_csv(path, sep="\t", keep_default_na=False)
              for seed, path in zip(snakemake.params.seeds, snakemake.input.claims)}
    text = claims_over_seeds_markdown(snakemake.params.experiment, tables)
    with atomic_path(snakemake.output[0]) as tmp:
        tmp.write_text(text, encoding="utf-8")
    log(text)
