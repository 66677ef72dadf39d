import json

from _common import job

from headcount.data.corpora import fit_training_corpus
from headcount.io import write_json
from headcount.models.loading import open_tokenizer

with job(snakemake) as log:
    with open(snakemake.input.stats, encoding="utf-8") as f:
        cleaned = json.load(f)
    stats = fit_training_corpus(
        snakemake.input.src, snakemake.input.tgt, cleaned, open_tokenizer(snakemake.input.src_spm, "source"),
        open_tokenizer(snakemake.input.tgt_spm, "target"),
        max_len=snakemake.params.max_len, out_src=snakemake.output.src, out_tgt=snakemake.output.tgt, log=log,
    )
    write_json(snakemake.output.stats, stats)
    log(f"{stats['pairs']} training pairs")
