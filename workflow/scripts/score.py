from _common import job

from headcount.training.evaluate import score_file

with job(snakemake) as log:
    scores = score_file(snakemake.input.hyp, snakemake.input.ref, snakemake.params.lowercase, snakemake.output[0],
                        extra={"split": snakemake.wildcards.split, "decoding": snakemake.params.decoding})
    log(f"{snakemake.wildcards.split}: BLEU {scores['bleu']} chrF {scores['chrf']} ({scores['bleu_signature']})")
