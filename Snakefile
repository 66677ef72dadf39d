# headcount: which attention heads of a Transformer matter, what they do, how many can go.
# Voita et al. (ACL 2019) as a workflow; the method is in SPEC.md and README.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/translate.smk"
include: "workflow/rules/heads.smk"
include: "workflow/rules/syntax.smk"
include: "workflow/rules/prune.smk"
include: "workflow/rules/seeds.smk"


rule all:
    default_target: True
    input:
        [final_outputs(exp) for exp in config["run"]],
