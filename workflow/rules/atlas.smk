# The head atlas: one self-contained HTML page per experiment with every head's scores,
# role evidence, attention on real sentences and gate trajectories (docs/atlas.md).


rule atlas:
    """The head atlas: results/{exp}/atlas/index.html, one page that opens from file:// (data and D3
    inside). It reads the baseline and its tokenizers (attention on the analysis sentences), the head
    scores and role tables, and where the experiment has them the pruning runs' gates and
    trajectories with the pruning table, and the positive control's planted-vs-found table. A
    language model's too: the attention of its one type over its text (no target side), its
    pruning in perplexity (lm_pruning_report's table).
    """
    input:
        model="results/{exp}/baseline/model.pt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        analysis_src=analysis_src,
        analysis_tgt=lambda w: f"results/{w.exp}/data/{exp_config(w)['analysis']['set']}.tgt.txt",
        train_src="results/{exp}/data/train.src.txt",
        head_scores="results/{exp}/heads/scores.parquet",
        parses="results/{exp}/syntax/parses.parquet",
        roles="results/{exp}/syntax/roles.csv",
        positional="results/{exp}/syntax/positional.csv",
        syntactic="results/{exp}/syntax/syntactic.csv",
        rare="results/{exp}/syntax/rare.csv",
        gates=lambda w: [
            f"results/{w.exp}/{m}/gates.json"
            for s in prune_settings(w.exp)
            for m in pruned_models(w.exp, s)
        ],
        trajectories=lambda w: [
            f"results/{w.exp}/{m}/trajectory.csv"
            for s in prune_settings(w.exp)
            for m in pruned_models(w.exp, s)
        ],
        # one file or none: the pruning table where the experiment prunes, the
        # planted-vs-found table for the positive control
        pruning=lambda w: (
            [f"results/{w.exp}/prune/pruning.tsv"] if prune_settings(w.exp) else []
        ),
        planted=lambda w: (
            [f"results/{w.exp}/control/planted_vs_found.csv"]
            if is_synthetic(exp_config(w))
            else []
        ),
    output:
        report(
            "results/{exp}/atlas/index.html",
            caption="../report/atlas.rst",
            category="Head atlas",
            subcategory="{exp}",
        ),
    log:
        log_path("atlas"),
    benchmark:
        benchmark_path("atlas")
    conda:
        ENV
    # A few hundred sentences through the model: one thread, beside other jobs, and no GPU to ask
    # a cluster for (on a workstation, training.device still picks one).
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        atlas=lambda w: exp_config(w)["atlas"],
        roles=lambda w: exp_config(w)["roles"],
        analysis_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        device=lambda w: exp_config(w)["training"]["device"],
        description=lambda w: exp_config(w).get("description", ""),
    script:
        "../scripts/build_atlas.py"
