"""What Qwen/Qwen2.5-0.5B and gpt2 cost in the language-model workflow: parameters, matmul FLOPs and
KV-cache bytes per token, activation memory, this CPU's measured speed on smaller random models of
the same families scaled by FLOPs, and the hours of each stage of the shipped `gpt2_en` experiment
on one GPU at an assumed throughput (docs/pretrained.md, "Qwen2.5-0.5B and GPT-2: what a run needs").

No download: the full models are built from their configs on the meta device (no memory), the
smaller ones with random weights. Usage: `.venv/bin/python benchmarks/lm_cost.py [--steps 3]`.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

# The public configs (transformers' Qwen2Config / GPT2Config of the hub repositories):
# Qwen/Qwen2.5-0.5B: hidden_size 896, 24 layers, 14 attention heads, 2 key/value heads,
# intermediate_size 4864, vocab 151,936, tied embeddings, max_position_embeddings 32768.
# gpt2 (124M): n_embd 768, 12 layers, 12 heads, vocab 50,257, n_positions 1024 (tied output layer).
QWEN = dict(family="qwen2", hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=151936, positions=32768)
GPT2 = dict(family="gpt2", hidden=768, layers=12, heads=12, kv_heads=12, ffn=3072, vocab=50257, positions=1024)
# The measured stand-ins: same family, same vocabulary, 4 layers of width 256.
SMALL = {"qwen2": dict(QWEN, hidden=256, layers=4, heads=4, kv_heads=2, ffn=1408),
         "gpt2": dict(GPT2, hidden=256, layers=4, heads=4, kv_heads=4, ffn=1024)}
EOT = {"qwen2": 151643, "gpt2": 50256}  # <|endoftext|>: BOS and EOS of both

# The shipped gpt2_en experiment (config/config.yaml) on Multi30k's English side. Sentences per
# split counted from the files (test_2017_flickr: 1,000 as test_2016_flickr); 13.2 pre-tokens a
# sentence counted with GPT-2's pre-tokenizer pattern on val/test/train; 16 tokens a sequence
# assumed (about 10% of words split by the BPE, plus BOS), for both tokenizers.
TOKENS = 16
SENTENCES = {"dev": 1014, "test": 1000}
ANALYSIS = 500  # analysis.max_sentences of dev
HEADS_MAX_TOKENS, TRAIN_MAX_TOKENS = 2000, 1600  # heads.max_tokens (lm_quality, curve too), training.max_tokens
PRUNE_RUNS, PRUNE_STEPS, EVALS = 4, 500, 2  # lambdas 0, 0.01, 0.1, 0.3; max_steps 500; eval_interval 250
CURVE_POINTS = 10  # michel_step 0.1: 0%, 10%, ..., 90% of the heads removed
QUALITY_JOBS = 6  # baseline on both test sets, each pruned model on test_2016_flickr
LRP_SEEDS = 8  # lrp.step_relevance's max_seeds: steps explained by one vmapped backward
# Assumed sustained throughput: 40% of the dense bf16 peak (A100 312, H100 SXM 989 TFLOP/s).
GPUS = {"A100": 0.4 * 312e12, "H100": 0.4 * 989e12}
# Assumed floor per model call (kernel launches of an eager model at small batches): ms per forward
# per layer; a training step or backward counts 3 forwards' time, LRP's vmapped backward 3.
MS_PER_LAYER = 0.5


def config(size: dict):
    eot = EOT[size["family"]]
    if size["family"] == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(vocab_size=size["vocab"], n_positions=size["positions"], n_embd=size["hidden"],
                          n_layer=size["layers"], n_head=size["heads"], bos_token_id=eot, eos_token_id=eot)
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=size["hidden"], num_hidden_layers=size["layers"],
                       num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
                       intermediate_size=size["ffn"], vocab_size=size["vocab"], tie_word_embeddings=True,
                       max_position_embeddings=size["positions"], bos_token_id=eot, eos_token_id=eot)


def build(size: dict):
    """headcount's adapter (hf_lm.HFCausalLM: gated heads, eager attention) around a random model."""
    from transformers import GPT2LMHeadModel, Qwen2ForCausalLM

    from headcount.models.hf_lm import HFCausalLM, special_ids_of

    cfg = config(size)
    hf = (GPT2LMHeadModel if size["family"] == "gpt2" else Qwen2ForCausalLM)(cfg)
    return HFCausalLM(hf, special=special_ids_of(cfg))


def parameters(size: dict) -> dict[str, int]:
    """Counted on the meta device: nothing is allocated. A tied output layer counts once."""
    with torch.device("meta"):
        model = build(size).hf
    out = {"embeddings": 0, "attention": 0, "MLP": 0, "norms": 0}
    for name, p in model.named_parameters():
        part = ("embeddings" if any(k in name for k in ("wte", "wpe", "embed_tokens", "lm_head")) else
                "attention" if any(k in name for k in ("attn", "self_attn")) else
                "MLP" if "mlp" in name else "norms")
        out[part] += p.numel()
    out["total"] = sum(out.values())
    return out


def forward_flops(size: dict, T: int, head: bool = True) -> float:
    """Matrix-product FLOPs per token of one forward pass over sequences of T tokens: the layers'
    projections, eager attention's full T x T scores and context (causal masking computes them all),
    and (with `head`) the output layer over the vocabulary."""
    D, L, F, H, KV, V = (size[k] for k in ("hidden", "layers", "ffn", "heads", "kv_heads", "vocab"))
    Dh = D // H
    mlp = (3 if size["family"] == "qwen2" else 2) * D * F  # SwiGLU gate, up, down / fc, proj
    layer = 2 * (2 * D * D + 2 * D * KV * Dh + mlp) + 4 * T * H * Dh
    return L * layer + (2 * D * V if head else 0)


def kv_cache_bytes(size: dict) -> int:
    """KV-cache bytes per token, 2-byte values, from the model's own attention modules
    (pruning.removal.kv_cache_bytes_per_token, what the physical export reports)."""
    from headcount.pruning.removal import kv_cache_bytes_per_token

    with torch.device("meta"):
        return kv_cache_bytes_per_token(build(size))


def activation_bytes(size: dict, batch: int, T: int) -> float:
    """Bytes autograd saves for backward in a training step's forward (fp32, training mode, the
    loss included) over batch x T tokens, on the meta device: the full model's, from the difference
    of a 1- and a 2-layer model (per layer) and the rest (embeddings, logits, loss)."""
    saved = []
    for layers in (1, 2):
        with torch.device("meta"):
            model = build(dict(size, layers=layers)).train()
            params = {id(p) for p in model.parameters()}
            tokens = torch.zeros(batch, T + 1, dtype=torch.long)
        seen, total = set(), [0]

        def pack(t, seen=seen, total=total, params=params):
            if id(t) not in params and id(getattr(t, "_base", None)) not in params and id(t) not in seen:
                seen.add(id(t))
                total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits, _ = model(tokens[:, :0], tokens[:, :-1])
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        saved.append(total[0])
    per_layer = saved[1] - saved[0]
    return saved[0] - per_layer + size["layers"] * per_layer


def lrp_layer_token_passes(T: int, seeds: int = LRP_SEEDS) -> int:
    """Token-layer passes of lrp.step_relevance over one sequence of T steps: steps in chunks of
    `seeds`, each chunk one LRP forward over the prefix it can see and one backward per step over
    that prefix (input gradients only: a forward's matmul FLOPs each)."""
    return sum((1 + min(seeds, T - first)) * min(T, first + seeds) for first in range(0, T, seeds))


def measure(size: dict, batch: int, T: int, steps: int, n: int = 1024) -> dict[str, float]:
    """Seconds on this CPU, each the fastest of `steps` (after a warm-up), timed alternately so that
    all are read under the same load: a forward (no gradients), a training step (forward,
    cross-entropy, backward; no optimizer), Michel importance (forward and backward to the head
    contexts), LRP (lrp.step_relevance, rule ding) over batch x T tokens; and an fp32 n^3 product."""
    from headcount.analysis.importance import michel_importance, summed_nll
    from headcount.models.lrp import step_relevance

    torch.manual_seed(0)
    model = build(size)
    eot = EOT[size["family"]]
    x = torch.randint(0, eot, (batch, T + 1))
    x[:, 0] = eot
    src, tgt_in, tgt_out = x[:, :0], x[:, :-1], x[:, 1:]
    a, b = torch.randn(n, n), torch.randn(n, n)

    def forward():
        with torch.no_grad():
            model.eval()(src, tgt_in)

    def train():
        loss, _ = summed_nll(model.train(), src, tgt_in, tgt_out)
        loss.backward()
        model.zero_grad(set_to_none=True)

    timed = {"forward": forward, "train": train, "michel": lambda: michel_importance(model, [(src, tgt_in, tgt_out)]),
             "lrp": lambda: step_relevance(model, src, tgt_in, rule="ding"), "matmul": lambda: a @ b}
    best = {k: float("inf") for k in timed}
    for i in range(steps + 1):  # the first round is a warm-up
        for name, fn in timed.items():
            start = time.perf_counter()
            fn()
            if i:
                best[name] = min(best[name], time.perf_counter() - start)
    best["matmul_flops"] = 2 * n**3 / best.pop("matmul")
    return best


def stages(size: dict, T: int = TOKENS) -> list[tuple[str, str, float, float]]:
    """(stage, passes, FLOPs, model calls) of each model-running stage of gpt2_en, from the stage code."""
    fwd, body = forward_flops(size, T), forward_flops(size, T, head=False)
    heads = size["layers"] * size["heads"]
    analysis, test, dev = ANALYSIS * T, SENTENCES["test"] * T, SENTENCES["dev"] * T
    calls = lambda tokens, budget: -(-tokens // budget)  # noqa: E731 - batches of a token budget
    a_batches, t_batches = calls(analysis, HEADS_MAX_TOKENS), calls(test, HEADS_MAX_TOKENS)
    lrp = ANALYSIS * (lrp_layer_token_passes(T) * body + T * 2 * size["hidden"] * size["vocab"])
    return [
        ("lm_quality (6 jobs)", f"{QUALITY_JOBS} x forward over a test set ({test:,} tokens)",
         QUALITY_JOBS * test * fwd, QUALITY_JOBS * t_batches),
        ("score_heads: confidence", f"1 forward over the analysis set ({analysis:,} tokens)",
         analysis * fwd, a_batches),
        ("score_heads: Michel", "1 forward + backward to the head contexts (2 forwards' FLOPs)",
         2 * analysis * fwd, 3 * a_batches),
        ("score_heads: ablation", f"{heads + 1} forwards over the analysis set (1 + one per head)",
         (heads + 1) * analysis * fwd, (heads + 1) * a_batches),
        ("score_heads: LRP", f"one backward per token over its prefix, chunks of {LRP_SEEDS} "
         f"({lrp_layer_token_passes(T) / T:.1f} forwards of the layers a sequence)", lrp,
         a_batches * -(-T // LRP_SEEDS) * 4),
        ("head_roles", "2 forwards over the analysis set + induction (20 x 101 tokens)",
         (2 * analysis + 20 * 101) * fwd, 2 * a_batches + 1),
        ("prune_heads (4 runs)", f"{PRUNE_RUNS} x {PRUNE_STEPS} steps x {TRAIN_MAX_TOKENS:,} tokens forward+backward, "
         f"{EVALS} dev losses each", PRUNE_RUNS * (PRUNE_STEPS * TRAIN_MAX_TOKENS * 3 * fwd + EVALS * dev * fwd),
         PRUNE_RUNS * (3 * PRUNE_STEPS + EVALS * calls(dev, TRAIN_MAX_TOKENS))),
        ("ranked_curve (Michel)", f"{CURVE_POINTS} points x forward over the test set",
         CURVE_POINTS * test * fwd, CURVE_POINTS * t_batches),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed rounds after a warm-up")
    parser.add_argument("--batch", type=int, default=4, help="sequences per measured pass")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    T = TOKENS
    cpu_flags = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} thread(s), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, AVX512-BF16 {'avx512_bf16' in cpu_flags}, "
          f"AMX {'amx_bf16' in cpu_flags}, {time.strftime('%Y-%m-%d')}")
    print(f"sequences of {T} tokens (gpt2_en on Multi30k); GPU throughput assumed: "
          + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s (40% of dense bf16)" for k, v in GPUS.items())
          + f"; floor {MS_PER_LAYER} ms per layer per model call (assumed)\n")
    for name, size in (("Qwen/Qwen2.5-0.5B", QWEN), ("gpt2", GPT2)):
        counts = parameters(size)
        fwd = forward_flops(size, T)
        print(f"## {name}\n")
        print("parameters: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in counts.items()))
        print(f"matmul FLOPs per token ({T}-token sequences): forward {fwd / 1e9:.3f} G, forward+backward "
              f"{3 * fwd / 1e9:.3f} G (at {size['positions']} tokens: forward "
              f"{forward_flops(size, size['positions']) / 1e9:.3f} G)")
        print(f"KV cache per token (fp16): {kv_cache_bytes(size):,} bytes")
        act = activation_bytes(size, TRAIN_MAX_TOKENS // T, T)
        states = 16 * counts["total"]
        print(f"fine-tuning memory: weights, gradients, Adam moments (fp32) {states / 1e9:.1f} GB + activations of a "
              f"{TRAIN_MAX_TOKENS}-token batch (fp32, saved for backward) {act / 1e9:.1f} GB = "
              f"{(states + act) / 1e9:.1f} GB")
        P = counts["total"]
        print(f"disk (4 bytes a parameter): baseline/model.pt {4 * P / 1e9:.2f} GB; each pruning run model.pt and "
              f"train/best.pt {8 * P / 1e9:.2f} GB, train/checkpoint.pt with Adam's moments {12 * P / 1e9:.2f} GB; "
              f"{PRUNE_RUNS} runs and the baseline {(4 + PRUNE_RUNS * 20) * P / 1e9:.1f} GB, without the runs' "
              f"train/ folders {(4 + PRUNE_RUNS * 4) * P / 1e9:.1f} GB (plus the download)")
        small = SMALL[size["family"]]
        seconds = measure(small, args.batch, T, args.steps)
        tokens = args.batch * T
        sf, sb = forward_flops(small, T), forward_flops(small, T, head=False)
        rates = {"forward": tokens * sf / seconds["forward"], "train": tokens * 3 * sf / seconds["train"],
                 "michel": tokens * 2 * sf / seconds["michel"],
                 "lrp": args.batch * (lrp_layer_token_passes(T) * sb + T * 2 * small["hidden"] * small["vocab"])
                 / seconds["lrp"]}
        print(f"measured on a random {small['layers']}-layer, width-{small['hidden']} {size['family']} "
              f"({args.batch} x {T} tokens, fp32): forward {seconds['forward'] / tokens * 1e3:.2f} ms/token, training "
              f"step {seconds['train']:.3f} s ({seconds['train'] / tokens * 1e3:.2f} ms/token), Michel "
              f"{seconds['michel'] / seconds['forward']:.1f}x and LRP {seconds['lrp'] / seconds['forward']:.1f}x a "
              f"forward; fp32 matmul {seconds['matmul_flops'] / 1e9:.0f} GFLOP/s; achieved "
              + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates.items()) + " GFLOP/s")
        print(f"scaled by FLOPs: {name} forward {rates['forward'] / fwd:.0f} tokens/s, training "
              f"{rates['train'] / (3 * fwd):.0f} tokens/s on this CPU\n")
        kind = {"lm_quality": "forward", "confidence": "forward", "Michel": "michel", "ablation": "forward",
                "LRP": "lrp", "head_roles": "forward", "prune_heads": "train", "ranked_curve": "forward"}
        print("| stage | passes | FLOPs | this CPU (h) | " + " | ".join(f"{g} (min)" for g in GPUS)
              + " | calls (forward-equivalent) | call floor (min) |")
        print("|---|---|---|---|" + "---|" * (len(GPUS) + 2))
        totals = [0.0] * (4 + len(GPUS))
        for stage, passes, flops, n_calls in stages(size, T):
            rate = rates[next(v for k, v in kind.items() if k in stage)]
            floor = n_calls * size["layers"] * MS_PER_LAYER / 1e3 / 60
            gpu = [flops / r / 60 for r in GPUS.values()]
            values = [flops, flops / rate / 3600, *gpu, n_calls, floor]
            totals = [t + v for t, v in zip(totals, values, strict=True)]
            print(f"| {stage} | {passes} | {flops:.2e} | {flops / rate / 3600:.2f} | "
                  + " | ".join(f"{g:.2f}" for g in gpu) + f" | {n_calls:,} | {floor:.2f} |")
        print(f"| total | | {totals[0]:.2e} | {totals[1]:.1f} | " + " | ".join(f"{g:.1f}" for g in totals[2:-2])
              + f" | {int(totals[-2]):,} | {totals[-1]:.1f} |\n")


if __name__ == "__main__":
    main()
