"""What facebook/wmt19-en-ru costs: parameters, matmul FLOPs per token, and this CPU's measured
training speed on a smaller FSMT, scaled by FLOPs (docs/pretrained.md, "facebook/wmt19-en-ru").

No download: the full model is built from its config on the meta device (no memory), the smaller
one with random weights. Usage: `.venv/bin/python benchmarks/fsmt_cost.py [--steps 8]`.
"""

from __future__ import annotations

import argparse
import time

import torch

# facebook/wmt19-en-ru as transformers' FSMTConfig describes it: d_model 1024, 6+6 layers, 16 heads,
# FFN 8192; vocabularies of about 31k a side (31,232 taken for both here).
WMT19 = dict(d_model=1024, layers=6, heads=16, ffn=8192, src_vocab=31232, tgt_vocab=31232)
SMALL = dict(d_model=256, layers=6, heads=4, ffn=2048, src_vocab=31232, tgt_vocab=31232)


def config(size: dict):
    from transformers import FSMTConfig

    return FSMTConfig(langs=["en", "ru"], src_vocab_size=size["src_vocab"], tgt_vocab_size=size["tgt_vocab"],
                      d_model=size["d_model"], encoder_layers=size["layers"], decoder_layers=size["layers"],
                      encoder_attention_heads=size["heads"], decoder_attention_heads=size["heads"],
                      encoder_ffn_dim=size["ffn"], decoder_ffn_dim=size["ffn"], max_position_embeddings=1024,
                      tie_word_embeddings=False, dropout=0.1, attention_dropout=0.1)


def parameters(size: dict) -> dict[str, int]:
    """Counted on the meta device: nothing is allocated."""
    from transformers import FSMTForConditionalGeneration

    with torch.device("meta"):
        model = FSMTForConditionalGeneration(config(size))
    out = {"encoder layers": 0, "decoder layers": 0, "embeddings and output layer": 0, "sinusoid tables": 0}
    for name, p in model.named_parameters():
        if "embed_positions" in name:
            out["sinusoid tables"] += p.numel()
        elif "embed_tokens" in name or "output_projection" in name:
            out["embeddings and output layer"] += p.numel()
        else:
            out["encoder layers" if ".encoder." in name else "decoder layers"] += p.numel()
    out["total"] = sum(out.values())
    return out


def forward_flops(size: dict, S: int, T: int) -> float:
    """Matrix-product FLOPs of one forward pass over a sentence pair of S source and T target tokens."""
    D, F, L, V = size["d_model"], size["ffn"], size["layers"], size["tgt_vocab"]
    encoder = L * (2 * S * (4 * D * D + 2 * D * F) + 4 * S * S * D)
    decoder = L * (2 * T * (6 * D * D + 2 * D * F) + 2 * S * 2 * D * D + 4 * T * T * D + 4 * T * S * D)
    return encoder + decoder + 2 * T * D * V


def measure(size: dict, batch: int, S: int, T: int, steps: int, n: int = 2048) -> tuple[float, float]:
    """(seconds per training step, FLOP/s of an fp32 n^3 matrix product) on this CPU, fp32. A step is
    forward, cross-entropy and backward (no optimizer). The machine is shared: the two are timed
    alternately and each keeps its fastest reading, so that both are read under the same load."""
    from transformers import FSMTForConditionalGeneration

    from headcount.models.hf import HFSeq2Seq

    torch.manual_seed(0)
    model = HFSeq2Seq(FSMTForConditionalGeneration(config(size))).train()
    src = torch.randint(4, size["src_vocab"], (batch, S))
    tgt = torch.randint(4, size["tgt_vocab"], (batch, T + 1))
    src[:, -1] = tgt[:, 0] = 2
    a, b = torch.randn(n, n), torch.randn(n, n)
    step, product = [], []
    for _ in range(steps + 1):  # the first of each is a warm-up
        start = time.perf_counter()
        logits, _ = model(src, tgt[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()).backward()
        model.zero_grad(set_to_none=True)
        step.append(time.perf_counter() - start)
        start = time.perf_counter()
        a @ b
        product.append(time.perf_counter() - start)
    return min(step[1:]), 2 * n**3 / min(product[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--length", type=int, default=30, help="tokens per sentence, each side")
    parser.add_argument("--batch", type=int, default=8, help="sentences per measured step")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    L, B = args.length, args.batch
    counts = parameters(WMT19)
    print("facebook/wmt19-en-ru parameters:", ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in counts.items()))
    big, small = 3 * forward_flops(WMT19, L, L) / L, 3 * forward_flops(SMALL, L, L) / L
    print(f"training matmul FLOPs per target token ({L}+{L}-token pairs): wmt19 {big / 1e9:.2f} G, "
          f"small {small / 1e9:.2f} G, ratio {big / small:.1f}")
    seconds, peak = measure(SMALL, B, L, L, args.steps)
    rate = small * B * L / seconds
    print(f"measured, {torch.get_num_threads()} threads: small FSMT {B * L / seconds:.0f} target tokens/s "
          f"({rate / 1e9:.1f} GFLOP/s, {rate / peak:.2f} of the fp32 matmul peak read beside it, "
          f"{peak / 1e9:.0f} GFLOP/s); scaled by FLOPs, wmt19 {rate / big:.1f} target tokens/s")


if __name__ == "__main__":
    main()
