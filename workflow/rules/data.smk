# Data: fetch (URL or mirror) -> clean -> sentencepiece BPE, one model per language -> drop the
# training pairs too long for the model in subwords; check the evaluation sets.


rule fetch_source:
    """Copy a source file from the data mirror, or download it, into resources/data/ (checksum checked)."""
    input:
        mirror_file,
    output:
        "resources/data/{source}",
    log:
        "resources/logs/fetch/{source}.log",
    # Never retried, not even with a profile's `retries`: a wrong checksum or a damaged file fails
    # the same way again. Downloads retry network errors themselves (headcount.data.fetch_source).
    retries: 0
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=60,
    params:
        url=lambda w: config["sources"][w.source]["url"],
        sha256=lambda w: config["sources"][w.source].get("sha256"),
    script:
        "../scripts/fetch_source.py"


# Training text is cleaned (cleaned.*), the BPE models learn from it, and then the pairs longer
# than model.max_len in subwords are dropped (train.*): only then are lengths known in subwords.
rule prepare_training_data:
    """Read, check, clean, subsample and normalise the training corpora into one text per side."""
    input:
        training_inputs,
    output:
        src="results/{exp}/data/cleaned.src.txt",
        tgt="results/{exp}/data/cleaned.tgt.txt",
        stats="results/{exp}/data/cleaned.stats.json",
    log:
        log_path("prepare_training_data"),
    wildcard_constraints:
        exp=CORPUS_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        corpora=lambda w: [
            (side_spec(p["src"]), side_spec(p["tgt"])) for p in exp_config(w)["train"]
        ],
        cleaning=lambda w: exp_config(w)["cleaning"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    script:
        "../scripts/prepare_training_data.py"


rule fit_training_data:
    """Drop the cleaned training pairs longer than model.max_len in subwords; count them."""
    input:
        src="results/{exp}/data/cleaned.src.txt",
        tgt="results/{exp}/data/cleaned.tgt.txt",
        stats="results/{exp}/data/cleaned.stats.json",
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
    output:
        src="results/{exp}/data/train.src.txt",
        tgt="results/{exp}/data/train.tgt.txt",
        stats="results/{exp}/data/train.stats.json",
    log:
        log_path("fit_training_data"),
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        max_len=lambda w: exp_config(w)["model"]["max_len"],
    script:
        "../scripts/fit_training_data.py"


rule prepare_evaluation_data:
    """Check a dev or test set (a line too long for the model is an error) and normalise it."""
    input:
        sides=lambda w: sorted(
            {fetched(side_source(s)) for s in split_pair(exp_config(w), w.split)}
        ),
        src_spm=tokenizer("src"),
        tgt_spm=tokenizer("tgt"),
    output:
        src="results/{exp}/data/{split}.src.txt",
        tgt="results/{exp}/data/{split}.tgt.txt",
    log:
        log_path("prepare_evaluation_data_{split}"),
    wildcard_constraints:
        exp=CORPUS_EXPERIMENTS,
        split=UNPOOLED_SPLITS,
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        sides=lambda w: [side_spec(s) for s in split_pair(exp_config(w), w.split)],
        max_chars=lambda w: exp_config(w)["cleaning"]["max_chars"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        max_len=lambda w: exp_config(w)["model"]["max_len"],
    script:
        "../scripts/prepare_evaluation_data.py"


rule pool_test_sets:
    """A pooled test set: its member sets' prepared sources and references one after another, with
    the sentences each member holds (for power: one set of 3,532 sentences, not four of 461-1,071).
    """
    input:
        src=lambda w: [
            f"results/{w.exp}/data/{m}.src.txt"
            for m in pooled_sets(exp_config(w))[w.split]
        ],
        tgt=lambda w: [
            f"results/{w.exp}/data/{m}.tgt.txt"
            for m in pooled_sets(exp_config(w))[w.split]
        ],
    output:
        src="results/{exp}/data/{split}.src.txt",
        tgt="results/{exp}/data/{split}.tgt.txt",
        members="results/{exp}/data/{split}.members.tsv",
    log:
        log_path("pool_test_sets_{split}"),
    wildcard_constraints:
        exp=CORPUS_EXPERIMENTS,
        split=POOLED_SPLITS,
    conda:
        ENV
    resources:
        mem_mb=500,
        runtime=5,
    params:
        members=lambda w: pooled_sets(exp_config(w))[w.split],
    script:
        "../scripts/pool_test_sets.py"


rule train_subwords:
    """Learn one language's BPE model on the cleaned training text. Threads as a training job's:
    a fixed 2 starved it behind single-thread training jobs (it starts only when both cores are
    free, and the scheduler keeps filling each freed core); the pieces are the same on 1 or 2.
    """
    input:
        "results/{exp}/data/cleaned.{side}.txt",
    output:
        "results/{exp}/subwords/{side}.model",
    log:
        log_path("train_subwords_{side}"),
    conda:
        ENV
    threads: training_threads
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        vocab_size=lambda w: exp_config(w)["subwords"][f"{w.side}_vocab"],
        character_coverage=lambda w: exp_config(w)["subwords"]["character_coverage"],
        max_piece_length=lambda w: exp_config(w)["subwords"]["max_piece_length"],
    script:
        "../scripts/train_subwords.py"
