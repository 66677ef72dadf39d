"""Train a small GPT-2, Qwen2 or BERT with transformers' own Trainer: trained language models for the tests.

headcount's language-model adapter (models/hf_lm.py) is tested on random models; this makes a model
the way the transformers world makes one, on English text this project has (Multi30k's English
side and the text of UD English-EWT's training treebank), so that the workflow's language-model
stages run on weights that mean something (tests/test_lm_workflow.py reads them from
tests/data/gpt2_multi30k, qwen2_multi30k and bert_multi30k):

- gpt2: a byte-level BPE tokenizer trained here (tiny_lm.write_tiny_gpt2: <|endoftext|> is BOS,
  EOS and, as for GPT-2, there is no pad token) and a GPT2LMHeadModel of the given size, trained by
  transformers' causal-LM collator (each line is <|endoftext|> + text, the collator's labels are
  the inputs, the model shifts them);
- qwen2: the same with a Qwen2ForCausalLM (tiny_lm.write_tiny_qwen2: byte-level BPE, no BOS, so
  <|endoftext|> starts each line as headcount's reading does; grouped-query attention, two query
  heads a key/value head; rotary positions; SwiGLU; RMSNorm);
- bert: a lowercasing WordPiece tokenizer trained here (tiny_lm.write_tiny_bert: [CLS] text
  [SEP]) and a BertForMaskedLM, trained by transformers' masked-LM collator (15% of the tokens,
  80% of them [MASK], 10% a random token, 10% kept); it is evaluated on headcount's own fixed,
  seeded masking (data.batching.masked_lm_tensors), the one headcount scores masked LMs on, so that
  the tests recompute the same loss;
- transformers' `Trainer`, AdamW, a linear decay after warm-up;
- `save_pretrained` of model and tokenizer into --out, and reference_summary.json: the recipe and
  the Trainer's own evaluation loss, one line a batch (so the mean of per-line mean NLL), on the
  dev lines and on PROBE_LINES, sentences of our own that the tests score again with headcount.

    python tools/train_lm_reference.py --out tests/data/gpt2_multi30k
    python tools/train_lm_reference.py --family qwen2 --out tests/data/qwen2_multi30k
    python tools/train_lm_reference.py --family bert --steps 3000 --out tests/data/bert_multi30k
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
# Sentences of our own (not from any corpus, which stays out of the repository) on which the
# Trainer's evaluation loss is recorded, for the tests to recompute with headcount.
PROBE_LINES = [
    "A man in a red jacket is walking his dog along the beach.",
    "Two children are playing with a ball in the park.",
    "A woman is reading a book on a bench near the river.",
    "The people are waiting for the bus in the rain.",
    "A young girl in a blue dress is jumping over a puddle.",
    "Several men are working on the roof of a house.",
    "A group of friends are sitting at a table and laughing.",
    "The dog is running through the snow with a stick.",
    "A man is playing the guitar on a street corner.",
    "Two women are talking while they walk down the street.",
    "The city was quiet after the storm had passed.",
    "She said that the meeting would start at nine.",
]


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:limit]


def treebank_text(path: Path) -> list[str]:
    """The `# text =` lines of a CoNLL-U file (gzipped or not)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line[len("# text = "):].strip() for line in f if line.startswith("# text = ")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", choices=["gpt2", "qwen2", "bert"], default="gpt2")
    ap.add_argument("--data", default=str(DATA), help="the shared data directory (multi30k/, UD_English-EWT/)")
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dev-lines", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch
    from transformers import (
        AutoTokenizer,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        GPT2LMHeadModel,
        Qwen2ForCausalLM,
        Trainer,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    from headcount.data.batching import masked_lm_tensors
    from headcount.models.hf_lm import special_ids_of
    from headcount.models.hf_lm_tokenizer import load_lm_tokenizer
    from headcount.testing.tiny_lm import write_tiny_bert, write_tiny_gpt2, write_tiny_qwen2

    torch.set_num_threads(args.threads)
    set_seed(args.seed)
    data = Path(args.data)
    train_lines = (read_lines(data / "multi30k" / "train.en.gz")
                   + treebank_text(data / "UD_English-EWT" / "en_ewt-ud-train.conllu.gz"))
    dev_lines = read_lines(data / "multi30k" / "val.en.gz", args.dev_lines)
    out = Path(args.out)
    sizes = dict(vocab_size=args.vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, positions=128,
                 seed=args.seed)
    if args.family in ("gpt2", "qwen2"):
        if args.family == "gpt2":
            write_tiny_gpt2(out, train_lines, **sizes)
            model = GPT2LMHeadModel.from_pretrained(str(out))
        else:
            write_tiny_qwen2(out, train_lines, ffn=4 * args.d_model, **sizes)
            model = Qwen2ForCausalLM.from_pretrained(str(out))
        tokenizer = AutoTokenizer.from_pretrained(str(out))
        tokenizer.pad_token = tokenizer.eos_token  # the collator pads; labels at padding become -100
        bos = special_ids_of(model.config, tokenizer).bos  # GPT-2's <|endoftext|>; Qwen has none: its EOS

        def encode(lines):
            return [{"input_ids": [bos] + tokenizer(line)["input_ids"][:126]} for line in lines]

        train_set, collator = encode(train_lines), DataCollatorForLanguageModeling(tokenizer, mlm=False)
        evaluate, eval_collator = encode, collator
    else:
        write_tiny_bert(out, train_lines, ffn=4 * args.d_model, **sizes)
        tokenizer = AutoTokenizer.from_pretrained(str(out))
        model = BertForMaskedLM.from_pretrained(str(out))
        train_set = [{"input_ids": tokenizer(line)["input_ids"][:128]} for line in train_lines]
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
        special, ours = special_ids_of(model.config, tokenizer), load_lm_tokenizer(out)

        def evaluate(lines):  # one line a batch, masked as headcount masks it: no padding to collate
            rows = []
            for ids in ours.encode(lines):
                src, _, tgt_out = masked_lm_tensors([ids], special)
                labels = torch.where(tgt_out[0].eq(special.pad), -100, tgt_out[0])
                rows.append({"input_ids": src[0].tolist(), "labels": labels.tolist()})
            return rows

        eval_collator = default_data_collator
    with_work = out.with_name(out.name + ".trainer")
    targs = TrainingArguments(output_dir=str(with_work), max_steps=args.steps, per_device_train_batch_size=args.batch,
                              per_device_eval_batch_size=1, learning_rate=args.lr, warmup_steps=args.steps // 10,
                              lr_scheduler_type="linear", logging_steps=100, save_strategy="no", report_to=[],
                              seed=args.seed, use_cpu=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=train_set, data_collator=collator)
    start = time.perf_counter()
    trainer.train()
    trainer.data_collator = eval_collator
    evaluation = trainer.evaluate(eval_dataset=evaluate(dev_lines))
    probe = trainer.evaluate(eval_dataset=evaluate(PROBE_LINES), metric_key_prefix="probe")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    summary = {"recipe": {k: v for k, v in vars(args).items() if k != "data"}, "train_lines": len(train_lines),
               "dev": "multi30k/val.en.gz", "dev_lines": len(dev_lines),
               "trainer_eval_loss": evaluation["eval_loss"], "probe_lines": PROBE_LINES,
               "trainer_probe_loss": probe["probe_loss"], "train_seconds": round(time.perf_counter() - start)}
    (out / "reference_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
