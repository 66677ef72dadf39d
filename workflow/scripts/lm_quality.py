from _common import job

from headcount.pipeline.lm_quality import score_text

with job(snakemake) as log:
    score_text(
        model_path=snakemake.input.model,
        tokenizer_path=snakemake.input.tokenizer,
        text=snakemake.input.text,
        split=snakemake.wildcards.split,
        max_tokens=snakemake.params.max_tokens,
        out_json=snakemake.output.scores,
        out_nll=snakemake.output.nll,
        device=snakemake.params.device,
        log=log,
    )
