# How many heads can go: every pruning method at the matched head counts against random head sets
# of the same size (pipeline.head_counts; rules in report.preregistered). On demand:
#   snakemake results/{exp}/head_counts/{setting}/head_counts.tsv


rule head_counts:
    """Every method's heads removed from the baseline at the matched counts, against random sets of as many heads."""
    input:
        baseline="results/{exp}/baseline/model.pt",
        head_scores="results/{exp}/heads/scores.parquet",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        rank_src=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.src.txt",
        rank_tgt=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.tgt.txt",
        eval_src=lambda w: f"results/{w.exp}/data/{prune_eval_split(w.exp)}.src.txt",
        eval_tgt=lambda w: f"results/{w.exp}/data/{prune_eval_split(w.exp)}.tgt.txt",
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
    output:
        table="results/{exp}/head_counts/{setting}/head_counts.tsv",
        summary="results/{exp}/head_counts/{setting}/head_counts_summary.tsv",
        markdown="results/{exp}/head_counts/{setting}/head_counts.md",
        figure="results/{exp}/head_counts/{setting}/head_counts.png",
    log:
        log_path("head_counts/{setting}"),
    benchmark:
        benchmark_path("head_counts/{setting}")
    wildcard_constraints:
        setting="enc|all",
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=8000,
        runtime=240,
    params:
        # the published scores' sentences: the rankings and Michel's rescoring read the same
        rank_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        scores_on=lambda w: exp_config(w)["analysis"]["set"],
        # gates trained to each count on the frozen baseline, as long as a pruning run fine-tunes
        l0_steps=lambda w: exp_config(w)["prune"]["training"]["max_steps"],
        l0_sentences=2000,
        # the baseline's: its seed, batch size, device and last learning rate (the gates' rate)
        training=lambda w: exp_config(w)["training"],
        # the Lagrangian controller's settings (prune.controller), where set; empty: its defaults
        controller=lambda w: exp_config(w)["prune"].get("controller") or {},
        device=lambda w: exp_config(w)["training"]["device"],
        work_dir=lambda w: f"results/{w.exp}/head_counts/{w.setting}",
    script:
        "../scripts/head_counts.py"
