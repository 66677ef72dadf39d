"""Peak memory and time of each analysis against input length (issue 62, item 3).

    PYTHONPATH=src .venv/bin/python benchmarks/long_inputs.py                 # CPU, SmolLM2's shape, fp32
    python benchmarks/long_inputs.py --model llama7b --device cuda --dtype bfloat16 --lengths 512,2048

One document of each length (random token ids), batch of one, a model of the given shape with
random weights (the weights change neither memory nor time) built from its LlamaConfig and wrapped
as headcount wraps a loaded one (hf_lm.HFCausalLM). Every (stage, length) runs in a process of its
own, so its max RSS (CPU) or torch.cuda.max_memory_allocated (GPU) is its own. Stages:

- maps_all_layers: `model(..., need_weights=True)`, every layer's maps held at once: what the
  analyses did before streaming (for comparison; no analysis runs it any more)
- confidence: importance.head_confidence (streamed: one layer's maps at a time)
- roles: roles.collect.text_statistics (positional, sink, rare-token; word-level maps per layer),
  the document's words each one piece
- ablation: importance.masked_mean_nlls over `--heads-per-pass` heads (default importance.HEADS_PER_PASS):
  one batched pass of that many masked copies of the document, as head_ablation makes it
- michel: importance.michel_importance (forward and the gradient of the summed NLL)
- lrp: one chunk of lrp.step_relevance's steps at the full prefix (the chunk with the most memory:
  the last `max_seeds` steps, 8, one vmapped backward), attnlrp rule; a whole document is about
  T / 8 such chunks of growing prefix, so about T / 16 times this time

`--recompute off,on` measures Michel and LRP without and with per-layer recomputation
(models.recompute), alternating per length; the default, auto, is the library's rule (on above
recompute.RECOMPUTE_ABOVE positions). Their rows say which ran ("recompute": true/false).

`--layers` builds the model with fewer layers than its shape's (per-layer costs; `--stage-layers
lrp=2` for one stage). Prints a Markdown table (and `--json` writes the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

SHAPES = {  # LlamaConfig arguments
    "smollm2": dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576,
                    intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True),
    "llama7b": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, hidden_size=4096,
                    intermediate_size=11008, vocab_size=32000, max_position_embeddings=4096,
                    tie_word_embeddings=False),
    "tiny": dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
                 intermediate_size=64, vocab_size=300, max_position_embeddings=2048, tie_word_embeddings=True),
}
STAGES = ("maps_all_layers", "confidence", "roles", "ablation", "michel", "lrp")
LENGTHS = (128, 256, 512, 1024, 2048)


def build(shape: str, layers: int | None, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from headcount.data.special import SpecialIds
    from headcount.models.hf_lm import HFCausalLM

    settings = dict(SHAPES[shape])
    if layers:
        settings["num_hidden_layers"] = layers
    config = LlamaConfig(**settings, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built in its dtype: a 7B model is never held in float32
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return HFCausalLM(hf, special=SpecialIds(pad=0, bos=1, eos=2, unk=3)).eval()


class WordSegmenter:
    """Each word one piece ('▁word'), ids from a fixed map: a document of n words is n tokens."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def pieces(self, line: str) -> list[str]:
        return ["▁" + w for w in line.split()]

    def encode(self, lines):
        return [[4 + int(w[1:]) % (self.vocab - 4) for w in self.pieces(line)] for line in lines]


def measure(stage: str, length: int, shape: str, layers: int | None, dtype_name: str, device: str,
            heads_per_pass: int, model=None, recompute: str = "auto") -> dict:
    import torch

    from headcount.analysis import importance
    from headcount.data.batching import causal_lm_tensors
    from headcount.models.recompute import wants_recompute

    recomputed = wants_recompute({"auto": None, "on": True, "off": False}[recompute], length)

    dtype = getattr(torch, dtype_name)
    model = model if model is not None else build(shape, layers, dtype, device)
    vocab = model.config.vocab_size
    rng = random.Random(length)
    ids = [rng.randrange(4, vocab) for _ in range(length)]
    batch = [x.to(device) for x in causal_lm_tensors([ids], model.special)]
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    if stage == "maps_all_layers":
        with torch.no_grad():
            _, maps = model(batch[0], batch[1], need_weights=True)
        del maps
    elif stage == "confidence":
        importance.head_confidence(model, [batch])
    elif stage == "roles":
        from collections import Counter

        from headcount.analysis.roles.collect import text_statistics

        words = " ".join(str(rng.randrange(0, 2000)) for _ in range(length - 1))  # + BOS = length positions
        text_statistics(model, WordSegmenter(vocab), [words], Counter(words.split()), lowercase=False,
                        device=device, log=lambda _: None)
    elif stage == "ablation":
        heads = [("dec_self", layer, head) for layer in range(len(model.attention_modules()["dec_self"]))
                 for head in range(model.attention_modules()["dec_self"][0].n_heads)][:heads_per_pass]
        importance.masked_mean_nlls(model, [batch], heads)
    elif stage == "michel":
        importance.michel_importance(model, [batch], recompute=recomputed)
    elif stage == "lrp":
        from headcount.models.lrp import _seeded_backward, make_rules

        rules, forward = make_rules("attnlrp"), model.lrp_forward()
        forward.recompute = recomputed
        src, tgt_in = batch[0], batch[1]
        encoded = forward.encode(src, rules)
        trace = forward.decode(encoded, tgt_in, rules, None)
        steps = torch.arange(max(0, length - 8), length, device=tgt_in.device)
        _seeded_backward(trace, steps, torch.ones(len(steps), 1, dtype=torch.bool, device=tgt_in.device))
    else:
        raise ValueError(f"unknown stage {stage!r}")
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    row = {"stage": stage, "length": length, "layers": len(model.attention_modules()["dec_self"]),
           "seconds": seconds, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if stage == "ablation":
        row["copies"] = heads_per_pass
    if stage in ("michel", "lrp"):
        row["recompute"] = recomputed
    if cuda:
        row["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        row["cuda_peak_over_weights_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return row


def machine() -> str:
    import torch

    line = f"{platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}"
    if torch.cuda.is_available():
        line += f", {torch.cuda.get_device_name()}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--layers", type=int, default=None, help="build the model with this many layers")
    parser.add_argument("--stage-layers", default="", help="per stage, e.g. lrp=2,ablation=4")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--heads-per-pass", type=int, default=None)
    parser.add_argument("--recompute", default="auto",
                        help="Michel and LRP: auto, on, off, or a list (off,on) measured alternately per length")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    parser.add_argument("--json", default=None)
    parser.add_argument("--in-process", action="store_true",
                        help="GPU only: one process, the model built once per layer count, the peak reset per stage")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from headcount.analysis.importance import HEADS_PER_PASS

    heads_per_pass = args.heads_per_pass or HEADS_PER_PASS
    stage_layers = {k: int(v) for k, v in (x.split("=") for x in args.stage_layers.split(",") if x)}
    if args.one:
        stage, length = args.stages, int(args.lengths)
        print(json.dumps(measure(stage, length, args.model, stage_layers.get(stage, args.layers), args.dtype,
                                 args.device, heads_per_pass, recompute=args.recompute)))
        return
    rows = []
    models = {}
    modes = args.recompute.split(",")
    lengths = [int(x) for x in args.lengths.split(",")]
    runs = [(stage, length, recompute) for stage in args.stages.split(",") for length in lengths
            for recompute in (modes if stage in ("michel", "lrp") else ["auto"])]  # the modes alternate per length
    for stage, length, recompute in runs:
        if args.in_process:
            import torch

            layers = stage_layers.get(stage, args.layers)
            if layers not in models:
                models.clear()
                torch.cuda.empty_cache() if torch.cuda.is_available() else None
                models[layers] = build(args.model, layers, getattr(torch, args.dtype), args.device)
            try:
                rows.append(measure(stage, length, args.model, layers, args.dtype, args.device, heads_per_pass,
                                    models[layers], recompute))
            except torch.OutOfMemoryError as error:
                rows.append({"stage": stage, "length": length, "error": f"out of memory: {str(error)[:80]}"})
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            continue
        cmd = [sys.executable, __file__, "--one", "--stages", stage, "--lengths", str(length), "--model",
               args.model, "--device", args.device, "--dtype", args.dtype, "--heads-per-pass",
               str(heads_per_pass), "--stage-layers", args.stage_layers, "--recompute", recompute]
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")})
        except subprocess.TimeoutExpired:
            rows.append({"stage": stage, "length": length, "error": f"over {args.timeout:.0f} s"})
            print(f"{stage} {length}: over {args.timeout:.0f} s", file=sys.stderr, flush=True)
            continue
        if done.returncode != 0:
            message = (done.stderr.strip().splitlines() or ["?"])[-1]
            rows.append({"stage": stage, "length": length, "error": message[:120]})
            print(f"{stage} {length}: {message}", file=sys.stderr, flush=True)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{args.model} shape, {args.dtype}, {args.device}, one document per batch; {machine()}\n")
    gpu = args.device.startswith("cuda")
    print("| stage | layers | tokens | time (s) | " + ("peak GPU memory (MB) | over the weights (MB) |" if gpu
                                                      else "max RSS (MB) |"))
    print("|---|---:|---:|---:|" + ("---:|---:|" if gpu else "---:|"))
    gpu = gpu and any("cuda_peak_mb" in row for row in rows)
    for row in rows:
        name = row["stage"] + (f" ({row['copies']} copies)" if "copies" in row else "")
        name += {True: ", recomputed", False: ", not recomputed"}.get(row.get("recompute"), "")
        if "error" in row:
            print(f"| {name} | | {row['length']} | {row['error']} | |")
        elif gpu:
            print(f"| {name} | {row['layers']} | {row['length']} | {row['seconds']:.2f} | {row['cuda_peak_mb']:,.0f} "
                  f"| {row['cuda_peak_over_weights_mb']:,.0f} |")
        else:
            print(f"| {name} | {row['layers']} | {row['length']} | {row['seconds']:.2f} | {row['max_rss_mb']:,.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
