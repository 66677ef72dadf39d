from _common import job

from headcount.stages import parse_analysis_sentences

with job(snakemake) as log:
    parse_analysis_sentences(
        parser=snakemake.params.parser,
        treebanks=list(snakemake.input.get("treebanks", [])),
        analysis_src=snakemake.input.get("analysis_src"),
        stanza_dir=snakemake.input.get("stanza"),
        lang=snakemake.params.lang,
        max_sentences=snakemake.params.max_sentences,
        out_path=snakemake.output[0],
        log=log,
    )
