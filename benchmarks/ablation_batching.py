"""Single-head ablation, one head per dev pass (the old loop) against several heads per forward pass
(importance.head_ablation's heads_per_pass; also at 1 head per pass, which separates batching from
forming logits at target positions only), and several heads per pass with every layer run on every
copy (full replication, as before models.shared_prefix) against copies that share the layers below
each pass's lowest head (the default), on a random Llama-shaped causal LM with grouped-query
attention: wall time of the whole ablation, the sides alternating in one process, each keeping its
fastest run, and the largest difference of their delta_loss.

Usage: `.venv/bin/python benchmarks/ablation_batching.py [--sentences 128] [--repeats 2]`. On a real
model, full replication against shared layers, pass by pass (head_ablation's passes: the heads in
layer order, HEADS_PER_PASS a pass; `--passes` picks some, `--layers` restricts the heads):
`--model results/smollm2_en/baseline/model.pt --tokenizer results/smollm2_en/pretrained/tokenizer
--text results/smollm2_en/data/dev.src.txt --sentences 100 --passes 0,4,8,12,16`. With `--score-heads`,
the whole ablation of every head through the workflow's entry point (pipeline.head_scores.score_model,
ablation alone), timed once, its deltas against `--published` (a heads/scores.csv).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

import headcount.models.shared_prefix as shared_prefix
from headcount.analysis.importance import HEADS_PER_PASS, dev_batches, head_ablation, masked_sentence_losses, mean_nll

# SmolLM2-135M is hidden 576, 30 layers, 9 query / 3 KV heads, ffn 1536, vocab 49,152; this is its
# shape scaled down so that the CPU measures all heads in about a minute.
SIZE = dict(hidden=192, layers=4, heads=6, kv_heads=2, ffn=512, vocab=49152)


def build(size: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    from headcount.models.hf_lm import HFCausalLM, special_ids_of

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                      num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
                      intermediate_size=size["ffn"], vocab_size=size["vocab"], bos_token_id=1, eos_token_id=2,
                      max_position_embeddings=256, tie_word_embeddings=True)
    return HFCausalLM(LlamaForCausalLM(cfg).eval(), special=special_ids_of(cfg)).eval()


@contextmanager
def full_replication():
    """The path before shared layers: no layer stacks, so every copy runs every layer."""
    stacks = shared_prefix.layer_stacks
    shared_prefix.layer_stacks = lambda model: None
    try:
        yield
    finally:
        shared_prefix.layer_stacks = stacks


def machine() -> str:
    return (f"{platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def one_head_at_a_time(model, batches) -> dict:
    """The loop head_ablation ran before heads_per_pass: set_head_mask, one dev pass per head."""
    original = {kind: m.clone() for kind, m in model.head_mask().items()}
    base, out = mean_nll(model, batches), {}
    for kind, mask in original.items():
        for layer in range(mask.shape[0]):
            for head in range(mask.shape[1]):
                masked = mask.clone()
                masked[layer, head] = 0.0
                model.set_head_mask({kind: masked})
                out[(kind, layer, head)] = mean_nll(model, batches) - base
                model.set_head_mask({kind: mask})
    return out


def real_model(args) -> None:
    """Full replication against shared layers on head_ablation's passes over a real model's
    checkpoint (the heads of `--layers`, in layer order, HEADS_PER_PASS a pass; the passes named by
    `--passes`), over the first `--sentences` lines of `--text`; each pass timed on both sides,
    alternating which goes first, each side's fastest of `--repeats` kept."""
    from headcount.io import read_lines
    from headcount.models.loading import load_model, open_tokenizer

    model = load_model(args.model).eval()
    tokenizer = open_tokenizer(args.tokenizer, "source")
    lines = read_lines(args.text)[: args.sentences]
    ids = tokenizer.encode(lines)
    batches = dev_batches(ids, ids, args.max_tokens, special=model.special, objective="causal_lm")
    masks = model.head_mask()
    layers = (range(next(iter(masks.values())).shape[0]) if args.layers == "all"
              else [int(x) for x in args.layers.split(",")])
    heads = sorted(((kind, layer, h) for kind, mask in masks.items() for layer in layers
                    for h in range(mask.shape[1])), key=lambda key: (shared_prefix.head_position(key), key))
    passes = [heads[i:i + HEADS_PER_PASS] for i in range(0, len(heads), HEADS_PER_PASS)]
    chosen = range(len(passes)) if args.passes == "all" else [int(x) for x in args.passes.split(",")]
    print(f"machine: {machine()}; {args.model}, {len(lines)} sentences, {len(batches)} batches of at most "
          f"{args.max_tokens} tokens, {len(heads)} heads in {len(passes)} passes of {HEADS_PER_PASS}")
    print("| pass | heads | lowest layer | full replication (s) | shared layers (s) | ratio | max diff |")
    print("|---|---|---|---|---|---|---|")
    totals = {"full": 0.0, "shared": 0.0, "heads": 0}
    with torch.no_grad():
        for index in chosen:
            chunk, best, sums = passes[index], {"full": float("inf"), "shared": float("inf")}, {}
            for repeat in range(args.repeats):
                for side in (("full", "shared") if (repeat + index) % 2 == 0 else ("shared", "full")):
                    start = time.perf_counter()
                    with full_replication() if side == "full" else nullcontext():
                        sums[side] = masked_sentence_losses(model, batches, chunk)[0]
                    best[side] = min(best[side], time.perf_counter() - start)
            diff = float(np.abs(sums["full"] - sums["shared"]).max())
            totals["full"] += best["full"]
            totals["shared"] += best["shared"]
            totals["heads"] += len(chunk)
            print(f"| {index} | {len(chunk)} | {chunk[0][1]} | {best['full']:.1f} | {best['shared']:.1f} | "
                  f"{best['full'] / best['shared']:.2f} | {diff:.1e} |", flush=True)
    n = totals["heads"]
    print(f"over {n} heads: full replication {totals['full'] / n:.2f} s/head, shared layers "
          f"{totals['shared'] / n:.2f} s/head, ratio {totals['full'] / totals['shared']:.2f}; {machine()}")


def score_heads(args) -> None:
    """Every head's ablation through the workflow's entry point (pipeline.head_scores.score_model,
    the measure `ablation` alone), on the analysis set as score_heads reads it, timed once."""
    import pandas as pd

    from headcount.io import read_lines
    from headcount.models.loading import load_model, open_tokenizer
    from headcount.pipeline.head_scores import score_model

    model = load_model(args.model).eval()
    tokenizer = open_tokenizer(args.tokenizer, "source")
    ids = tokenizer.encode(read_lines(args.text)[: args.sentences])
    batches = dev_batches(ids, ids, args.max_tokens, special=model.special, objective="causal_lm",
                          max_positions=model.max_positions)
    print(f"machine: {machine()}; {args.model}, {len(ids)} sentences, {len(batches)} batches", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    table = score_model(model, batches, batches, lrp_rule="ding", ablation=True, only=["ablation"], log=print).table
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    line = (f"{len(table)} heads: {wall:.0f} s wall, {cpu:.0f} s CPU, {wall / len(table):.2f} s a head, "
            f"max RSS {rss:.1f} GB")
    if args.published:
        published = pd.read_csv(args.published).set_index(["type", "layer", "head"])["delta_loss"]
        got = table.set_index(["type", "layer", "head"])["delta_loss"]
        line += f"; max |delta_loss - published| {float((got - published.reindex(got.index)).abs().max()):.1e}"
    print(f"{line}; {machine()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", help="a headcount checkpoint of a causal LM (with --tokenizer, --text, --layers)")
    parser.add_argument("--tokenizer")
    parser.add_argument("--text")
    parser.add_argument("--layers", default="all", help="the heads of these layers (comma-separated) or all")
    parser.add_argument("--passes", default="all", help="these of head_ablation's passes (comma-separated) or all")
    parser.add_argument("--score-heads", action="store_true", help="time the whole ablation (with --model)")
    parser.add_argument("--published", help="a heads/scores.csv to compare --score-heads' deltas with")
    parser.add_argument("--max-tokens", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        return score_heads(args) if args.score_heads else real_model(args)
    model = build(SIZE)
    rng = random.Random(0)
    texts = [[rng.randrange(3, SIZE["vocab"]) for _ in range(rng.randint(8, 24))] for _ in range(args.sentences)]
    print(f"machine: {machine()}; model {SIZE}, {args.sentences} sentences")
    print(f"| dev batches (max_tokens) | batches | heads | one at a time (s) | 1 head per pass (s) | "
          f"{HEADS_PER_PASS} per pass, full replication (s) | {HEADS_PER_PASS} per pass, shared layers (s) | "
          f"ratio to one at a time | max diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for max_tokens in (2000, 250):
        batches = dev_batches(texts, texts, max_tokens, special=model.special, objective="causal_lm")
        best = {"one": float("inf"), "single": float("inf"), "batched": float("inf"), "shared": float("inf")}
        for _ in range(args.repeats):  # alternating, each side's fastest kept: the machine is shared
            start = time.perf_counter()
            reference = one_head_at_a_time(model, batches)
            best["one"] = min(best["one"], time.perf_counter() - start)
            start = time.perf_counter()  # the new path without batching: logits at targets only
            head_ablation(model, batches, heads_per_pass=1)
            best["single"] = min(best["single"], time.perf_counter() - start)
            start = time.perf_counter()
            with full_replication():
                head_ablation(model, batches, heads_per_pass=HEADS_PER_PASS)
            best["batched"] = min(best["batched"], time.perf_counter() - start)
            start = time.perf_counter()
            table = head_ablation(model, batches, heads_per_pass=HEADS_PER_PASS)
            best["shared"] = min(best["shared"], time.perf_counter() - start)
        diff = max(abs(r.delta_loss - reference[(r.type, r.layer, r.head)]) for r in table.itertuples())
        print(f"| {max_tokens} | {len(batches)} | {len(reference)} | {best['one']:.1f} | {best['single']:.1f} | "
              f"{best['batched']:.1f} | {best['shared']:.1f} | {best['one'] / best['shared']:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
