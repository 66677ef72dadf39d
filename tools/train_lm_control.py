"""Train the decoder-only positive control: a tiny GPT-2 whose training text can only be predicted
with a previous-token head and an induction head, trained by headcount's own loop.

    python tools/train_lm_control.py --out tests/data/lm_control [--steps 15000]

The text (issue 37, item 3): each line is r + r, r a run of 8-24 distinct random token ids drawn
from a small alphabet. The first copy is unpredictable (uniform over the alphabet); every token of
the second copy is the one that followed the same token in the first copy, which a two-layer
model computes with a previous-token head in layer 1 (each position learns its predecessor) and an
induction head in layer 2 (attend to the position after the earlier occurrence of the current
token: Olsson et al. 2022). The length varies, so no fixed offset answers it. The model is a
transformers GPT2LMHeadModel (tiny_lm.write_tiny_gpt2, dropout off) trained through the
HFCausalLM adapter by training.loop.train and saved as a headcount checkpoint, model.pt (what the
role analysis and the tests read). What the role detectors find in it is printed and written to
roles.json beside it.

What it learned (docs/method.md): with 4 heads, seeds 1 and 2 copy through heads that attend two
after the earlier occurrence, not one; with --heads 1 the model copies with neither circuit. The
textbook circuit is checked on hand-set weights instead (tests/test_lm_control.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ALPHABET = 60  # token ids 1..59 of the byte-level vocabulary (0 is <|endoftext|>)


def repeated_runs(n: int, seed: int, min_len: int = 8, max_len: int = 24) -> list[list[int]]:
    """n lines r + r, r of min_len..max_len distinct ids from 1..ALPHABET-1 (seeded)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n):
        r = rng.choice(np.arange(1, ALPHABET), size=int(rng.integers(min_len, max_len + 1)), replace=False).tolist()
        lines.append(r + r)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=15000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-tokens", type=int, default=3000)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from headcount.analysis.roles.collect import induction_statistics
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.testing.tiny_lm import write_tiny_gpt2
    from headcount.training.loop import Corpus, DevSet, TrainConfig, train

    out = Path(args.out)
    work = out.with_name(out.name + ".work")
    alphabet_text = [" ".join(chr(97 + i % 26) * (1 + i // 26) for i in range(ALPHABET))] * 4
    directory = write_tiny_gpt2(work / "init", alphabet_text, d_model=args.d_model, layers=2, heads=args.heads,
                                positions=64, seed=args.seed)
    config = json.loads((directory / "config.json").read_text())
    config.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # a clean signal: no dropout
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    model = load_pretrained_lm(directory)
    train_lines, dev_lines = repeated_runs(20000, args.seed), repeated_runs(200, args.seed + 1000)
    cfg = TrainConfig(max_tokens=args.max_tokens, max_steps=args.steps, warmup_steps=100, eval_interval=1000,
                      checkpoint_interval=1000, dev_bleu_sentences=0, select="last", label_smoothing=0.0,
                      threads=args.threads, precision="fp32", seed=args.seed)
    start = time.perf_counter()
    train(model, cfg, Corpus(train_lines, train_lines), DevSet(dev_lines, dev_lines), work / "train",
          lr_at=lambda step: args.lr * min(1.0, step / 100), log=print)
    scores = induction_statistics(model, ALPHABET, length=20, sequences=50, seed=7)
    print(scores.round(3).to_string(index=False))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save(out / "model.pt")  # a headcount checkpoint: loading.load_model reads it back
    (out / "roles.json").write_text(json.dumps({
        "recipe": vars(args), "train_seconds": round(time.perf_counter() - start),
        "induction": scores.to_dict(orient="records")}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
