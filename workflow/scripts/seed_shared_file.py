import shutil

from _common import job

from headcount.io import atomic_path

with job(snakemake) as log:
    with atomic_path(snakemake.output[0]) as tmp:
        shutil.copyfile(snakemake.input[0], tmp)
    log(f"copied {snakemake.input[0]}")
