"""Single-head ablation, one head per dev pass (the old loop) against several heads per forward pass
(importance.head_ablation's heads_per_pass; also at 1 head per pass, which separates batching from
forming logits at target positions only), on a random Llama-shaped causal LM with grouped-query
attention: wall time of the whole ablation, both sides alternating in one process, each keeping its
fastest run, and the largest difference of their delta_loss.

Usage: `.venv/bin/python benchmarks/ablation_batching.py [--sentences 128] [--repeats 2]`.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

import torch

from headcount.analysis.importance import HEADS_PER_PASS, dev_batches, head_ablation, mean_nll

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
