"""The head atlas's size and load time for the default experiment (issue 39, item 4), on a stand-in
of the same size, since the default experiment's results are not kept in the repository:

    PYTHONPATH=src .venv/bin/python benchmarks/atlas_size.py --workdir /tmp/atlas-bench

The stand-in: the published tables (docs/tables: head scores of 144 heads, encoder roles and the
pruning table), the three role statistics tables rebuilt from head_roles.csv (the
syntactic accuracies drawn at random: the published tables keep only each head's best relation),
gates and trajectories for each run of the pruning table (the retained counts of each run, the
heads of lowest LRP closed, 15 steps like the default's 500 + 200 at log_interval 50), a model of
the default shape (6+6 layers x 8 heads, d_model 256, FFN 1024; random init) with sentencepiece
models of the default size learned on Multi30k's training text, the first 500 Multi30k dev pairs as
the analysis set, and UD English EWT dev as the parse table. The attention examples are what the
atlas rule stores for them with the default settings (config/config.yaml, atlas).

`--sentences 10 --best 10` measures the page at the config's bounds (atlas.sentences, at most 10
lines; atlas.best_sentences, at most 10).

Printed: the time to build the page, its size, and the load time in headless Chromium (from the
start of navigation until the page's script has drawn the overview; median of --loads loads)
and the time to open a head's card, where chromium and chromedriver are installed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from headcount.analysis.roles.statistics import DIRECTION_NAMES  # noqa: E402
from headcount.report.atlas.build import build_atlas  # noqa: E402

TABLES = REPO / "docs" / "tables"
DATA = REPO.parent / "shared" / "data"


def gz_lines(path: Path, n: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:n] if n else lines


def stand_in(workdir: Path, config: dict) -> dict:
    """The stand-in's files; returns build_atlas's keyword arguments."""
    import torch

    from headcount.data.parses import read_conllu
    from headcount.data.subwords import Segmenter, train_bpe
    from headcount.models.transformer import ModelConfig, Transformer

    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    defaults = config["defaults"]
    roles = pd.read_csv(TABLES / "head_roles.csv")
    positional = roles[["layer", "head"]].assign(
        offset=roles["positional_offset"], fraction=roles["positional_fraction"],
        fraction_paper=roles["positional_fraction_paper"], initial_offset=roles["positional_initial_offset"],
        initial_fraction=roles["positional_initial_fraction"],
        continuation_offset=roles["positional_continuation_offset"],
        continuation_fraction=roles["positional_continuation_fraction"])
    rare = roles[["layer", "head"]].assign(rate_rarest=roles["rate_rarest"], rate_two_rarest=roles["rate_two_rarest"],
                                          n_sentences=roles["rare_sentences"], uniform_rate_rarest=np.nan,
                                          uniform_rate_two_rarest=roles["rare_uniform_two_rarest"])
    syntactic = pd.DataFrame([
        {"relation": r, "direction": d, "name": name, "layer": row.layer, "head": row.head,
         "accuracy": rng.uniform(0.05, 0.6), "n": 200, "baseline_offset": 1, "baseline_accuracy": 0.4}
        for (r, d), name in DIRECTION_NAMES.items() for row in roles.itertuples()])
    paths = {"roles": TABLES / "head_roles.csv", "positional": workdir / "positional.csv",
             "syntactic": workdir / "syntactic.csv", "rare": workdir / "rare.csv"}
    positional.to_csv(paths["positional"], index=False)
    syntactic.to_csv(paths["syntactic"], index=False)
    rare.to_csv(paths["rare"], index=False)

    scores = pd.read_csv(TABLES / "head_scores.csv")
    pruning = pd.read_csv(TABLES / "pruning.tsv", sep="\t")
    gates, trajectories = [], []
    steps = np.arange(0, 701, 50)
    for run in pruning[pruning["setting"] != "baseline"].itertuples():
        folder = workdir / "prune" / run.setting / f"lambda_{run.lam}"
        folder.mkdir(parents=True, exist_ok=True)
        gated = ["enc_self"] if run.setting == "enc" else ["enc_self", "dec_self", "dec_enc"]
        heads, rows = [], []
        for kind in ("enc_self", "dec_self", "dec_enc"):
            part = scores[scores["type"] == kind].sort_values("lrp")
            closed = set(part.index[:len(part) - int(getattr(run, f"retained_{kind}"))])
            for i, h in part.iterrows():
                heads.append({"type": kind, "layer": int(h["layer"]), "head": int(h["head"]), "gated": kind in gated,
                              "pruned": i in closed})
                if kind in gated:
                    end = 1.0 if i in closed else 0.0
                    rows += [(int(s), kind, int(h["layer"]), int(h["head"]), end * s / steps[-1] + rng.uniform(0, 0.05))
                             for s in steps]
        (folder / "gates.json").write_text(json.dumps({"setting": run.setting, "lambda": run.lam,
                                                       "control": bool(run.control), "heads": heads}))
        pd.DataFrame(rows, columns=["step", "type", "layer", "head", "p_closed"]).to_csv(
            folder / "trajectory.csv", index=False)
        gates.append(str(folder / "gates.json"))
        trajectories.append(str(folder / "trajectory.csv"))

    # Model, subwords, analysis set, parses.
    texts = {}
    for side, lang in (("src", "en"), ("tgt", "de")):
        train = workdir / f"train.{side}.txt"
        train.write_text("\n".join(gz_lines(DATA / f"multi30k/train.{lang}.gz")) + "\n", encoding="utf-8")
        if not (workdir / f"{side}.model").exists():
            train_bpe(train, workdir / f"{side}.model", defaults["subwords"][f"{side}_vocab"])
        texts[side] = workdir / f"analysis.{side}.txt"
        texts[side].write_text("\n".join(gz_lines(DATA / f"multi30k/val.{lang}.gz", 500)) + "\n", encoding="utf-8")
    model = defaults["model"]
    torch.manual_seed(0)
    Transformer(ModelConfig(src_vocab=len(Segmenter(workdir / "src.model")),
                            tgt_vocab=len(Segmenter(workdir / "tgt.model")),
                            **{k: model[k] for k in ("d_model", "n_heads", "d_ff", "enc_layers", "dec_layers",
                                                     "max_len")})).save(workdir / "model.pt")
    parses = read_conllu(DATA / "UD_English-EWT/en_ewt-ud-dev.conllu")
    parses = parses[parses["sentence"] < 500]
    parses.to_parquet(workdir / "parses.parquet")
    return {"head_scores": str(TABLES / "head_scores.csv"), **{k: str(v) for k, v in paths.items()},
            "pruning": str(TABLES / "pruning.tsv"), "gates": gates,
            "trajectories": trajectories, "model": str(workdir / "model.pt"), "src_spm": str(workdir / "src.model"),
            "tgt_spm": str(workdir / "tgt.model"), "analysis_src": str(texts["src"]),
            "analysis_tgt": str(texts["tgt"]), "analysis_sentences": defaults["analysis"]["max_sentences"],
            "parses": str(workdir / "parses.parquet"), "train_src": str(workdir / "train.src.txt"),
            "role_settings": defaults["roles"], "sentences": defaults["atlas"]["sentences"],
            "best_sentences": defaults["atlas"]["best_sentences"], "lowercase": defaults["subwords"]["lowercase"],
            "device": "cpu", "experiment": "multi30k_en_de (stand-in)",
            "description": "published tables, random-init model of the default shape"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default="/tmp/atlas-bench")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--sentences", type=int, help="chosen sentences: the first N lines (default: the config's)")
    parser.add_argument("--best", type=int, help="sentences per head that show its role (default: the config's)")
    args = parser.parse_args()
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    import torch

    torch.set_num_threads(1)  # the atlas rule's one thread
    workdir = Path(args.workdir)
    kwargs = stand_in(workdir, config)
    if args.sentences is not None:
        kwargs["sentences"] = list(range(args.sentences))
    if args.best is not None:
        kwargs["best_sentences"] = args.best
    out = workdir / "atlas/index.html"
    start = time.perf_counter()
    data = build_atlas(str(out), log=lambda m: None, **kwargs)
    build_seconds = time.perf_counter() - start
    examples = sum(len(v) for v in data["examples"].values())
    print(f"heads {len(data['heads'])}, analysis sentences {kwargs['analysis_sentences']}, sentences stored "
          f"{len(data['sentences'])}, attention examples {examples} "
          f"(lines {kwargs['sentences']} for every head + {kwargs['best_sentences']} of its own)")
    print(f"build (tables + model on 500 sentences + page): {build_seconds:.1f} s")
    print(f"page size: {out.stat().st_size / 1e6:.2f} MB (limit 20 MB)")

    from headcount.report.atlas.browser import find_chromium, headless_chromium, open_page

    if find_chromium() is None:
        print("load time: not measured (no chromium/chromedriver)")
        return
    driver = headless_chromium()
    try:
        loads, cards = [], []
        for _ in range(args.loads):
            loads.append(open_page(driver, out))
            start = time.perf_counter()
            driver.execute_script("document.querySelector('rect.head[data-key=\"enc_self/0/0\"]')"
                                  ".dispatchEvent(new MouseEvent('click', {bubbles: true}))")
            cards.append(time.perf_counter() - start)
        version = driver.capabilities.get("browserVersion")
    finally:
        driver.quit()
    print(f"load time in headless Chromium {version}: median {statistics.median(loads):.2f} s, max {max(loads):.2f} s "
          f"over {args.loads} loads (limit 2 s)")
    print(f"opening a head's card (click to drawn): median {statistics.median(cards) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
