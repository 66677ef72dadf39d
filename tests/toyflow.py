"""The toy workflow the workflow tests share: its config, a runner, and a copy of the workflow.

One completed toy run (conftest's `smoke_run`, made once per session) serves the smoke checks,
the rerun plans and the kill-and-resume comparison: every full run of the DAG costs minutes on
two cores, most of it process start-up per job.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jobserver
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CORES = os.environ.get("HEADCOUNT_TEST_CORES", "2")


DRY = {"-n", "--dry-run", "--dryrun", "--lint", "--unlock", "--report", "--summary", "--list-rules"}


def snakemake(*args, cwd=REPO, env=None, timeout=600, snakefile=REPO / "Snakefile", plain=False):
    """Snakemake on the command line. Unless `plain` (a test of how Snakemake's or a job's own process
    behaves), Snakemake runs in a fork of a process that has imported it (tests/jobserver.py), and a
    run that executes jobs sends its script jobs to the warm interpreter of the job server."""
    args = list(map(str, args))
    env = {**os.environ, **(env or {})}
    if plain:
        cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), *args]
    else:
        env.pop(jobserver.ENV, None)
        if not DRY & set(args):
            env[jobserver.ENV] = start_server("jobs")
        client = jobserver.client_path(Path(start_server("snakemake")).parent)
        cmd = [str(client), "-m", "snakemake", "-s", str(snakefile), *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


_servers: dict = {}


def start_server(kind: str = "jobs") -> str:
    """The socket of this test process's server of `kind`, started on first use and stopped when the
    tests end: "jobs" imports torch and transformers once (about 10 CPU s), "snakemake" Snakemake
    and its plugins (2-3 CPU s)."""
    if kind not in _servers:
        import atexit
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix=f"headcount-{kind}-"))
        path = str(folder / "socket")
        process = subprocess.Popen([sys.executable, str(Path(jobserver.__file__)), "serve", path, kind],
                                   stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert process.stdout.readline().strip() == "ready", f"the {kind} server did not start"
        atexit.register(lambda: (process.kill(), shutil.rmtree(folder, ignore_errors=True)))
        _servers[kind] = path
    return _servers[kind]


def shipped_config() -> dict:
    with open(REPO / "config/config.yaml") as f:
        return yaml.safe_load(f)


def smoke_config(mirror: Path) -> dict:
    """A toy experiment: tiny model, a few hundred steps, the real rules end to end."""
    config = shipped_config()
    config["run"] = ["toy"]
    config["mirror"] = str(mirror)
    config["sources"] = {f"toy/{split}.{lang}.gz": {"url": f"https://example.org/toy/{split}.{lang}.gz"}
                         for split in ("train", "val", "test_2016_flickr") for lang in ("en", "de")}
    config["sources"]["toy/treebank.conllu"] = {"url": "https://example.org/toy/treebank.conllu"}
    config["defaults"]["roles"].update(treebanks=["toy/treebank.conllu"], min_instances=5)
    config["defaults"]["subwords"].update(src_vocab=100, tgt_vocab=100)
    config["defaults"]["model"].update(d_model=32, n_heads=4, d_ff=64, enc_layers=2, dec_layers=2, dropout=0.0,
                                       attn_dropout=0.0, max_len=64)
    config["defaults"]["training"].update(max_tokens=300, max_steps=200, warmup_steps=40, lr_scale=0.3,
                                          log_interval=20, eval_interval=100, checkpoint_interval=40,
                                          snapshot_interval=100, dev_bleu_sentences=40)
    config["defaults"]["decoding"].update(max_tokens=2000)
    config["defaults"]["heads"].update(ablation_bleu_sentences=20)
    config["defaults"]["prune"].update(
        # The default recipe (constant rate, then healing with gates fixed), with a short healing phase.
        lambdas={"enc": [0, 2.0], "all": [0, 0.5]}, from_scratch={"all": True}, michel_step=0.25, heal_steps=10,
        training={"max_steps": 40, "warmup_steps": 10, "lr_scale": 0.3, "log_interval": 10, "eval_interval": 20,
                  "checkpoint_interval": 10})
    config["experiments"] = {"toy": {
        "src_lang": "en", "tgt_lang": "de",
        "train": [{"src": "toy/train.en.gz", "tgt": "toy/train.de.gz"}],
        "dev": {"src": "toy/val.en.gz", "tgt": "toy/val.de.gz"},
        "test": {"test_2016_flickr": {"src": "toy/test_2016_flickr.en.gz", "tgt": "toy/test_2016_flickr.de.gz"}},
    }}
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def copy_workflow(dest: Path) -> Path:
    """The files that define the workflow, copied with their mtimes, so that a test may edit
    scripts or library code without touching the repository."""
    dest.mkdir(parents=True)
    shutil.copy2(REPO / "Snakefile", dest / "Snakefile")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("workflow", "src", "config", "envs"):
        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    return dest


def run_to(tmp_path: Path, config: dict, setting: str, label: str) -> Path:
    """The stages particular to an imported model, in a fresh copy of the workflow: the baseline's
    test scores, head scores, roles, and the lambda = 2 pruning run of `setting` to its physical
    export. -> the experiment's results directory."""
    workdir = copy_workflow(tmp_path / "wf")
    config_path = write_config(workdir / f"{label}.yaml", config)
    targets = [f"results/toy/{name}" for name in (
        "baseline/scores/test_2016_flickr.json", "heads/scores.parquet", "syntax/roles.csv",
        f"prune/{setting}/lambda_2/physical/model.pt")]
    start = time.perf_counter()
    result = snakemake(*targets, "--cores", CORES, "--configfile", config_path, cwd=workdir,
                       snakefile=workdir / "Snakefile", timeout=600)
    print(f"{label} workflow: {time.perf_counter() - start:.0f} s")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return workdir / "results/toy"


# What run_stages reads, made by the workflow: the imported model and tokenizer, the data, the parses.
STAGE_INPUTS = ("results/toy/baseline/model.pt", "results/toy/syntax/parses.parquet",
                *(f"results/toy/data/{name}.{side}.txt" for name in ("train", "dev", "test_2016_flickr")
                  for side in ("src", "tgt")))


def run_stages(results: Path, config: dict, setting: str, lams=(2.0,), *, report=False, export=True,
               log=None) -> dict:
    """The baseline's quality on the analysis set (rule lm_quality for a language model, translate and
    score for a translation model), then the rules score_heads, head_roles, prune_heads (`setting` at
    each of `lams`) and export_pruned of the pretrained experiment `toy`, called as their scripts call
    them, in this process, on what the workflow wrote to `results` (STAGE_INPUTS: the imported model
    and tokenizer, the data, the parses), with the experiment's settings as the workflow merges them
    (config/config.yaml, then `config`): the stages of a model kind whose wiring a whole-workflow run
    of another kind tests. With `report` (a language model), each pruned model's quality, rule
    lm_pruning_report's table and rule atlas's page too; without `export`, no export_pruned. `log`
    gets what the stages log.
    -> the baseline's scores (what the quality rule writes)."""
    import json

    from snakemake.utils import update_config

    from headcount.config import FINE_TUNING_KEYS, is_lm_experiment, load_experiments
    from headcount.pipeline.head_scores import score_heads
    from headcount.pipeline.lm_quality import lm_pruning_report, score_text
    from headcount.pipeline.pruning_runs import export_pruned, prune_heads
    from headcount.pipeline.role_finding import find_head_roles
    from headcount.pipeline.translation import translate_file
    from headcount.pruning.transformers_export import export_transformers
    from headcount.report.atlas.build import build_atlas
    from headcount.training.evaluate import score_file

    merged = shipped_config()
    update_config(merged, config)
    exp = load_experiments(merged, REPO / "workflow/schemas/config.schema.yaml")["toy"]
    split, n, device = exp["analysis"]["set"], exp["analysis"]["max_sentences"], exp["training"]["device"]
    heads, lowercase, roles = exp["heads"], exp["subwords"]["lowercase"], exp["roles"]
    assert roles["parser"] == "gold" or not roles["treebanks"], "no reference treebanks here (rule head_roles)"
    model, tokenizer = str(results / "baseline/model.pt"), str(results / "pretrained/tokenizer")
    data, log = results / "data", log or (lambda message: None)
    source, target = str(data / f"{split}.src.txt"), str(data / f"{split}.tgt.txt")
    language_model = is_lm_experiment(exp)
    # rule score_heads's `translations` (common.smk, lrp_text): what LRP teacher-forces
    translations = target if language_model else str(results / f"baseline/translations/{split}.txt")
    for folder in ("heads", "baseline/scores", "baseline/translations", "atlas"):
        (results / folder).mkdir(parents=True, exist_ok=True)

    def quality(model_dir: Path) -> dict:
        (model_dir / "scores").mkdir(parents=True, exist_ok=True)
        scores = model_dir / f"scores/{split}"
        return score_text(str(model_dir / "model.pt"), tokenizer, target, split, heads["max_tokens"],
                          f"{scores}.json", f"{scores}.nll.tsv", device=device, log=log)

    if language_model:
        record = quality(results / "baseline")
    else:  # rules translate and score
        translate_file(model, tokenizer, tokenizer, source, translations, decoding=exp["decoding"], device=device,
                       log=log)
        record = score_file(translations, target, lowercase, str(results / f"baseline/scores/{split}.json"),
                            extra={"split": split, "decoding": exp["decoding"]})
    score_heads(model, tokenizer, tokenizer, source, target, translations, n, heads["lrp_rule"], heads["ablation"],
                heads["ablation_bleu_sentences"], heads["max_tokens"], lowercase, str(results / "heads/scores.parquet"),
                str(results / "heads/scores.csv"), str(results / "heads/correlations.tsv"),
                str(results / "heads/lrp_conservation.tsv"), device=device, log=log)
    tables = {"roles": "roles.csv", "positional": "positional.csv", "syntactic": "syntactic.csv", "rare": "rare.csv",
              "table1": "table1.csv", "table1_md": "table1.md", "function_map": "function_map.png",
              "relative_positions": "relative_positions.png"}
    tables = {name: str(results / "syntax" / file) for name, file in tables.items()}
    find_head_roles(model, tokenizer, str(results / "syntax/parses.parquet"), str(data / "train.src.txt"), lowercase,
                    roles, tables, head_scores_path=str(results / "heads/scores.parquet"), device=device, log=log,
                    analysis_src=source, analysis_sentences=n, analysis_label=f"{split}[:{n}] of toy",
                    parses_info_path=str(results / "syntax/parses.json"), reference_treebanks=[])
    runs = [results / f"prune/{setting}/lambda_{lam:g}" for lam in lams]
    for lam, run in zip(lams, runs):
        prune_heads(model, str(data / "train.src.txt"), str(data / "train.tgt.txt"), str(data / "dev.src.txt"),
                    str(data / "dev.tgt.txt"), tokenizer, tokenizer, setting, lam,
                    {k: exp["prune"][k] for k in FINE_TUNING_KEYS if k in exp["prune"]}, exp["training"],
                    str(run / "train"), str(run / "model.pt"), str(run / "gates.json"), str(run / "trajectory.csv"),
                    log=log, lowercase=lowercase, baseline_checkpoint=str(results / "baseline/train/checkpoint.pt"))
        if export:
            summary = export_pruned(str(run / "model.pt"), str(run / "physical/model.pt"),
                                    str(run / "physical/summary.json"), log=log)
            summary["transformers"] = export_transformers(str(run / "model.pt"), str(run / "physical/transformers"),
                                                          tokenizer_dir=tokenizer, log=log)
            (run / "physical/summary.json").write_text(json.dumps(summary))
    if report:  # a language model's: no ranked method runs here (common.smk, lm_pruning_report_inputs)
        assert language_model and (exp["prune"]["eval_split"] or split) == split
        for run in runs:
            quality(run)
        baseline = results / f"baseline/scores/{split}"
        lm_pruning_report(f"{baseline}.json", f"{baseline}.nll.tsv", [str(run / "gates.json") for run in runs],
                          [str(run / f"scores/{split}.json") for run in runs],
                          [str(run / f"scores/{split}.nll.tsv") for run in runs], [],
                          str(results / "prune/pruning.tsv"), str(results / "prune/pruning.md"), "toy", log=log)
        atlas = exp["atlas"]
        build_atlas(str(results / "atlas/index.html"), str(results / "heads/scores.parquet"), model, tokenizer,
                    tokenizer, source, target, n, tables["roles"], tables["positional"], tables["syntactic"],
                    tables["rare"], str(results / "syntax/parses.parquet"), str(data / "train.src.txt"), roles,
                    str(results / "prune/pruning.tsv"), [str(run / "gates.json") for run in runs],
                    [str(run / "trajectory.csv") for run in runs], None, atlas["sentences"], atlas["best_sentences"],
                    lowercase, device, "toy", exp.get("description", ""), log=log)
    return record


def plan(workdir: Path, config: dict, *extra) -> dict[str, int]:
    """The jobs a run of the workflow copied into workdir would do now: rule -> count."""
    config_path = write_config(workdir / "plan.yaml", config)
    result = snakemake("-n", "--cores", "1", "--quiet", "rules", "--configfile", config_path, *extra,
                       cwd=workdir, snakefile=workdir / "Snakefile", timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    jobs = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit() and fields[0] != "total":
            jobs[fields[0]] = int(fields[1])
    print(f"plan with {' '.join(map(str, extra)) or 'no options'}: {jobs}")
    return jobs


def kill_when(process, ready, timeout: float, poll: float = 0.2) -> None:
    """SIGKILL the process group of a job started with start_new_session=True, as soon as
    ready() is true (it checks what the job has written so far)."""
    import signal
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None and not ready():
        time.sleep(poll)
    assert process.poll() is None, "the job ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
