# The baseline Transformer. Checkpoints live in results/{exp}/baseline/train/ (not declared as
# outputs, so a failed or killed job keeps them); rerunning the job resumes from the last one.


rule train_baseline:
    """Train the baseline Transformer, resuming from its last checkpoint after a stop."""
    input:
        train_src="results/{exp}/data/train.src.txt",
        train_tgt="results/{exp}/data/train.tgt.txt",
        dev_src="results/{exp}/data/dev.src.txt",
        dev_tgt="results/{exp}/data/dev.tgt.txt",
        src_spm="results/{exp}/subwords/src.model",
        tgt_spm="results/{exp}/subwords/tgt.model",
    output:
        model="results/{exp}/baseline/model.pt",
        summary="results/{exp}/baseline/training.json",
    log:
        log_path("train_baseline"),
    benchmark:
        benchmark_path("train_baseline")
    wildcard_constraints:
        exp=TRAINED_EXPERIMENTS,
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
        training=lambda w: exp_config(w)["training"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        work_dir=lambda w: f"results/{w.exp}/baseline/train",
    script:
        "../scripts/train_baseline.py"
