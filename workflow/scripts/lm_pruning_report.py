from _common import job

from headcount.pipeline.lm_quality import lm_pruning_report

with job(snakemake) as log:
    lm_pruning_report(
        baseline_scores=snakemake.input.baseline,
        baseline_nll=snakemake.input.baseline_nll,
        gates=list(snakemake.input.gates),
        pruned_scores=list(snakemake.input.pruned),
        pruned_nll=list(snakemake.input.pruned_nll),
        ranked=list(snakemake.input.ranked),
        out_table=snakemake.output.table,
        out_markdown=snakemake.output.markdown,
        experiment=snakemake.params.experiment,
        log=log,
    )
