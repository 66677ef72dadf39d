from _common import job

from headcount.pipeline.role_finding import parse_analysis_sentences

with job(snakemake) as log:
    parse_analysis_sentences(
        parser=snakemake.params.parser,
        treebanks=list(snakemake.input.get("treebanks", [])),
        analysis_src=snakemake.input.get("analysis_src"),
        stanza_dir=snakemake.input.get("stanza"),
        lang=snakemake.params.lang,
        max_sentences=snakemake.params.max_sentences,
        out_path=snakemake.output.parses,
        info_path=snakemake.output.info,
        spacy_model=snakemake.params.spacy_model,
        analysis_sentences=snakemake.params.analysis_sentences,
        analysis_label=snakemake.params.analysis_label,
        log=log,
    )
