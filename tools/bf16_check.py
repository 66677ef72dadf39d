"""Does bf16 autocast move the matched-count numbers? A published run of tools/head_counts.py scored
again under torch.autocast(bfloat16): the unpruned model, the best arm and the median random draw at
the middle count, on the same held-out texts, each set set against its float32 score (stored in
the run's scored.tsv) by a paired bootstrap over the texts; and the arm's difference from the
unpruned model, which the verdicts read, under both precisions.

    .venv/bin/python tools/bf16_check.py results/head_counts/smollm2 --model smollm2

Writes bf16_check.tsv in the run's folder. On a CPU without bf16 instructions (AVX2 only) autocast
still computes in bf16, emulated and about 12 times slower than float32: the numbers are the same
as on a CPU that has them, only the time differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tools"))

from headcount.analysis.head_access import BASELINE, HeadAccess  # noqa: E402
from headcount.pruning import matched_counts as mc  # noqa: E402
from headcount.training.perplexity import paired_bootstrap_nll  # noqa: E402


def chosen_sets(summary: pd.DataFrame, table: pd.DataFrame) -> dict[str, int]:
    """{set name: count}: the best method or structure arm at the middle count, and the random draw
    whose loss is the median of that count's draws."""
    counts = sorted(summary["count"].unique())
    middle = counts[len(counts) // 2]
    named = summary[(summary["count"] == middle) & (summary["family"] != mc.RANDOM)].sort_values("loss")
    draws = table[(table["count"] == middle) & (table["family"] == mc.RANDOM)].sort_values("loss")
    median = draws.iloc[len(draws) // 2]
    return {f"{named.iloc[0]['arm']} @ {middle}": middle, f"{median['arm']} @ {middle}": middle}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a folder tools/head_counts.py wrote")
    parser.add_argument("--model", required=True, help="the model it ran on (tools/head_counts.py's MODELS)")
    parser.add_argument("--max-tokens", type=int, default=1100)
    args = parser.parse_args(argv)
    import head_counts as tool

    run = args.run
    model, tokenizer = tool.load(args.model, run / "model")
    texts = json.loads((run / "texts.json").read_text())["held_out"]["texts"]
    arms = {arm["name"]: arm for arm in json.loads((run / "arms.json").read_text())}
    summary = pd.read_csv(run / "head_counts_summary.tsv", sep="\t")
    table = pd.read_csv(run / "head_counts.tsv", sep="\t")
    scored = pd.read_csv(run / "scored.tsv", sep="\t")
    access = HeadAccess(model, tokenizer, tokenizer, torch.device("cpu"), max_tokens=args.max_tokens)
    sets = {}
    for name, count in chosen_sets(summary, table).items():
        arm = arms[name.rsplit(" @ ", 1)[0]]
        sets[name] = [access.names.name((t, int(layer), int(head))) for t, layer, head in arm["removed"][str(count)]]
    start = time.process_time()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = access.measure(texts, sets)
    seconds = time.process_time() - start

    def fp32(name: str) -> np.ndarray:
        rows = scored[scored["set"] == name].sort_values("text")
        return rows["sum"].to_numpy(float)

    units = found.units
    rows = []
    for name in [BASELINE, *sets]:
        bf16 = found.sums[found.sets.index(name if name in found.sets else found.baseline)]
        against = paired_bootstrap_nll(bf16, fp32(name), units)
        row = {"set": name, "loss_fp32": fp32(name).sum() / units.sum(), "loss_bf16": bf16.sum() / units.sum(),
               "bf16_minus_fp32": against["difference"], "low": against["low"], "high": against["high"]}
        if name != BASELINE:
            base_bf16 = found.sums[found.sets.index(found.baseline)]
            row["vs_unpruned_fp32"] = paired_bootstrap_nll(fp32(name), fp32(BASELINE), units)["difference"]
            row["vs_unpruned_bf16"] = paired_bootstrap_nll(bf16, base_bf16, units)["difference"]
        rows.append(row)
    out = pd.DataFrame(rows)
    out["texts"], out["tokens"], out["cpu_seconds_bf16"] = len(texts), int(units.sum()), round(seconds, 1)
    out.to_csv(run / "bf16_check.tsv", sep="\t", index=False)
    print(out.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
