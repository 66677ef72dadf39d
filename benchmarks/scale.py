"""Time and peak memory of data preparation, subword learning, encoding, batching and training at
1x, 10x and 100x Multi30k's size (issue 19 item 4), on synthetic corpora made here.

    nice -n 5 .venv/bin/python benchmarks/scale.py --sizes 1 10 100 --workdir /tmp/scale

The corpora: Multi30k training pairs drawn with replacement (seeded), a quarter of them with one
word on both sides replaced by a pseudo-word drawn from a Zipf distribution over an unbounded
vocabulary (names, numbers: a larger corpus has more word types, as real ones do), and 1 in 1000
with an empty target (dropped by cleaning). Lengths are Multi30k's (~13 words); WMT's are ~2x.

Each stage runs in its own process, one thread; its peak memory is that process's peak RSS
(getrusage), beside the RSS of the same process after its imports (the baseline). A training
epoch at 100x is hours on 2 cores: the training stage runs `--steps` steps of the default model
(config/config.yaml) through train_translation_model (which loads the corpus as the workflow
does) and the epoch time is extrapolated from the measured seconds per step and the number of
batches per epoch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path("/work/shared/data/multi30k")
BASE_PAIRS = 29_000
PAPER_PAIRS = {"WMT (2.5M)": 2_500_000, "OpenSubtitles (6M)": 6_000_000}
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "gu", "be", "fi", "ho", "ja"]


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def cpu_seconds() -> float:
    """This process's CPU time: less disturbed than wall time by other jobs on shared cores."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pseudo_word(n: int) -> str:
    letters = []
    while True:
        n, r = divmod(n, len(SYLLABLES))
        letters.append(SYLLABLES[r])
        if n == 0:
            break
        n -= 1
    return "".join(letters).capitalize()


def make_corpus(size: int, out: Path, seed: int = 1) -> dict:
    """`size` x 29,000 synthetic pairs at out/train.{en,de}.gz; a dev set of 200 real val pairs."""
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    en = gzip.decompress((MULTI30K / "train.en.gz").read_bytes()).decode().split("\n")[:BASE_PAIRS]
    de = gzip.decompress((MULTI30K / "train.de.gz").read_bytes()).decode().split("\n")[:BASE_PAIRS]
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    n = size * BASE_PAIRS
    start = time.perf_counter()
    with gzip.open(out / "train.en.gz", "wt", encoding="utf-8", compresslevel=1) as fe, \
            gzip.open(out / "train.de.gz", "wt", encoding="utf-8", compresslevel=1) as fd:
        done = 0
        while done < n:
            block = min(100_000, n - done)
            picks = nrng.integers(0, BASE_PAIRS, block).tolist()
            ranks = nrng.zipf(1.3, block).tolist()
            for k in range(block):
                s, t = en[picks[k]], de[picks[k]]
                u = rng.random()
                if u < 0.25:
                    word = pseudo_word(ranks[k])
                    sw, tw = s.split(), t.split()
                    sw[rng.randrange(len(sw))] = word
                    tw[rng.randrange(len(tw))] = word
                    s, t = " ".join(sw), " ".join(tw)
                elif u > 0.999:
                    t = ""
                fe.write(s + "\n")
                fd.write(t + "\n")
            done += block
    dev_en = gzip.decompress((MULTI30K / "val.en.gz").read_bytes()).decode().split("\n")[:200]
    dev_de = gzip.decompress((MULTI30K / "val.de.gz").read_bytes()).decode().split("\n")[:200]
    (out / "dev.en").write_text("".join(line + "\n" for line in dev_en), encoding="utf-8")
    (out / "dev.de").write_text("".join(line + "\n" for line in dev_de), encoding="utf-8")
    return {"pairs": n, "seconds": time.perf_counter() - start,
            "gz_mb": sum((out / f"train.{x}.gz").stat().st_size for x in ("en", "de")) / 1e6}


def defaults() -> dict:
    return yaml.safe_load((ROOT / "config/config.yaml").read_text())["defaults"]


def list_bytes(seqs) -> int:
    """What a list of id lists takes: each list's own size, and 32 bytes (a 28-byte int in pymalloc's
    32-byte block) for each id above 256 (CPython shares the ints -5..256)."""
    return sys.getsizeof(seqs) + sum(sys.getsizeof(s) + 32 * sum(1 for i in s if i > 256) for s in seqs)


# --------------------------------------------------------------------------------------------
# Stages: each runs in a child process (`--stage`) and prints one JSON line


def stage(name: str, d: Path) -> dict:
    import torch

    torch.set_num_threads(1)
    from headcount.data.batching import make_batches
    from headcount.data.corpora import CleaningConfig, fit_training_corpus, prepare_training_corpus
    from headcount.data.subwords import Segmenter, train_bpe
    from headcount.data.token_corpus import encode_file

    cfg = defaults()
    base = peak_mb()
    extra: dict = {}
    start, cpu_start = time.perf_counter(), cpu_seconds()
    quiet = lambda m: None  # noqa: E731
    if name == "prepare":
        c = cfg["cleaning"]
        stats = prepare_training_corpus(
            [({"file": d / "train.en.gz"}, {"file": d / "train.de.gz"})],
            CleaningConfig(c["max_words"], c["max_chars"], c["max_ratio"], c["min_words_for_ratio"]),
            cfg["subwords"]["lowercase"], c["max_pairs"], c["seed"], d / "clean.en", d / "clean.de", log=quiet)
        (d / "clean.json").write_text(json.dumps(stats))
        extra["pairs"] = stats["pairs"]
    elif name in ("subwords_en", "subwords_de"):
        lang = name[-2:]
        train_bpe(d / f"clean.{lang}", d / f"{lang}.model", cfg["subwords"]["src_vocab"],
                  character_coverage=cfg["subwords"]["character_coverage"], threads=1)
    elif name == "fit":
        stats = fit_training_corpus(d / "clean.en", d / "clean.de", json.loads((d / "clean.json").read_text()),
                                    d / "en.model", d / "de.model", cfg["model"]["max_len"], d / "train.en",
                                    d / "train.de", log=quiet)
        extra["pairs"] = stats["pairs"]
    elif name == "encode":
        corpora = [encode_file(Segmenter(d / f"{lang}.model"), d / f"train.{lang}") for lang in ("en", "de")]
        extra["corpus_mb"] = sum(c.nbytes for c in corpora) / 2**20
        extra["subwords"] = [int(c.tokens.size) for c in corpora]
        import numpy as np

        for lang, c in zip(("en", "de"), corpora):
            np.save(d / f"lengths.{lang}.npy", c.lengths())
    elif name == "encode_lists":
        from headcount.io import read_lines

        corpora = [Segmenter(d / f"{lang}.model").encode(read_lines(d / f"train.{lang}")) for lang in ("en", "de")]
        extra["seconds_to_encode"] = time.perf_counter() - start
        extra["corpus_mb"] = sum(list_bytes(c) for c in corpora) / 2**20
    elif name == "batching":
        import numpy as np

        lens = [(np.load(d / f"lengths.{lang}.npy") + 1).tolist() for lang in ("en", "de")]
        start, cpu_start = time.perf_counter(), cpu_seconds()  # the batching itself, not reading the lengths
        batches = make_batches(lens[0], lens[1], cfg["training"]["max_tokens"], seed=cfg["training"]["seed"] * 1000)
        extra["batches"] = len(batches)
    elif name == "train":
        extra.update(train_steps(d, cfg))
    else:
        raise SystemExit(f"unknown stage {name}")
    return {"stage": name, "seconds": time.perf_counter() - start, "cpu_seconds": cpu_seconds() - cpu_start,
            "peak_mb": peak_mb(), "baseline_mb": base, **extra}


def train_steps(d: Path, cfg: dict) -> dict:
    """`STEPS` steps of the default model and training settings through train_translation_model."""
    import shutil

    from headcount.pipeline.training_runs import train_translation_model

    steps = int(os.environ["SCALE_STEPS"])
    work = d / "train_work"
    shutil.rmtree(work, ignore_errors=True)
    times: dict = {}
    start = time.perf_counter()

    def log(message: str) -> None:
        if message.startswith("training on"):
            times["first_batch_ready"] = time.perf_counter() - start
            times["cpu_at_first_batch"] = cpu_seconds()
            times["batches"] = int(message.split(" batches per epoch")[0].rsplit(" ", 1)[1])

    settings = {**cfg["training"], "max_steps": steps, "log_interval": 5, "eval_interval": 10**9,
                "checkpoint_interval": 10**9, "checkpoint_minutes": 0, "dev_bleu_sentences": 0, "select": "last",
                "device": "cpu", "threads": 1}
    train_translation_model(str(d / "train.en"), str(d / "train.de"), str(d / "dev.en"), str(d / "dev.de"),
                            str(d / "en.model"), str(d / "de.model"), cfg["model"], settings,
                            cfg["subwords"]["lowercase"], str(work), str(work / "model.pt"),
                            str(work / "summary.json"), log=log)
    steps_cpu = cpu_seconds() - times["cpu_at_first_batch"]  # with the final dev loss and checkpoint
    records = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    logged = {r["step"]: r["elapsed_s"] for r in records if "train_loss" in r}
    first = min(s for s in logged if s >= 5)  # the first steps warm up allocators and caches
    per_step = (logged[steps] - logged[first]) / (steps - first)
    shutil.rmtree(work, ignore_errors=True)
    return {"setup_seconds": times["first_batch_ready"], "batches": times["batches"], "seconds_per_step": per_step,
            "epoch_seconds_extrapolated": per_step * times["batches"], "steps": steps,
            "cpu_seconds_per_step": steps_cpu / steps,
            "epoch_cpu_seconds_extrapolated": steps_cpu / steps * times["batches"]}


# --------------------------------------------------------------------------------------------
# Driver


def run_stage(name: str, d: Path, steps: int) -> dict:
    env = {**os.environ, "SCALE_STEPS": str(steps), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, "--stage", name, "--dir", str(d)], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"stage {name} in {d} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load() -> str:
    return os.getloadavg().__repr__()


STAGE_NAMES = {"prepare": "data preparation (read, clean, normalise, write)",
               "subwords_en": "subword learning, en (sentencepiece BPE)",
               "subwords_de": "subword learning, de (sentencepiece BPE)",
               "fit": "fit to model.max_len (encode, drop, write)",
               "encode": "load for training: encode to TokenCorpus",
               "encode_lists": "(old) encode to lists of lists",
               "batching": "batching (make_batches, whole corpus)",
               "train": "training: N steps (time per step)"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--workdir", default="/tmp/scale")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--old-lists-up-to", type=int, default=100, help="measure the old list encoding up to this size")
    ap.add_argument("--json", default=None, help="also write the measurements here")
    ap.add_argument("--stage")
    ap.add_argument("--dir")
    args = ap.parse_args()
    if args.stage:
        print(json.dumps(stage(args.stage, Path(args.dir))))
        return

    results = {}
    out_json = Path(args.json or Path(args.workdir) / "scale.json")
    for size in args.sizes:
        d = Path(args.workdir) / f"x{size}"
        print(f"# {size}x: making {size * BASE_PAIRS} pairs in {d} (load {load()})", flush=True)
        made = make_corpus(size, d)
        rows = {"make": made}
        for name in STAGE_NAMES:
            if name == "encode_lists" and size > args.old_lists_up_to:
                continue
            t0 = time.strftime("%H:%M:%S")
            rows[name] = run_stage(name, d, args.steps)
            rows[name]["load"] = os.getloadavg()[0]
            print(f"  {t0} {name}: {json.dumps(rows[name])}", flush=True)
        results[size] = rows
        out_json.write_text(json.dumps(results, indent=1))
    print()
    print(report(results))


def report(results: dict) -> str:
    sizes = sorted(results, key=int)
    lines = ["| size | pairs | stage | wall s | CPU s | peak MB (baseline after imports) | 1-min load | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        rows = results[size]
        for name, label in STAGE_NAMES.items():
            if name not in rows:
                continue
            r = rows[name]
            notes = []
            seconds, cpu = f"{r['seconds']:.1f}", f"{r['cpu_seconds']:.1f}"
            if name == "train":
                seconds, cpu = f"{r['seconds_per_step']:.2f} /step", f"{r['cpu_seconds_per_step']:.2f} /step"
                notes.append(f"setup (encode, batch) {r['setup_seconds']:.0f} s wall; {r['batches']} batches/epoch; "
                             f"one epoch extrapolated from {r['steps']} steps: "
                             f"{r['epoch_seconds_extrapolated'] / 3600:.2f} h wall, "
                             f"{r['epoch_cpu_seconds_extrapolated'] / 3600:.2f} h CPU")
            if "corpus_mb" in r:
                notes.append(f"corpus in memory {r['corpus_mb']:.0f} MB")
            if "batches" in r and name == "batching":
                notes.append(f"{r['batches']} batches")
            lines.append(f"| {size}x | {int(size) * BASE_PAIRS:,} | {label} | {seconds} | {cpu} | {r['peak_mb']:.0f} "
                         f"({r['baseline_mb']:.0f}) | {r.get('load', float('nan')):.2f} | {'; '.join(notes)} |")
    out = "\n".join(lines)
    out += ("\n\nGrowth exponents (log ratio of the two sizes' values / log size ratio; 1 = linear). Time: CPU "
            "seconds (training: of an extrapolated epoch). Memory: peak minus baseline.\n\n")
    out += "| stage | " + " | ".join(f"{a}x->{b}x time, memory" for a, b in zip(sizes, sizes[1:])) + " |\n"
    out += "|---|" + "---|" * (len(sizes) - 1) + "\n"
    for name, label in STAGE_NAMES.items():
        cells = []
        for a, b in zip(sizes, sizes[1:]):
            ra, rb = results[a].get(name), results[b].get(name)
            if not ra or not rb:
                cells.append("")
                continue
            k = math.log(int(b) / int(a))
            time_key = "epoch_cpu_seconds_extrapolated" if name == "train" else "cpu_seconds"
            ta, tb = ra[time_key], rb[time_key]
            ma, mb = ra["peak_mb"] - ra["baseline_mb"], rb["peak_mb"] - rb["baseline_mb"]
            growth_m = f"{math.log(mb / ma) / k:.2f}" if ma > 1 and mb > 1 else "n/a (<1 MB)"
            cells.append(f"{math.log(tb / ta) / k:.2f}, {growth_m}")
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    # Projection to the paper's corpora: the marginal cost per pair between the two largest sizes
    # (a model's or a tokenizer's fixed memory does not grow with the corpus).
    if len(sizes) < 2:
        return out
    big, prev = sizes[-1], sizes[-2]
    n_big, n_prev = int(big) * BASE_PAIRS, int(prev) * BASE_PAIRS
    out += (f"\nProjection to the paper's corpora: the value at {big}x ({n_big:,} pairs) plus the cost per pair "
            f"between {prev}x and {big}x times the further pairs:\n\n")
    out += "| stage | " + " | ".join(PAPER_PAIRS) + " |\n|---|" + "---|" * len(PAPER_PAIRS) + "\n"

    def project(key: str, r_big: dict, r_prev: dict, n: int) -> float:
        return r_big[key] + (r_big[key] - r_prev[key]) / (n_big - n_prev) * (n - n_big)

    for name, label in STAGE_NAMES.items():
        r, q = results[big].get(name), results[prev].get(name)
        if not r or not q:
            continue
        cells = []
        for n in PAPER_PAIRS.values():
            cell = f"peak {project('peak_mb', r, q, n):.0f} MB"
            if "corpus_mb" in r:
                cell += f", corpus {project('corpus_mb', r, q, n):.0f} MB"
            if name == "train":
                cell += f", epoch {project('epoch_cpu_seconds_extrapolated', r, q, n) / 3600:.1f} h CPU"
            else:
                cell += f", {project('cpu_seconds', r, q, n):.0f} s CPU"
            cells.append(cell)
        out += f"| {label} | " + " | ".join(cells) + " |\n"
    return out


if __name__ == "__main__":
    main()
