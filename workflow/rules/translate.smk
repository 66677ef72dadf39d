# Translation with beam search and scoring with sacrebleu (BLEU and chrF, with signatures), for
# any model: {model} is `baseline` or a pruned model (`prune/{setting}/lambda_{lam}`), or its
# from-scratch twin (`.../scratch`). A language-model experiment translates nothing: its quality is
# perplexity (rules/quality.smk).


rule translate:
    """Translate an evaluation set with beam search, with the baseline or a pruned model."""
    input:
        model="results/{exp}/{model}/model.pt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        src="results/{exp}/data/{split}.src.txt",
    output:
        "results/{exp}/{model}/translations/{split}.txt",
    log:
        log_path("{model}/translate_{split}"),
    benchmark:
        benchmark_path("{model}/translate_{split}")
    wildcard_constraints:
        exp=TRANSLATION_EXPERIMENTS,
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=4000,
        runtime=120,
    params:
        decoding=lambda w: exp_config(w)["decoding"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/translate.py"


rule score:
    """BLEU and chrF of one model's translations of one evaluation set, with signatures."""
    input:
        hyp="results/{exp}/{model}/translations/{split}.txt",
        ref="results/{exp}/data/{split}.tgt.txt",
    output:
        "results/{exp}/{model}/scores/{split}.json",
    log:
        log_path("{model}/score_{split}"),
    wildcard_constraints:
        exp=TRANSLATION_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        decoding=lambda w: exp_config(w)["decoding"],
    script:
        "../scripts/score.py"


rule reference_nll:
    """Each reference's NLL under one model given its source, for paired NLL intervals beside BLEU's."""
    input:
        model="results/{exp}/{model}/model.pt",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
        src="results/{exp}/data/{split}.src.txt",
        tgt="results/{exp}/data/{split}.tgt.txt",
    output:
        "results/{exp}/{model}/scores/{split}.nll.tsv",
    log:
        log_path("{model}/reference_nll_{split}"),
    benchmark:
        benchmark_path("{model}/reference_nll_{split}")
    wildcard_constraints:
        exp=TRANSLATION_EXPERIMENTS,
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=4000,
        runtime=30,
    params:
        max_tokens=lambda w: exp_config(w)["heads"]["max_tokens"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/reference_nll.py"


rule score_table:
    """The baseline's scores on every test set, one table (BLEU and chrF, or a language model's perplexity)."""
    input:
        lambda w: expand(
            "results/{{exp}}/baseline/scores/{split}.json", split=test_splits(w.exp)
        ),
    output:
        report(
            "results/{exp}/baseline/scores.tsv",
            caption="../report/scores.rst",
            category="Baseline",
            subcategory="{exp}",
        ),
    log:
        log_path("score_table"),
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=5,
    script:
        "../scripts/score_table.py"
