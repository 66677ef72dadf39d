"""A from-scratch twin's training step: masked heads computed and zeroed, against computing only
the kept heads (pruning.removal.computing_kept_heads, what train_translation_model does for twins).

    .venv/bin/python benchmarks/twin_kept_heads.py [--kept 22 63 110] [--steps 8] [--rounds 2]

The default experiment's model (6+6 layers, d 256, 8 heads, vocabularies of 6,000, the default
dropout), one thread, bf16 autocast where the CPU has it (as `precision: auto` trains), a batch
of 64 x 26 tokens (about the default 1,600 tokens) and Adam. For each count of kept heads (random,
seeded, over all 144) the two ways alternate, `rounds` times each, so that drift hits both alike;
it prints seconds a step and the ratio physical / masked.
"""

from __future__ import annotations

import argparse
import time

import torch

from headcount.models.device import pick_autocast_dtype
from headcount.models.transformer import ModelConfig, Transformer
from headcount.pruning.removal import computing_kept_heads

KINDS = ("enc_self", "dec_self", "dec_enc")


def twin(kept: int) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab=6000, tgt_vocab=6000, d_model=256, n_heads=8, d_ff=1024,
                                    enc_layers=6, dec_layers=6, dropout=0.1, attn_dropout=0.1,
                                    dropout_masks="fast", tie_target_embeddings=True))
    flat = torch.zeros(144)
    flat[torch.randperm(144, generator=torch.Generator().manual_seed(kept))[:kept]] = 1
    model.set_head_mask({kind: flat[i * 48:(i + 1) * 48].view(6, 8) for i, kind in enumerate(KINDS)})
    return model.train()


def seconds_a_step(model: Transformer, steps: int, autocast_dtype) -> float:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 6000, (64, 26), generator=g), torch.randint(4, 6000, (64, 27), generator=g)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for step in range(steps + 2):  # two warm-up steps
        if step == 2:
            start = time.perf_counter()
        with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            logits, _ = model(src, tgt[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 6000), tgt[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kept", type=int, nargs="+", default=[22, 63, 110])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    autocast_dtype = pick_autocast_dtype("auto", torch.device("cpu"))
    print(f"one thread, {autocast_dtype or torch.float32}; seconds a training step (mean of {args.steps})")
    print("| kept heads of 144 | masked (s/step) | kept heads only (s/step) | ratio |")
    print("|---|---|---|---|")
    for kept in args.kept:
        times = {"masked": [], "kept": []}
        for _ in range(args.rounds):
            model = twin(kept)
            times["masked"].append(seconds_a_step(model, args.steps, autocast_dtype))
            with computing_kept_heads(model):
                times["kept"].append(seconds_a_step(model, args.steps, autocast_dtype))
        masked, only = (sum(t) / len(t) for t in (times["masked"], times["kept"]))
        print(f"| {kept} | {masked:.3f} | {only:.3f} | {only / masked:.2f} |")


if __name__ == "__main__":
    main()
