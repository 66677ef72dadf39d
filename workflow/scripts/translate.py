from _common import job

from headcount.pipeline.translation import translate_file

with job(snakemake) as log:
    translate_file(
        model_path=snakemake.input.model,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        src_text=snakemake.input.src,
        out_path=snakemake.output[0],
        decoding=snakemake.params.decoding,
        device=snakemake.params.device,
        log=log,
    )
