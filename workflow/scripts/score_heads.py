from _common import job

from headcount.pipeline.head_scores import score_heads

with job(snakemake) as log:
    heads = snakemake.params.heads
    score_heads(
        model_path=snakemake.input.model,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        analysis_src=snakemake.input.analysis_src,
        analysis_tgt=snakemake.input.analysis_tgt,
        translations=snakemake.input.translations,
        max_sentences=snakemake.params.max_sentences,
        lrp_rule=heads["lrp_rule"],
        ablation=heads["ablation"],
        ablation_bleu_sentences=heads["ablation_bleu_sentences"],
        max_tokens=heads["max_tokens"],
        lowercase=snakemake.params.lowercase,
        out_table=snakemake.output.table,
        out_csv=snakemake.output.csv,
        out_correlations=snakemake.output.correlations,
        out_conservation=snakemake.output.conservation,
        device=snakemake.params.device,
        log=log,
    )
