from _common import job

from headcount.data.corpora import CleaningConfig, prepare_training_corpus
from headcount.io import write_json

with job(snakemake) as log:
    cleaning = dict(snakemake.params.cleaning)
    max_pairs, seed = cleaning.pop("max_pairs"), cleaning.pop("seed")
    stats = prepare_training_corpus(
        corpora=snakemake.params.corpora,
        cfg=CleaningConfig(**cleaning),
        lowercase=snakemake.params.lowercase,
        max_pairs=max_pairs,
        seed=seed,
        out_src=snakemake.output.src,
        out_tgt=snakemake.output.tgt,
        log=log,
    )
    write_json(snakemake.output.stats, stats)
    log(f"{stats['pairs']} training pairs")
