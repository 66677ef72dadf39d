# Baseline seeds (the `seeds` setting): each seed besides training.seed trains its own baseline
# and lambda = 0 controls under results/{exp}/seeds/seed_{seed}/, translated and scored by the
# generic rules; seed_spread tabulates the spread of their BLEU. The main run (training.seed)
# keeps its own paths, and the heads, roles and lambda grid stay on it: adding a seed adds its
# jobs and reruns nothing else.


rule train_baseline_seed:
    """Train the baseline again with another seed (the `seeds` setting)."""
    input:
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm="results/{exp}/subwords/src.model",
        tgt_spm="results/{exp}/subwords/tgt.model",
    output:
        model="results/{exp}/seeds/seed_{seed}/baseline/model.pt",
        summary="results/{exp}/seeds/seed_{seed}/baseline/training.json",
    log:
        log_path("seeds/seed_{seed}/train_baseline"),
    benchmark:
        benchmark_path("seeds/seed_{seed}/train_baseline")
    wildcard_constraints:
        seed="[0-9]+",
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
        training=seed_training,
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        work_dir=lambda w: f"results/{w.exp}/seeds/seed_{w.seed}/baseline/train",
    script:
        "../scripts/train_baseline.py"


rule prune_control_seed:
    """The lambda = 0 control (gates pinned open) fine-tuned from another seed's baseline."""
    input:
        baseline="results/{exp}/seeds/seed_{seed}/baseline/model.pt",
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm="results/{exp}/subwords/src.model",
        tgt_spm="results/{exp}/subwords/tgt.model",
    output:
        model="results/{exp}/seeds/seed_{seed}/prune/{setting}/lambda_0/model.pt",
        gates="results/{exp}/seeds/seed_{seed}/prune/{setting}/lambda_0/gates.json",
        trajectory="results/{exp}/seeds/seed_{seed}/prune/{setting}/lambda_0/trajectory.csv",
    log:
        log_path("seeds/seed_{seed}/prune/{setting}/lambda_0/prune_heads"),
    benchmark:
        benchmark_path("seeds/seed_{seed}/prune/{setting}/lambda_0/prune_heads")
    wildcard_constraints:
        seed="[0-9]+",
    conda:
        ENV
    threads: training_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=lambda w: exp_config(w)["resources"]["train_mem_mb"],
        runtime=lambda w: exp_config(w)["resources"]["train_runtime_min"],
    params:
        lam=0.0,
        prune=prune_job_settings,
        training=seed_training,
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        baseline_checkpoint="results/{exp}/seeds/seed_{seed}/baseline/train/checkpoint.pt",
        work_dir=lambda w: f"results/{w.exp}/seeds/seed_{w.seed}/prune/{w.setting}/lambda_0/train",
    script:
        "../scripts/prune_heads.py"


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
