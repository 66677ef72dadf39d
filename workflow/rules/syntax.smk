# What heads do: dependency parses (gold treebanks, spaCy or stanza), then positional, syntactic and
# rare-token encoder heads, Table 1, the head function map and relative positions.


rule download_stanza_models:
    """Download the stanza models of a language, for parsing when no gold treebank is used."""
    output:
        directory("resources/stanza/{lang}"),
    log:
        "resources/logs/stanza_{lang}.log",
    conda:
        ENV
    resources:
        mem_mb=2000,
        runtime=60,
    script:
        "../scripts/download_stanza_models.py"


rule parse_analysis_sentences:
    """Dependency parses for the syntactic heads: gold treebanks, or spaCy's or stanza's parses of the analysis set; parses.json names the text and the parser."""
    input:
        unpack(parse_inputs),
    output:
        parses="results/{exp}/syntax/parses.parquet",
        info="results/{exp}/syntax/parses.json",
    log:
        log_path("parse_analysis_sentences"),
    conda:
        ENV
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        parser=lambda w: exp_config(w)["roles"]["parser"],
        spacy_model=lambda w: exp_config(w)["roles"]["spacy_model"],
        max_sentences=lambda w: exp_config(w)["roles"]["max_sentences"],
        analysis_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        analysis_label=analysis_label,
        lang=lambda w: exp_config(w)["src_lang"],
    script:
        "../scripts/parse_analysis_sentences.py"


rule head_roles:
    """Positional, syntactic and rare-token encoder heads; Table 1, function map, relative positions."""
    input:
        model="results/{exp}/baseline/model.pt",
        src_spm=tokenizer("src"),
        parses="results/{exp}/syntax/parses.parquet",
        parses_info="results/{exp}/syntax/parses.json",
        analysis_src=analysis_src,
        reference_treebanks=reference_treebanks,
        train_src="results/{exp}/data/train.src.txt",
        head_scores="results/{exp}/heads/scores.parquet",
    output:
        roles="results/{exp}/syntax/roles.csv",
        positional="results/{exp}/syntax/positional.csv",
        syntactic="results/{exp}/syntax/syntactic.csv",
        rare="results/{exp}/syntax/rare.csv",
        table1="results/{exp}/syntax/table1.csv",
        table1_md=report(
            "results/{exp}/syntax/table1.md",
            caption="../report/table1.rst",
            category="Head roles",
            subcategory="{exp}",
        ),
        function_map=report(
            "results/{exp}/syntax/function_map.png",
            caption="../report/function_map.rst",
            category="Head roles",
            subcategory="{exp}",
        ),
        relative_positions=report(
            "results/{exp}/syntax/relative_positions.png",
            caption="../report/relative_positions.rst",
            category="Head roles",
            subcategory="{exp}",
        ),
    log:
        log_path("head_roles"),
    benchmark:
        benchmark_path("head_roles")
    conda:
        ENV
    threads: evaluation_threads
    resources:
        gpu=gpu_count,
        gpu_model=gpu_model,
        mem_mb=8000,
        runtime=120,
    params:
        roles=lambda w: exp_config(w)["roles"],
        analysis_sentences=lambda w: exp_config(w)["analysis"]["max_sentences"],
        analysis_label=analysis_label,
        lowercase=lambda w: exp_config(w)["subwords"]["lowercase"],
        device=lambda w: exp_config(w)["training"]["device"],
    script:
        "../scripts/head_roles.py"
