from _common import job

from headcount.report.atlas.build import build_atlas


def optional(files):
    """A named input that holds one file or none."""
    return files[0] if len(files) else None


with job(snakemake) as log:
    build_atlas(
        out_html=snakemake.output[0],
        head_scores=snakemake.input.head_scores,
        model=snakemake.input.model,
        src_spm=snakemake.input.src_spm,
        tgt_spm=snakemake.input.tgt_spm,
        analysis_src=snakemake.input.analysis_src,
        analysis_tgt=snakemake.input.analysis_tgt,
        analysis_sentences=snakemake.params.analysis_sentences,
        roles=snakemake.input.roles,
        positional=snakemake.input.positional,
        syntactic=snakemake.input.syntactic,
        rare=snakemake.input.rare,
        parses=snakemake.input.parses,
        train_src=snakemake.input.train_src,
        role_settings=snakemake.params.roles,
        pruning=optional(snakemake.input.pruning),
        gates=list(snakemake.input.gates),
        trajectories=list(snakemake.input.trajectories),
        planted=optional(snakemake.input.planted),
        sentences=snakemake.params.atlas["sentences"],
        best_sentences=snakemake.params.atlas["best_sentences"],
        lowercase=snakemake.params.lowercase,
        device=snakemake.params.device,
        experiment=snakemake.wildcards.exp,
        description=snakemake.params.description,
        log=log,
    )
