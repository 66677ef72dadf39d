from _common import job

from headcount.pipeline.translation import reference_nll_file

with job(snakemake) as log:
    reference_nll_file(
        model_path=snakemake.input.model,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        src_text=snakemake.input.src,
        tgt_text=snakemake.input.tgt,
        out_path=snakemake.output[0],
        max_tokens=snakemake.params.max_tokens,
        device=snakemake.params.device,
        log=log,
    )
