from _common import job

from headcount.report.pruning_report import seed_spread

with job(snakemake) as log:
    seed_spread(
        experiment=snakemake.params.experiment,
        seeds=list(snakemake.params.seeds),
        settings=list(snakemake.params.settings),
        baseline_scores=list(snakemake.input.baselines),
        control_scores=list(snakemake.input.controls),
        out_table=snakemake.output.table,
        out_markdown=snakemake.output.markdown,
        references=snakemake.input.references,
        baseline_translations=list(snakemake.input.baseline_translations),
        control_translations=list(snakemake.input.control_translations),
        lowercase=snakemake.params.lowercase,
        baseline_training=list(snakemake.input.baseline_training),
        baseline_nll=list(snakemake.input.baseline_nll),
        control_nll=list(snakemake.input.control_nll),
        log=log,
    )
