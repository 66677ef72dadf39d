# The positive control (SPEC section 3): a generated language pair whose grammar plants
# positional, syntactic and rare-token heads, and the table of what the analyses found of them.


rule generate_synthetic_data:
    """Generate a synthetic experiment's training text, dev and test sets and the gold
    dependency parse of every source sentence (headcount.synthetic_language), in place of
    fetching and cleaning corpora."""
    output:
        **{
            f"{split}_{kind}": f"results/{{exp}}/data/{split}.{suffix}"
            for split in ("dev", SYNTHETIC_TEST_SET)
            for kind, suffix in (
                ("src", "src.txt"),
                ("tgt", "tgt.txt"),
                ("conllu", "conllu"),
            )
        },
        src="results/{exp}/data/cleaned.src.txt",
        tgt="results/{exp}/data/cleaned.tgt.txt",
        stats="results/{exp}/data/cleaned.stats.json",
    log:
        log_path("generate_synthetic_data"),
    wildcard_constraints:
        exp=SYNTHETIC_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        synthetic=lambda w: exp_config(w)["synthetic"],
    script:
        "../scripts/generate_synthetic_data.py"


rule control_report:
    """What the analyses found of each planted function: the heads with that role and their
    rates, where LRP and ablation rank them within their layer, and the lambda at which
    each one's encoder gate closes."""
    input:
        roles="results/{exp}/syntax/roles.csv",
        syntactic="results/{exp}/syntax/syntactic.csv",
        head_scores="results/{exp}/heads/scores.parquet",
        gates=lambda w: [
            f"results/{w.exp}/{m}/gates.json"
            for s in prune_settings(w.exp)
            for m in pruned_models(w.exp, s)
        ],
    output:
        table="results/{exp}/control/planted_vs_found.csv",
        markdown=report(
            "results/{exp}/control/planted_vs_found.md",
            caption="../report/planted_vs_found.rst",
            category="Positive control",
            subcategory="{exp}",
        ),
    log:
        log_path("control_report"),
    wildcard_constraints:
        exp=SYNTHETIC_EXPERIMENTS,
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        roles=lambda w: exp_config(w)["roles"],
    script:
        "../scripts/control_report.py"
