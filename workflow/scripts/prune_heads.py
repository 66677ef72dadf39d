from _common import job

from headcount.pipeline.pruning_runs import prune_heads

with job(snakemake) as log:
    prune_heads(
        baseline=snakemake.input.baseline,
        train_src=snakemake.input.train_src,
        train_tgt=snakemake.input.train_tgt,
        dev_src=snakemake.input.dev_src,
        dev_tgt=snakemake.input.dev_tgt,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        setting=snakemake.wildcards.setting,
        lam=snakemake.params.lam,
        prune_settings=snakemake.params.prune,
        train_settings=snakemake.params.training,
        work_dir=snakemake.params.work_dir,
        model_out=snakemake.output.model,
        gates_out=snakemake.output.gates,
        trajectory_out=snakemake.output.trajectory,
        lowercase=snakemake.params.lowercase,
        baseline_checkpoint=snakemake.params.baseline_checkpoint,
        target=getattr(snakemake.params, "target", None),  # prune_to_target's runs
        log=log,
    )
