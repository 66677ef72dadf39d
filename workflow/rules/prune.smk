# Pruning heads (paper section 6): fine-tuning with Hard Concrete gates for each lambda of each
# setting's grid, training each pruned configuration from scratch, the curve of every ranked
# method (Michel et al.'s and any other in pruning.methods), and the tables and figures. Lambda
# is a wildcard: a new grid value adds its own jobs only; so is the ranked method.
# Lambda 0 is each setting's control (gates pinned open); it has no from-scratch twin. A run of
# prune.targets prunes to a named head count instead of by a lambda (prune_to_target).

from headcount.pruning.methods import target_dirs, target_from_label


rule prune_heads:
    """Fine-tune the baseline with Hard Concrete head gates at one lambda: the pruned model."""
    input:
        baseline="results/{exp}/baseline/model.pt",
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
    output:
        model="results/{exp}/prune/{setting}/lambda_{lam}/model.pt",
        gates="results/{exp}/prune/{setting}/lambda_{lam}/gates.json",
        trajectory="results/{exp}/prune/{setting}/lambda_{lam}/trajectory.csv",
    log:
        log_path("prune/{setting}/lambda_{lam}/prune_heads"),
    benchmark:
        benchmark_path("prune/{setting}/lambda_{lam}/prune_heads")
    conda:
        ENV
    threads: training_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=lambda w: exp_config(w)["resources"]["train_mem_mb"],
        runtime=lambda w: exp_config(w)["resources"]["train_runtime_min"],
    params:
        lam=lambda w: float(w.lam),
        prune=prune_job_settings,
        training=lambda w: exp_config(w)["training"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        # Not an input: train_baseline keeps it without declaring it (prune.resume_optimizer reads it).
        baseline_checkpoint="results/{exp}/baseline/train/checkpoint.pt",
        work_dir=lambda w: f"results/{w.exp}/prune/{w.setting}/lambda_{w.lam}/train",
    script:
        "../scripts/prune_heads.py"


rule prune_to_target:
    """Prune to a named head count (prune.targets) with a Lagrangian controller over the same gates;
    written as prune_heads writes a lambda's run. On demand (or through prune_targets).
    """
    input:
        baseline="results/{exp}/baseline/model.pt",
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
    output:
        model="results/{exp}/prune/{setting}/target_{target}/model.pt",
        gates="results/{exp}/prune/{setting}/target_{target}/gates.json",
        trajectory="results/{exp}/prune/{setting}/target_{target}/trajectory.csv",
    log:
        log_path("prune/{setting}/target_{target}/prune_to_target"),
    benchmark:
        benchmark_path("prune/{setting}/target_{target}/prune_to_target")
    wildcard_constraints:
        target=r"heads_[0-9]+|fraction_[0-9.e-]+",
    conda:
        ENV
    threads: training_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=lambda w: exp_config(w)["resources"]["train_mem_mb"],
        runtime=lambda w: exp_config(w)["resources"]["train_runtime_min"],
    params:
        lam=None,
        target=lambda w: target_from_label(w.target),
        # the fine-tuning recipe and, where set, the controller's settings
        prune=lambda w: {
            **prune_job_settings(w),
            **{k: v for k, v in exp_config(w)["prune"].items() if k == "controller"},
        },
        training=lambda w: exp_config(w)["training"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        baseline_checkpoint="results/{exp}/baseline/train/checkpoint.pt",
        work_dir=lambda w: f"results/{w.exp}/prune/{w.setting}/target_{w.target}/train",
    script:
        "../scripts/prune_heads.py"


# On demand: snakemake results/{exp}/prune/targets.tsv
rule prune_targets:
    """Every run of prune.targets: its error against the target and its undecided gates."""
    input:
        gates=lambda w: [
            f"results/{w.exp}/{folder}/gates.json"
            for folder in target_dirs(
                exp_config(w)["prune"], lm_settings() if is_lm(w.exp) else SETTINGS
            )
        ],
    output:
        "results/{exp}/prune/targets.tsv",
    log:
        log_path("prune/prune_targets"),
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/prune_targets.py"


rule train_from_scratch:
    """Train the architecture a pruned model kept, from scratch, for comparison."""
    input:
        pruned="results/{exp}/prune/{setting}/lambda_{lam}/model.pt",
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
    output:
        model="results/{exp}/prune/{setting}/lambda_{lam}/scratch/model.pt",
        summary="results/{exp}/prune/{setting}/lambda_{lam}/scratch/training.json",
    log:
        log_path("prune/{setting}/lambda_{lam}/train_from_scratch"),
    benchmark:
        benchmark_path("prune/{setting}/lambda_{lam}/train_from_scratch")
    conda:
        ENV
    threads: training_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=lambda w: exp_config(w)["resources"]["train_mem_mb"],
        runtime=lambda w: exp_config(w)["resources"]["train_runtime_min"],
    params:
        model=lambda w: exp_config(w)["model"],
        # The pruned model's budget (baseline plus fine-tuning steps) and checkpoint selection
        # (config.scratch_training). No snapshots: the statistics over training are the baseline's.
        # With prune.scratch_schedule: pruned, a "schedule" entry (config.scratch_schedule) for
        # train_translation_model; with noam none, so twins trained before the option are not rerun.
        training=lambda w: {
            **scratch_training(exp_config(w)["training"], exp_config(w)["prune"]),
            "snapshot_interval": 0,
            **(
                {"schedule": schedule}
                if (
                    schedule := scratch_schedule(
                        exp_config(w)["training"], exp_config(w)["prune"]
                    )
                )
                else {}
            ),
        },
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        work_dir=lambda w: f"results/{w.exp}/prune/{w.setting}/lambda_{w.lam}/scratch/train",
    script:
        "../scripts/train_baseline.py"


# On demand, not part of `all`: snakemake results/{exp}/prune/{setting}/lambda_{lam}/physical/model.pt
rule export_pruned:
    """Remove a pruned model's closed heads physically: a smaller checkpoint, parameters and FLOPs;
    beside it the same model as plain transformers loads it (save_pretrained, closed heads zeroed:
    pruning.transformers_export), or NOT_EXPORTED.txt where the family has no transformers class.
    """
    input:
        model="results/{exp}/prune/{setting}/lambda_{lam}/model.pt",
        tokenizer=export_tokenizer,
    output:
        model="results/{exp}/prune/{setting}/lambda_{lam}/physical/model.pt",
        summary="results/{exp}/prune/{setting}/lambda_{lam}/physical/summary.json",
        transformers=directory(
            "results/{exp}/prune/{setting}/lambda_{lam}/physical/transformers"
        ),
    log:
        log_path("prune/{setting}/lambda_{lam}/export_pruned"),
    benchmark:
        benchmark_path("prune/{setting}/lambda_{lam}/export_pruned")
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=30,
    script:
        "../scripts/export_pruned.py"


rule ranked_curve:
    """BLEU as heads are removed, without retraining, in order of a ranked method's score
    (pruning.methods: Michel et al.'s importance, or any other registered ranked method).
    """
    input:
        baseline="results/{exp}/baseline/model.pt",
        head_scores="results/{exp}/heads/scores.parquet",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        src=lambda w: f"results/{w.exp}/data/{prune_eval_split(w.exp)}.src.txt",
        ref=lambda w: f"results/{w.exp}/data/{prune_eval_split(w.exp)}.tgt.txt",
    output:
        table="results/{exp}/prune/{setting}/{method}.tsv",
        translations="results/{exp}/prune/{setting}/{method}_translations.jsonl",
    log:
        log_path("prune/{setting}/{method}_curve"),
    benchmark:
        benchmark_path("prune/{setting}/{method}_curve")
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=4000,
        runtime=240,
    params:
        # The step of every ranked curve; the key keeps the name users' configs know it by.
        step=lambda w: exp_config(w)["prune"]["michel_step"],
        decoding=lambda w: exp_config(w)["decoding"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/ranked_curve.py"


rule plot_gate_trajectory:
    """How a pruning run's gates opened and closed during training (PNG and GIF)."""
    input:
        "results/{exp}/prune/{setting}/lambda_{lam}/trajectory.csv",
    output:
        png=report(
            "results/{exp}/prune/{setting}/lambda_{lam}/gates.png",
            caption="../report/gates.rst",
            category="Pruning",
            subcategory="gate trajectories",
        ),
        gif="results/{exp}/prune/{setting}/lambda_{lam}/gates.gif",
    log:
        log_path("prune/{setting}/lambda_{lam}/plot_gate_trajectory"),
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    script:
        "../scripts/plot_gate_trajectory.py"


rule pruning_report:
    """Pruning table, Table 2 beside the paper's, the paper's findings checked, Figures 7-10."""
    input:
        unpack(pruning_report_inputs),
    output:
        table=report(
            "results/{exp}/prune/pruning.tsv",
            caption="../report/pruning.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        table2=report(
            "results/{exp}/prune/table2.md",
            caption="../report/table2.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        table2_csv="results/{exp}/prune/table2.csv",
        layers="results/{exp}/prune/layer_survival.tsv",
        encoder=report(
            "results/{exp}/prune/encoder.md",
            caption="../report/encoder.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        claims=report(
            "results/{exp}/prune/claims.md",
            caption="../report/claims.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        claims_table="results/{exp}/prune/claims.tsv",
        figure7=report(
            "results/{exp}/prune/figures/figure7_bleu_vs_heads.png",
            caption="../report/figure7.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        figure8=report(
            "results/{exp}/prune/figures/figure8_functions.png",
            caption="../report/figure8.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        figure9=report(
            "results/{exp}/prune/figures/figure9_types.png",
            caption="../report/figure9.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        figure10=report(
            "results/{exp}/prune/figures/figure10_decoder_layers.png",
            caption="../report/figure10.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
    log:
        log_path("pruning_report"),
    wildcard_constraints:
        exp=TRANSLATION_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        experiment=lambda w: w.exp,
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    script:
        "../scripts/pruning_report.py"


rule lm_pruning_report:
    """A language model's pruning table: each pruned model's perplexity (lower is better) with its
    NLL difference from the baseline and a paired bootstrap interval, and the ranked curves.
    """
    input:
        unpack(lm_pruning_report_inputs),
    output:
        table=report(
            "results/{exp}/prune/pruning.tsv",
            caption="../report/lm_pruning.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
        markdown=report(
            "results/{exp}/prune/pruning.md",
            caption="../report/lm_pruning.rst",
            category="Pruning",
            subcategory="{exp}",
        ),
    log:
        log_path("lm_pruning_report"),
    wildcard_constraints:
        exp=LM_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        experiment=lambda w: w.exp,
    script:
        "../scripts/lm_pruning_report.py"
