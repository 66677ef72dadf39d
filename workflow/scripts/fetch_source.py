from _common import job

import os

from headcount.config import MIRROR_ENV
from headcount.data.corpora import fetch_source

with job(snakemake) as log:
    fetch_source(
        url=snakemake.params.url,
        relpath=snakemake.wildcards.source,
        dest=snakemake.output[0],
        mirror=os.environ.get(MIRROR_ENV) or None,
        sha256=snakemake.params.sha256,
        log=log,
    )
