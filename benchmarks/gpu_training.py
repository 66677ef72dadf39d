"""The default model's training step on a GPU, eager against fixed shapes replayed as CUDA graphs
(issue 60, item 3): steps/s and tokens/s in fp32 and under bf16 autocast. benchmarks/gpu_training.sh
runs it on a lent GPU; `--device cpu --steps 2 --variants eager eager-buckets` checks its logic here.

Every variant trains its own copy of the default experiment's model (same initial weights,
relu_dropout 0) with training.loop's optimizer (fused Adam), label smoothing and clipping, on the
same synthetic Multi30k-like batches (benchmarks/run.py's). Variants:
- eager: training.loop's own step (loop.forward_loss and loop.update), no padding;
- eager-buckets: static_shapes.padded_loss without compiling: the padding to buckets alone;
- cudagraphs: the same step through torch.compile's cudagraphs backend (the eager kernels, recorded
  once per shape and replayed with one launch);
- inductor: torch.compile(mode="reduce-overhead"): fused kernels, replayed as CUDA graphs.
Only the batches of the `--shapes` most common bucket shapes are used, so that the compiling fits a
short call; the variants alternate over them `--repeats` times after a warm-up pass that compiles
every shape, each keeping its fastest pass. tokens/s counts real source and target tokens, not
padding. A variant that fails is reported with its error; one that would start after `--deadline`
seconds is skipped.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "benchmarks"))


def select_batches(batches, buckets, shapes: int):
    """The batches whose bucket shape is among the `shapes` most common, in their order."""
    count = collections.Counter(buckets.shape(s.shape[0], s.shape[1], t.shape[1]) for s, t, _ in batches)
    keep = {shape for shape, _ in count.most_common(shapes)}
    return [b for b in batches if buckets.shape(b[0].shape[0], b[0].shape[1], b[1].shape[1]) in keep], sorted(keep)


def make_variant(name: str, precision: str, device, buckets):
    import torch
    from run import SIZES

    from headcount.models.transformer import ModelConfig, Transformer
    from headcount.training.loop import TrainConfig, forward_loss, make_optimizer, parameter_groups, update
    from headcount.training.static_shapes import padded_loss

    d, ff, layers, vocab = SIZES["default"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab, vocab, d_model=d, n_heads=8, d_ff=ff, enc_layers=layers,
                                    dec_layers=layers, relu_dropout=0.0, dropout_masks="fast", max_len=512)).to(device)
    model.train()
    cfg = TrainConfig()
    groups = parameter_groups(model)
    params = [p for group in groups for p in group["params"]]
    optimizer = make_optimizer(groups, cfg, device)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    dtype = torch.bfloat16 if precision == "bf16" else None
    # The loop's own step (forward_loss, update); every variant but eager on padded bucket shapes.
    padded = None if name == "eager" else padded_loss(
        model, cfg.label_smoothing, dtype, "buckets" if name == "eager-buckets" else name, buckets)

    def step(batch):
        loss, loss_sum, _, n_tokens = forward_loss(model, batch, cfg, device, dtype, padded=padded)
        update(optimizer, loss, params, cfg.clip_norm)
        return loss_sum.detach(), n_tokens
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--variants", nargs="+", default=["eager", "eager-buckets", "cudagraphs", "inductor"])
    parser.add_argument("--batches", type=int, default=120, help="synthetic batches drawn before selecting shapes")
    parser.add_argument("--shapes", type=int, default=2, help="bucket shapes kept (each is compiled once)")
    parser.add_argument("--steps", type=int, default=40, help="steps per timed pass (cycling over the batches)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows-multiple", type=int, default=16)
    parser.add_argument("--length-multiple", type=int, default=8)
    parser.add_argument("--deadline", type=float, default=200.0, help="seconds; no variant starts after it")
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the results")
    args = parser.parse_args()
    start = time.perf_counter()

    import torch
    from run import SIZES, synthetic_batches

    from headcount.data.subwords import SPECIAL_IDS
    from headcount.training.static_shapes import Buckets, pad_batch

    device = torch.device(args.device)
    buckets = Buckets(args.rows_multiple, args.length_multiple)
    batches, shapes = select_batches(synthetic_batches(SIZES["default"][3], args.batches), buckets, args.shapes)
    batches = [tuple(x.to(device) for x in b) for b in batches]
    timed = [batches[i % len(batches)] for i in range(args.steps)]
    real = sum(int(s.ne(0).sum()) + int(o.ne(0).sum()) for s, _, o in timed)
    padded = sum(int(x.numel()) for b in timed
                 for x in pad_batch(b, buckets.shape(b[0].shape[0], b[0].shape[1], b[1].shape[1]), SPECIAL_IDS)[:2])
    own = sum(int(s.numel()) + int(t.numel()) for s, t, _ in timed)
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "shapes": [list(s) for s in shapes], "batches": len(batches), "steps_per_pass": args.steps,
            "real_tokens_per_pass": real, "bucket_positions_over_batch_positions": padded / own}
    print(json.dumps(info), flush=True)
    results = []

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    groups = {precision: {} for precision in args.precisions}  # name -> (step, row) of the variants built
    best: dict = {}

    def build(precision: str, name: str) -> None:
        row = {"precision": precision, "variant": name}
        results.append(row)
        if time.perf_counter() - start > args.deadline:
            row["skipped"] = "deadline"
            return
        try:
            step = make_variant(name, precision, device, buckets)
            t0 = time.perf_counter()
            losses = [float(step(b)[0]) for b in batches]  # every shape once: compiles here
            sync()
            row["warmup_s"] = time.perf_counter() - t0
            row["first_loss_per_token"] = losses[0] / float(batches[0][2].ne(0).sum())
            groups[precision][name] = (step, row)
            best[precision, name] = float("inf")
        except Exception as error:  # noqa: BLE001 - reported, and the other variants still run
            row["error"] = f"{type(error).__name__}: {error}"[:500]
            traceback.print_exc()
        print(json.dumps(row), flush=True)

    def time_group(precision: str) -> None:
        """The precision's variants alternate over the same steps; each keeps its fastest pass."""
        variants = groups[precision]
        for _ in range(args.repeats):
            for name, (step, row) in list(variants.items()):
                try:
                    sync()
                    t0 = time.perf_counter()
                    for b in timed:
                        step(b)
                    sync()
                    best[precision, name] = min(best[precision, name], time.perf_counter() - t0)
                except Exception as error:  # noqa: BLE001
                    row["error"] = f"{type(error).__name__}: {error}"[:500]
                    del variants[name]
        for name, (_, row) in variants.items():
            row["steps_per_s"] = args.steps / best[precision, name]
            row["tokens_per_s"] = real / best[precision, name]
        eager = variants.get("eager")
        for _, row in variants.values():
            if eager:
                row["over_eager"] = row["tokens_per_s"] / eager[1]["tokens_per_s"]

    # The quick variants of every precision first, inductor (minutes of compiling) last.
    phases = [[v for v in args.variants if v != "inductor"], [v for v in args.variants if v == "inductor"]]
    for phase in filter(None, phases):
        for precision in args.precisions:
            for name in phase:
                build(precision, name)
            time_group(precision)
    info["results"], info["seconds"] = results, time.perf_counter() - start
    lines = [f"{info['device']}, torch {info['torch']}; shapes {info['shapes']}, {args.steps} steps a pass, "
             f"bucket positions / batch positions {info['bucket_positions_over_batch_positions']:.2f}", "",
             "| precision | variant | steps/s | tokens/s | / eager | warm-up s |", "|---|---|---|---|---|---|"]
    for r in results:
        if "tokens_per_s" in r:
            lines.append(f"| {r['precision']} | {r['variant']} | {r['steps_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
                         f"{r.get('over_eager', float('nan')):.2f} | {r['warmup_s']:.1f} |")
        else:
            lines.append(f"| {r['precision']} | {r['variant']} | {r.get('skipped') or r.get('error', '?')} | | | |")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(info, indent=1) + "\n")
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
