"""The causal tests and the matched-count arms on the planted copying circuit (tests/data/copying_control,
tools/make_copying_control.py), where the answer is known: its layer-1 prefix-matching heads copy,
and the loss on the second copy rests on them. Writes causal.tsv and head_counts_summary.tsv under
--out (tools/publish_results.py --head-counts puts them in docs/tables as copying_control_*).

    .venv/bin/python tools/copying_control_evidence.py --out results/head_counts/copying_control
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import headcount  # noqa: E402
from headcount.analysis import causal_roles as cr  # noqa: E402
from headcount.pipeline import head_counts as hcnt  # noqa: E402
from headcount.pruning import matched_counts as mc  # noqa: E402

CONTROL = REPO / "tests" / "data" / "copying_control"
HALF = 20  # inside the control's training range (10-30)
THRESHOLD = 0.4  # roles.registry's induction threshold, for prefix matching and the previous-token score


def scores(h, sequences) -> pd.DataFrame:
    """Each head's prefix matching and previous-token attention on the copied positions."""
    cache = h.cache(sequences, outputs=False)
    rows = []
    q = torch.arange(HALF + 1, 2 * HALF)
    for (_, layer), per_text in cache.patterns.items():
        maps = torch.stack(per_text)  # (texts, H, T, T)
        for head in range(maps.shape[1]):
            rows.append({"layer": layer, "head": head, "name": f"{layer + 1}.{head + 1}",
                         "prefix": float(maps[:, head, q, q - HALF + 1].mean()),
                         "previous": float(maps[:, head, q, q - 1].mean())})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    import argparse
    import json

    import transformers

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "head_counts" / "copying_control")
    out = parser.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    from headcount.provenance import provenance

    (out / "provenance").mkdir(exist_ok=True)
    (out / "provenance" / "run.json").write_text(json.dumps(provenance(), indent=1), encoding="utf-8")

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(CONTROL), attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(CONTROL))
    with headcount.heads(hf, tokenizer, device="cpu") as h:
        special = cr.special_ids(h)
        sequences = cr.repeated_random_tokens(hf.config.vocab_size, 30, half=HALF, seed=3, avoid=special)
        found = scores(h, sequences)
        induction = list(found.loc[found["prefix"] >= THRESHOLD, "name"])
        previous = list(found.loc[found["previous"] >= THRESHOLD, "name"])
        rows = []
        for heads in [[name] for name in induction] + [induction]:
            rows.append(cr.induction_test(h, heads, sequences, seed=0).table.assign(role="induction"))
        away = [n for n in found.loc[found["layer"] == 1, "name"] if n not in induction][: len(induction)]
        rows.append(cr.induction_test(h, away, sequences, seed=0).table.assign(role="none (drawn away)"))
        composition = cr.composition_test(h, previous, induction, sequences, seed=0)
        rows.append(composition.table.assign(role="previous token -> induction"))
        copying = cr.copying_scores(h, sequences).set_index("name")
        table = pd.concat(rows, ignore_index=True)
        table["copying_score"] = [np.mean([copying.loc[n, "copying_score"] for n in heads.split()])
                                  for heads in table["heads"]]
        table = table.merge(found.rename(columns={"name": "heads"})[["heads", "prefix", "previous"]], on="heads",
                            how="left")
        table.to_csv(out / "causal.tsv", sep="\t", index=False)
        print(table.drop(columns=["note"]).to_string(index=False))
        # the matched-count arms: single-head ablation's ranking (on other sequences) against 20 draws
        train = cr.repeated_random_tokens(hf.config.vocab_size, 30, half=HALF, seed=11, avoid=special)
        keys = [(r.type, int(r.layer), int(r.head)) for r in h.heads.itertuples()]
        counts = mc.counts_removed(len(keys))
        ablation = hcnt.single_head_ablation(h, train)
        arms = [mc.ranking_arm("single-head ablation", hcnt._keyed(ablation, "delta_loss"), counts,
                               "delta loss, other repeated sequences"), *mc.random_arms(keys, counts)]
        with tempfile.TemporaryDirectory() as scratch:
            measured = mc.measure_arms(h, sequences, arms, Path(scratch) / "scored.tsv", log=lambda m: None)
        verdicts = mc.verdicts(measured, arms, margin=0.05)
        summary = mc.summary(verdicts, len(keys))
        summary.to_csv(out / "head_counts_summary.tsv", sep="\t", index=False)
        print(summary[["count", "arm", "removed", "loss", "random_p5", "random_p95", "beats_random"]].to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
