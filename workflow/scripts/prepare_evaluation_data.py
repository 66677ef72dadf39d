from _common import job

from headcount.data.corpora import prepare_evaluation_set
from headcount.models.loading import open_tokenizer

with job(snakemake) as log:
    src_side, tgt_side = snakemake.params.sides
    stats = prepare_evaluation_set(
        src_side, tgt_side, snakemake.params.max_chars, snakemake.params.lowercase,
        snakemake.output.src, snakemake.output.tgt,
        subwords=(open_tokenizer(snakemake.input.src_spm, "source"), open_tokenizer(snakemake.input.tgt_spm, "target"),
                  snakemake.params.max_len),
    )
    log(f"{snakemake.wildcards.split}: {stats['pairs']} pairs")
