from _common import job

from headcount.pipeline.training_runs import import_pretrained_baseline

with job(snakemake) as log:
    import_pretrained_baseline(
        source=snakemake.params.source,
        model_out=snakemake.output.model,
        summary_out=snakemake.output.summary,
        tokenizer_dir=snakemake.output.tokenizer,
        src_lang=snakemake.params.src_lang,
        tgt_lang=snakemake.params.tgt_lang,
        allow_weights=snakemake.params.allow_weights,
        objective=snakemake.params.objective,
        log=log,
    )
