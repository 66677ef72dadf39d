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
        exp=PRETRAINED_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        source=lambda w: exp_config(w)["pretrained"],
        src_lang=lambda w: exp_config(w)["src_lang"],
        tgt_lang=lambda w: exp_config(w)["tgt_lang"],
        model_langs=lambda w: exp_config(w).get("pretrained_langs"),
    script:
        "../scripts/import_pretrained.py"
