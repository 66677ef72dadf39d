"""Single-head ablation, one head per dev pass (the old loop) against several heads per forward pass
(importance.head_ablation's heads_per_pass; also at 1 head per pass, which separates batching from
forming logits at target positions only), on a random Llama-shaped causal LM with grouped-query
attention: wall time of the whole ablation, both sides alternating in one process, each keeping its
fastest run, and the largest difference of their delta_loss.

Usage: `.venv/bin/python benchmarks/ablation_batching.py [--sentences 128] [--repeats 2]`; on a real
model, the heads of some layers: `--model results/smollm2_en/baseline/model.pt --tokenizer
results/smollm2_en/pretrained/tokenizer --text results/smollm2_en/data/dev.src.txt --layers 0,17`.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

import torch

from headcount.analysis.importance import HEADS_PER_PASS, dev_batches, head_ablation, masked_mean_nlls, mean_nll

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
    """The old loop against heads_per_pass on the heads of `--layers` of a real model's checkpoint,
    over the first `--sentences` lines of `--text`, alternating, each side's fastest kept."""
    from headcount.io import read_lines
    from headcount.models.loading import load_model, open_tokenizer

    model = load_model(args.model).eval()
    tokenizer = open_tokenizer(args.tokenizer, "source")
    lines = read_lines(args.text)[: args.sentences]
    ids = tokenizer.encode(lines)
    batches = dev_batches(ids, ids, args.max_tokens, special=model.special, objective="causal_lm")
    kind = next(iter(model.head_mask()))
    n_heads = model.head_mask()[kind].shape[1]
    heads = [(kind, int(layer), h) for layer in args.layers.split(",") for h in range(n_heads)]
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.model}, {len(lines)} sentences, {len(batches)} batches "
          f"of at most {args.max_tokens} tokens, {len(heads)} heads (layers {args.layers})")
    best = {"one": float("inf"), "batched": float("inf")}
    with torch.no_grad():
        for _ in range(args.repeats):
            start = time.perf_counter()
            base, old = mean_nll(model, batches), []
            for kind_, layer, head in heads:
                mask = torch.ones_like(model.head_mask()[kind_])
                mask[layer, head] = 0
                model.set_head_mask({kind_: mask})
                old.append(mean_nll(model, batches) - base)
                model.set_head_mask({kind_: torch.ones_like(mask)})
            best["one"] = min(best["one"], time.perf_counter() - start)
            start = time.perf_counter()
            base, new = mean_nll(model, batches), []
            for i in range(0, len(heads), HEADS_PER_PASS):
                new += [loss - base for loss in masked_mean_nlls(model, batches, heads[i:i + HEADS_PER_PASS])]
            best["batched"] = min(best["batched"], time.perf_counter() - start)
    diff = max(abs(a - b) for a, b in zip(old, new))
    print(f"one head per pass {best['one'] / len(heads):.2f} s/head, {HEADS_PER_PASS} per pass "
          f"{best['batched'] / len(heads):.2f} s/head: ratio {best['one'] / best['batched']:.2f}; "
          f"max delta_loss difference {diff:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--model", help="a headcount checkpoint of a causal LM (with --tokenizer, --text, --layers)")
    parser.add_argument("--tokenizer")
    parser.add_argument("--text")
    parser.add_argument("--layers", default="0")
    parser.add_argument("--max-tokens", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model:
        return real_model(args)
    model = build(SIZE)
    rng = random.Random(0)
    texts = [[rng.randrange(3, SIZE["vocab"]) for _ in range(rng.randint(8, 24))] for _ in range(args.sentences)]
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; model {SIZE}, {args.sentences} sentences")
    print(f"| dev batches (max_tokens) | batches | heads | one at a time (s) | 1 head per pass (s) | "
          f"{HEADS_PER_PASS} per pass (s) | ratio | max diff |")
    print("|---|---|---|---|---|---|---|---|")
    for max_tokens in (2000, 250):
        batches = dev_batches(texts, texts, max_tokens, special=model.special, objective="causal_lm")
        best = {"one": float("inf"), "single": float("inf"), "batched": float("inf")}
        for _ in range(args.repeats):  # alternating, each side's fastest kept: the machine is shared
            start = time.perf_counter()
            reference = one_head_at_a_time(model, batches)
            best["one"] = min(best["one"], time.perf_counter() - start)
            start = time.perf_counter()  # the new path without batching: logits at targets only
            head_ablation(model, batches, heads_per_pass=1)
            best["single"] = min(best["single"], time.perf_counter() - start)
            start = time.perf_counter()
            table = head_ablation(model, batches, heads_per_pass=HEADS_PER_PASS)
            best["batched"] = min(best["batched"], time.perf_counter() - start)
        diff = max(abs(r.delta_loss - reference[(r.type, r.layer, r.head)]) for r in table.itertuples())
        print(f"| {max_tokens} | {len(batches)} | {len(reference)} | {best['one']:.1f} | {best['single']:.1f} | "
              f"{best['batched']:.1f} | {best['one'] / best['batched']:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
