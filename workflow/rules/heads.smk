# Which heads matter: confidence, LRP relevance, Michel importance and single-head ablation.


rule score_heads:
    """Score every head of the baseline: confidence, LRP relevance, Michel importance, ablation."""
    input:
        model="results/{exp}/baseline/model.pt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        analysis_src=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.src.txt",
        analysis_tgt=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.tgt.txt",
        translations=lrp_text,
    output:
        table="results/{exp}/heads/scores.parquet",
        csv="results/{exp}/heads/scores.csv",
        correlations=report(
            "results/{exp}/heads/correlations.tsv",
            caption="../report/correlations.rst",
            category="Head importance",
            subcategory="{exp}",
        ),
        conservation="results/{exp}/heads/lrp_conservation.tsv",
    log:
        log_path("score_heads"),
    benchmark:
        benchmark_path("score_heads")
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=8000,
        runtime=240,
    params:
        max_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        heads=lambda w: exp_config(w)["heads"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/score_heads.py"


rule plot_head_scores:
    """The heatmaps (layer x head) of every head score for every kind of attention
    (common.head_figures), in one job: a figure takes a fraction of a second, a job seconds to start.
    """
    input:
        "results/{exp}/heads/scores.parquet",
    output:
        report(
            directory("results/{exp}/heads/figures/heatmaps"),
            patterns=["{score}.{kind}.png"],
            caption="../report/head_heatmap.rst",
            category="Head importance",
            subcategory="{exp}",
        ),
    log:
        "results/{exp}/logs/plot_head_scores.log",
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        figures=lambda w: head_figures(w.exp),
    script:
        "../scripts/plot_head_scores.py"


rule snapshot_statistics:
    """Head specialisation over training: per snapshot of the baseline (training.snapshot_interval),
    the largest positional share, mean confidence and LRP concentration per layer and dev BLEU, and
    their figure against training steps. The snapshots and metrics.jsonl are in the baseline's
    training folder, listed by training.json."""
    input:
        summary="results/{exp}/baseline/training.json",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        analysis_src=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.src.txt",
        analysis_tgt=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
    output:
        csv="results/{exp}/heads/snapshots.csv",
        figure=report(
            "results/{exp}/heads/figures/specialisation.png",
            caption="../report/specialisation.rst",
            category="Head importance",
            subcategory="{exp}",
        ),
    log:
        log_path("snapshot_statistics"),
    benchmark:
        benchmark_path("snapshot_statistics")
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=8000,
        runtime=240,
    params:
        snapshot_interval=lambda w: exp_config(w)["training"]["snapshot_interval"],
        dev_bleu_sentences=lambda w: exp_config(w)["training"]["dev_bleu_sentences"],
        max_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        lrp_rule=lambda w: exp_config(w)["heads"]["lrp_rule"],
        max_tokens=lambda w: exp_config(w)["heads"]["max_tokens"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/snapshot_statistics.py"
