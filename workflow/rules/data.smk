# Data: fetch (URL or mirror) -> clean and split -> sentencepiece BPE, one model per language.


def fetch_input(wildcards):
    # With a mirror the file is an input, so a missing one is reported before any job runs.
    return [f"{MIRROR}/{wildcards.source}"] if MIRROR else []


rule fetch_source:
    input:
        fetch_input,
    output:
        "resources/data/{source}",
    params:
        url=lambda w: config["sources"][w.source]["url"],
        sha256=lambda w: config["sources"][w.source].get("sha256"),
        mirror=MIRROR,
    log:
        "resources/logs/fetch/{source}.log",
    resources:
        mem_mb=1000,
        runtime=60,
    retries: 2
    script:
        "../scripts/fetch_source.py"


def training_inputs(wildcards):
    exp = exp_config(wildcards)
    return sorted({fetched(side_source(pair[s])) for pair in exp["train"] for s in ("src", "tgt")})


rule prepare_training_data:
    input:
        training_inputs,
    output:
        src="results/{exp}/data/train.src.txt",
        tgt="results/{exp}/data/train.tgt.txt",
        stats="results/{exp}/data/train.stats.json",
    params:
        corpora=lambda w: [(side_spec(p["src"]), side_spec(p["tgt"])) for p in exp_config(w)["train"]],
        cleaning=lambda w: exp_config(w)["cleaning"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    log:
        log_path("prepare_training_data"),
    resources:
        mem_mb=8000,
        runtime=120,
    script:
        "../scripts/prepare_training_data.py"


rule prepare_evaluation_data:
    input:
        lambda w: sorted({fetched(side_source(s)) for s in split_pair(exp_config(w), w.split)}),
    output:
        src="results/{exp}/data/{split}.src.txt",
        tgt="results/{exp}/data/{split}.tgt.txt",
    params:
        sides=lambda w: [side_spec(s) for s in split_pair(exp_config(w), w.split)],
        max_chars=lambda w: exp_config(w)["cleaning"]["max_chars"],
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
    log:
        log_path("prepare_evaluation_data_{split}"),
    resources:
        mem_mb=1000,
        runtime=10,
    script:
        "../scripts/prepare_evaluation_data.py"


rule train_subwords:
    input:
        "results/{exp}/data/train.{side}.txt",
    output:
        "results/{exp}/subwords/{side}.model",
    params:
        vocab_size=lambda w: exp_config(w)["subwords"][f"{w.side}_vocab"],
        character_coverage=lambda w: exp_config(w)["subwords"]["character_coverage"],
    threads: 2
    log:
        log_path("train_subwords_{side}"),
    resources:
        mem_mb=4000,
        runtime=60,
    script:
        "../scripts/train_subwords.py"
