from _common import job

from headcount.report.positive_control import control_report

with job(snakemake) as log:
    control_report(
        roles_path=snakemake.input.roles,
        syntactic_path=snakemake.input.syntactic,
        scores_path=snakemake.input.head_scores,
        gates_paths=list(snakemake.input.gates),
        settings=snakemake.params.roles,
        out_csv=snakemake.output.table,
        out_md=snakemake.output.markdown,
        log=log,
    )
