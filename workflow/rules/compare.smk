# The same question on several models (`compare`): one table per comparison of the
# experiments' own outputs side by side, with the largest positional share's paired bootstrap over
# the analysis sentences (headcount.report.model_comparison), in results/compare/{name}/.


rule compare_models:
    """One table comparing experiments' models (config `compare`): BLEU, roles, LRP concentration, single-head ablation, and the largest positional share with paired bootstrap intervals over the analysis sentences."""
    input:
        unpack(comparison_inputs),
    output:
        table=f"results/{COMPARE_DIR}/{{name}}/comparison.tsv",
        markdown=f"results/{COMPARE_DIR}/{{name}}/comparison.md",
    log:
        f"results/{COMPARE_DIR}/{{name}}/logs/compare_models.log",
    wildcard_constraints:
        name=experiment_pattern(COMPARISONS),
    conda:
        ENV
    # No GPU asked for: the encoders only run forward over the analysis sentences, minutes on a CPU.
    threads: all_cores
    resources:
        mem_mb=8000,
        runtime=60,
    params:
        name=lambda w: w.name,
        experiments=compared,
        descriptions=lambda w: {
            exp: EXPERIMENTS[exp].get("description", "") for exp in compared(w)
        },
        lowercase=model_comparison_param("lowercase", compared),
        analysis_sentences=model_comparison_param("analysis_sentences", compared),
        device=model_comparison_param("device", compared),
    script:
        "../scripts/compare_models.py"
