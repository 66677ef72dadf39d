"""Check headcount's HuggingFace adapter against transformers' own outputs on a MarianMT directory.

The model goes through headcount the way the workflow takes it (`import_pretrained` writes a
headcount checkpoint and the tokenizer's files; `loading.load_model` and `loading.open_tokenizer`
read them back); transformers' side is the directory loaded as it is (`from_pretrained`, eager
attention). On the given sentence pairs:

  tokens     headcount's source and target ids equal the MarianTokenizer's (less EOS);
  greedy     headcount's greedy search (training/decode.py, with its per-sentence length limit)
             gives the tokens `generate(num_beams=1, do_sample=False)` gives with the same limit;
             again with a limit most sentences reach (EOS forced there, by both);
  attention  the attention probabilities of `forward(..., need_weights=True)` equal
             `output_attentions=True`'s, every layer of all three types; the logits too;
  loglik     the log-likelihood of each reference (headcount's logits, its target tensors) equals
             transformers' (its logits, log_softmax, gathered at the labels); headcount's training
             loss equals transformers' loss;
  head mask  with some heads of every type masked (`set_head_mask`), headcount's logits and greedy
             translations equal those of a copy of the transformers model whose masked heads'
             output-projection input columns are zero.

tools/train_marian_reference.py makes such a directory; tests/test_trained_marian.py runs these
checks on a tiny trained one.

    python tools/crosscheck_marian.py --model runs/marian_multi30k \\
        --src /work/shared/data/multi30k/val.en.gz --tgt /work/shared/data/multi30k/val.de.gz -n 100
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import sys
import tempfile
from pathlib import Path

import torch

from headcount.data.batching import source_tensor, target_tensors
from headcount.models.hf import import_pretrained
from headcount.models.loading import load_model, open_tokenizer
from headcount.training.decode import translate
from headcount.training.loop import sequence_loss

ATTENTION_TYPES = ("enc_self", "dec_self", "dec_enc")
SHORT_LIMIT = (0.5, 1)  # max_len_a, max_len_b of the second greedy check: translations cut short


def read_lines(path: str | Path, n: int | None = None) -> list[str]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n is not None else lines


class Pair:
    """One model directory, seen by headcount (through the workflow's path) and by transformers."""

    def __init__(self, model_dir: str | Path, work_dir: str | Path):
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        work = Path(work_dir)
        import_pretrained(model_dir, work / "model.pt", work / "tokenizer", offline=True)
        self.model = load_model(work / "model.pt").eval()
        self.source = open_tokenizer(work / "tokenizer", "source")
        self.target = open_tokenizer(work / "tokenizer", "target")
        self.hf = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir), local_files_only=True,
                                                        attn_implementation="eager").eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    def hf_attentions(self, hf=None) -> dict[str, list[torch.nn.Module]]:
        """transformers' attention modules by type (Marian's layout), found without headcount."""
        inner = (hf or self.hf).model
        return {"enc_self": [layer.self_attn for layer in inner.encoder.layers],
                "dec_self": [layer.self_attn for layer in inner.decoder.layers],
                "dec_enc": [layer.encoder_attn for layer in inner.decoder.layers]}


def _batches(n: int, size: int):
    for i in range(0, n, size):
        yield range(i, min(n, i + size))


# --------------------------------------------------------------------------------------------
# The checks


def check_tokens(pair: Pair, src: list[str], tgt: list[str]) -> dict:
    eos = pair.tokenizer.eos_token_id
    hc_src, hc_tgt = pair.source.encode(src), pair.target.encode(tgt)
    hf_src = pair.tokenizer(src)["input_ids"]
    hf_tgt = pair.tokenizer(text_target=tgt)["input_ids"]
    same = sum(a + [eos] == b for a, b in zip(hc_src, hf_src)) + sum(a + [eos] == b for a, b in zip(hc_tgt, hf_tgt))
    return {"token_sequences": 2 * len(src), "token_sequences_identical": same}


def length_limit(n_source_ids: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """headcount's limit on a translation's tokens, EOS included: a * |x| + b, |x| counting the
    source's EOS, rounded down, under the model's positions (decode._max_lengths)."""
    return min(int((n_source_ids + 1) * max_len_a + max_len_b), max_positions - 1)


def hf_greedy(pair: Pair, hf, src: list[str], limits: list[int], batch_size: int) -> list[list[int]]:
    """transformers' generate, greedy, each sentence with its own limit (sentences grouped by it)."""
    eos = pair.tokenizer.eos_token_id
    out: list[list[int]] = [[] for _ in src]
    for limit in sorted(set(limits)):
        rows = [i for i, L in enumerate(limits) if L == limit]
        for part in _batches(len(rows), batch_size):
            chosen = [rows[k] for k in part]
            enc = pair.tokenizer([src[i] for i in chosen], padding=True, return_tensors="pt")
            with torch.no_grad():
                # max_length counts the decoder start token: `limit` new tokens at most
                seqs = hf.generate(**enc, num_beams=1, do_sample=False, max_length=limit + 1)
            for i, seq in zip(chosen, seqs.tolist()):
                seq = seq[1:]  # the decoder start token
                out[i] = seq[:seq.index(eos)] if eos in seq else seq
    return out


def check_greedy(pair: Pair, hf, src: list[str], max_len_a: float, max_len_b: int, batch_size: int) -> dict:
    model = pair.model
    ids = pair.source.encode(src)
    ours = translate(model, ids, beam=1, max_len_a=max_len_a, max_len_b=max_len_b, max_tokens=4000)
    limits = [length_limit(len(x), max_len_a, max_len_b, model.max_positions) for x in ids]
    theirs = hf_greedy(pair, hf, src, limits, batch_size)
    different = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    result = {"greedy_sentences": len(src), "greedy_identical": len(src) - len(different),
              "greedy_at_limit": sum(len(t) + 1 >= L for t, L in zip(theirs, limits))}
    if different:
        i = different[0]
        result["greedy_first_difference"] = {"sentence": i, "headcount": ours[i], "transformers": theirs[i]}
    return result


def _teacher_forced(pair: Pair, hf, src: list[str], tgt: list[str], rows, need_weights: bool):
    """Both models on one batch of reference pairs: (src, tgt_in, tgt_out, our logits, our
    attentions, their output, their labels, real). transformers makes its decoder input from the
    labels (shifted right after its start token), so past a shorter sentence's end it reads EOS
    where headcount reads padding: only the `real` target positions (B, T), the start token and
    the sentence's tokens, are compared; the padded ones predict nothing."""
    special = pair.model.special
    s, t = [src[i] for i in rows], [tgt[i] for i in rows]
    src_t = source_tensor(pair.source.encode(s), special)
    tgt_in, tgt_out = target_tensors(pair.target.encode(t), special)
    enc = pair.tokenizer(s, text_target=t, padding=True, return_tensors="pt")
    labels = enc["labels"].masked_fill(enc["labels"].eq(pair.tokenizer.pad_token_id), -100)
    with torch.no_grad():
        logits, attn = pair.model(src_t, tgt_in, need_weights=need_weights)
        out = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels,
                 output_attentions=need_weights)
    if not torch.equal(src_t, enc["input_ids"]) or out.logits.shape != logits.shape:
        raise AssertionError("headcount's and transformers' batches differ: compare the token check")
    real = labels.ne(-100)
    if not torch.equal(real, tgt_out.ne(special.pad)):
        raise AssertionError("headcount's and transformers' targets differ in length")
    return src_t, tgt_in, tgt_out, logits, attn, out, labels, real


def _loglik(logits: torch.Tensor, targets: torch.Tensor, ignore: int) -> torch.Tensor:
    """(B,) summed log-probabilities of the targets, positions equal to `ignore` left out."""
    real = targets.ne(ignore)
    lp = logits.float().log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (lp * real).sum(-1)


def check_forward(pair: Pair, src: list[str], tgt: list[str], batch_size: int) -> dict:
    """Attention probabilities, logits, per-sentence log-likelihoods and the loss, teacher-forced."""
    err = {kind: 0.0 for kind in ATTENTION_TYPES}
    logit_err = ll_err = loss_err = 0.0
    total_ll, tokens, maps = 0.0, 0, 0
    for rows in _batches(len(src), batch_size):
        src_t, tgt_in, tgt_out, logits, attn, out, labels, real = _teacher_forced(pair, pair.hf, src, tgt, rows, True)
        theirs = {"enc_self": out.encoder_attentions, "dec_self": out.decoder_attentions,
                  "dec_enc": out.cross_attentions}
        for kind in ATTENTION_TYPES:
            assert len(attn[kind]) == len(theirs[kind])
            for mine, ref in zip(attn[kind], theirs[kind]):
                assert mine.shape == ref.shape, (kind, mine.shape, ref.shape)
                diff = (mine - ref).abs()  # (B, H, Tq, Tk)
                if kind != "enc_self":  # decoder queries: the real target positions only
                    diff = diff.masked_fill(~real[:, None, :, None], 0.0)
                err[kind] = max(err[kind], diff.max().item())
                maps += mine.shape[0] * mine.shape[1]
        logit_err = max(logit_err, (logits - out.logits)[real].abs().max().item())
        ours, ref = _loglik(logits, tgt_out, pair.model.special.pad), _loglik(out.logits, labels, -100)
        ll_err = max(ll_err, (ours - ref).abs().max().item())
        total_ll += ref.sum().item()
        n = int(labels.ne(-100).sum())
        tokens += n
        with torch.no_grad():
            _, nll, counted = sequence_loss(pair.model, src_t, tgt_in, tgt_out, label_smoothing=0.0)
        assert counted == n
        loss_err = max(loss_err, abs(nll.item() / n - out.loss.item()))
    return {"attention_max_abs_error": err, "attention_maps": maps, "logits_max_abs_error": logit_err,
            "loglik_max_abs_error": ll_err, "loss_max_abs_error": loss_err,
            "nll_per_token": -total_ll / tokens, "uniform_nll_per_token": math.log(pair.model.config.vocab_size)}


def head_masks(pair: Pair, seed: int = 0) -> dict[str, torch.Tensor]:
    """{type: (layers, H) 0/1}: about half the heads of every type masked, at least one per type, never
    all of them."""
    g = torch.Generator().manual_seed(seed)
    masks = {}
    for kind, counts in pair.model.head_counts().items():
        mask = (torch.rand(len(counts), max(counts), generator=g) > 0.5).float()
        mask[0, 0], mask[-1, -1] = 0.0, 1.0
        masks[kind] = mask
    return masks


def zero_heads_hf(pair: Pair, masks: dict[str, torch.Tensor]):
    """A copy of the transformers model whose masked heads' columns of W^O (its input) are zero:
    head h owns columns h*Dh:(h+1)*Dh."""
    hf = copy.deepcopy(pair.hf)
    for kind, modules in pair.hf_attentions(hf).items():
        for attention, row in zip(modules, masks[kind]):
            Dh = attention.head_dim
            with torch.no_grad():
                for h in (row == 0).nonzero().flatten().tolist():
                    attention.out_proj.weight[:, h * Dh:(h + 1) * Dh] = 0.0
    return hf


def check_head_mask(pair: Pair, src: list[str], tgt: list[str], batch_size: int, max_len_a: float,
                    max_len_b: int, seed: int = 0) -> dict:
    masks = head_masks(pair, seed)
    hf = zero_heads_hf(pair, masks)
    before = pair.model.head_mask()
    pair.model.set_head_mask(masks)
    try:
        logit_err = ll_err = 0.0
        changed = 0.0  # how far masking moved the logits: a mask that did nothing would prove nothing
        for rows in _batches(len(src), batch_size):
            _, _, tgt_out, logits, _, out, labels, real = _teacher_forced(pair, hf, src, tgt, rows, False)
            logit_err = max(logit_err, (logits - out.logits)[real].abs().max().item())
            ours, ref = _loglik(logits, tgt_out, pair.model.special.pad), _loglik(out.logits, labels, -100)
            ll_err = max(ll_err, (ours - ref).abs().max().item())
            with torch.no_grad():
                plain = pair.hf(**pair.tokenizer([src[i] for i in rows], text_target=[tgt[i] for i in rows],
                                                 padding=True, return_tensors="pt")).logits
            changed = max(changed, (plain - out.logits)[real].abs().max().item())
        greedy = check_greedy(pair, hf, src, max_len_a, max_len_b, batch_size)
    finally:
        pair.model.set_head_mask(before)
    return {"masked_heads": {kind: int((m == 0).sum()) for kind, m in masks.items()},
            "heads": {kind: int(m.numel()) for kind, m in masks.items()},
            "head_mask_logits_max_abs_error": logit_err, "head_mask_loglik_max_abs_error": ll_err,
            "head_mask_logits_moved_by": changed,
            "head_mask_greedy_identical": greedy["greedy_identical"],
            **({"head_mask_greedy_first_difference": greedy["greedy_first_difference"]}
               if "greedy_first_difference" in greedy else {})}


def crosscheck(model_dir: str | Path, src: list[str], tgt: list[str], work_dir: str | Path | None = None,
               batch_size: int = 32, max_len_a: float = 1.5, max_len_b: int = 10, mask_seed: int = 0) -> dict:
    """All the checks -> their numbers (see the module's docstring)."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source sentences but {len(tgt)} references")
    with tempfile.TemporaryDirectory() as tmp:
        pair = Pair(model_dir, work_dir or tmp)
        result = {"sentences": len(src)}
        result.update(check_tokens(pair, src, tgt))
        result.update(check_greedy(pair, pair.hf, src, max_len_a, max_len_b, batch_size))
        # Again with a limit most sentences reach: EOS forced there (generate's forced_eos_token_id).
        short = check_greedy(pair, pair.hf, src, SHORT_LIMIT[0], SHORT_LIMIT[1], batch_size)
        result.update({f"short_{k}": v for k, v in short.items()})
        result.update(check_forward(pair, src, tgt, batch_size))
        result.update(check_head_mask(pair, src, tgt, batch_size, max_len_a, max_len_b, mask_seed))
    return result


def report(result: dict) -> str:
    r = result
    att = r["attention_max_abs_error"]
    masked = ", ".join(f"{k} {r['masked_heads'][k]}/{n}" for k, n in r["heads"].items())
    lines = [
        f"sentences: {r['sentences']}",
        f"token ids identical: {r['token_sequences_identical']}/{r['token_sequences']}",
        f"greedy translations identical: {r['greedy_identical']}/{r['greedy_sentences']} "
        f"({r['greedy_at_limit']} stopped at the length limit); with a short limit "
        f"{r['short_greedy_identical']}/{r['sentences']} ({r['short_greedy_at_limit']} at the limit)",
        "attention probabilities, max abs error: " + ", ".join(f"{k} {v:.3g}" for k, v in att.items())
        + f" ({r['attention_maps']} head maps)",
        f"logits, max abs error: {r['logits_max_abs_error']:.3g}",
        f"per-sentence log-likelihood, max abs error: {r['loglik_max_abs_error']:.3g} "
        f"(NLL {r['nll_per_token']:.3f} per token; uniform {r['uniform_nll_per_token']:.3f})",
        f"training loss (headcount's sequence_loss vs transformers' loss), abs error: {r['loss_max_abs_error']:.3g}",
        f"head mask ({masked} masked): logits max abs error {r['head_mask_logits_max_abs_error']:.3g} "
        f"(masking moved them by {r['head_mask_logits_moved_by']:.3g}), log-likelihood "
        f"{r['head_mask_loglik_max_abs_error']:.3g}, greedy identical "
        f"{r['head_mask_greedy_identical']}/{r['sentences']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a MarianMT directory (save_pretrained of model and tokenizer)")
    parser.add_argument("--src", required=True, help="source sentences, one a line (plain or .gz)")
    parser.add_argument("--tgt", required=True, help="their references")
    parser.add_argument("-n", type=int, default=100, help="the first N pairs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len-a", type=float, default=1.5)
    parser.add_argument("--max-len-b", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    result = crosscheck(args.model, read_lines(args.src, args.n), read_lines(args.tgt, args.n),
                        batch_size=args.batch_size, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
