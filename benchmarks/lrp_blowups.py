"""Does the "ding" rule's conservation drift change which heads LRP ranks first?

    PYTHONPATH=src .venv/bin/python benchmarks/lrp_blowups.py results/multi30k_en_de [--sentences 500]

The "ding" rule (LRP-0, no stabiliser) is exact at the top cut and drifts below it
(heads/lrp_conservation.tsv): a sum of summands near zero on one token multiplies that token's
relevance. Head relevance is normalised per layer and step, so a blown-up step cannot outweigh the
others, but it can still skew its own step's shares. This compares, per attention type and layer,
the head shares averaged over every step with those averaged over the well-conserved steps only
(the total crossing every cut at or above the layer within [1/2, 2]), and with the "attnlrp"
rule's shares over every step. Teacher-forces the reference translations of the first dev
sentences (the DAG's LRP forces the model's own translations; this asks only about the rule).
Prints a markdown table: Spearman and largest share difference per layer.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from headcount.analysis.correlations import spearman
from headcount.analysis.importance import dev_batches
from headcount.analysis.relevance import sub_batches
from headcount.io import read_lines
from headcount.models.loading import load_model, open_tokenizer
from headcount.models.lrp import step_relevance


def add(sums: dict, key: tuple, shares: torch.Tensor, mask: torch.Tensor) -> None:
    """Adds one layer's head shares (T, B, H) over the steps in mask (T, B) to sums[key]."""
    sums[key] = sums.get(key, 0) + (shares.double() * mask[..., None]).sum((0, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--band", type=float, default=2.0, help="well conserved: total in [1/band, band]")
    args = parser.parse_args()
    torch.set_num_threads(1)
    exp = args.experiment
    model = load_model(exp / "baseline/model.pt").eval()
    src_seg = open_tokenizer(exp / "subwords/src.model", "source")
    tgt_seg = open_tokenizer(exp / "subwords/tgt.model", "target")
    src = src_seg.encode(read_lines(exp / "data/dev.src.txt")[: args.sentences])
    tgt = tgt_seg.encode(read_lines(exp / "data/dev.tgt.txt")[: args.sentences])
    forward = model.lrp_forward()
    skip = len(model.special.forced)
    sums = {"all": {}, "conserved": {}, "attnlrp": {}}
    counts = {"all": {}, "conserved": {}}
    n_steps = 0
    for batch in dev_batches(src, tgt, 2000, special=model.special, objective="translation"):
        for s, t in sub_batches(model, batch[0], batch[1], 250):
            ding = forward.ding_relevance(s, t)
            attn = step_relevance(model, s, t, "attnlrp")
            valid = ding.valid.clone()
            valid[:skip] = False
            n_steps += int(valid.sum())
            ok = torch.ones_like(valid)  # (T, B): every cut so far within the band
            ok_at = {}
            for name in ding.cuts:  # filled top-down, as the backward pass meets them
                total = ding.cuts[name]
                ok = ok & (total >= 1 / args.band) & (total <= args.band)
                ok_at[name] = ok.clone()
            for kind, r in ding.normalised().items():
                layers = r.shape[2]
                for layer in range(layers):
                    # the cut just above this layer's heads: its context neurons are read there
                    keep = ok_at.get(f"{'enc' if kind == 'enc_self' else 'dec'}.{layer + 1}", ok) & valid
                    for label, mask in (("all", valid), ("conserved", keep)):
                        add(sums[label], (kind, layer), r[:, :, layer], mask)
                        counts[label][kind, layer] = counts[label].get((kind, layer), 0) + int(mask.sum())
            for kind, r in attn.normalised().items():
                for layer in range(r.shape[2]):
                    add(sums["attnlrp"], (kind, layer), r[:, :, layer], valid)
    print(f"{exp}: {len(src)} dev sentences, {n_steps} steps, reference translations teacher-forced, "
          f"well conserved = every cut down to the layer within [1/{args.band:g}, {args.band:g}]\n")
    print("| type | layer | steps well conserved | Spearman all vs conserved | max share diff | "
          "Spearman ding vs attnlrp | top head all / conserved / attnlrp |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(sums["all"]):
        all_ = sums["all"][key] / max(counts["all"][key], 1)
        cons = sums["conserved"][key] / max(counts["conserved"][key], 1)
        attn = sums["attnlrp"][key] / max(n_steps, 1)
        rho_c = spearman(all_.numpy(), cons.numpy()) if counts["conserved"][key] else float("nan")
        rho_a = spearman(all_.numpy(), attn.numpy())
        share = counts["conserved"][key] / max(counts["all"][key], 1)
        print(f"| {key[0]} | {key[1] + 1} | {share:.2f} | {rho_c:.2f} | {float((all_ - cons).abs().max()):.3f} | "
              f"{rho_a:.2f} | {int(all_.argmax()) + 1} / {int(cons.argmax()) + 1} / {int(attn.argmax()) + 1} |")


if __name__ == "__main__":
    main()
