from _common import job

from headcount.report.plots import gate_trajectory_figures

with job(snakemake) as log:
    w = snakemake.wildcards
    gate_trajectory_figures(snakemake.input[0], snakemake.output.png, snakemake.output.gif,
                            f"{w.exp}: P(gate closed), {w.setting} pruning, lambda {w.lam}")
