# Seeds (the `seeds` setting): each seed besides training.seed is an experiment of its own,
# <exp>_seed<s> (headcount.config.seed_replicas), on which every stage runs as on any experiment,
# with the lambdas of `seed_lambdas`. It shares the experiment's data, subwords and parses, copied
# here, so that the seeds differ in their seed alone. seed_spread tabulates the spread of their
# BLEU, claims_over_seeds each finding's verdict on every seed (plot_runs_over_seeds draws the runs
# behind it), heads_over_seeds their heads' roles, LRP and ablation side by side. Adding a seed adds
# its jobs and reruns nothing else.


rule seed_shared_file:
    """A seed's data, subword models and parses: the experiment's own, copied (sentencepiece does
    not learn the same model twice on other thread counts)."""
    input:
        lambda w: f"results/{REPLICA_OF[w.exp]}/{w.shared}",
    output:
        "results/{exp}/{shared}",
    log:
        log_path("seed_shared_file/{shared}"),
    wildcard_constraints:
        exp="|".join(re.escape(name) for name in REPLICA_OF) or "(?!)",
        shared=r"(data|subwords)/[^/]+|syntax/parses\.(parquet|json)",
    localrule: True
    conda:
        ENV
    resources:
        mem_mb=500,
        runtime=5,
    script:
        "../scripts/seed_shared_file.py"


# For a seed's experiment, the copy wins over making the file again.
ruleorder: seed_shared_file > generate_synthetic_data
ruleorder: seed_shared_file > prepare_training_data
ruleorder: seed_shared_file > fit_training_data
ruleorder: seed_shared_file > prepare_evaluation_data
ruleorder: seed_shared_file > pool_test_sets
ruleorder: seed_shared_file > train_subwords
ruleorder: seed_shared_file > parse_analysis_sentences


rule seed_spread:
    """BLEU of the baseline and of each lambda = 0 control across seeds: mean, sd, min, max, and
    each seed's control - baseline with its paired bootstrap interval."""
    input:
        unpack(seed_spread_inputs),
    output:
        table=report(
            "results/{exp}/seeds/spread.tsv",
            caption="../report/spread.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        markdown="results/{exp}/seeds/spread.md",
    log:
        log_path("seeds/seed_spread"),
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        experiment=lambda w: w.exp,
        seeds=lambda w: EXPERIMENTS[w.exp]["seeds"],
        settings=lambda w: prune_settings(w.exp),
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    script:
        "../scripts/seed_spread.py"


rule claims_over_seeds:
    """The paper's pruning findings on every seed's run, judged on the lambdas all seeds ran, and
    how many seeds agree on each."""
    input:
        unpack(claims_over_seeds_inputs),
    output:
        report(
            "results/{exp}/seeds/claims.md",
            caption="../report/claims_over_seeds.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
    log:
        log_path("seeds/claims_over_seeds"),
    conda:
        ENV
    resources:
        mem_mb=500,
        runtime=5,
    params:
        experiment=lambda w: w.exp,
        seeds=lambda w: EXPERIMENTS[w.exp]["seeds"],
    script:
        "../scripts/claims_over_seeds.py"


rule matched_over_seeds:
    """The pruning findings over seeds at matched head counts: each seed's curve read at the paper's
    counts, intervals over seeds and sentences together in BLEU and NLL, what each resolves, and the
    prunable verdicts by the rules fixed before the rerun (docs/method.md)."""
    input:
        unpack(matched_inputs),
    output:
        markdown=report(
            "results/{exp}/seeds/matched.md",
            caption="../report/matched_over_seeds.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        table="results/{exp}/seeds/matched.tsv",
    log:
        log_path("seeds/matched_over_seeds"),
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        experiment=lambda w: w.exp,
        runs=lambda w: matched_runs(w.exp),
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    script:
        "../scripts/matched_over_seeds.py"


rule plot_runs_over_seeds:
    """The runs behind the verdicts over seeds, drawn: each seed's pruned - control and pruned - from
    scratch against the heads it kept, on the lambdas all seeds ran."""
    input:
        pruning=lambda w: seed_pruning_tables(w.exp),
    output:
        report(
            "results/{exp}/seeds/runs_over_seeds.png",
            caption="../report/runs_over_seeds.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
    log:
        log_path("seeds/plot_runs_over_seeds"),
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        experiment=lambda w: w.exp,
        seeds=lambda w: EXPERIMENTS[w.exp]["seeds"],
    script:
        "../scripts/plot_runs_over_seeds.py"


rule heads_over_seeds:
    """Every seed's baseline side by side, as compare_models sets models side by side: roles, the
    largest positional share with paired bootstrap intervals, LRP concentration, single-head ablation.
    """
    input:
        unpack(lambda w: model_comparison_inputs(seed_runs(w.exp))),
    output:
        table="results/{exp}/seeds/heads.tsv",
        markdown=report(
            "results/{exp}/seeds/heads.md",
            caption="../report/heads_over_seeds.rst",
            category="Head importance",
            subcategory="{exp}",
        ),
    log:
        log_path("seeds/heads_over_seeds"),
    conda:
        ENV
    threads: all_cores
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        name=lambda w: f"{w.exp}, seeds {', '.join(map(str, EXPERIMENTS[w.exp]['seeds']))}",
        experiments=lambda w: seed_runs(w.exp),
        descriptions=lambda w: {
            run: f"training seed {seed}"
            for seed, run in zip(EXPERIMENTS[w.exp]["seeds"], seed_runs(w.exp))
        },
        lowercase=model_comparison_param("lowercase", seed_runs_of),
        analysis_sentences=model_comparison_param("analysis_sentences", seed_runs_of),
        device=model_comparison_param("device", seed_runs_of),
    script:
        "../scripts/compare_models.py"
