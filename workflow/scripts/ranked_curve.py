from _common import job

from headcount.pipeline.pruning_runs import ranked_curve

with job(snakemake) as log:
    ranked_curve(
        baseline=snakemake.input.baseline,
        head_scores=snakemake.input.head_scores,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        src_text=snakemake.input.src,
        ref_text=snakemake.input.ref,
        setting=snakemake.wildcards.setting,
        step=snakemake.params.step,
        decoding=snakemake.params.decoding,
        lowercase=snakemake.params.lowercase,
        out_path=snakemake.output.table,
        translations_out=snakemake.output.translations,
        device=snakemake.params.device,
        method=snakemake.wildcards.method,
        log=log,
    )
