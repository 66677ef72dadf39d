"""Do settled gates decide on the translation model too, and what does deciding cost?

    PYTHONPATH=src .venv/bin/python benchmarks/translation_settle.py results/multi30k_en_de_seed2 \
        --setting enc --kept 12 10 [--settle 0.25] [--out results/translation_settle]

Reruns rule head_counts' L0 arm (pipeline.head_counts.l0_arm_arguments: gates alone on the frozen
baseline, trained to each count by the Lagrangian controller) with `prune.controller.settle` set,
from the settings that rule recorded in head_counts/{setting}/fingerprint.json (its training
settings, steps and first 2,000 training pairs), and holds the result against that rule's own
unsettled gates (gates_target_{kept}.tsv):
the heads each run's own rule keeps, the undecided gates (P(open) strictly inside
report.preregistered.GATE_UNDECIDED), and the references' loss on the evaluation pairs
(test_2016_flickr) with the count's lowest log alphas removed, settled against unsettled with the
paired 95% bootstrap interval over the pairs. Prints a markdown table; writes it as TSV to --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch

import headcount
from headcount.analysis.head_access import HeadAccess
from headcount.io import read_lines
from headcount.models.loading import load_model, open_tokenizer
from headcount.models.seq2seq import kind_of
from headcount.pipeline.head_counts import digest, l0_arm_arguments, target_arm
from headcount.pruning import matched_counts as mc
from headcount.pruning.methods import setting_types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", type=Path, help="a results folder whose rule head_counts has run")
    parser.add_argument("--setting", choices=("enc", "all"), default="enc")
    parser.add_argument("--kept", type=int, nargs="+", required=True, help="target head counts kept")
    parser.add_argument("--settle", type=float, default=0.25)
    parser.add_argument("--eval-split", default="test_2016_flickr")
    parser.add_argument("--out", type=Path, default=Path("results/translation_settle"))
    args = parser.parse_args()
    torch.set_num_threads(2)

    exp, setting = args.experiment, args.setting
    unsettled_dir = exp / "head_counts" / setting
    recorded = json.loads((unsettled_dir / "fingerprint.json").read_text(encoding="utf-8"))
    training, steps = recorded["training"], int(recorded["l0_steps"])
    # checked before any gate trains: the unsettled runs to hold against, on the same pairs
    missing = [kept for kept in args.kept if not (unsettled_dir / f"gates_target_{kept}.tsv").exists()]
    if missing:
        raise SystemExit(f"{unsettled_dir} has no unsettled gates for {missing} kept: run rule head_counts first")
    l0_src = read_lines(exp / "data" / "train.src.txt")[:2000]
    l0_tgt = read_lines(exp / "data" / "train.tgt.txt")[:2000]
    if digest([l0_src, l0_tgt]) != recorded["l0_sentences"]:
        raise SystemExit(f"{exp / 'data'}: the first 2,000 training pairs are not those rule head_counts "
                         f"trained its gates on ({unsettled_dir / 'fingerprint.json'}, l0_sentences)")
    out = args.out / exp.name / setting
    out.mkdir(parents=True, exist_ok=True)

    model = load_model(exp / "baseline" / "model.pt").eval()
    src_tok = open_tokenizer(exp / "subwords" / "src.model", "source")
    tgt_tok = open_tokenizer(exp / "subwords" / "tgt.model", "target")
    # the rule's end-of-run evaluation pairs (the analysis set's first two); they do not steer the gates
    dev_src, dev_tgt = read_lines(exp / "data" / "dev.src.txt")[:2], read_lines(exp / "data" / "dev.tgt.txt")[:2]
    access = HeadAccess(model, src_tok, tgt_tok, torch.device("cpu"), max_tokens=int(recorded["max_tokens"]))
    total = int(access.heads["type"].isin(setting_types(setting, kind_of(model).name)).sum())
    cpu = {}

    def prune_run(kept: int) -> pd.DataFrame:
        start = time.process_time()
        arguments = l0_arm_arguments(kept, l0_src, l0_tgt, setting=setting, steps=steps, baseline_training=training,
                                     d_model=model.d_model, work_dir=out / f"l0_{kept}",
                                     controller={"settle": args.settle}, dev=(dev_src, dev_tgt))
        gates = headcount.prune(model, (src_tok, tgt_tok), **arguments, device="cpu").gates
        cpu[kept] = time.process_time() - start
        return gates

    counts = [total - kept for kept in args.kept]
    settled, settled_targets = target_arm(prune_run, counts, total, out)
    unsettled, unsettled_targets = target_arm(None, counts, total, unsettled_dir)  # read, never trained
    settled.name, unsettled.name = "settled", "unsettled"
    eval_src = read_lines(exp / "data" / f"{args.eval_split}.src.txt")
    eval_tgt = read_lines(exp / "data" / f"{args.eval_split}.tgt.txt")
    measured = mc.measure_arms(access, eval_src, [settled, unsettled], out / "scored.tsv", targets=eval_tgt)

    rows = []
    for count, s, u in zip(counts, settled_targets.itertuples(), unsettled_targets.itertuples()):
        a, b = mc.set_name(settled, count), mc.set_name(unsettled, count)
        found = measured.compare(a, b)
        overlap = len(set(settled.removed[count]) & set(unsettled.removed[count]))
        rows.append({"exp": exp.name, "setting": setting, "target_kept": total - count, "total": total,
                     "unsettled_kept": u.kept, "unsettled_undecided": u.undecided,
                     "settled_kept": s.kept, "settled_undecided": s.undecided,
                     "same_heads_removed": overlap, "unsettled_loss": measured.value(b),
                     "settled_loss": measured.value(a), "difference": found["difference"],
                     "low": found["low"], "high": found["high"],
                     "settled_cpu_s": round(cpu.get(total - count, float("nan")), 1)})
    table = pd.DataFrame(rows)
    table.to_csv(out / "settled_against_unsettled.tsv", sep="\t", index=False)
    print(f"unpruned loss {measured.value(measured.baseline):.4f} on {len(eval_src)} {args.eval_split} pairs; "
          f"settle {args.settle} of {steps} steps")
    print(table.to_markdown(index=False, floatfmt=".4f"))


if __name__ == "__main__":
    main()
