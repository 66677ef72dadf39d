# headcount: which attention heads of a Transformer matter, what they do, how many can go.
# Voita et al. (ACL 2019) as a workflow; the method is in SPEC.md and README.md.
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from headcount.config import ConfigError, check_yaml_syntax

DEFAULT_CONFIG = "config/config.yaml"
# Snakemake's message for a YAML error names no file, line or column: check first. (A file
# given with --configfile is read by Snakemake before this file; see config/README.md.)
if Path(DEFAULT_CONFIG).is_file():
    try:
        check_yaml_syntax(DEFAULT_CONFIG)
    except ConfigError as error:
        raise WorkflowError(str(error)) from None


configfile: DEFAULT_CONFIG


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/synthetic.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/pretrained.smk"
include: "workflow/rules/translate.smk"
include: "workflow/rules/quality.smk"
include: "workflow/rules/heads.smk"
include: "workflow/rules/syntax.smk"
include: "workflow/rules/prune.smk"
include: "workflow/rules/head_counts.smk"
include: "workflow/rules/seeds.smk"
include: "workflow/rules/atlas.smk"
include: "workflow/rules/compare.smk"


# Snakemake does not pass SIGTERM or SIGINT on to running jobs when it alone receives one: it
# waited for them (hours of training) and held its lock. Passed on, training saves a checkpoint
# and every job stops, so the run ends in seconds and `--rerun-incomplete` resumes it.
onstart:
    from headcount.signals import pass_on_stop_signals

    pass_on_stop_signals()


rule all:
    """Everything the experiments in `run` produce: scores, head analyses, roles and pruning; the comparisons in `compare`."""
    default_target: True
    input:
        [final_outputs(exp) for exp in config["run"]],
        # Every experiment's head atlas, a language model's too (its role-type attention).
        [f"results/{exp}/atlas/index.html" for exp in config["run"]],
        # The comparisons of experiments' models (`compare`), where the config has any.
        comparison_outputs(),


rule existing_results:
    """Target for the report of a partial run: `snakemake --report report.html existing_results`."""
    input:
        existing_report_files,
    localrule: True
