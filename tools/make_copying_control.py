"""Train the planted copying circuit that tests/test_causal_evidence.py tests the causal role tests
on, and write it as a committed fixture (tests/data/copying_control/, under 1 MB):

    .venv/bin/python tools/make_copying_control.py [--out tests/data/copying_control]

A two-layer Llama (tiny_lm.write_tiny_llama: d_model 64, 4 heads, rotary positions, a 64-token
vocabulary) trained on sequences r + r, r a run of 10-30 distinct random token ids: the first copy
cannot be predicted, every token of the second copy (but its first) is the one that followed the
same token in the first copy. A two-layer model answers that with a previous-token head in layer 0
and an induction head in layer 1 (Olsson et al. 2022); the length varies, so no fixed offset does.
Training takes 65 s of one core (85 s on a shared 2-core machine) and is deterministic from its
seed on one machine (two runs wrote the same weights); what it learns depends on the CPU's
kernels, which is why the tests read the stored model. The second copy's loss falls abruptly
(the induction bump) between steps 500 and 800 with seed 0, and with seed 2; seed 1 had not
fallen by step 800, so another seed may need more steps. What seed 0 learned: layer 0 holds a
previous-token head (1.2, counted from 1) and a head that attends to its own position (1.4),
layer 1 two induction heads (2.2 and 2.4).

The folder holds what transformers' save_pretrained writes (config, float32 safetensors weights,
tokenizer) and recipe.json: the recipe (which the test compares with `recipe()` here, so a changed
recipe fails until the fixture is made again), the final losses on each half, the weights'
sha256, and the versions and CPU it was made with.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SEED = 0
# The tokenizer's training lines: only there because headcount.heads reads texts through a
# tokenizer; the model itself reads token ids.
WORDS = "the a cat dog sat on mat ran far near blue red green old new big small one two three".split()
LINES = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
MODEL = {"vocab_size": 64, "d_model": 64, "layers": 2, "heads": 4, "kv_heads": 4, "ffn": 128, "positions": 128}
TRAINING = {"steps": 800, "batch": 32, "lr": 3e-3, "weight_decay": 0.1, "min_half": 10, "max_half": 30,
            "threads": 1}
SPECIAL_IDS = (0, 1, 2)  # the tiny Llama tokenizer's <unk>, <s>, </s>: never drawn
EVALUATION = {"sequences": 200, "half": 20, "seed": SEED + 1}


def recipe() -> dict:
    """What recipe.json must say for the fixture to be this script's output."""
    return {"seed": SEED, "model": MODEL, "training": TRAINING, "evaluation": EVALUATION, "lines": LINES,
            "special_ids": list(SPECIAL_IDS)}


def halves(rng: np.random.Generator, count: int, low: int, high: int, vocab: int) -> list[list[int]]:
    """`count` runs r of low..high distinct ids (none special), each to be read twice."""
    ids = np.array([i for i in range(vocab) if i not in SPECIAL_IDS])
    return [rng.choice(ids, int(rng.integers(low, high + 1)), replace=False).tolist() for _ in range(count)]


def batch(runs: list[list[int]], bos: int, pad: int):
    """As headcount reads a causal LM's text x = r + r: input BOS + x[:-1], targets x (-100 past
    the end); `second` marks the targets the first copy predicts (the second copy but its first)."""
    T = 2 * max(len(r) for r in runs)
    inputs = torch.full((len(runs), T), pad)
    targets = torch.full((len(runs), T), -100)
    second = torch.zeros(len(runs), T, dtype=torch.bool)
    first = torch.zeros(len(runs), T, dtype=torch.bool)
    for row, r in enumerate(runs):
        x, n = r + r, len(r)
        inputs[row, : 2 * n] = torch.tensor([bos] + x[:-1])
        targets[row, : 2 * n] = torch.tensor(x)
        first[row, :n] = True
        second[row, n + 1: 2 * n] = True
    return inputs, targets, first, second


def half_losses(hf, bos: int, pad: int) -> dict:
    """Mean next-token loss on the first copy and on the predictable part of the second, over
    held-out sequences of EVALUATION's half length."""
    rng = np.random.default_rng(EVALUATION["seed"])
    runs = halves(rng, EVALUATION["sequences"], EVALUATION["half"], EVALUATION["half"], MODEL["vocab_size"])
    inputs, targets, first, second = batch(runs, bos, pad)
    with torch.no_grad():
        nll = F.cross_entropy(hf(input_ids=inputs).logits.transpose(1, 2), targets, reduction="none",
                              ignore_index=-100)
    return {"first_half": float(nll[first].mean()), "second_half": float(nll[second].mean())}


def train(out: Path, log=print) -> dict:
    """Write the tiny Llama and its tokenizer to `out`, train its weights, save them, and write
    recipe.json -> what recipe.json holds."""
    import transformers

    from headcount.testing.tiny_lm import write_tiny_llama

    torch.set_num_threads(TRAINING["threads"])  # one thread: the same sums in the same order every run
    m = MODEL
    write_tiny_llama(out, LINES, vocab_size=m["vocab_size"], d_model=m["d_model"], layers=m["layers"],
                     heads=m["heads"], kv_heads=m["kv_heads"], ffn=m["ffn"], positions=m["positions"], seed=SEED)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    if len(tokenizer) != m["vocab_size"] or sorted(tokenizer.all_special_ids) != list(SPECIAL_IDS):
        raise SystemExit(f"the tokenizer has {len(tokenizer)} ids and specials {tokenizer.all_special_ids}; the recipe "
                         f"expects {m['vocab_size']} and {SPECIAL_IDS}")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager")
    bos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    t = TRAINING
    optimizer = torch.optim.AdamW(hf.parameters(), lr=t["lr"], weight_decay=t["weight_decay"])
    hf.train()
    start = time.time()
    for step in range(1, t["steps"] + 1):
        inputs, targets, _, second = batch(halves(rng, t["batch"], t["min_half"], t["max_half"], m["vocab_size"]),
                                           bos, pad)
        nll = F.cross_entropy(hf(input_ids=inputs).logits.transpose(1, 2), targets, reduction="none",
                              ignore_index=-100)
        loss = nll[targets != -100].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            log(f"step {step}: loss {loss.item():.3f}, second copy {nll[second].mean().item():.3f} "
                f"({time.time() - start:.0f} s)")
    hf.eval()
    seconds = time.time() - start
    hf.save_pretrained(str(out))
    (out / "generation_config.json").unlink(missing_ok=True)  # nothing here generates
    weights = out / "model.safetensors"
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    made = {**recipe(), "losses": half_losses(hf, bos, pad), "train_seconds": round(seconds),
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(), "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2")))}
    (out / "recipe.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "tests/data/copying_control"))
    args = ap.parse_args()
    made = train(Path(args.out))
    print(f"{TRAINING['steps']} steps in {made['train_seconds']} s; losses {made['losses']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
