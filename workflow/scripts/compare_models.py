from _common import job

from headcount.report.model_comparison import ModelOutputs, ModelRun, compare_models

with job(snakemake) as log:
    names, i = snakemake.params.experiments, snakemake.input
    outputs = [ModelOutputs(name, i.baseline_scores[k], i.head_scores[k], i.roles[k]) for k, name in enumerate(names)]
    runs = {name: ModelRun(i.models[k], i.src_spm[k], i.analysis_src[k], snakemake.params.lowercase[name])
            for k, name in enumerate(names)}
    compare_models(
        name=snakemake.params.name,
        outputs=outputs,
        runs=runs,
        max_sentences=snakemake.params.analysis_sentences,
        out=dict(snakemake.output.items()),
        descriptions=snakemake.params.descriptions,
        device=snakemake.params.device,
        log=log,
    )
