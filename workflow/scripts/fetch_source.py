from _common import job

import os

from headcount.config import FETCHED_DIR, MIRROR_ENV, ConfigError, escapes
from headcount.data.corpora import fetch_source

with job(snakemake) as log:
    source = snakemake.wildcards.source
    # The config's check, again where the file is written: a source key is the path under both
    # resources/data/ and the mirror, and neither may be left.
    if escapes(FETCHED_DIR, source):
        raise ConfigError(f"config key 'sources': the key '{source}' resolves outside {FETCHED_DIR}/; "
                          f"use a relative path without .. or a leading /")
    fetch_source(
        url=snakemake.params.url,
        relpath=source,
        dest=snakemake.output[0],
        mirror=os.environ.get(MIRROR_ENV) or None,
        sha256=snakemake.params.sha256,
        log=log,
    )
