# Data: fetch (URL or mirror) -> clean and split -> sentencepiece BPE, one model per language.


rule fetch_source:
    output:
        "resources/data/{source}",
    log:
        "resources/logs/fetch/{source}.log",
    retries: 2
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


rule prepare_training_data:
    input:
        training_inputs,
    output:
        src="results/{exp}/data/train.src.txt",
        tgt="results/{exp}/data/train.tgt.txt",
        stats="results/{exp}/data/train.stats.json",
    log:
        log_path("prepare_training_data"),
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


rule prepare_evaluation_data:
    input:
        lambda w: sorted(
            {fetched(side_source(s)) for s in split_pair(exp_config(w), w.split)}
        ),
    output:
        src="results/{exp}/data/{split}.src.txt",
        tgt="results/{exp}/data/{split}.tgt.txt",
    log:
        log_path("prepare_evaluation_data_{split}"),
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        sides=lambda w: [side_spec(s) for s in split_pair(exp_config(w), w.split)],
        max_chars=lambda w: exp_config(w)["cleaning"]["max_chars"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    script:
        "../scripts/prepare_evaluation_data.py"


rule train_subwords:
    input:
        "results/{exp}/data/train.{side}.txt",
    output:
        "results/{exp}/subwords/{side}.model",
    log:
        log_path("train_subwords_{side}"),
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        vocab_size=lambda w: exp_config(w)["subwords"][f"{w.side}_vocab"],
        character_coverage=lambda w: exp_config(w)["subwords"]["character_coverage"],
    script:
        "../scripts/train_subwords.py"
