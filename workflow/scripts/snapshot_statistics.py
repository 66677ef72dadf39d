from _common import job

from headcount.pipeline.specialisation import specialisation_over_training

with job(snakemake) as log:
    specialisation_over_training(
        training_summary=snakemake.input.summary,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        analysis_src=snakemake.input.analysis_src,
        analysis_tgt=snakemake.input.analysis_tgt,
        dev_src=snakemake.input.dev_src,
        dev_tgt=snakemake.input.dev_tgt,
        max_sentences=snakemake.params.max_sentences,
        dev_bleu_sentences=snakemake.params.dev_bleu_sentences,
        lrp_rule=snakemake.params.lrp_rule,
        max_tokens=snakemake.params.max_tokens,
        lowercase=snakemake.params.lowercase,
        out_csv=snakemake.output.csv,
        out_figure=snakemake.output.figure,
        title=f"{snakemake.wildcards.exp}: head specialisation over training",
        device=snakemake.params.device,
        log=log,
    )
