"""The workflow recovers and explains itself: Snakemake's own commands without --cores, a report of
a partial run, rules that say what they do, a fixed mirror file copied again, a checksum failure
not retried, the GPU request of a CPU-only experiment on SLURM, a broken config file located.

Snakemake commands that run no job are run in one Python process (snakemake.cli.main, what the
`snakemake` command calls), each with its own arguments: a process per command would cost seconds
of start-up each.
"""

import copy
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import toyflow
from conftest import make_toy_mirror, write_gz

from headcount.config import MIRROR_ENV
from headcount.io import sha256_file

MARK = "@@ command"

RUNNER = f"""
import contextlib, json, os, sys
from snakemake.cli import main
for cwd, args in json.loads(sys.argv[1]):
    os.chdir(cwd)
    try:
        main(args)
        code = 0
    except SystemExit as exit:
        code = exit.code
    for stream in (sys.stdout, sys.stderr):
        print("\\n{MARK}", code, file=stream, flush=True)
"""


def run_commands(commands: list[tuple[Path, list[str]]], env: dict) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each `snakemake <args>` run in its directory."""
    commands = [(str(cwd), list(map(str, args))) for cwd, args in commands]
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(commands)], capture_output=True,
                            text=True, timeout=600, env={**os.environ, **env})
    outs = re.split(rf"^{MARK} (\S+)\n", result.stdout, flags=re.M)
    errs = re.split(rf"^{MARK} \S+\n", result.stderr, flags=re.M)
    assert len(errs) == len(commands) + 1, result.stderr[-3000:]
    return [(int(outs[2 * i + 1]), outs[2 * i], errs[i]) for i in range(len(commands))]


def resources_of(dry_run: str, rule: str, exp: str) -> dict[str, str]:
    """The resources a dry run lists for the job of `rule` for experiment `exp`."""
    for block in dry_run.split("\nrule ")[1:]:
        if block.startswith(f"{rule}:") and re.search(rf"wildcards: exp={exp}\b", block):
            line = re.search(r"resources: (.*)", block).group(1)
            return dict(item.split("=", 1) for item in line.split(", "))
    raise AssertionError(f"no {rule} job for {exp} in the dry run:\n{dry_run[-3000:]}")


COMMANDS_WITHOUT_CORES = ["--unlock", "--dag", "--rulegraph", "--summary", "--detailed-summary"]
# A partial run: the baseline scored and the heads scored, nothing of roles or pruning.
PARTIAL = ["results/toy/baseline/scores.tsv", "results/toy/heads/correlations.tsv",
           "results/toy/heads/figures/heatmaps"]


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """What Snakemake's commands print on the toy workflow, keyed by a short name."""
    root = tmp_path_factory.mktemp("commands")
    workdir = toyflow.copy_workflow(root / "wf")
    config = toyflow.smoke_config(make_toy_mirror(root))
    # A second experiment that asks for a GPU, beside the toy one that asks for none.
    config["experiments"]["toy_gpu"] = {**copy.deepcopy(config["experiments"]["toy"]), "resources": {"gpu": 1}}
    smoke = toyflow.write_config(workdir / "smoke.yaml", config)
    for path in PARTIAL[:2]:
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_bytes(b"score\t1\n")
    heatmaps = workdir / PARTIAL[2]  # the heatmaps folder with its 13 figures
    heatmaps.mkdir(parents=True)
    for score in ("confidence", "lrp", "michel", "delta_loss"):
        for kind in ("enc_self", "dec_self", "dec_enc"):
            (heatmaps / f"{score}.{kind}.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (heatmaps / "delta_bleu.enc_self.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    broken = toyflow.copy_workflow(root / "broken")
    text = (broken / "config/config.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text) if t.startswith("run:"))
    text[line] = "run: [multi30k_en_de"  # an unclosed list
    (broken / "config/config.yaml").write_text("\n".join(text) + "\n")

    named = {args: (workdir, [args, "--configfile", smoke]) for args in COMMANDS_WITHOUT_CORES}
    named["report"] = (workdir, ["--report", "report.html", "existing_results", "--configfile", smoke])
    named["list-rules"] = (workdir, ["--list-rules", "--configfile", smoke])
    named["gpu"] = (workdir, ["-n", "--profile", toyflow.REPO / "profiles/slurm", "results/toy/baseline/model.pt",
                              "results/toy_gpu/baseline/model.pt", "--configfile", smoke])
    named["broken-config"] = (broken, ["-n"])
    results = run_commands(list(named.values()), env={"HEADCOUNT_SLURM_GPU_MODEL": "a100"})
    return {"workdir": workdir, "broken_line": line + 1, **dict(zip(named, results))}


@pytest.mark.parametrize("command", COMMANDS_WITHOUT_CORES)
@pytest.mark.slow
def test_commands_that_run_nothing_need_no_cores(commands, command):
    code, out, err = commands[command]
    assert code == 0, err[-3000:]
    assert "total number of cores" not in err


@pytest.mark.slow
def test_a_report_of_a_partial_run_holds_what_exists(commands):
    code, out, err = commands["report"]
    assert code == 0, err[-3000:]
    html = (commands["workdir"] / "report.html").read_text()
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html, flags=re.S).group(1))
    heatmaps = [path for path in results if path.startswith(PARTIAL[2] + "/")]  # the folder's figures
    assert sorted(set(results) - set(heatmaps)) == sorted(PARTIAL[:2])
    assert len(heatmaps) == 13 and all(path.endswith(".png") for path in heatmaps)


@pytest.mark.slow
def test_every_rule_says_what_it_does(commands):
    """`snakemake --list-rules` prints each rule as `name (docstring)`."""
    code, out, err = commands["list-rules"]
    assert code == 0, err[-3000:]
    files = [commands["workdir"] / "Snakefile", *sorted((commands["workdir"] / "workflow/rules").glob("*.smk"))]
    rules = [name for path in files for name in re.findall(r"^rule (\w+):", path.read_text(), flags=re.M)]
    assert len(rules) > 15
    bare = [name for name in rules if not re.search(rf"^{name} \(\S", out + err, flags=re.M)]
    assert bare == [], "no docstring in `snakemake --list-rules` (or a rules file the Snakefile does not include)"


@pytest.mark.slow
def test_slurm_asks_for_a_gpu_model_only_with_gpus(commands):
    utils = pytest.importorskip("snakemake_executor_plugin_slurm.utils")
    code, out, err = commands["gpu"]
    assert code == 0, err[-3000:]

    class Job:
        def __init__(self, resources):
            self.resources = type("Resources", (dict,), {"__getattr__": dict.__getitem__})(resources)

    cpu = resources_of(err + out, "train_baseline", "toy")
    gpu = resources_of(err + out, "train_baseline", "toy_gpu")
    assert "gpu_model" not in cpu and utils.set_gres_string(Job({**cpu, "gpu": 0})) == ""
    assert utils.set_gres_string(Job({**gpu, "gpu": 1})) == " --gpus=a100:1"


@pytest.mark.slow
def test_a_yaml_error_in_the_config_names_file_line_and_column(commands):
    code, out, err = commands["broken-config"]
    assert code != 0
    # The parser notices the unclosed list lines later, and names where it started.
    message = re.search(r"config/config.yaml:(\d+):(\d+): not valid YAML: (.*)", out + err)
    assert message, (out + err)[-2000:]
    assert int(message.group(1)) > commands["broken_line"]
    assert f"at line {commands['broken_line']}, column 6" in message.group(3)


@pytest.mark.workflow
def test_a_fixed_mirror_file_is_copied_again_a_pinned_one_is_not_and_a_bad_checksum_fails_at_once(tmp_path):
    """One run of four fetches: a copy older than its mirror file, a checksum that does not
    match (with --retries 2 given), a mirror file of random bytes named .gz, and a copy older than
    its mirror file whose checksum the config pins (left alone)."""
    workdir = toyflow.copy_workflow(tmp_path / "wf")
    mirror = make_toy_mirror(tmp_path)
    config = toyflow.smoke_config(mirror)
    config["sources"]["toy/val.de.gz"]["sha256"] = "0" * 64
    smoke = toyflow.write_config(workdir / "smoke.yaml", config)
    stale = workdir / "resources/data/toy/val.en.gz"
    write_gz(stale, ["the copy made before the fix"])
    write_gz(mirror / "toy/val.en.gz", ["the fixed line"])
    # The copy is older than the fixed mirror file (both in the past: a mirror file dated in the
    # future would make Snakemake report clock skew on the fresh copy).
    earlier = (mirror / "toy/val.en.gz").stat().st_mtime - 10
    os.utime(stale, (earlier, earlier))
    (mirror / "toy/test_2016_flickr.en.gz").write_bytes(bytes(range(7, 207)))
    # A copy whose checksum the config pins, older than its mirror file (a remounted mirror): the
    # date says nothing where the bytes are pinned, so it is not copied again.
    pinned = workdir / "resources/data/toy/train.de.gz"
    pinned.parent.mkdir(parents=True, exist_ok=True)
    pinned.write_bytes((mirror / "toy/train.de.gz").read_bytes())
    config["sources"]["toy/train.de.gz"]["sha256"] = sha256_file(pinned)
    toyflow.write_config(smoke, config)
    os.utime(pinned, (earlier, earlier))

    targets = ["resources/data/toy/val.en.gz", "resources/data/toy/val.de.gz",
               "resources/data/toy/test_2016_flickr.en.gz", "resources/data/toy/train.de.gz"]
    result = toyflow.snakemake("--cores", "1", "--keep-going", "--retries", "2", *targets, "--configfile", smoke,
                               cwd=workdir, snakefile=workdir / "Snakefile", timeout=300)
    assert result.returncode != 0
    assert gzip.decompress(stale.read_bytes()) == b"the fixed line\n"
    assert pinned.stat().st_mtime == earlier and not (workdir / "resources/logs/fetch/toy/train.de.gz.log").exists()

    # No job is tried again, although --retries 2 was given (a retry rewrites the job's log).
    assert "Trying to restart job" not in result.stdout + result.stderr
    logs = workdir / "resources/logs/fetch/toy"
    assert f"{mirror / 'toy/val.de.gz'}: sha256" in (logs / "val.de.gz.log").read_text()
    assert not (workdir / "resources/data/toy/val.de.gz").exists()
    random_log = (logs / "test_2016_flickr.en.gz.log").read_text()
    assert f"{mirror / 'toy/test_2016_flickr.en.gz'} is not gzip data (first bytes 07 08 09" in random_log


def test_an_error_about_a_mirror_copy_names_the_mirror_file(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(toyflow.REPO / "workflow/scripts"))
    from _common import job

    from headcount.io import DataError

    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "mirror"))
    monkeypatch.chdir(tmp_path)
    snakemake = type("Snakemake", (), {"log": ["job.log"], "threads": 1, "rule": "r", "wildcards": {},
                                       "input": ["resources/data/toy/val.en.gz", "results/x.txt"]})()
    with pytest.raises(SystemExit), job(snakemake):
        raise DataError("resources/data/toy/val.en.gz, line 3: not valid UTF-8")
    log = Path("job.log").read_text()
    assert f"resources/data/toy/val.en.gz is a copy of {tmp_path / 'mirror/toy/val.en.gz'}" in log
    assert "results/x.txt is a copy" not in log


def test_a_jobs_error_is_reported_where_only_the_jobs_own_packages_are_installed(tmp_path):
    """The one-line error of a job must not depend on the config validator's package: on a lent GPU
    without jsonschema the report itself failed, and the log kept no ERROR line."""
    code = f"""
import sys
sys.modules["jsonschema"] = None  # importing it now fails, as where it is not installed
sys.path.insert(0, {str(toyflow.REPO / "workflow/scripts")!r})
from _common import job
from headcount.io import HeadcountError
snakemake = type("Snakemake", (), {{"log": ["job.log"], "threads": 1, "rule": "r", "wildcards": {{}}, "input": []}})()
with job(snakemake):
    raise HeadcountError("training stopped by SIGTERM at step 12")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "ERROR: training stopped by SIGTERM at step 12" in (tmp_path / "job.log").read_text()
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_job_loads_no_torch_itself_and_torch_takes_the_jobs_threads(tmp_path):
    """The job wrapper sizes torch's thread pool through OMP_NUM_THREADS, so jobs that never use
    torch do not pay for importing it, and a job that does gets its `threads` (1 here, where
    torch alone would take both cores)."""
    code = f"""
import os, sys
sys.path.insert(0, {str(toyflow.REPO / "workflow/scripts")!r})
from _common import job
snakemake = type("Snakemake", (), {{"log": ["job.log"], "threads": 1, "rule": "r", "wildcards": {{}}, "input": []}})()
with job(snakemake):
    before = "torch" in sys.modules
    import torch
    print(before, torch.get_num_threads(), flush=True)
    os._exit(0)  # before the wrapper writes provenance, which needs a whole snakemake object
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1"]


# Jobs that run no model: data preparation, parsing, tables, figures, reports and the views over
# seeds. Loading torch costs each of them about 2 s, many times in a run of a small experiment.
TORCH_FREE_SCRIPTS = ("fetch_source", "prepare_training_data", "prepare_evaluation_data", "pool_test_sets",
                      "train_subwords", "fit_training_data", "parse_analysis_sentences", "score", "score_table",
                      "lm_quality", "pruning_report", "lm_pruning_report", "control_report", "plot_head_scores",
                      "plot_gate_trajectory", "plot_runs_over_seeds", "seed_spread", "claims_over_seeds",
                      "matched_over_seeds", "build_atlas")


@pytest.mark.slow
def test_jobs_that_run_no_model_load_no_torch():
    """Each script's module-level imports, run in one fresh interpreter: none of them loads torch
    (an import of a torch module from a shared one put 2-4 s on every report job)."""
    import ast

    scripts = toyflow.REPO / "workflow/scripts"
    code = ["import sys", f"sys.path[:0] = [{str(scripts)!r}, {str(toyflow.REPO / 'src')!r}]", "loaded = []"]
    for name in TORCH_FREE_SCRIPTS:
        tree = ast.parse((scripts / f"{name}.py").read_text())
        imports = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        code += [*imports, f"loaded.append(({name!r}, 'torch' in sys.modules))"]
    code.append("print(*(name for name, torch in loaded if torch))")
    result = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    # the first script whose imports load torch is the one to fix (later ones only inherit it)
    assert result.stdout.split() == [], f"torch loaded from the imports of {result.stdout.split()[0]}.py"


def test_random_bytes_named_gz_are_not_gzip_data(tmp_path):
    from headcount.data.corpora import fetch_source, read_text_lines
    from headcount.io import DataError

    junk = bytes(range(200, 256)) * 4
    (tmp_path / "mirror/c").mkdir(parents=True)
    (tmp_path / "mirror/c/x.en.gz").write_bytes(junk)
    (tmp_path / "served.bin").write_bytes(junk)
    dest = tmp_path / "out/c/x.en.gz"
    with pytest.raises(DataError, match=rf"^{tmp_path}/mirror/c/x.en.gz is not gzip data \(first bytes c8 c9 "):
        fetch_source("https://example.org/x", "c/x.en.gz", dest, mirror=tmp_path / "mirror", log=lambda m: None)
    with pytest.raises(DataError, match=r"^file://.*/served.bin is not gzip data .*check 'url' of source 'c/x.en.gz'"):
        fetch_source((tmp_path / "served.bin").as_uri(), "c/x.en.gz", dest, log=lambda m: None)
    assert not dest.exists()
    with pytest.raises(DataError, match=r"x.en.gz is not gzip data .*delete it so that it is fetched again"):
        read_text_lines(tmp_path / "mirror/c/x.en.gz")


def test_the_slurm_plugin_is_where_profiles_readme_says():
    readme = (toyflow.REPO / "profiles/README.md").read_text()
    where = re.search(r"Needs `snakemake-executor-plugin-slurm` \(([^)]*)\)", readme).group(1)
    files = [name for name in re.findall(r"`([^`]+)`", where) if Path(name).suffix in {".toml", ".yaml", ".txt"}]
    assert files, where
    for name in files:
        assert "snakemake-executor-plugin-slurm" in (toyflow.REPO / name).read_text(), name
