from _common import job

from headcount.data.corpora import pool_evaluation_sets

with job(snakemake) as log:
    members = list(zip(snakemake.params.members, snakemake.input.src, snakemake.input.tgt))
    stats = pool_evaluation_sets(members, snakemake.output.src, snakemake.output.tgt, snakemake.output.members)
    log(f"{snakemake.wildcards.split}: {stats['pairs']} pairs from {', '.join(snakemake.params.members)}")
