#!/usr/bin/env python3
"""Measure fine-tuning recipes for pruning on an experiment's trained baseline (README, method:
"Fine-tuning recipes"). Each recipe is a set of `prune` keys on top of the experiment's own; each
runs the lambda = 0 control (and any other lambdas asked for), translates the dev set and the
comparison test set with the experiment's beam search, and is compared with the baseline on the
same sentences (paired bootstrap, 95% interval).

    .venv/bin/python tools/measure_recipes.py --experiment multi30k_en_de --setting all
    .venv/bin/python tools/measure_recipes.py --experiment multi30k_en_de --setting all --lambdas 0 0.01 \\
        --recipe mine '{"lr_schedule": "continue", "heal_steps": 200}'

It reads the workflow's results (results/<exp>/baseline/model.pt, train/checkpoint.pt, data/,
subwords/), writes only under --out (default results/<exp>/recipes/), skips runs already done,
and writes <out>/recipes.tsv. The goal (SPEC section 2): a recipe whose control loses at most
0.3 BLEU against the baseline; choose on dev, confirm on the test set.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from headcount.config import FINE_TUNING_KEYS, lambda_label, load_experiments  # noqa: E402
from headcount.io import HeadcountError, atomic_path, read_lines  # noqa: E402
from headcount.pipeline.pruning_runs import prune_heads  # noqa: E402
from headcount.pipeline.translation import translate_file  # noqa: E402
from headcount.training.evaluate import paired_bootstrap, score_file  # noqa: E402

# The candidates of issue 18, item 2. The gate initialisation matters only where gates can move
# (lambda > 0): the control's gates are pinned open whatever log_alpha_init says.
RECIPES = {
    "authors": {},
    "constant": {"lr_schedule": "constant"},
    "continue": {"lr_schedule": "continue"},
    "constant_resumed": {"lr_schedule": "constant", "resume_optimizer": True},
    "continue_resumed": {"lr_schedule": "continue", "resume_optimizer": True},
    "authors_heal": {"heal_steps": 200},
    "constant_heal": {"lr_schedule": "constant", "heal_steps": 200},
    "authors_select": {"select": "best_dev_bleu"},
    "continue_select": {"lr_schedule": "continue", "select": "best_dev_bleu"},
    "open_gates": {"log_alpha_init": 10.0},
    "open_gates_continue": {"log_alpha_init": 10.0, "lr_schedule": "continue"},
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", required=True)
    parser.add_argument("--setting", choices=("enc", "all"), default="all")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[0.0])
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), help="names from RECIPES")
    parser.add_argument("--recipe", nargs=2, action="append", default=[], metavar=("NAME", "JSON"),
                        help="another recipe: prune keys as JSON")
    parser.add_argument("--config", default=str(REPO / "config/config.yaml"))
    parser.add_argument("--results", default=str(REPO / "results"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    with open(args.config, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    exp = load_experiments(config, REPO / "workflow/schemas/config.schema.yaml")[args.experiment]
    recipes = {name: RECIPES[name] for name in args.recipes}
    recipes.update({name: json.loads(text) for name, text in args.recipe})
    results = Path(args.results) / args.experiment
    out = Path(args.out) if args.out else results / "recipes"
    baseline = results / "baseline/model.pt"
    if not baseline.is_file():
        raise HeadcountError(f"{baseline} is missing: train the baseline first (snakemake "
                             f"results/{args.experiment}/baseline/model.pt)")
    files = {name: str(results / path) for name, path in {
        "train_src": "data/train.src.txt", "train_tgt": "data/train.tgt.txt", "dev_src": "data/dev.src.txt",
        "dev_tgt": "data/dev.tgt.txt", "src_spm": "subwords/src.model", "tgt_spm": "subwords/tgt.model"}.items()}
    splits = ["dev", exp["prune"]["eval_split"] or list(exp.get("test") or {"test": None})[0]]
    lowercase, decoding, device = exp["subwords"]["lowercase"], exp["decoding"], exp["training"]["device"]

    def translated(model: Path, folder: Path, split: str) -> list[str]:
        path = folder / "translations" / f"{split}.txt"
        if not path.is_file():
            translate_file(str(model), files["src_spm"], files["tgt_spm"], str(results / f"data/{split}.src.txt"),
                           str(path), decoding, device, log=print)
        return read_lines(path)

    references = {split: read_lines(results / f"data/{split}.tgt.txt") for split in splits}
    base = {split: translated(baseline, out / "baseline", split) for split in splits}
    rows = []
    for name, recipe in recipes.items():
        unknown = set(recipe) - set(FINE_TUNING_KEYS)
        if unknown:
            raise HeadcountError(f"recipe {name}: {sorted(unknown)} are not prune keys a fine-tuning run reads "
                                 f"({', '.join(FINE_TUNING_KEYS)})")
        prune = {**exp["prune"], **recipe}
        for lam in args.lambdas:
            folder = out / name / args.setting / f"lambda_{lambda_label(lam)}"
            if not (folder / "gates.json").is_file():
                print(f"== {name}, {args.setting}, lambda {lam:g}: fine-tuning", flush=True)
                prune_heads(str(baseline), **files, setting=args.setting, lam=lam,
                            prune_settings={k: prune[k] for k in FINE_TUNING_KEYS}, train_settings=exp["training"],
                            work_dir=str(folder / "train"), model_out=str(folder / "model.pt"),
                            gates_out=str(folder / "gates.json"), trajectory_out=str(folder / "trajectory.csv"),
                            lowercase=lowercase, baseline_checkpoint=str(results / "baseline/train/checkpoint.pt"))
            record = json.loads((folder / "gates.json").read_text(encoding="utf-8"))
            row = {"recipe": name, "setting": args.setting, "lam": lam, "prune": json.dumps(recipe, sort_keys=True),
                   "retained_total": sum(record["retained"].values()), "steps": record["steps"]["total"],
                   "lr_peak": record["lr"]["fine_tuning_peak"], "lr_baseline_last": record["lr"]["baseline_last"]}
            for split in splits:
                hyps = translated(folder / "model.pt", folder, split)
                score = score_file(str(folder / "translations" / f"{split}.txt"),
                                   str(results / f"data/{split}.tgt.txt"), lowercase,
                                   str(folder / "scores" / f"{split}.json"))
                diff = paired_bootstrap(hyps, base[split], references[split], lowercase=lowercase)
                tag = "dev" if split == "dev" else "test"
                row.update({f"bleu_{tag}": score["bleu"], f"d_{tag}": diff["difference"],
                            f"d_{tag}_low": diff["low"], f"d_{tag}_high": diff["high"]})
            rows.append(row)
            print(pd.DataFrame([row]).to_string(index=False), flush=True)
    table = pd.DataFrame(rows)
    with atomic_path(out / "recipes.tsv") as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.4g")
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
