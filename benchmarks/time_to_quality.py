"""Time to quality (issue 41): test BLEU against updates for headcount and fairseq, seeds apart.

    python benchmarks/time_to_quality.py train --arm headcount --seed 1 [--variant qkv_gain]
    python benchmarks/time_to_quality.py train --arm fairseq --seed 1
    python benchmarks/time_to_quality.py evaluate      # every checkpoint not yet scored
    python benchmarks/time_to_quality.py report        # curves and updates to 30 / 34 / 36 test BLEU
    python benchmarks/time_to_quality.py positional --at 2000   # largest positional share per seed (issue 36)
    python benchmarks/time_to_quality.py queue headcount:default:2 fairseq:default:2 ...   # in order, then evaluate

Both arms train the default experiment's model (6+6 layers, d_model 256, 8 heads, FFN 1024, pre-LN,
tied target embeddings) on Multi30k en-de with headcount's own sentencepiece data (results/
multi30k_en_de, made by `snakemake results/multi30k_en_de/data/test_2016_flickr.src.txt
results/multi30k_en_de/subwords/src.model ...`), max-tokens 1600, Noam / inverse_sqrt with the same
peak and warm-up, and keep the weights every --every updates. headcount trains with its own loop
(headcount.training.loop.train, the settings of config/config.yaml's multi30k_en_de, one variant's
change applied); fairseq with fairseq-train (tools/fairseq_reference.py, which also records fairseq's
own outputs). Both resume where they stopped: rerunning `train` continues a run.

`evaluate` scores every kept checkpoint the same way for both arms, with headcount's decoder (fairseq's
checkpoints through headcount's fairseq reader, which tests/test_fairseq.py checks against fairseq's
own SequenceGenerator): dev BLEU of greedy translations of the whole dev set, and test_2016_flickr
BLEU with beam 4 (alpha 0.6), the default experiment's decoding. Scores are cached per checkpoint
(scores.json beside the run), so evaluation also resumes.

`report` prints, per arm and variant, test BLEU at each update count (mean over seeds and a 95%
t-interval), and the updates each seed needed to reach 30, 34 and 36 test BLEU (linear
interpolation between kept checkpoints; "not reached" otherwise) with their mean and interval, and
CPU seconds per update where the run recorded them (headcount's checkpoint records CPU time; fairseq
logs wall time only). Runs live under --runs (default benchmarks/.time-to-quality, git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from headcount.report.seed_statistics import t_interval, welch_interval  # noqa: E402

EXP = REPO / "results" / "multi30k_en_de"
THRESHOLDS = (30.0, 34.0, 36.0)
OLD_INIT = {"qkv_init_gain": 1.0, "ffn_init": "xavier"}
# One change at a time against headcount's default (issue 41, item 2); each is a model or training
# setting of the config, so a variant that helps becomes a config default.
VARIANTS = {
    "default": {},
    "qkv_gain": {"model": {"qkv_init_gain": 0.5**0.5}},  # fairseq's Xavier gain for W^Q, W^K, W^V
    "ffn_init": {"model": {"ffn_init": "torch"}},  # fairseq's FFN: nn.Linear's own init, random biases
    "fairseq_init": {"model": {"qkv_init_gain": 0.5**0.5, "ffn_init": "torch"}},  # the two together
    # headcount trains in bf16 autocast where the CPU has AVX512-BF16 (precision: auto); fairseq's CPU
    # path is fp32: whether bf16 costs anything per update
    "fp32": {"training": {"precision": "fp32"}},
    # Not a difference from fairseq (both have the same peak and warm-up): whether a larger step or a
    # shorter warm-up learns more per update on this model.
    "lr_x2": {"training": {"lr_scale": 2.0}},
    "warmup_400": {"training": {"warmup_steps": 400}},
}


def log(message: str) -> None:
    print(message, flush=True)


def run_dir(runs: Path, arm: str, variant: str, seed: int) -> Path:
    name = arm if arm == "fairseq" or variant == "default" else f"{arm}-{variant}"
    return runs / name / f"seed_{seed}"


def experiment_settings(settings_file: str | None = None) -> dict:
    """config/config.yaml's multi30k_en_de, defaults merged, as the workflow sees it; or the copy
    that `settings` wrote, on a machine without the workflow's packages (a lent GPU)."""
    if settings_file:
        return json.loads(Path(settings_file).read_text())
    import yaml

    from headcount.config import load_experiments

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["run"] = ["multi30k_en_de"]
    return load_experiments(config, REPO / "workflow" / "schemas" / "config.schema.yaml")["multi30k_en_de"]


# --------------------------------------------------------------------------------------------
# Training


def train_headcount(out: Path, seed: int, variant: str, max_updates: int, every: int, threads: int,
                    device: str = "auto", settings_file: str | None = None) -> None:
    from headcount.pipeline.training_runs import train_translation_model

    exp = experiment_settings(settings_file)
    # The arms' base is headcount's init before 2026-11-26 (Xavier everywhere, zero biases), as the runs
    # were started: the config's default is fairseq's init since (the variant fairseq_init).
    model = {**exp["model"], **OLD_INIT, **VARIANTS[variant].get("model", {})}
    training = {**exp["training"], **VARIANTS[variant].get("training", {}), "seed": seed,
                "max_steps": max_updates, "snapshot_interval": every, "threads": threads, "device": device,
                # the benchmark scores the snapshots itself: no dev BLEU inside training, last weights
                "eval_interval": max_updates, "dev_bleu_sentences": 0, "select": "last"}
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps({"model": model, "training": training}, indent=1))
    data, sub = EXP / "data", EXP / "subwords"
    train_translation_model(
        str(data / "train.src.txt"), str(data / "train.tgt.txt"), str(data / "dev.src.txt"),
        str(data / "dev.tgt.txt"), str(sub / "src.model"), str(sub / "tgt.model"), model, training,
        exp["subwords"]["lowercase"], str(out / "work"), str(out / "model.pt"), str(out / "summary.json"), log=log)


def train_fairseq(out: Path, seed: int, max_updates: int, every: int, threads: int, device: str = "auto",
                  venv: str | None = None) -> None:
    device = "cuda" if score_device(device) == "cuda" else "cpu"
    subprocess.run([sys.executable, str(REPO / "tools" / "fairseq_reference.py"), "--out", str(out),
                    "--device", device, *(["--fairseq-venv", venv] if venv else []),
                    "--text-dir", str(EXP / "data"), "--spm-src", str(EXP / "subwords" / "src.model"),
                    "--spm-tgt", str(EXP / "subwords" / "tgt.model"), "--arch-preset", "multi30k",
                    "--max-update", str(max_updates), "--save-every", str(every), "--seed", str(seed),
                    "--threads", str(threads), "--reference-sentences", "100"], check=True)


# --------------------------------------------------------------------------------------------
# Evaluation


def checkpoints(run: Path) -> dict[int, Path]:
    """{updates: checkpoint} of a run, either arm."""
    found = {}
    for path in (run / "work" / "snapshots").glob("step_*.pt"):  # headcount
        found[int(path.stem.split("_")[1])] = path
    for path in (run / "checkpoints").glob("checkpoint_*_*.pt"):  # fairseq: checkpoint_{epoch}_{updates}.pt
        found[int(path.stem.rsplit("_", 1)[1])] = path
    return dict(sorted(found.items()))


def open_run(run: Path, path: Path):
    """(model, source tokenizer, target tokenizer) of one checkpoint."""
    if (run / "checkpoints").exists():
        from headcount.data.fairseq_dictionary import FairseqTokenizer
        from headcount.models.fairseq import read_fairseq

        model, _ = read_fairseq(path)
        return (model, FairseqTokenizer(run / "data-bin" / "dict.src.txt", run / "spm" / "src.model"),
                FairseqTokenizer(run / "data-bin" / "dict.tgt.txt", run / "spm" / "tgt.model"))
    from headcount.data.subwords import Segmenter
    from headcount.models.loading import load_model

    return (load_model(path).eval(), Segmenter(str(EXP / "subwords" / "src.model")),
            Segmenter(str(EXP / "subwords" / "tgt.model")))


def score(run: Path, updates: int, path: Path, beam: int, alpha: float, sentences: int | None = None,
          device: str = "cpu") -> dict:
    import torch

    from headcount.io import read_lines
    from headcount.training.decode import translate
    from headcount.training.evaluate import corpus_bleu

    model, src_tok, tgt_tok = open_run(run, path)
    out = {}
    with torch.inference_mode():
        for name, split, b in (("dev_bleu_greedy", "dev", 1), ("test_bleu_beam", "test_2016_flickr", beam)):
            sources = src_tok.encode(read_lines(EXP / "data" / f"{split}.src.txt")[:sentences])
            hyps = translate(model, sources, beam=b, alpha=alpha, max_tokens=8000, device=device)
            references = read_lines(EXP / "data" / f"{split}.tgt.txt")[:sentences]
            out[name] = corpus_bleu(tgt_tok.decode(hyps), references)
    log(f"{run.relative_to(run.parent.parent)} at {updates} updates: dev {out['dev_bleu_greedy']:.2f} (greedy), "
        f"test {out['test_bleu_beam']:.2f} (beam {beam})")
    return out


def evaluate(runs: Path, beam: int, alpha: float, sentences: int | None = None, device: str = "cpu",
             only: Path | None = None) -> None:
    for run in sorted(p for p in runs.glob("*/seed_*") if p.is_dir() and (only is None or p == only)):
        cache = run / "scores.json"
        scores = json.loads(cache.read_text()) if cache.exists() else {}
        for updates, path in checkpoints(run).items():
            key = str(updates)
            if key in scores and scores[key].get("checkpoint_mtime") == os.path.getmtime(path):
                continue
            scores[key] = {**score(run, updates, path, beam, alpha, sentences, device),
                           "checkpoint_mtime": os.path.getmtime(path), "sentences": sentences or "all"}
            cache.write_text(json.dumps(scores, indent=1))  # after each: an interrupted run keeps what it scored


def positional(runs: Path, updates: int, sentences: int = 500) -> str:
    """Issue 36's question over seeds: the largest positional share of any encoder head at `updates`,
    per run (the workflow's measure: headcount.analysis.roles, as rule compare_models computes it, on
    the default experiment's analysis set, the first `sentences` dev lines), and per arm its mean with
    a 95% t-interval over seeds. Cached per run in positional.json."""
    from headcount.analysis.roles.collect import sentence_positional_counts
    from headcount.io import read_lines
    from headcount.report.model_comparison import largest_share

    texts = read_lines(EXP / "data" / "dev.src.txt")[:sentences]
    by_arm: dict[str, dict[str, float]] = {}
    for run in sorted(p for p in runs.glob("*/seed_*") if p.is_dir()):
        path = checkpoints(run).get(updates)
        if path is None:
            continue
        cache = run / "positional.json"
        known = json.loads(cache.read_text()) if cache.exists() else {}
        key = f"{updates}@{sentences}"
        if key not in known or known[key]["checkpoint_mtime"] != os.path.getmtime(path):
            model, src_tok, _ = open_run(run, path)
            _, hits, valid = sentence_positional_counts(model, src_tok, texts, lowercase=False, log=lambda m: None)
            known[key] = {"largest_share": largest_share(hits, valid), "checkpoint_mtime": os.path.getmtime(path)}
            cache.write_text(json.dumps(known, indent=1))
        by_arm.setdefault(run.parent.name, {})[run.name] = known[key]["largest_share"]
    lines = [f"| arm | largest positional share at {updates} updates ({sentences} dev sentences), per seed | "
             "mean over seeds |", "|---|---|---|"]
    for arm, shares in by_arm.items():
        lines.append(f"| {arm} | " + ", ".join(f"{s}: {v:.3f}" for s, v in shares.items())
                     + f" | {interval(list(shares.values()))} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Report


def interval(values: list[float]) -> str:
    """mean [95% t-interval] over seeds; the mean alone for one seed."""
    mean, half = t_interval(values)
    if half is None:
        return f"{mean:.2f} (1 seed)"
    return f"{mean:.2f} [{mean - half:.2f}, {mean + half:.2f}] ({len(values)} seeds)"


def updates_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """Linear interpolation between the first checkpoint at or above target and the one before."""
    before = (0, 0.0)
    for updates, bleu in curve:
        if bleu >= target:
            u0, b0 = before
            return u0 + (target - b0) / (bleu - b0) * (updates - u0) if bleu > b0 else float(updates)
        before = (updates, bleu)
    return None


def cpu_per_update(run: Path) -> float | None:
    """headcount: CPU seconds per update from its last training checkpoint's record."""
    summary = run / "summary.json"
    if summary.exists():
        record = json.loads(summary.read_text())
        cpu, steps = record.get("train_cpu_seconds_all"), record.get("steps") or record.get("last_step")
        if cpu and steps:
            return cpu / steps
    return None


def seed_scores(arm_dir: Path) -> dict[str, dict[int, dict]]:
    """{seed_N: {updates: scores}} of one arm or variant's scored runs."""
    seeds = {}
    for run in sorted(arm_dir.glob("seed_*")):
        cache = run / "scores.json"
        if cache.exists():
            seeds[run.name] = {int(k): v for k, v in json.loads(cache.read_text()).items()}
    return seeds


def paired_report(runs: Path, baseline: str = "headcount") -> str:
    """Each headcount variant minus the default, seed by seed (the same seed draws the same batches
    and dropout, so the pair differs in the variant alone): test BLEU at each kept checkpoint, its
    mean over the checkpoints from 800 updates, and the updates to each threshold; mean and 95%
    t-interval over the seeds both have."""
    base = seed_scores(runs / baseline)
    header = ["updates " + str(u) for u in sorted({u for s in base.values() for u in s})]
    lines = ["| variant - default, test BLEU (beam 4) | " + " | ".join(header) + " | mean from 800 | "
             + " | ".join(f"updates to {t:g}" for t in THRESHOLDS) + " |",
             "|---|" + "---|" * (len(header) + 1 + len(THRESHOLDS))]
    for arm_dir in sorted(p for p in runs.glob(f"{baseline}-*") if p.is_dir()):
        seeds = {k: v for k, v in seed_scores(arm_dir).items() if k in base}
        if not seeds:
            continue
        cells = []
        for u in sorted({u for s in base.values() for u in s}):
            diff = [v[u]["test_bleu_beam"] - base[k][u]["test_bleu_beam"]
                    for k, v in seeds.items() if u in v and u in base[k]]
            cells.append(signed_interval(diff) if diff else "")
        common = common_checkpoints([*seeds.values(), *(base[k] for k in seeds)])
        later = [statistics.fmean(v[u]["test_bleu_beam"] - base[k][u]["test_bleu_beam"] for u in common)
                 for k, v in seeds.items()]
        cells.append(signed_interval(later) if common else "")
        for t in THRESHOLDS:
            pairs = [(updates_to_reach(sorted((u, x["test_bleu_beam"]) for u, x in v.items()), t),
                      updates_to_reach(sorted((u, x["test_bleu_beam"]) for u, x in base[k].items()), t))
                     for k, v in seeds.items()]
            diff = [a - b for a, b in pairs if a is not None and b is not None]
            missing = f", {len(pairs) - len(diff)} seed(s) not both" if len(diff) < len(pairs) else ""
            cells.append(signed_interval(diff, "{:+.0f}") + missing if diff else "not reached")
        lines.append(f"| {arm_dir.name.removeprefix(baseline + '-')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def common_checkpoints(curves: list[dict[int, dict]]) -> list[int]:
    """The checkpoints from 800 updates that every curve has: a mean over them compares like with
    like (a run stopped early would otherwise be averaged over its early, lower checkpoints)."""
    return sorted(u for u in set.intersection(*(set(c) for c in curves)) if u >= 800) if curves else []


def signed_interval(values: list[float], form: str = "{:+.2f}") -> str:
    """mean [95% t-interval] of paired differences, and how many seeds."""
    mean, half = t_interval(values)
    if half is None:
        return form.format(mean) + " (1 seed)"
    return f"{form.format(mean)} [{form.format(mean - half)}, {form.format(mean + half)}] ({len(values)})"


def against_fairseq(runs: Path, reference: str = "fairseq") -> str:
    """Each headcount arm minus fairseq over seeds (unpaired, Welch): test BLEU averaged over the
    checkpoints from 800 updates, and the updates to each threshold (seeds that reach it)."""
    base = seed_scores(runs / reference)
    if not base:
        return ""

    def later(seeds, common):
        return [statistics.fmean(s[u]["test_bleu_beam"] for u in common) for s in seeds.values()] if common else []

    def reached(seeds, t):
        values = [updates_to_reach(sorted((u, v["test_bleu_beam"]) for u, v in s.items()), t) for s in seeds.values()]
        return [v for v in values if v is not None]

    def cell(pair, form):
        return "fewer than 2 seeds a side" if pair is None else \
            f"{form.format(pair[0])} [{form.format(pair[1])}, {form.format(pair[2])}]"

    lines = [f"| arm - {reference} (Welch, 95%) | test BLEU, mean from 800 | "
             + " | ".join(f"updates to {t:g}" for t in THRESHOLDS) + " |", "|---|---|" + "---|" * len(THRESHOLDS)]
    for arm_dir in sorted(p for p in runs.iterdir() if p.is_dir() and p.name != reference):
        seeds = seed_scores(arm_dir)
        if seeds:
            common = common_checkpoints([*seeds.values(), *base.values()])
            cells = [cell(welch_interval(later(seeds, common), later(base, common)), "{:+.2f}")]
            cells += [cell(welch_interval(reached(seeds, t), reached(base, t)), "{:+.0f}") for t in THRESHOLDS]
            lines.append(f"| {arm_dir.name} ({len(seeds)} against {len(base)} seeds) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(runs: Path) -> str:
    lines = ["| arm | updates | seeds | dev BLEU, greedy | test BLEU, beam 4 |", "|---|---|---|---|---|"]
    reach = ["", "| arm | " + " | ".join(f"updates to {t:g} test BLEU" for t in THRESHOLDS)
             + " | CPU s / update (headcount's record) |", "|---|" + "---|" * (len(THRESHOLDS) + 1)]
    for arm_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        seeds = seed_scores(arm_dir)
        if not seeds:
            continue
        all_updates = sorted({u for s in seeds.values() for u in s})
        for u in all_updates:
            have = [s[u] for s in seeds.values() if u in s]
            lines.append(f"| {arm_dir.name} | {u} | {len(have)} | {interval([h['dev_bleu_greedy'] for h in have])} | "
                         f"{interval([h['test_bleu_beam'] for h in have])} |")
        cells = []
        for t in THRESHOLDS:
            reached = [updates_to_reach(sorted((u, v["test_bleu_beam"]) for u, v in s.items()), t)
                       for s in seeds.values()]
            got = [r for r in reached if r is not None]
            missing = len(reached) - len(got)
            cell = interval(got) if got else "not reached"
            cells.append(cell + (f", {missing} seed(s) not reached" if got and missing else ""))
        cpu = [c for run in sorted(arm_dir.glob("seed_*")) if (c := cpu_per_update(run)) is not None]
        cells.append(interval(cpu) if cpu else "not recorded")
        reach.append(f"| {arm_dir.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines + reach + ["", paired_report(runs), "", against_fairseq(runs)])


def train_item(item: str, runs: Path, args) -> Path:
    """Train one queue item, arm:variant:seed; returns its run directory."""
    arm, variant, seed = item.split(":")
    out = run_dir(runs, arm, variant, int(seed))
    log(f"queue: {arm} {variant} seed {seed} -> {out}")
    if arm == "headcount":
        train_headcount(out, int(seed), variant, args.max_updates, args.every, args.threads, args.device, args.settings)
    else:
        train_fairseq(out, int(seed), args.max_updates, args.every, args.threads, args.device, args.fairseq_venv)
    return out


def queue_in_parallel(plan: list[str], runs: Path, args) -> None:
    """The items as child processes, --jobs at a time, each trained and then its own checkpoints
    scored (a lent GPU: small models leave it idle most of a step, so several runs share it). Past
    --deadline seconds nothing new starts and the running children are stopped; each resumes from
    its checkpoint and keeps what it scored."""
    start, pending, running, stopped = time.monotonic(), list(plan), {}, set()
    passed = ["--max-updates", str(args.max_updates), "--every", str(args.every), "--threads", str(args.threads),
              "--beam", str(args.beam), "--alpha", str(args.alpha), "--runs", str(runs), "--device", args.device]
    passed += ["--settings", args.settings] if args.settings else []
    passed += ["--fairseq-venv", args.fairseq_venv] if args.fairseq_venv else []
    passed += ["--sentences", str(args.sentences)] if args.sentences else []
    while pending or running:
        late = time.monotonic() - start > args.deadline
        while pending and len(running) < args.jobs and not late:
            item = pending.pop(0)
            arm, variant, seed = item.split(":")
            out = run_dir(runs, arm, variant, int(seed))
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "queue.log", "a") as sink:  # the child keeps its own copy of the handle
                # a session of its own: the deadline stops the item's whole process group, fairseq-train
                # too (a grandchild, which outlived its parent when only the parent was stopped)
                running[item] = subprocess.Popen([sys.executable, "-u", __file__, "one", item, *passed],
                                                 stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            log(f"queue: started {item} ({len(pending)} waiting)")
        for item, child in list(running.items()):
            if late and child.poll() is None and item not in stopped:
                stopped.add(item)  # once: a second signal could land while the first one's checkpoint is written
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
            if child.poll() is not None:
                log(f"queue: {item} ended with code {child.wait()} after {time.monotonic() - start:.0f} s")
                del running[item]
        if late and pending:
            log(f"queue: deadline passed; not started: {' '.join(pending)}")
            pending.clear()
        time.sleep(2)


def score_device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["train", "evaluate", "report", "queue", "one", "settings", "positional"],
                    help="one: train and score one arm:variant:seed (what queue --jobs runs); settings: write "
                         "the experiment's settings to --settings for a machine without the workflow's packages")
    ap.add_argument("plan", nargs="*", help="queue: runs as arm:variant:seed, trained one after another (each "
                    "resumes where it stopped), every checkpoint scored after each")
    ap.add_argument("--arm", choices=["headcount", "fairseq"])
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-updates", type=int, default=2400)
    ap.add_argument("--every", type=int, default=400, help="keep the weights every this many updates")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--sentences", type=int, help="score only the first N sentences of each set (a smoke test)")
    ap.add_argument("--runs", default=str(HERE / ".time-to-quality"))
    ap.add_argument("--device", default="auto", help="where headcount trains and scores: auto, cpu or cuda")
    ap.add_argument("--fairseq-venv", help="fairseq's environment (a folder with bin/python, bin/fairseq-train "
                    "and bin/fairseq-preprocess); tools/fairseq_reference.py's default if not given")
    ap.add_argument("--settings", help="the experiment's settings as `settings` wrote them (JSON)")
    ap.add_argument("--jobs", type=int, default=1, help="queue: this many runs at once, each in its own process")
    ap.add_argument("--at", type=int, default=2000, help="positional: the checkpoint's updates")
    ap.add_argument("--deadline", type=float, default=float("inf"),
                    help="queue --jobs: seconds after which nothing new starts and running items stop")
    args = ap.parse_args()
    runs = Path(args.runs)
    if args.command == "train":
        if args.arm is None:
            ap.error("train needs --arm")
        if args.arm == "fairseq" and args.variant != "default":
            ap.error("variants change headcount's model; fairseq trains as fairseq does")
        out = run_dir(runs, args.arm, args.variant, args.seed)
        if args.arm == "headcount":
            train_headcount(out, args.seed, args.variant, args.max_updates, args.every, args.threads,
                            args.device, args.settings)
        else:
            train_fairseq(out, args.seed, args.max_updates, args.every, args.threads, args.device,
                          args.fairseq_venv)
    elif args.command == "settings":
        if not args.settings:
            ap.error("settings needs --settings FILE")
        Path(args.settings).write_text(json.dumps(experiment_settings(), indent=1))
    elif args.command == "one":
        out = train_item(args.plan[0], runs, args)
        evaluate(runs, args.beam, args.alpha, args.sentences, score_device(args.device), only=out)
    elif args.command == "queue" and args.jobs > 1:
        queue_in_parallel(args.plan, runs, args)
    elif args.command == "queue":
        # One run at a time on one thread: two queues with different plans share 2 cores without the
        # contention that multi-threaded runs suffer on a loaded machine.
        for item in args.plan:
            train_item(item, runs, args)
            evaluate(runs, args.beam, args.alpha, args.sentences, score_device(args.device))
    elif args.command == "evaluate":
        evaluate(runs, args.beam, args.alpha, args.sentences, score_device(args.device))
    elif args.command == "positional":
        print(positional(runs, args.at))
    else:
        table = report(runs)
        print(table)
        (HERE / "time_to_quality_latest.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
