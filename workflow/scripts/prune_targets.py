from _common import job

from headcount.io import atomic_path
from headcount.pipeline.pruning_runs import target_table

with job(snakemake) as log:
    table = target_table(list(snakemake.input.gates))
    with atomic_path(snakemake.output[0]) as tmp:
        table.to_csv(tmp, sep="\t", index=False)
    for row in table.itertuples():
        log(f"{row.setting} {row.target}: {row.kept} of {row.gated} heads kept (target {row.target_heads}, "
            f"error {row.error:+d}), {row.undecided} gates undecided")
