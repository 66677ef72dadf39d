from _common import job

from headcount.data import prepare_evaluation_set

with job(snakemake) as log:
    src_side, tgt_side = snakemake.params.sides
    stats = prepare_evaluation_set(
        src_side, tgt_side, snakemake.params.max_chars, snakemake.params.lowercase,
        snakemake.output.src, snakemake.output.tgt,
        subwords=(snakemake.input.src_spm, snakemake.input.tgt_spm, snakemake.params.max_len),
    )
    log(f"{snakemake.wildcards.split}: {stats['pairs']} pairs")
