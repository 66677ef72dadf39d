"""Does a trained model compute the same on CUDA as on the CPU? (run on a lent GPU)

    python benchmarks/cuda_agreement.py CHECKPOINT [--sentences 200] [--out agreement.json]

With fp32 on both devices: the teacher-forced logits and attention maps of the first N dev sentences
(largest absolute difference), the same with half of the heads masked, and greedy translations
(how many are identical). Dev data and subword models: results/multi30k_en_de, as time_to_quality.py.
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
    args = ap.parse_args()
    src_seg, tgt_seg = Segmenter(str(EXP / "subwords" / "src.model")), Segmenter(str(EXP / "subwords" / "tgt.model"))
    src_ids = src_seg.encode(read_lines(EXP / "data" / "dev.src.txt")[: args.sentences])
    tgt_ids = tgt_seg.encode(read_lines(EXP / "data" / "dev.tgt.txt")[: args.sentences])
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
    text = json.dumps(record, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
