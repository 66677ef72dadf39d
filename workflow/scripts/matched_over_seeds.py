from _common import job

from headcount.pipeline.seed_verdicts import write_matched_over_seeds

with job(snakemake) as log:
    write_matched_over_seeds(snakemake.params.experiment, snakemake.params.runs, snakemake.input.references,
                             snakemake.output.markdown, snakemake.output.table, snakemake.params.lowercase, log=log,
                             spread=snakemake.input.spread)
