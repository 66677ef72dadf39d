"""Train a MarianMT model with transformers' own training code: a reference for headcount's adapter.

headcount analyses pretrained opus-mt models through its HuggingFace adapter (models/hf.py). The
tests there run on randomly initialised models; this tool makes a *trained* model the way the
transformers world makes one, so that the adapter can be checked against transformers' own outputs
on weights that mean something (tools/crosscheck_marian.py, tests/test_trained_marian.py):

- a MarianTokenizer: source.spm and target.spm, sentencepiece models trained here on the training
  text (or, with --spm-src/--spm-tgt, headcount's own models, e.g. results/multi30k_en_de/subwords/
  {src,tgt}.model), and one vocab.json covering both sides plus </s>, <unk> and <pad>, laid out as
  opus-mt's are (</s> 0, <unk> 1, <pad> last);
- a MarianMTModel of the given size (default: headcount's default Transformer, 6+6 layers, d_model
  256, 8 heads, FFN 1024), trained by `Seq2SeqTrainer` with label smoothing, an inverse square root
  learning rate after a linear warm-up, Adam(0.9, 0.98) and gradient clipping;
- `save_pretrained` of model and tokenizer into --out: config.json, model.safetensors,
  generation_config.json, source.spm, target.spm, vocab.json, tokenizer_config.json, as a
  directory downloaded from the hub.

The trainer's checkpoints (every --save-steps) go to --checkpoint-dir (default: OUT.checkpoints,
beside --out, so that --out stays an opus-mt-shaped directory). Run the same command again and it
resumes from the last one: the tokenizer already in --out is reused, and the checkpoint brings back
weights, optimiser, schedule, data order and random states (without dropout the resumed run ends
with the uninterrupted run's weights exactly; with dropout they differ a little, as the Trainer
restores the random state one draw off). A rerun with a different setting (other than the step
counts, how often to log, evaluate and save, and the thread count) is refused. Seeded (--seed):
the same command gives the same model.

headcount's library does not import this tool; it needs `accelerate` (transformers' Trainer
does), which the `dev` extra installs.

    python tools/train_marian_reference.py \\
        --src-train /work/shared/data/multi30k/train.en.gz --tgt-train /work/shared/data/multi30k/train.de.gz \\
        --src-dev /work/shared/data/multi30k/val.en.gz --tgt-dev /work/shared/data/multi30k/val.de.gz \\
        --max-steps 2000 --out runs/marian_multi30k
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Knobs of the run that resuming must not change; the step counts and how often to log may.
MAY_CHANGE_ON_RESUME = {"max_steps", "save_steps", "eval_steps", "logging_steps", "threads", "checkpoint_dir", "quiet"}
SUMMARY = "reference_summary.json"  # in the checkpoint directory
SETTINGS = "reference_config.json"  # in the checkpoint directory
TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json")


@dataclass
class ReferenceConfig:
    src_train: str
    tgt_train: str
    src_dev: str
    tgt_dev: str
    out: str
    checkpoint_dir: str | None = None  # None: OUT.checkpoints
    # architecture (headcount's default Transformer)
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 256
    heads: int = 8
    ffn: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.0  # opus-mt's
    max_positions: int = 512
    # tokenizer
    vocab_size: int = 6000  # pieces per side's sentencepiece model (a soft limit on small corpora)
    spm_src: str | None = None  # an existing sentencepiece model for the source side (headcount's own)
    spm_tgt: str | None = None
    max_length: int = 256  # longer sentences are truncated (tokens, EOS included)
    train_limit: int | None = None  # the first N training pairs only
    dev_limit: int | None = None  # the first N dev pairs only (the dev loss)
    # training
    max_steps: int = 2000
    batch_size: int = 55  # sentences per update
    # random: a new order each epoch, the same after a resume; group_by_length (batches of similar
    # length, less padding) draws its order from the global random state, so a resumed run's differs
    sampling: str = "random"
    lr: float = 1e-3  # peak, reached at the end of the warm-up
    warmup_steps: int = 400
    label_smoothing: float = 0.1
    clip_norm: float = 1.0
    seed: int = 1
    save_steps: int = 250
    eval_steps: int = 500
    logging_steps: int = 50
    eval_batch_size: int = 64
    threads: int = 0  # torch intra-op threads; 0 keeps torch's default
    quiet: bool = False  # no progress lines (tests)

    def checkpoints(self) -> Path:
        return Path(self.checkpoint_dir) if self.checkpoint_dir else Path(f"{self.out}.checkpoints")


# --------------------------------------------------------------------------------------------
# Data and tokenizer


def read_lines(path: str | os.PathLike, limit: int | None = None) -> list[str]:
    """One sentence a line, plain text or gzip."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit is not None else lines


def _train_spm(lines: list[str], model_file: Path, vocab_size: int, seed: int) -> None:
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "text.txt"
        text.write_text("\n".join(lines) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(Path(tmp) / "m"), vocab_size=vocab_size,
                                       model_type="unigram", character_coverage=1.0, hard_vocab_limit=False,
                                       num_threads=1, minloglevel=2)
        shutil.copyfile(Path(tmp) / "m.model", model_file)


def shared_vocabulary(spm_files: list[Path]) -> list[str]:
    """opus-mt's layout: </s> 0, <unk> 1, every ordinary piece of either side once, <pad> last."""
    import sentencepiece as spm

    pieces = ["</s>", "<unk>"]
    seen = set(pieces)
    for path in spm_files:
        sp = spm.SentencePieceProcessor(model_file=str(path))
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if sp.is_control(i) or sp.is_unknown(i) or piece in seen or piece == "<pad>":
                continue
            pieces.append(piece)
            seen.add(piece)
    return pieces + ["<pad>"]


def write_tokenizer(cfg: ReferenceConfig, src_lines: list[str], tgt_lines: list[str]):
    """The MarianTokenizer in cfg.out: made once (sentencepiece models trained on the training text,
    or the given ones), then read back on every rerun so that a resumed run keeps its ids."""
    from transformers import MarianTokenizer

    out = Path(cfg.out)
    if all((out / name).exists() for name in TOKENIZER_FILES):
        return MarianTokenizer.from_pretrained(str(out))
    out.mkdir(parents=True, exist_ok=True)
    for side, lines, given in (("source", src_lines, cfg.spm_src), ("target", tgt_lines, cfg.spm_tgt)):
        if given:
            shutil.copyfile(given, out / f"{side}.spm")
        else:
            _train_spm(lines, out / f"{side}.spm", cfg.vocab_size, cfg.seed)
    pieces = shared_vocabulary([out / "source.spm", out / "target.spm"])
    (out / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}, ensure_ascii=False, indent=0),
                                    encoding="utf-8")
    tokenizer = MarianTokenizer(source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
                                vocab=str(out / "vocab.json"), model_max_length=cfg.max_positions)
    tokenizer.save_pretrained(str(out))
    return MarianTokenizer.from_pretrained(str(out))


class Pairs:
    """Tokenised sentence pairs as the Trainer's data collator wants them (a map-style dataset)."""

    def __init__(self, tokenizer, src: list[str], tgt: list[str], max_length: int):
        if len(src) != len(tgt):
            raise SystemExit(f"{len(src)} source lines but {len(tgt)} target lines")
        enc = tokenizer(src, text_target=tgt, truncation=True, max_length=max_length)
        self.rows = [{"input_ids": i, "attention_mask": a, "labels": y}
                     for i, a, y in zip(enc["input_ids"], enc["attention_mask"], enc["labels"])]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return self.rows[i]


# --------------------------------------------------------------------------------------------
# Model


def build_model(cfg: ReferenceConfig, tokenizer):
    """A freshly initialised MarianMTModel (seeded), configured as opus-mt models are: the decoder
    starts from the pad id, swish activations, scaled and shared embeddings tied to the output
    layer, sinusoidal positions; generate never outputs <pad> and ends with </s> at its length limit."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, set_seed

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    config = MarianConfig(vocab_size=len(tokenizer), d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
                          decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.heads,
                          decoder_attention_heads=cfg.heads, encoder_ffn_dim=cfg.ffn, decoder_ffn_dim=cfg.ffn,
                          max_position_embeddings=cfg.max_positions, pad_token_id=pad, eos_token_id=eos,
                          decoder_start_token_id=pad, forced_eos_token_id=eos, activation_function="swish",
                          scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
                          dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=0.0)
    set_seed(cfg.seed)
    model = MarianMTModel(config)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=eos, forced_eos_token_id=eos,
        pad_token_id=pad, max_length=cfg.max_positions, num_beams=4)
    return model


# --------------------------------------------------------------------------------------------
# Training


def _settings(cfg: ReferenceConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in MAY_CHANGE_ON_RESUME}


def _check_resume(cfg: ReferenceConfig, directory: Path) -> None:
    path = directory / SETTINGS
    if path.exists():
        before = json.loads(path.read_text())
        changed = {k: (before.get(k), v) for k, v in _settings(cfg).items() if before.get(k) != v}
        if changed:
            raise SystemExit(f"{directory} holds a run with other settings ({changed}: before, now); resuming it "
                             f"would mix the two. Use another --out/--checkpoint-dir, or delete {directory}.")
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_settings(cfg), indent=1) + "\n")


def _progress_callback():
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """One line per log: step, updates per second since this process started training, the logs."""

        start, first = None, 0

        def on_train_begin(self, args, state, control, **kwargs):
            self.start, self.first = time.monotonic(), state.global_step
            print(f"training from step {state.global_step} to {state.max_steps}", flush=True)

        def on_log(self, args, state, control, logs=None, **kwargs):
            shown = {k: (round(v, 5) if isinstance(v, float) else v) for k, v in (logs or {}).items()}
            if self.start is None:  # the dev loss before training
                print(f"step {state.global_step} {shown}", flush=True)
                return
            done, elapsed = state.global_step - self.first, time.monotonic() - self.start
            rate = done / elapsed if elapsed > 0 else 0.0
            print(f"step {state.global_step}/{state.max_steps} {rate:.3f} steps/s {elapsed:.0f} s {shown}", flush=True)

        def on_save(self, args, state, control, **kwargs):
            print(f"checkpoint at step {state.global_step}", flush=True)

    return Progress()


def train(cfg: ReferenceConfig) -> dict:
    """Train (or resume) and write the model and tokenizer to cfg.out. -> the summary: dev loss
    before training and after (label-smoothed, as the Trainer reports it), steps, paths."""
    import torch
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
    from transformers.trainer_callback import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint
    from transformers.utils import logging

    logging.disable_progress_bar()  # no bar per checkpoint written in the log

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    checkpoints = cfg.checkpoints()
    _check_resume(cfg, checkpoints)
    src_train, tgt_train = read_lines(cfg.src_train, cfg.train_limit), read_lines(cfg.tgt_train, cfg.train_limit)
    src_dev, tgt_dev = read_lines(cfg.src_dev, cfg.dev_limit), read_lines(cfg.tgt_dev, cfg.dev_limit)
    tokenizer = write_tokenizer(cfg, src_train, tgt_train)
    model = build_model(cfg, tokenizer)
    train_set = Pairs(tokenizer, src_train, tgt_train, cfg.max_length)
    dev_set = Pairs(tokenizer, src_dev, tgt_dev, cfg.max_length)
    args = Seq2SeqTrainingArguments(
        output_dir=str(checkpoints), max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size, learning_rate=cfg.lr, warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="inverse_sqrt", adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-9, weight_decay=0.0,
        max_grad_norm=cfg.clip_norm, label_smoothing_factor=cfg.label_smoothing, seed=cfg.seed, data_seed=cfg.seed,
        train_sampling_strategy=cfg.sampling, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2,
        eval_strategy="steps", eval_steps=cfg.eval_steps, prediction_loss_only=True, logging_strategy="steps",
        logging_steps=cfg.logging_steps, report_to="none", disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, predict_with_generate=False)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_set, eval_dataset=dev_set,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
                             processing_class=tokenizer, callbacks=[] if cfg.quiet else [_progress_callback()])
    trainer.remove_callback(PrinterCallback)  # Progress prints the logs, with the speed
    summary_path = checkpoints / SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    last = get_last_checkpoint(str(checkpoints)) if checkpoints.is_dir() else None
    if last is None:  # a fresh start: the untrained model's dev loss, to show what training did
        summary["dev_loss_untrained"] = trainer.evaluate()["eval_loss"]
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    elif not cfg.quiet:
        print(f"resuming from {last}", flush=True)
    start = time.monotonic()
    result = trainer.train(resume_from_checkpoint=last)
    trained_for = time.monotonic() - start
    step = trainer.state.global_step
    evaluated = [log["eval_loss"] for log in trainer.state.log_history if "eval_loss" in log and log["step"] == step]
    summary.update(dev_loss=evaluated[-1] if evaluated else trainer.evaluate()["eval_loss"], steps=step,
                   resumed_from=last, train_loss=result.training_loss, vocabulary=len(tokenizer),
                   seconds_this_run=round(trained_for, 1), out=str(Path(cfg.out)))
    model.save_pretrained(cfg.out)
    tokenizer.save_pretrained(cfg.out)
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    if not cfg.quiet:
        print(f"saved to {cfg.out}: {json.dumps(summary)}", flush=True)
    return summary


# --------------------------------------------------------------------------------------------


HELP = {
    "src_train": "source side of the training text, one sentence a line (plain or .gz)",
    "tgt_train": "its target side", "src_dev": "dev source (the dev loss)", "tgt_dev": "dev target",
    "out": "where model and tokenizer are written (save_pretrained), the tokenizer first",
    "checkpoint_dir": "the Trainer's checkpoints (default: OUT.checkpoints)",
    "vocab_size": "pieces of each side's sentencepiece model, trained on the training text",
    "spm_src": "use this sentencepiece model for the source side instead (e.g. headcount's subwords/src.model)",
    "spm_tgt": "and this one for the target side",
    "max_length": "tokens kept of a sentence (EOS included)",
    "batch_size": "sentences per update",
    "lr": "peak learning rate, reached after the warm-up; then inverse square root decay",
    "sampling": "random: the same order after a resume; group_by_length: less padding, another order after a resume",
    "save_steps": "checkpoint every this many steps (a rerun resumes from the last)",
    "threads": "torch threads (0: torch's default)",
}


def parse_args(argv: list[str] | None = None) -> ReferenceConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    required = {"src_train", "tgt_train", "src_dev", "tgt_dev", "out"}
    for field in dataclasses.fields(ReferenceConfig):
        flag = "--" + field.name.replace("_", "-")
        text = HELP.get(field.name, "")
        if field.name not in required and field.type != "bool" and field.name != "checkpoint_dir":
            text = f"{text} (default: %(default)s)".strip()
        if field.name in required:
            parser.add_argument(flag, required=True, help=text)
        elif field.type == "bool":
            parser.add_argument(flag, action="store_true", help=text)
        else:
            kind = {"int": int, "float": float}.get(str(field.type).split(" ")[0], str)
            choices = ("random", "group_by_length") if field.name == "sampling" else None
            parser.add_argument(flag, type=kind, default=field.default, choices=choices, help=text)
    return ReferenceConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
