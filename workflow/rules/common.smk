# Configuration: validated before any job runs; every rule reads its settings from EXPERIMENTS.
import os
import re
import sys
from pathlib import Path

from snakemake.io import strip_wildcard_constraints

sys.path.insert(0, str(Path(workflow.basedir) / "src"))
from headcount.config import (
    MIRROR_ENV,
    SYNTHETIC_TEST_SET,
    FETCHED_DIR,
    ConfigError,
    check_mirror,
    is_lm_experiment,
    is_pretrained,
    packaged_sha256,
    packaged_source,
    pretrained_files,
    pretrained_location,
    is_synthetic,
    lambda_label,
    load_experiments,
    pooled_sets,
    resolve_mirror,
    side_source,
    test_sets,
)
from headcount.config import (
    COMPARE_DIR,
    FINE_TUNING_KEYS,
    SEED_REPLICA,
    scratch_schedule,
    scratch_training,
)
from headcount.analysis.measures import MEASURES, score_names, score_undefined
from headcount.models.seq2seq import ATTENTION_TYPES
from headcount.pruning.methods import (
    SETTINGS,
    lm_settings,
    ranked_method,
    ranked_methods,
    ranked_pattern,
    settings_pattern,
)

try:
    EXPERIMENTS = load_experiments(
        config, Path(workflow.basedir) / "workflow/schemas/config.schema.yaml"
    )
    MIRROR = resolve_mirror(config)
    if MIRROR:
        check_mirror(MIRROR, config, [EXPERIMENTS[name] for name in config["run"]])
except ConfigError as error:
    raise WorkflowError(str(error)) from None

# Where a file was fetched from does not change it (checksums guard the content), so the mirror
# is no job parameter. Jobs (local, or on a cluster node, where this file is evaluated again) see
# it in the environment.
if MIRROR:
    os.environ[MIRROR_ENV] = MIRROR


def mirror_file(wildcards):
    """The mirror's file that a fetch copies, as the fetch's input: a fixed file in the mirror
    (newer than its copy) is then copied again, and what was built from it redone. Where the config
    pins a sha256 the copy's bytes are fixed by it, so the mirror file's date says nothing (a
    remounted or re-copied mirror is newer without being different): only a changed sha256, a
    change of params, copies it again."""
    if not MIRROR:
        return []
    path = f"{MIRROR}/{wildcards.source}"
    return (
        [ancient(path)] if config["sources"][wildcards.source].get("sha256") else [path]
    )


wildcard_constraints:
    exp="|".join(re.escape(name) for name in EXPERIMENTS),
    side="src|tgt",
    kind="|".join(ATTENTION_TYPES),
    model=rf"baseline|prune/({settings_pattern()})/lambda_[0-9][0-9.e+-]*(/scratch)?",
    setting=settings_pattern(),
    method=ranked_pattern(),
    lam=r"[0-9][0-9.e+-]*",
    score="[a-z_]+",
    split="|".join(
        ["dev"]
        + sorted({re.escape(t) for e in EXPERIMENTS.values() for t in test_sets(e)})
    ),


def experiment_pattern(names):
    """A wildcard constraint matching exactly these experiments (nothing if there are none)."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


# Experiments that generate their data (the positive control) and those that read corpora: each
# kind has its own rules for results/{exp}/data/.
SYNTHETIC_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if is_synthetic(e)
)
CORPUS_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if not is_synthetic(e)
)

# Experiments that analyse a pretrained model (`pretrained:`; rules/pretrained.smk imports it as
# their baseline) and those that train their own baseline (subwords, train_baseline).
PRETRAINED_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if is_pretrained(e)
)
TRAINED_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if not is_pretrained(e)
)
# Pretrained experiments with an `objective` (a sentence encoder's `sentence_embedding`): imported
# by their own rule, import_with_objective, so that import_pretrained's jobs keep the params they ran with.
OBJECTIVE_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if is_pretrained(e) and e.get("objective")
)
PLAIN_PRETRAINED_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if is_pretrained(e) and not e.get("objective")
)


# Experiments on a language model (`text:`; a causal or a masked one, the same DAG: only the
# imported model knows which) and on a translation model: quality is perplexity for the former
# (rules/quality.smk), translation and BLEU for the latter (rules/translate.smk).
LM_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if is_lm_experiment(e)
)
TRANSLATION_EXPERIMENTS = experiment_pattern(
    n for n, e in EXPERIMENTS.items() if not is_lm_experiment(e)
)


def is_lm(exp):
    """Whether the experiment named `exp` analyses a language model."""
    return is_lm_experiment(EXPERIMENTS[exp])


def exp_config(wildcards):
    return EXPERIMENTS[wildcards.exp]


def fetched(source):
    return f"{FETCHED_DIR}/{source}"


def side_spec(side):
    """What a script needs to read one corpus side: the fetched file, member and column."""
    if isinstance(side, str):
        return {"file": fetched(side)}
    return {
        "file": fetched(side["source"]),
        **{k: side[k] for k in ("member", "column") if k in side},
    }


def split_pair(exp, split):
    """The (src, tgt) sides of an evaluation split: 'dev' or a test set's name."""
    pair = exp["dev"] if split == "dev" else exp["test"][split]
    return pair["src"], pair["tgt"]


def test_splits(exp):
    return test_sets(EXPERIMENTS[exp])


# Pooled test sets (test: {name: {pool: [sets]}}) are the members' prepared files one after another.
POOLS = {name for e in EXPERIMENTS.values() for name in pooled_sets(e)}
POOLED_SPLITS = "|".join(re.escape(p) for p in sorted(POOLS)) or "(?!)"
UNPOOLED_SPLITS = "|".join(
    ["dev"]
    + sorted(
        {re.escape(t) for e in EXPERIMENTS.values() for t in test_sets(e)}
        - {re.escape(p) for p in POOLS}
    )
)


ENV = "../../envs/headcount.yaml"


def all_cores(wildcards):
    """Threads of a job that uses every core it is given: --cores (on a cluster, per job).

    Read when a job is planned, not when the rules are: commands that run nothing (--unlock,
    --dag, --summary, --report) then need no --cores, and Snakemake sets 1 for them."""
    return workflow.resource_settings.cores or workflow.cores


def configured_threads(wildcards, key):
    """Threads of a job from the experiment's `resources.<key>`, or every core it is given (0)."""
    cores = all_cores(wildcards)
    threads = exp_config(wildcards)["resources"][key]
    return min(threads, cores) if threads else cores


def training_threads(wildcards):
    """Threads of a training job: `resources.train_threads`, or every core it is given (0).

    One thread per job lets independent training runs (seeds, the lambda grid, from-scratch runs)
    share the cores side by side, which trains more tokens per second on a small CPU than one job
    on all of them (benchmarks/RESULTS.md, "Training jobs side by side")."""
    return configured_threads(wildcards, "train_threads")


def evaluation_threads(wildcards):
    """Threads of a job that runs a trained model without training it (decoding, head scores,
    roles, Michel curves, snapshot statistics, perplexity): `resources.eval_threads`, or every core
    it is given (0).

    On a GPU machine such a job leaves its cores idle; with every core reserved, the many small
    decoding jobs after a training ran one at a time there (benchmarks/RESULTS.md, "The demo DAG
    on a GPU, to the end")."""
    return configured_threads(wildcards, "eval_threads")


# The GPU type to ask a SLURM cluster for (profiles/slurm): only jobs that ask for a GPU name
# it, since the plugin turns a model with 0 GPUs into --gpus=<model>:0.
GPU_MODEL_ENV = "HEADCOUNT_SLURM_GPU_MODEL"


def gpu_count(wildcards):
    return exp_config(wildcards)["resources"]["gpu"]


def gpu_model(wildcards):
    """The `gpu_model` resource: $HEADCOUNT_SLURM_GPU_MODEL for a job that asks for a GPU, else none."""
    model = os.environ.get(GPU_MODEL_ENV)
    return model if model and gpu_count(wildcards) else None


def existing_report_files(wildcards):
    """Every file that a rule marks with report() and that exists now."""
    found = []
    for r in workflow.rules:
        for pattern in r.output:
            if "report" in pattern.flags:
                values = glob_wildcards(str(pattern))._asdict()
                if values:
                    plain = strip_wildcard_constraints(str(pattern))
                    found += expand(plain, zip, **values)
                elif Path(pattern).exists():
                    found.append(str(pattern))
    return sorted(set(found))


def log_path(name):
    return f"results/{{exp}}/logs/{name}.log"


def benchmark_path(name):
    return f"results/{{exp}}/benchmarks/{name}.tsv"


def training_inputs(wildcards):
    exp = exp_config(wildcards)
    return sorted(
        {fetched(side_source(pair[s])) for pair in exp["train"] for s in ("src", "tgt")}
    )


def pretrained_tokenizer(exp):
    """Where the import_pretrained rule writes a pretrained model's tokenizer (a directory)."""
    return f"results/{exp}/pretrained/tokenizer"


def tokenizer(side):
    """A rule's `src_spm`/`tgt_spm` input (side: src or tgt): headcount's sentencepiece model of that
    language, or a pretrained experiment's tokenizer directory (subwords.open_tokenizer opens both).
    """

    def path(wildcards):
        return tokenizer_path(wildcards.exp, side)

    return path


def tokenizer_path(exp, side):
    """The `tokenizer(side)` input of the experiment named `exp`."""
    if is_pretrained(EXPERIMENTS[exp]):
        return pretrained_tokenizer(exp)
    return f"results/{exp}/subwords/{side}.model"


def export_tokenizer(wildcards):
    """A pretrained experiment's tokenizer, which the transformers export carries; none otherwise."""
    if is_pretrained(EXPERIMENTS[wildcards.exp]):
        return pretrained_tokenizer(wildcards.exp)
    return []


def pretrained_source(wildcards):
    """A pretrained model's local files as the import's input (a changed model is imported
    again); a hub id is no file, and is a parameter only."""
    return pretrained_files(exp_config(wildcards))


def parse_inputs(wildcards):
    roles = exp_config(wildcards)["roles"]
    # A synthetic experiment: the grammar's own parses of the analysis set.
    if is_synthetic(exp_config(wildcards)):
        analysis = exp_config(wildcards)["analysis"]["set"]
        return {"treebanks": [f"results/{wildcards.exp}/data/{analysis}.conllu"]}
    if roles["parser"] == "gold":
        return {"treebanks": [fetched(t) for t in roles["treebanks"]]}
    analysis = exp_config(wildcards)["analysis"]["set"]
    if roles["parser"] == "spacy":  # an installed pipeline package: nothing to fetch
        return {"analysis_src": f"results/{wildcards.exp}/data/{analysis}.src.txt"}
    models = (
        roles["stanza_dir"] or f"resources/stanza/{exp_config(wildcards)['src_lang']}"
    )
    return {
        "analysis_src": f"results/{wildcards.exp}/data/{analysis}.src.txt",
        "stanza": models,
    }


def analysis_src(wildcards):
    """The source side of the experiment's analysis set (positional and rare-token statistics)."""
    return f"results/{wildcards.exp}/data/{exp_config(wildcards)['analysis']['set']}.src.txt"


def reference_treebanks(wildcards):
    """Gold treebanks read beside a parser's in-domain parses, as a cross-check (none for gold)."""
    roles = exp_config(wildcards)["roles"]
    return [] if roles["parser"] == "gold" else [fetched(t) for t in roles["treebanks"]]


def analysis_label(wildcards):
    """How the role tables name the analysis set, e.g. 'dev[:500] of multi30k_en_de'."""
    analysis = exp_config(wildcards)["analysis"]
    return f"{analysis['set']}[:{analysis['max_sentences']}] of {wildcards.exp}"


def head_figures(exp):
    """The head-score heatmaps an experiment's settings produce, as (score, kind of attention):
    every registered measure's score (headcount.measures; ablation's only if run) for every
    attention type, and ablation's BLEU impact for encoder heads. One job draws them all into
    heads/figures/heatmaps/<score>.<kind>.png."""
    settings = EXPERIMENTS[exp]["heads"]
    figures = [
        [score, kind]
        for score in score_names(optional=settings["ablation"])
        for kind in ATTENTION_TYPES
    ]
    if settings["ablation"] and settings["ablation_bleu_sentences"]:
        figures.append([MEASURES["ablation"].columns[1], "enc_self"])
    return figures


def prune_eval_split(exp):
    """The test set pruned models are compared on."""
    return EXPERIMENTS[exp]["prune"]["eval_split"] or test_splits(exp)[0]


def pruned_models(exp, setting):
    """The model directories of one setting's lambda grid."""
    grid = EXPERIMENTS[exp]["prune"]["lambdas"].get(setting, [])
    return [f"prune/{setting}/lambda_{lambda_label(lam)}" for lam in grid]


def scratch_models(exp, setting):
    """The pruned models of a setting that are also trained from scratch."""
    choice = EXPERIMENTS[exp]["prune"]["from_scratch"].get(setting, False)
    chosen = {lambda_label(lam) for lam in (choice if isinstance(choice, list) else [])}
    return [
        m
        for m in pruned_models(exp, setting)
        if m.rsplit("lambda_", 1)[1] != lambda_label(0)  # the control prunes nothing
        and (choice is True or m.rsplit("lambda_", 1)[1] in chosen)
    ]


def prune_settings(exp):
    """The settings an experiment prunes with: those with a grid, of the model's (a language model
    has "all" only: an `enc` grid in `defaults` does not apply to it)."""
    settings = lm_settings() if is_lm(exp) else SETTINGS
    return [s for s in settings if EXPERIMENTS[exp]["prune"]["lambdas"].get(s)]


def extra_seeds(exp):
    """Seeds besides training.seed (the main run): each an experiment of its own (seed_experiment)."""
    main = EXPERIMENTS[exp]["training"]["seed"]
    return [s for s in EXPERIMENTS[exp]["seeds"] if s != main]


def seed_experiment(exp, seed):
    """The experiment that runs `seed`: exp itself for training.seed, else its replica
    (headcount.config.seed_replicas)."""
    if seed == EXPERIMENTS[exp]["training"]["seed"]:
        return exp
    return SEED_REPLICA.format(name=exp, seed=seed)


def seed_runs(exp):
    """The experiment of each seed of `exp`, in the order of its `seeds`."""
    return [seed_experiment(exp, s) for s in EXPERIMENTS[exp]["seeds"]]


# Replicas and the experiment each copies its data, subwords and parses from (seeds.smk).
REPLICA_OF = {
    name: exp["replica_of"]
    for name, exp in EXPERIMENTS.items()
    if exp.get("replica_of")
}


def seed_spread_inputs(wildcards):
    exp, split = wildcards.exp, prune_eval_split(wildcards.exp)
    runs = seed_runs(exp)
    return {
        "baselines": [f"results/{run}/baseline/scores/{split}.json" for run in runs],
        "controls": [
            f"results/{run}/prune/{setting}/lambda_0/scores/{split}.json"
            for setting in prune_settings(exp)
            for run in runs
        ],
        # Translations and references: each seed's control - baseline gets its bootstrap interval.
        "references": f"results/{exp}/data/{split}.tgt.txt",
        "baseline_translations": [
            f"results/{run}/baseline/translations/{split}.txt" for run in runs
        ],
        "control_translations": [
            f"results/{run}/prune/{setting}/lambda_0/translations/{split}.txt"
            for setting in prune_settings(exp)
            for run in runs
        ],
        # the plateau rule on each baseline's dev losses; control - baseline in token NLL
        "baseline_training": [f"results/{run}/baseline/training.json" for run in runs],
        "baseline_nll": [
            f"results/{run}/baseline/scores/{split}.nll.tsv" for run in runs
        ],
        "control_nll": [
            f"results/{run}/prune/{setting}/lambda_0/scores/{split}.nll.tsv"
            for setting in prune_settings(exp)
            for run in runs
        ],
    }


def seed_pruning_tables(exp):
    """Each seed's pruning table, in the order of the experiment's `seeds`."""
    return [f"results/{run}/prune/pruning.tsv" for run in seed_runs(exp)]


def claims_over_seeds_inputs(wildcards):
    """Each seed's pruning table and heads kept per layer, from which the seeds' verdicts are
    judged on the lambdas all seeds ran, and the positive control's heads kept per layer.
    """
    runs = seed_runs(wildcards.exp)
    return {
        "pruning": seed_pruning_tables(wildcards.exp),
        "layers": [f"results/{run}/prune/layer_survival.tsv" for run in runs],
        **control_layers_input(wildcards.exp),
    }


def matched_runs(exp):
    """Every pruning run of every seed of `exp`, for the findings at matched head counts: its seed,
    setting, lambda, gates, and the translations and reference NLL of it, its setting's control and
    its from-scratch twin (where trained) on the set pruned models are compared on."""
    split = prune_eval_split(exp)
    runs = []
    for seed, run in zip(EXPERIMENTS[exp]["seeds"], seed_runs(exp)):
        for setting in prune_settings(run):
            models = pruned_models(run, setting)
            control = next(
                (m for m in models if m.rsplit("lambda_", 1)[1] == lambda_label(0)),
                None,
            )
            twins = set(scratch_models(run, setting))
            for m in models:
                if m == control or control is None:
                    continue

                def files(model):
                    return {
                        "hyps": f"results/{run}/{model}/translations/{split}.txt",
                        "nll": f"results/{run}/{model}/scores/{split}.nll.tsv",
                    }

                runs.append(
                    {
                        "seed": seed,
                        "setting": setting,
                        "lam": float(m.rsplit("lambda_", 1)[1]),
                        "gates": f"results/{run}/{m}/gates.json",
                        "pruned": files(m),
                        "control": files(control),
                        **({"scratch": files(f"{m}/scratch")} if m in twins else {}),
                    }
                )
    return runs


def matched_inputs(wildcards):
    """The files matched_runs names, the references they are scored against, and the seeds' spread."""
    exp = wildcards.exp
    paths = {
        path
        for r in matched_runs(exp)
        for path in [
            r["gates"],
            *(
                f
                for part in ("pruned", "control", "scratch")
                for f in r.get(part, {}).values()
            ),
        ]
    }
    return {
        "runs": sorted(paths),
        "references": f"results/{exp}/data/{prune_eval_split(exp)}.tgt.txt",
        # each seed's control - baseline: the control's check of its baseline
        "spread": f"results/{exp}/seeds/spread.tsv",
    }


def control_layers_input(exp):
    """The positive control's heads kept per layer, evidence for "specialised heads last", where
    the experiment names a control."""
    control = EXPERIMENTS[exp].get("positive_control")
    return (
        {"control_layers": f"results/{control}/prune/layer_survival.tsv"}
        if control
        else {}
    )


def final_outputs(exp):
    """What `rule all` builds for one experiment."""
    syntax = ["roles.csv", "table1.md", "function_map.png", "relative_positions.png"]
    if is_lm(exp):
        return [
            f"results/{exp}/baseline/scores.tsv",
            f"results/{exp}/heads/correlations.tsv",
            f"results/{exp}/heads/figures/heatmaps",
            *(f"results/{exp}/syntax/{name}" for name in syntax),
            *(
                [f"results/{exp}/prune/pruning.tsv", f"results/{exp}/prune/pruning.md"]
                if prune_settings(exp)
                else []
            ),
        ]
    return [
        f"results/{exp}/baseline/scores.tsv",
        f"results/{exp}/heads/correlations.tsv",
        f"results/{exp}/heads/figures/heatmaps",
        *(
            [f"results/{exp}/heads/figures/specialisation.png"]
            if EXPERIMENTS[exp]["training"].get("snapshot_interval", 0)
            else []
        ),
        *(f"results/{exp}/syntax/{name}" for name in syntax),
        *(
            [f"results/{exp}/prune/pruning.tsv", f"results/{exp}/prune/table2.md"]
            if prune_settings(exp)
            else []
        ),
        *(
            [
                f"results/{exp}/seeds/spread.tsv",
                f"results/{exp}/seeds/claims.md",
                f"results/{exp}/seeds/matched.md",
                f"results/{exp}/seeds/runs_over_seeds.png",
                f"results/{exp}/seeds/heads.md",
            ]
            if extra_seeds(exp)
            else []
        ),
        # each other seed's own results (an experiment of its own)
        *(
            path
            for seed in extra_seeds(exp)
            for path in final_outputs(seed_experiment(exp, seed))
        ),
        *(
            [f"results/{exp}/control/planted_vs_found.md"]
            if is_synthetic(EXPERIMENTS[exp])
            else []
        ),
    ]


def prune_job_settings(wildcards):
    """What a pruning run depends on: not the grid itself, so extending it reruns nothing."""
    prune = exp_config(wildcards)["prune"]
    # Optional keys only where set: a run from before such a key keeps its params.
    return {k: prune[k] for k in FINE_TUNING_KEYS if k in prune}


def pruning_report_inputs(wildcards):
    exp, split = wildcards.exp, prune_eval_split(wildcards.exp)
    settings = prune_settings(exp)
    models = {s: pruned_models(exp, s) for s in settings}
    return {
        "baseline": f"results/{exp}/baseline/scores/{split}.json",
        "gates": [f"results/{exp}/{m}/gates.json" for s in settings for m in models[s]],
        "pruned": [
            f"results/{exp}/{m}/scores/{split}.json"
            for s in settings
            for m in models[s]
        ],
        "scratch": [
            f"results/{exp}/{m}/scratch/scores/{split}.json"
            for s in settings
            for m in scratch_models(exp, s)
        ],
        # Every ranked method's curve per setting (pruning.methods), in the registry's order.
        "ranked": [
            f"results/{exp}/prune/{s}/{m}.tsv"
            for m in ranked_methods()
            for s in settings
        ],
        "ranked_translations": [
            f"results/{exp}/prune/{s}/{m}_translations.jsonl"
            for m in ranked_methods()
            for s in settings
        ],
        "trajectories": [
            f"results/{exp}/{m}/gates.png" for s in settings for m in models[s]
        ],
        "roles": f"results/{exp}/syntax/roles.csv",
        # the positive control's heads kept per layer, evidence for "specialised heads last"
        **control_layers_input(exp),
        # for the paired bootstrap intervals and the matched budgets
        "references": f"results/{exp}/data/{split}.tgt.txt",
        "baseline_translations": f"results/{exp}/baseline/translations/{split}.txt",
        "pruned_translations": [
            f"results/{exp}/{m}/translations/{split}.txt"
            for s in settings
            for m in models[s]
        ],
        "scratch_translations": [
            f"results/{exp}/{m}/scratch/translations/{split}.txt"
            for s in settings
            for m in scratch_models(exp, s)
        ],
        "baseline_training": f"results/{exp}/baseline/training.json",
        "scratch_training": [
            f"results/{exp}/{m}/scratch/training.json"
            for s in settings
            for m in scratch_models(exp, s)
        ],
        # each reference's NLL under every model: paired NLL intervals beside BLEU's
        "baseline_nll": f"results/{exp}/baseline/scores/{split}.nll.tsv",
        "pruned_nll": [
            f"results/{exp}/{m}/scores/{split}.nll.tsv"
            for s in settings
            for m in models[s]
        ],
        "scratch_nll": [
            f"results/{exp}/{m}/scratch/scores/{split}.nll.tsv"
            for s in settings
            for m in scratch_models(exp, s)
        ],
    }


def exp_ranked_methods(exp):
    """The ranked methods with a curve in a language-model experiment: those whose score column
    its model gets (a sentence encoder has no Michel importance: measures.score_undefined).
    """
    objective = EXPERIMENTS[exp].get("objective")
    return [
        m
        for m in ranked_methods()
        if not score_undefined(ranked_method(m).score, objective)
    ]


def lm_pruning_report_inputs(wildcards):
    """A language model's pruned models and ranked curves with the baseline's perplexity."""
    exp, split = wildcards.exp, prune_eval_split(wildcards.exp)
    models = [m for s in prune_settings(exp) for m in pruned_models(exp, s)]
    return {
        "baseline": f"results/{exp}/baseline/scores/{split}.json",
        "baseline_nll": f"results/{exp}/baseline/scores/{split}.nll.tsv",
        "gates": [f"results/{exp}/{m}/gates.json" for m in models],
        "pruned": [f"results/{exp}/{m}/scores/{split}.json" for m in models],
        "pruned_nll": [f"results/{exp}/{m}/scores/{split}.nll.tsv" for m in models],
        "ranked": [
            f"results/{exp}/prune/{s}/{m}.tsv"
            for m in exp_ranked_methods(exp)
            for s in prune_settings(exp)
        ],
    }


def lrp_text(wildcards):
    """What LRP teacher-forces: the baseline's own translations of the analysis set, or a
    language model's analysis text itself."""
    split = exp_config(wildcards)["analysis"]["set"]
    if is_lm(wildcards.exp):
        return f"results/{wildcards.exp}/data/{split}.tgt.txt"
    return f"results/{wildcards.exp}/baseline/translations/{split}.txt"


# The comparisons of experiments' models (`compare`; rules/compare.smk): name -> experiments.
COMPARISONS = config.get("compare") or {}


def comparison_outputs():
    """The outputs of every comparison (the `all` target's): each one's table and its markdown."""
    return [
        f"results/{COMPARE_DIR}/{name}/comparison.{ext}"
        for name in COMPARISONS
        for ext in ("tsv", "md")
    ]


def compared(wildcards):
    """The experiments of a comparison, in its table's order."""
    return COMPARISONS[wildcards.name]


def comparison_inputs(wildcards):
    """Each compared experiment's scores, head scores and roles, and what running its model over the
    analysis sentences reads (the model, its source tokenizer, the analysis set)."""
    return model_comparison_inputs(compared(wildcards))


def model_comparison_inputs(exps):
    """What report.model_comparison reads of each experiment in `exps` (a comparison's, or an
    experiment's seeds)."""

    def each(pattern):
        return [pattern.format(exp=exp) for exp in exps]

    return {
        "baseline_scores": each("results/{exp}/baseline/scores.tsv"),
        "head_scores": each("results/{exp}/heads/scores.csv"),
        "roles": each("results/{exp}/syntax/roles.csv"),
        "models": each("results/{exp}/baseline/model.pt"),
        "src_spm": [tokenizer_path(exp, "src") for exp in exps],
        "analysis_src": [
            f"results/{exp}/data/{EXPERIMENTS[exp]['analysis']['set']}.src.txt"
            for exp in exps
        ],
    }


def model_comparison_settings(exps):
    """What compare_models.py takes of the settings of the experiments in `exps` (a comparison's,
    or an experiment's seeds): each one's lowercasing (its BLEU), and the first one's analysis size
    (the same for all, config.py checks) and device, which the job runs the models on.
    """
    first = EXPERIMENTS[exps[0]]
    return {
        "lowercase": {exp: EXPERIMENTS[exp]["subwords"]["lowercase"] for exp in exps},
        "analysis_sentences": first["analysis"]["max_sentences"],
        "device": first["training"]["device"],
    }


def model_comparison_param(name, experiments_of):
    """The param `name` of model_comparison_settings for the experiments experiments_of(wildcards)."""
    return lambda wildcards: model_comparison_settings(experiments_of(wildcards))[name]


def seed_runs_of(wildcards):
    """The experiment of each seed of the wildcards' experiment (seed_runs)."""
    return seed_runs(wildcards.exp)
