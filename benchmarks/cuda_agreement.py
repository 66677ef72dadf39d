"""Does a trained model compute the same on CUDA as on the CPU? (run on a lent GPU)

    python benchmarks/cuda_agreement.py CHECKPOINT [--sentences 200] [--out agreement.json]
        [--experiment results/multi30k_en_de] [--lrp]

With fp32 on both devices: the teacher-forced logits and attention maps of the first N dev sentences
(largest absolute difference), the same with half of the heads masked, and greedy translations
(how many are identical). With --lrp, also the "ding" LRP of those sentences (reference
translations teacher-forced): each cut's mean total on each device, the share of steps whose total
agrees to 1e-3, and the largest difference of a head's averaged share. Dev data and subword
models: the experiment's (default results/multi30k_en_de, as time_to_quality.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
EXP = HERE.parent / "results" / "multi30k_en_de"


def main() -> int:
    import torch

    from headcount.data.batching import source_tensor, target_tensors
    from headcount.data.subwords import Segmenter
    from headcount.io import read_lines
    from headcount.models.loading import load_model
    from headcount.training.decode import translate

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--out")
    ap.add_argument("--devices", default="cpu,cuda", help="the two devices compared (cpu,cpu: a dry run here)")
    ap.add_argument("--experiment", type=Path, default=EXP, help="where the dev data and subword models are")
    ap.add_argument("--lrp", action="store_true", help="compare the ding rule's LRP too")
    args = ap.parse_args()
    exp = args.experiment
    src_seg, tgt_seg = Segmenter(str(exp / "subwords" / "src.model")), Segmenter(str(exp / "subwords" / "tgt.model"))
    src_ids = src_seg.encode(read_lines(exp / "data" / "dev.src.txt")[: args.sentences])
    tgt_ids = tgt_seg.encode(read_lines(exp / "data" / "dev.tgt.txt")[: args.sentences])
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides, as the CPU computes
    torch.backends.cudnn.allow_tf32 = False
    first, second = args.devices.split(",")
    devices = {"first": first, "second": second}
    models = {k: load_model(args.checkpoint).eval().to(d) for k, d in devices.items()}
    special = models["first"].special
    src, (tgt_in, _) = source_tensor(src_ids, special), target_tensors(tgt_ids, special)

    def outputs(model, device):
        with torch.inference_mode():
            logits, weights = model(src.to(device), tgt_in.to(device), need_weights=True)
        maps = [w.float().cpu() for side in weights.values() for w in side]
        return logits.float().cpu(), maps

    def largest_difference():
        (a, maps_a), (b, maps_b) = (outputs(models[k], devices[k]) for k in ("first", "second"))
        return (float((a - b).abs().max()), max(float((x - y).abs().max()) for x, y in zip(maps_a, maps_b)),
                float(a.abs().max()))

    record = {"checkpoint": args.checkpoint, "sentences": len(src_ids), "torch": torch.__version__,
              "devices": args.devices,
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    record["logits_max_abs_diff"], record["attention_max_abs_diff"], record["logits_max_abs"] = largest_difference()
    torch.manual_seed(0)
    masks = {k: (torch.rand(m.shape) < 0.5).float() for k, m in models["first"].head_mask().items()}
    for model in models.values():
        model.set_head_mask({k: m.to(next(model.parameters()).device) for k, m in masks.items()})
    record["masked_heads"] = int(sum(float((1 - m).sum()) for m in masks.values()))
    record["masked_logits_max_abs_diff"], record["masked_attention_max_abs_diff"], _ = largest_difference()
    for model in models.values():
        model.set_head_mask({k: torch.ones_like(m).to(next(model.parameters()).device) for k, m in masks.items()})
    hyps = {k: translate(models[k], src_ids, beam=1, max_tokens=8000, device=devices[k]) for k in models}
    record["greedy_identical"] = sum(a == b for a, b in zip(hyps["first"], hyps["second"]))
    if args.lrp:
        record["lrp"] = lrp_agreement(models, devices, src_ids, tgt_ids)
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def lrp_agreement(models: dict, devices: dict, src_ids: list, tgt_ids: list) -> dict:
    """The ding rule's cut totals and averaged head shares on both devices, and how far they agree."""
    import torch

    from headcount.analysis.importance import dev_batches
    from headcount.analysis.relevance import sub_batches

    first = models["first"]
    totals = {k: {} for k in models}  # device -> cut -> list of (steps,) totals
    shares = {k: {} for k in models}  # device -> type -> (L, H) summed normalised shares
    n_steps = 0
    for batch in dev_batches(src_ids, tgt_ids, 2000, special=first.special):
        for src, tgt_in in sub_batches(first, batch[0], batch[1], 250):
            for k, model in models.items():
                result = model.lrp_forward().ding_relevance(src.to(devices[k]), tgt_in.to(devices[k]))
                valid = result.valid.cpu()
                for name, total in result.cuts.items():
                    totals[k].setdefault(name, []).append(total.double().cpu()[valid])
                for kind, r in result.normalised().items():
                    summed = (r.double().cpu() * valid[..., None, None]).sum((0, 1))
                    shares[k][kind] = shares[k].get(kind, 0) + summed
            n_steps += int(valid.sum())
    cuts = {}
    for name in totals["first"]:
        a, b = torch.cat(totals["first"][name]), torch.cat(totals["second"][name])
        agree = (a - b).abs() <= 1e-3 * a.abs().clamp_min(1)
        cuts[name] = {"mean_total_first": float(a.mean()), "mean_total_second": float(b.mean()),
                      "share_of_steps_agreeing": float(agree.double().mean())}
    heads = {kind: float((shares["first"][kind] - shares["second"][kind]).abs().max() / n_steps)
             for kind in shares["first"]}
    return {"steps": n_steps, "cuts": cuts, "head_share_max_abs_diff": heads}


if __name__ == "__main__":
    sys.exit(main())
