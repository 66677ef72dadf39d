from _common import job

from headcount.io import write_json
from headcount.pipeline.pruning_runs import export_pruned
from headcount.pruning.transformers_export import export_transformers

with job(snakemake) as log:
    record = export_pruned(
        model_path=snakemake.input.model,
        model_out=snakemake.output.model,
        summary_out=snakemake.output.summary,
        log=log,
    )
    # The same pruned model for plain transformers (closed heads zeroed), recorded in the summary.
    record["transformers"] = export_transformers(
        snakemake.input.model,
        snakemake.output.transformers,
        tokenizer_dir=snakemake.input.get("tokenizer") or None,
        log=log,
    )
    write_json(snakemake.output.summary, record)
