from _common import job

from headcount.prune_stages import pruning_report

with job(snakemake) as log:
    pruning_report(
        experiment=snakemake.params.experiment,
        baseline_scores=snakemake.input.baseline,
        gates=list(snakemake.input.gates),
        pruned_scores=list(snakemake.input.pruned),
        scratch_scores=list(snakemake.input.scratch),
        michel=list(snakemake.input.michel),
        roles=snakemake.input.roles,
        out=dict(snakemake.output.items()),
        log=log,
    )
