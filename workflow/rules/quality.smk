# A language model's quality (experiments with `text:`): perplexity of an evaluation set, for the
# baseline or a pruned model, where a translation experiment translates and scores BLEU
# (rules/translate.smk). Lower is better.


rule lm_quality:
    """Perplexity of a language model (baseline or pruned) on a dev or test set, and each sentence's NLL."""
    input:
        model="results/{exp}/{model}/model.pt",
        tokenizer=tokenizer("src"),
        text="results/{exp}/data/{split}.tgt.txt",
    output:
        scores="results/{exp}/{model}/scores/{split}.json",
        nll="results/{exp}/{model}/scores/{split}.nll.tsv",
    log:
        log_path("{model}/lm_quality_{split}"),
    benchmark:
        benchmark_path("{model}/lm_quality_{split}")
    wildcard_constraints:
        exp=LM_EXPERIMENTS,
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=4000,
        runtime=120,
    params:
        max_tokens=lambda w: exp_config(w)["heads"]["max_tokens"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/lm_quality.py"
