from _common import job

from headcount.data import fetch_source

with job(snakemake) as log:
    fetch_source(
        url=snakemake.params.url,
        relpath=snakemake.wildcards.source,
        dest=snakemake.output[0],
        mirror=snakemake.params.mirror,
        sha256=snakemake.params.sha256,
        log=log,
    )
