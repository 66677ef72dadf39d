import pandas as pd
from _common import job

import headcount
from headcount.io import read_lines
from headcount.models.device import pick_device
from headcount.pipeline.head_counts import digest, l0_arm_arguments, translation_head_counts

with job(snakemake) as log:
    params = snakemake.params
    n, m, steps = params.rank_sentences, params.l0_sentences, params.l0_steps
    device = str(pick_device(params.device))
    l0_src, l0_tgt = read_lines(snakemake.input.train_src)[:m], read_lines(snakemake.input.train_tgt)[:m]
    eval_src, eval_tgt = read_lines(snakemake.input.eval_src), read_lines(snakemake.input.eval_tgt)
    rank_src, rank_tgt = read_lines(snakemake.input.rank_src)[:n], read_lines(snakemake.input.rank_tgt)[:n]

    def prune_run(model, tokenizers, kept, work_dir):
        """Gates alone on the frozen baseline, trained to `kept` heads of the setting."""
        arguments = l0_arm_arguments(kept, l0_src, l0_tgt, setting=snakemake.wildcards.setting, steps=steps,
                                     baseline_training=params.training, d_model=model.d_model, work_dir=work_dir,
                                     controller=params.controller, dev=(rank_src[:2], rank_tgt[:2]))
        return headcount.prune(model, tokenizers, **arguments, device=device, log=log).gates

    translation_head_counts(
        baseline=snakemake.input.baseline,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        rank_src=rank_src,
        rank_tgt=rank_tgt,
        eval_src=eval_src,
        eval_tgt=eval_tgt,
        head_scores=pd.read_parquet(snakemake.input.head_scores),
        setting=snakemake.wildcards.setting,
        out=params.work_dir,
        scores_on=f"{params.scores_on}[:{n}] (the published scores)",
        seed=params.training["seed"],
        prune_run=prune_run if steps else None,
        max_tokens=params.training["max_tokens"],
        device=device,
        # what the L0 runs depend on beyond the arms' own inputs
        # (the controller only where set, so that runs under its defaults keep their fingerprint)
        fingerprint={"l0_steps": steps, "l0_sentences": digest([l0_src, l0_tgt]), "training": params.training,
                     **({"controller": dict(params.controller)} if params.controller else {})},
        log=log,
    )
