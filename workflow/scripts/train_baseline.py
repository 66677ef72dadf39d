from _common import job

from headcount.pipeline.training_runs import train_translation_model

with job(snakemake) as log:
    summary = train_translation_model(
        train_src=snakemake.input.train_src,
        train_tgt=snakemake.input.train_tgt,
        dev_src=snakemake.input.dev_src,
        dev_tgt=snakemake.input.dev_tgt,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        model_settings=snakemake.params.model,
        train_settings=snakemake.params.training,
        lowercase=snakemake.params.lowercase,
        work_dir=snakemake.params.work_dir,
        model_out=snakemake.output.model,
        summary_out=snakemake.output.summary,
        head_mask_from=snakemake.input.get("pruned"),  # train_from_scratch: the pruned model's mask
        log=log,
    )
    log(f"trained {summary['steps']} steps in {summary['train_seconds_all'] / 60:.1f} min "
        f"({summary['attempts']} attempt(s), {summary['train_cpu_seconds_all'] / 60:.1f} min CPU)")
