from _common import job

from headcount.pipeline.pruning_runs import export_pruned

with job(snakemake) as log:
    export_pruned(
        model_path=snakemake.input.model,
        model_out=snakemake.output.model,
        summary_out=snakemake.output.summary,
        log=log,
    )
