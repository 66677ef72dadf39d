from _common import job

from headcount.report.pruning_report import pruning_report

with job(snakemake) as log:
    pruning_report(
        experiment=snakemake.params.experiment,
        baseline_scores=snakemake.input.baseline,
        gates=list(snakemake.input.gates),
        pruned_scores=list(snakemake.input.pruned),
        scratch_scores=list(snakemake.input.scratch),
        ranked=list(snakemake.input.ranked),
        ranked_translations=list(snakemake.input.ranked_translations),
        roles=snakemake.input.roles,
        out=dict(snakemake.output.items()),
        references=snakemake.input.references,
        baseline_translations=snakemake.input.baseline_translations,
        pruned_translations=list(snakemake.input.pruned_translations),
        scratch_translations=list(snakemake.input.scratch_translations),
        baseline_training=snakemake.input.baseline_training,
        scratch_training=list(snakemake.input.scratch_training),
        lowercase=snakemake.params.lowercase,
        control_layers=snakemake.input.get("control_layers"),
        baseline_nll=snakemake.input.baseline_nll,
        pruned_nll=list(snakemake.input.pruned_nll),
        scratch_nll=list(snakemake.input.scratch_nll),
        log=log,
    )
