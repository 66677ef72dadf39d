"""headcount's reading of a fairseq checkpoint against what fairseq computed with it, on many sentences.

    python tools/crosscheck_fairseq.py --run runs/ttq/fairseq/seed_1 --checkpoint checkpoint_7_2000.pt \
        --reference reference_2000.pt [--out crosscheck.json]

The reference file is tools/fairseq_reference.py's record for that checkpoint (`--reference-only
NAME --checkpoint ... --reference-sentences 1014`): fairseq's greedy SequenceGenerator output,
per-token log-likelihoods of the references with and without some heads' output-projection
columns zeroed, and every head's attention on the first sentences. The tests do the same on two
tiny models (tests/test_fairseq.py); this runs it on a model trained for thousands of updates.
Prints and writes: sentences whose greedy translation is token for token fairseq's, the largest
attention and log-likelihood errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from headcount.models.fairseq import read_fairseq
from headcount.training.decode import greedy_search


def teacher_forced(model, src: list[int], tgt: list[int], need_weights: bool = False):
    """(per-token log-probabilities of tgt (T,), attention by type) for one sentence, fairseq's way:
    the decoder input starts with EOS."""
    s, t = torch.tensor([src]), torch.tensor([tgt])
    tgt_in = torch.cat([torch.tensor([[model.special.bos]]), t[:, :-1]], dim=1)
    with torch.no_grad():
        logits, attention = model(s, tgt_in, need_weights=need_weights)
    return torch.log_softmax(logits.float(), dim=-1)[0].gather(1, t[0][:, None])[:, 0], attention


def crosscheck(model, ref: dict) -> dict:
    model.eval()
    same, differing = 0, []
    for i, (src, theirs) in enumerate(zip(ref["sources"], ref["greedy"])):
        # fairseq lets max_len tokens come before the EOS it forces; headcount counts that EOS in.
        hyp = greedy_search(model, torch.tensor([src]), ref["max_len_a"], ref["max_len_b"] + 1)[0]
        if hyp + [model.special.eos] == theirs:
            same += 1
        else:
            differing.append(i)
    attention = 0.0
    for i, recorded in enumerate(ref["attention"]):
        _, mine = teacher_forced(model, ref["sources"][i], ref["targets"][i], need_weights=True)
        for kind, layers in recorded.items():
            for a, b in zip(mine[kind], layers):
                attention = max(attention, float((a[0] - b).abs().max()))
    loglik = max(float((teacher_forced(model, s, t)[0] - theirs).abs().max())
                 for s, t, theirs in zip(ref["sources"], ref["targets"], ref["loglik"]))
    masks = {kind: torch.ones(len(layers), model.cfg.n_heads) for kind, layers in model.attention_modules().items()}
    for kind, layer, head in ref["masked_heads"]:
        masks[kind][layer, head] = 0
    model.set_head_mask(masks)
    try:
        masked = max(float((teacher_forced(model, s, t)[0] - theirs).abs().max())
                     for s, t, theirs in zip(ref["sources"], ref["targets"], ref["loglik_masked"]))
    finally:
        model.set_head_mask({kind: torch.ones_like(m) for kind, m in masks.items()})
    moved = max(float((a - b).abs().max()) for a, b in zip(ref["loglik_masked"], ref["loglik"]))
    return {"checkpoint": ref.get("checkpoint"), "sentences": len(ref["sources"]), "greedy_identical": same,
            "greedy_differing": differing, "attention_sentences": len(ref["attention"]),
            "attention_max_abs_error": attention, "loglik_max_abs_error_per_token": loglik,
            "masked_loglik_max_abs_error_per_token": masked, "masked_heads": [list(h) for h in ref["masked_heads"]],
            "masking_moved_loglik_by": moved}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="tools/fairseq_reference.py's --out")
    ap.add_argument("--checkpoint", required=True, help="a file in the run's checkpoints/")
    ap.add_argument("--reference", required=True, help="the record in --run for that checkpoint")
    ap.add_argument("--out", help="write the figures here as JSON")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    model, _ = read_fairseq(run / "checkpoints" / args.checkpoint)
    ref = torch.load(run / args.reference, weights_only=True)
    result = crosscheck(model, ref)
    print(json.dumps({k: v for k, v in result.items() if k != "greedy_differing"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
