from _common import job

from headcount.pipeline.role_finding import find_head_roles

with job(snakemake) as log:
    find_head_roles(
        model_path=snakemake.input.model,
        src_spm=snakemake.input.src_spm,
        parses_path=snakemake.input.parses,
        parses_info_path=snakemake.input.parses_info,
        analysis_src=snakemake.input.analysis_src,
        analysis_sentences=snakemake.params.analysis_sentences,
        analysis_label=snakemake.params.analysis_label,
        reference_treebanks=list(snakemake.input.reference_treebanks),
        train_src=snakemake.input.train_src,
        lowercase=snakemake.params.lowercase,
        settings=snakemake.params.roles,
        out=dict(snakemake.output.items()),
        head_scores_path=snakemake.input.head_scores,
        device=snakemake.params.device,
        log=log,
    )
