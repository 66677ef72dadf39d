from _common import job

from headcount.data.subwords import Segmenter, train_bpe

with job(snakemake) as log:
    train_bpe(
        snakemake.input[0],
        snakemake.output[0],
        vocab_size=snakemake.params.vocab_size,
        character_coverage=snakemake.params.character_coverage,
        max_piece_length=snakemake.params.max_piece_length,
        threads=snakemake.threads,
    )
    log(f"BPE model with {len(Segmenter(snakemake.output[0]))} pieces")
