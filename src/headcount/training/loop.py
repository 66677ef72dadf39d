"""Training: token-count batches with length bucketing, a learning-rate schedule (training.schedules;
Noam by default), label smoothing, dev loss and dev BLEU at intervals, atomic checkpoints
(models.checkpoint) and resumption after a kill.

The loop in `train` is the one visible training loop of the project; the pruning and
from-scratch stages reuse it with their own model and parameter groups.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from headcount.data.batching import make_batches, objective_tensors
from headcount.data.token_corpus import TokenCorpus, sequence_lengths
from headcount.io import HeadcountError, atomic_path, config_hash
from headcount.models.checkpoint import load_checkpoint, save_checkpoint, state_step
from headcount.models.device import inherited_precision, pick_autocast_dtype, pick_device, precision_name
from headcount.models.sentence_embedding import SENTENCE_EMBEDDING, embedding_distance
from headcount.models.seq2seq import Seq2SeqWithHeads, kind_of
from headcount.progress import Progress
from headcount.settings import TrainingSettings
from headcount.training.averaging import average_state_dicts, averaging_window
from headcount.training.convergence import dev_losses
from headcount.training.schedules import noam_lr
from headcount.training.static_shapes import BACKENDS, Buckets, padded_loss


@dataclass
class TrainConfig(TrainingSettings):
    """The loop's settings: headcount.settings.TrainingSettings, every field and default (the
    workflow's `training`), with the methods the loop uses."""

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Loss


def sequence_loss(model: Seq2SeqWithHeads, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, label_smoothing: float):
    """Summed label-smoothed cross-entropy and summed NLL over the non-padding target tokens.

    The output layer runs on real tokens only: padding costs no vocabulary projection. A sentence
    encoder's loss is each sentence's embedding distance to the unpruned model's (one unit per
    sentence; no label smoothing: there is no vocabulary).
    """
    if kind_of(model).objective == SENTENCE_EMBEDDING:
        distance = embedding_distance(model, src)  # (B,)
        return distance.sum(), distance.sum().detach(), len(distance)
    memory, src_pad, _ = model.encode(src)
    if kind_of(model).objective == "masked_lm":  # the encoder's states are the output, aligned with tgt_out
        hidden = memory  # (B, S, D)
    else:
        hidden, _, _ = model.decode(tgt_in, memory, src_pad)  # (B, T, D)
    real = tgt_out.ne(model.special.pad)
    logits = model.logits(hidden[real]).float()  # (N, V)
    target = tgt_out[real]
    # F.cross_entropy's own label-smoothing formula, spelled out so that the loss and the plain NLL
    # share one log-softmax over the vocabulary (bitwise the same values and gradients; the second
    # log-softmax cost ~1.5% of a training step).
    log_probs = F.log_softmax(logits, dim=-1)  # (N, V)
    nll = F.nll_loss(log_probs, target, reduction="sum")
    loss = nll
    if label_smoothing:
        uniform = -log_probs.sum(dim=-1).sum()  # summed cross-entropy with the uniform distribution
        loss = (1.0 - label_smoothing) * nll + uniform * (label_smoothing / logits.shape[-1])
    return loss, nll.detach(), int(real.sum())


def forward_loss(model: Seq2SeqWithHeads, batch: tuple[Tensor, Tensor, Tensor], cfg: TrainConfig, device,
                 autocast_dtype, extra_loss: Callable[[Seq2SeqWithHeads], Tensor] | None = None,
                 padded: Callable | None = None):
    """The forward half of a training step: -> (the mean loss to minimise, summed loss, summed NLL,
    target tokens). benchmarks/run.py times this same code. `padded`: static_shapes.padded_loss, the
    same sums on the batch padded to its bucket (training.compile_step)."""
    src, tgt_in, tgt_out = batch
    if padded is not None:
        loss_sum, nll_sum, n_real = padded(batch)
        loss = loss_sum / n_real
        if extra_loss is not None:  # e.g. the gates' L0 penalty: a few parameters, outside the graph
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                loss = loss + extra_loss(model)
        return loss, loss_sum, nll_sum, int(n_real)
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        loss_sum, nll_sum, n_tokens = sequence_loss(model, src, tgt_in, tgt_out, cfg.label_smoothing)
        loss = loss_sum / n_tokens
        if extra_loss is not None:
            loss = loss + extra_loss(model)
    return loss, loss_sum, nll_sum, n_tokens


def update(optimizer: torch.optim.Optimizer, loss: Tensor, params: list[Tensor], clip_norm: float) -> None:
    """The backward half: gradients, clipped to `clip_norm`, and one optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()


def make_optimizer(groups: list[dict], cfg: TrainConfig, device, fused: bool | None = None) -> torch.optim.Adam:
    """Adam over the parameter groups (learning rates are set each step).

    Fused (torch's one-kernel update per parameter group) on CPU and CUDA: on a single CPU thread the
    update takes 18 ms instead of 58 ms for the default model, the for-loop it replaces spending
    about 4% of an fp32 step and more of a shorter one (benchmarks/RESULTS.md, "Fast training step").
    The update is the same formula, rounded in another order (weights within ~1e-7 after a step);
    the moments in a checkpoint are the same tensors, so runs resume across the change.
    `fused=False`: the for-loop update, for comparison."""
    if fused is None:
        fused = torch.device(device).type in ("cpu", "cuda") and all(
            p.is_floating_point() for group in groups for p in group["params"])
    return torch.optim.Adam(groups, lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps, fused=fused)


class TrainingStopped(HeadcountError):
    """The job was asked to stop (SIGTERM, SIGINT or SIGHUP: _StopRequests); a checkpoint was written first."""


class _StopRequests:
    """SIGTERM, SIGINT and SIGHUP handlers for the length of a training run.

    A signal during a training step only raises a flag, checked once the step is done (a step takes
    about a second). A signal during an evaluation (which can take minutes: greedy dev BLEU) stops
    it at once: evaluation changes no weights and draws no random numbers, so the checkpoint
    written then is exact, and it records that the evaluation is still to do.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self.in_evaluation = False
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers only install there
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: a closed terminal
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame):
        self.signal_name = signal.Signals(signum).name
        if self.in_evaluation:
            # Cleared first: a second copy of the signal (Ctrl-C reaches the whole process group and
            # Snakemake forwards one too) must not interrupt the checkpoint that follows.
            self.in_evaluation = False
            raise _EvaluationInterrupted


class _EvaluationInterrupted(Exception):
    pass


@dataclass
class Corpus:
    """A training set: each side a TokenCorpus (compact, for millions of pairs) or a list of id lists."""

    src: TokenCorpus | list[list[int]]
    tgt: TokenCorpus | list[list[int]]


@dataclass
class DevSet:
    src: TokenCorpus | list[list[int]]
    tgt: TokenCorpus | list[list[int]]
    references: list[str] = field(default_factory=list)  # raw target text for BLEU


def evaluate_loss(model: Seq2SeqWithHeads, data: Corpus, max_tokens: int, device, autocast_dtype) -> float:
    """Mean per-token NLL (nats) on a set, in evaluation mode."""
    model.eval()
    objective = kind_of(model).objective
    total, tokens = 0.0, 0
    with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                         enabled=autocast_dtype is not None):
        for batch in make_batches(sequence_lengths(data.src), sequence_lengths(data.tgt), max_tokens, seed=0):
            src, tgt_in, tgt_out = (x.to(device) for x in objective_tensors(
                objective, [data.src[i] for i in batch], [data.tgt[i] for i in batch], model.special))
            _, nll, n = sequence_loss(model, src, tgt_in, tgt_out, 0.0)
            total, tokens = total + float(nll), tokens + n
    return total / max(tokens, 1)


def train(
    model: Seq2SeqWithHeads,
    cfg: TrainConfig,
    data: Corpus,
    dev: DevSet,
    out_dir: str | os.PathLike,
    dev_bleu: Callable[[Seq2SeqWithHeads, DevSet], float] | None = None,
    parameters=None,  # the parameters to train, or param groups with an "lr_scale"; default: all
    extra_loss: Callable[[Seq2SeqWithHeads], Tensor] | None = None,  # e.g. the L0 penalty of the gates
    extra_metrics: Callable[[Seq2SeqWithHeads], dict] | None = None,  # more fields for each log record
    run_fingerprint: dict | None = None,  # everything the run depends on; a checkpoint must match it
    earlier_fingerprints: Sequence[dict] = (),  # the same run as older versions fingerprinted it: resumes too
    lr_at: Callable[[int], float] | None = None,  # learning rate at a 1-based step (training.schedules); default: Noam
    init_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,  # e.g. load moments; fresh runs only
    log: Callable[[str], None] = print,
) -> dict:
    """Train `model` in place until `cfg.max_steps`; resume from `out_dir/checkpoint.pt` if present.

    Returns a summary with the selected step and its dev scores; the selected weights are loaded
    into `model` at the end.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, best_path, metrics_path = out_dir / "checkpoint.pt", out_dir / "best.pt", out_dir / "metrics.jsonl"
    fingerprint = run_fingerprint_hash(cfg.to_dict(), model.cfg.to_dict(), run_fingerprint)

    if lr_at is None:
        def lr_at(step: int) -> float:
            return noam_lr(step, model.d_model, cfg.warmup_steps, cfg.lr_scale)

    device = pick_device(cfg.device)
    autocast_dtype = pick_autocast_dtype(cfg.precision, device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model.to(device)
    groups = parameter_groups(model if parameters is None else parameters)
    params = [p for group in groups for p in group["params"]]
    optimizer = make_optimizer(groups, cfg, device)

    step, epoch, batch_in_epoch, eval_pending = 0, 0, 0, False
    best = {"dev_bleu": -1.0, "step": 0, "dev_loss": math.inf}
    # Time spent up to the checkpoint this attempt resumes from (wall and CPU seconds, attempts):
    # Snakemake's benchmark file keeps only the last attempt of a job that was stopped and rerun.
    earlier = {"seconds": 0.0, "cpu_seconds": 0.0, "attempts": 0}
    torch.manual_seed(cfg.seed)
    if ckpt_path.exists():
        state = load_checkpoint(ckpt_path, map_location=device)
        reason = resume_conflict(state, cfg, model.cfg.to_dict(), run_fingerprint, earlier_fingerprints)
        if reason:
            log(f"{ckpt_path} was written with another configuration ({reason}); starting this run afresh")
        else:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            # `auto` resolves once, when the run starts: a run resumed on a machine that would choose
            # otherwise (bf16 where the CPU has AVX512-BF16 or AMX) finishes in the numerics it began in.
            kept = inherited_precision(cfg.precision, state.get("precision"))
            if kept != cfg.precision and kept != precision_name(autocast_dtype):
                log(f"precision auto: this run began in {kept}; it continues in {kept}, although this "
                    f"machine would choose {precision_name(autocast_dtype)}")
                autocast_dtype = pick_autocast_dtype(kept, device)
            step, epoch, batch_in_epoch, best = state["step"], state["epoch"], state["batch_in_epoch"], state["best"]
            eval_pending = bool(state.get("eval_pending", False))
            # A checkpoint from before this record was kept: at least one earlier attempt, time unknown.
            earlier = state.get("time_so_far") or {"seconds": 0.0, "cpu_seconds": 0.0, "attempts": 1}
            # The generators' states must be CPU byte tensors; map_location moved them to the GPU.
            torch.set_rng_state(state["rng_cpu"].cpu())
            if device.type == "cuda" and state.get("rng_cuda") is not None:
                torch.cuda.set_rng_state(state["rng_cuda"].cpu())
            log(f"resuming from {ckpt_path} at step {step} (epoch {epoch}, batch {batch_in_epoch})")
    if step == 0 and init_optimizer is not None:
        init_optimizer(optimizer)
    padded = padded_step_loss(model, cfg, device, autocast_dtype)
    _truncate_metrics(metrics_path, step)
    _drop_snapshots_after(out_dir / "snapshots", step)
    last_checkpoint = time.monotonic()

    def time_so_far() -> dict:
        return {"seconds": earlier["seconds"] + time.perf_counter() - run_start,
                "cpu_seconds": earlier["cpu_seconds"] + time.process_time() - cpu_start,
                "attempts": earlier["attempts"] + 1}

    def checkpoint() -> None:
        nonlocal last_checkpoint
        save_checkpoint(ckpt_path, {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "model_config": model.cfg.to_dict(),
            "train_config": cfg.to_dict(), "fingerprint": fingerprint, "step": step, "epoch": epoch,
            "batch_in_epoch": batch_in_epoch, "best": best, "eval_pending": eval_pending,
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state() if device.type == "cuda" else None,
            "time_so_far": time_so_far(), "precision": precision_name(autocast_dtype),
        })
        last_checkpoint = time.monotonic()
        log(f"checkpoint: step {step} written to {ckpt_path}")

    def evaluate(metrics, stop: _StopRequests) -> None:
        """Dev loss (and dev BLEU) at `step`; keeps best.pt. A signal may cut the measuring short,
        not the writing."""
        nonlocal best
        stop.in_evaluation = True
        record = {"step": step, "epoch": epoch,
                  "dev_loss": evaluate_loss(model, Corpus(dev.src, dev.tgt), cfg.max_tokens * 2, device,
                                            autocast_dtype)}
        if dev_bleu is not None:
            record["dev_bleu"] = dev_bleu(model, dev)
        stop.in_evaluation = False
        metrics.write(json.dumps(record) + "\n")
        metrics.flush()
        log(f"eval at step {step}: dev loss {record['dev_loss']:.3f}"
            + (f", dev BLEU {record['dev_bleu']:.2f}" if "dev_bleu" in record else ""))
        score = record.get("dev_bleu", -record["dev_loss"])
        best_score = best["dev_bleu"] if "dev_bleu" in record else -best["dev_loss"]
        if score > best_score:
            best = {"dev_bleu": record.get("dev_bleu", -1.0), "step": step, "dev_loss": record["dev_loss"]}
            save_checkpoint(best_path, {"model": model.state_dict(), "model_config": model.cfg.to_dict(),
                                        "step": step})

    def after_step(metrics, stop: _StopRequests) -> None:
        """Evaluation, snapshot and checkpoint due at `step`, in that order (a resumed run whose
        evaluation was interrupted starts here)."""
        nonlocal eval_pending
        if eval_pending:
            evaluate(metrics, stop)
            eval_pending = False
            window["time"] = time.perf_counter()  # evaluation time is not training throughput
        if cfg.snapshot_interval and (step % cfg.snapshot_interval == 0 or step == cfg.max_steps):
            save_checkpoint(out_dir / "snapshots" / f"step_{step}.pt",
                            {"model": model.state_dict(), "model_config": model.cfg.to_dict(), "step": step})
        overdue = cfg.checkpoint_minutes and time.monotonic() - last_checkpoint >= 60 * cfg.checkpoint_minutes
        if step % cfg.checkpoint_interval == 0 or step == cfg.max_steps or overdue or stop.signal_name:
            checkpoint()

    objective = kind_of(model).objective
    src_lens, tgt_lens = [n + 1 for n in sequence_lengths(data.src)], [n + 1 for n in sequence_lengths(data.tgt)]
    batches = make_batches(src_lens, tgt_lens, cfg.max_tokens, seed=cfg.seed * 1000 + epoch)
    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0, "time": time.perf_counter()}
    run_start, cpu_start = time.perf_counter(), time.process_time()
    log(f"training on {device} ({autocast_dtype or torch.float32}); {len(data.src)} pairs, "
        f"{len(batches)} batches per epoch, {sum(p.numel() for p in params):,} trained parameters")

    bar = Progress(cfg.max_steps, "training", log, unit="step", initial=step)
    with open(metrics_path, "a", encoding="utf-8") as metrics, _StopRequests() as stop:
        try:
            if eval_pending:
                after_step(metrics, stop)
            while step < cfg.max_steps and not stop.signal_name:
                if batch_in_epoch >= len(batches):
                    epoch, batch_in_epoch = epoch + 1, 0
                    batches = make_batches(src_lens, tgt_lens, cfg.max_tokens, seed=cfg.seed * 1000 + epoch)
                batch = batches[batch_in_epoch]
                model.train()
                src, tgt_in, tgt_out = (x.to(device) for x in objective_tensors(
                    objective, [data.src[i] for i in batch], [data.tgt[i] for i in batch], model.special,
                    seed=cfg.seed * 1000 + epoch + 1))  # a masked LM's masks drawn anew each epoch; dev uses seed 0
                lr = lr_at(step + 1)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group["lr_scale"]
                loss, loss_sum, nll_sum, n_tokens = forward_loss(model, (src, tgt_in, tgt_out), cfg, device,
                                                                 autocast_dtype, extra_loss, padded)
                if not torch.isfinite(loss):
                    raise HeadcountError(
                        f"training loss became {float(loss.detach())} at step {step + 1}; the last good checkpoint "
                        f"({ckpt_path}, step {state_step(ckpt_path)}) is kept. Lower training.lr_scale or "
                        f"raise training.warmup_steps, then rerun to resume."
                    )
                update(optimizer, loss, params, cfg.clip_norm)
                step, batch_in_epoch = step + 1, batch_in_epoch + 1
                window["loss"] += float(loss_sum.detach())
                window["nll"] += float(nll_sum)
                window["tokens"] += n_tokens
                window["src_tokens"] += int(src.ne(model.special.pad).sum())

                if step % cfg.log_interval == 0 or step == cfg.max_steps:
                    now = time.perf_counter()
                    seconds = now - window["time"]
                    record = {
                        "step": step, "epoch": epoch, "lr": lr, "train_loss": window["loss"] / window["tokens"],
                        "train_nll": window["nll"] / window["tokens"],
                        "tokens_per_s": (window["tokens"] + window["src_tokens"]) / seconds,
                        "elapsed_s": now - run_start,
                    }
                    if extra_metrics is not None:
                        record.update(extra_metrics(model))
                    metrics.write(json.dumps(record) + "\n")
                    metrics.flush()
                    log(f"step {step}/{cfg.max_steps} epoch {epoch} loss {record['train_loss']:.3f} lr {lr:.2e} "
                        f"{record['tokens_per_s']:.0f} tok/s")
                    bar.postfix = f"loss={record['train_loss']:.3f}"
                    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "src_tokens": 0, "time": time.perf_counter()}
                bar.update(1)

                eval_pending = step % cfg.eval_interval == 0 or step == cfg.max_steps
                after_step(metrics, stop)
        except _EvaluationInterrupted:
            stop.in_evaluation = False
            checkpoint()  # eval_pending is still set: the resumed run evaluates this step first
    if stop.signal_name:
        log(f"{stop.signal_name} received: checkpoint written at step {step} ({ckpt_path}); stopping")
        raise TrainingStopped(
            f"training stopped by {stop.signal_name} at step {step} of {cfg.max_steps}; the checkpoint "
            f"{ckpt_path} holds that step. Run the workflow again (snakemake --rerun-incomplete) to resume."
        )

    if cfg.select == "best_dev_bleu" and best_path.exists():
        model.load_state_dict(load_checkpoint(best_path, map_location=device)["model"])
        selected = best["step"]
    else:
        selected = step
    log(f"done: {step} steps; selected the weights of step {selected}")
    snapshots = [{"step": n, "path": str(out_dir / "snapshots" / f"step_{n}.pt")}
                 for n in _snapshot_steps(out_dir / "snapshots")]
    averaged = [selected]
    if cfg.average_snapshots > 1:
        paths = {snap["step"]: snap["path"] for snap in snapshots}
        averaged = averaging_window(list(paths), selected, cfg.average_snapshots)
        model.load_state_dict(average_state_dicts(
            [load_checkpoint(paths[n], map_location=device)["model"] for n in averaged]))
        log(f"the output: the mean of the snapshots of steps {', '.join(map(str, averaged))}")
    spent = time_so_far()
    return {"steps": step, "epochs": epoch, "selected_step": selected, "averaged_steps": averaged, "best": best,
            "precision": precision_name(autocast_dtype),
            "dev_losses": dev_losses(metrics_path),  # every evaluation: the plateau rule reads them
            "train_seconds": time.perf_counter() - run_start, "train_seconds_all": spent["seconds"],
            "train_cpu_seconds_all": spent["cpu_seconds"], "attempts": spent["attempts"], "snapshots": snapshots}


def parameter_groups(parameters) -> list[dict]:
    """Adam param groups from a model, a list of parameters, or groups with an "lr_scale" (a
    multiplier on the schedule's learning rate); frozen parameters are left out."""
    if isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    parameters = list(parameters)
    if not parameters or not isinstance(parameters[0], dict):
        parameters = [{"params": parameters}]
    groups = []
    for group in parameters:
        trained = [p for p in group["params"] if p.requires_grad]
        if trained:
            groups.append({**group, "params": trained, "lr_scale": float(group.get("lr_scale", 1.0))})
    if not groups:
        raise HeadcountError("nothing to train: every parameter is frozen")
    return groups


def padded_step_loss(model: Seq2SeqWithHeads, cfg: TrainConfig, device, autocast_dtype) -> Callable | None:
    """training.compile_step's forward pass on padded shapes (static_shapes.padded_loss), or None
    for the eager step on each batch's own shape."""
    if cfg.compile_step == "eager":
        return None
    if cfg.compile_step not in BACKENDS:
        raise HeadcountError(f"training.compile_step: {cfg.compile_step!r} is not one of eager, {', '.join(BACKENDS)}")
    if kind_of(model).objective != "translation":
        raise HeadcountError(f"training.compile_step: {cfg.compile_step} pads translation batches (an encoder-"
                             f"decoder's); this model's objective is {kind_of(model).objective}. Set it to eager.")
    if cfg.compile_step in ("cudagraphs", "inductor") and torch.device(device).type != "cuda":
        raise HeadcountError(f"training.compile_step: {cfg.compile_step} replays CUDA graphs, and this run "
                             f"trains on {device}. Set it to eager (or buckets) for a CPU, or train on a GPU.")
    return padded_loss(model, cfg.label_smoothing, autocast_dtype, cfg.compile_step, Buckets())


# Settings that do not change the weights up to a given step: a run may be extended (more
# max_steps), evaluated differently or moved to other hardware and still resume its checkpoint.
# compile_step changes the shapes a step runs on, not what it learns (the padding is masked out).
RESUMABLE_CHANGES = ("max_steps", "log_interval", "eval_interval", "checkpoint_interval", "checkpoint_minutes",
                     "snapshot_interval", "dev_bleu_sentences", "select", "average_snapshots", "device", "threads",
                     "compile_step")


def run_fingerprint_hash(train_config: dict, model_config: dict, run: dict | None) -> str:
    return config_hash({"train": train_config, "model": model_config, "run": run})


def resume_conflict(state: dict, cfg: TrainConfig, model_config: dict, run: dict | None,
                    earlier: Sequence[dict] = ()) -> str | None:
    """Why a checkpoint cannot be resumed under the current settings, or None if it can. `earlier`:
    the run's fingerprint in the forms older versions gave it, which its checkpoints may carry."""
    saved = state.get("train_config", {})
    if all(state.get("fingerprint") != run_fingerprint_hash(saved, model_config, r) for r in (run, *earlier)):
        return "model or data differ"
    current = cfg.to_dict()
    changed = sorted(k for k in current if k not in RESUMABLE_CHANGES and _plain(saved.get(k)) != _plain(current[k]))
    return f"training settings {', '.join(changed)} differ" if changed else None


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _snapshot_steps(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.stem.removeprefix("step_")) for p in directory.glob("step_*.pt")
                  if p.stem.removeprefix("step_").isdigit())


def _drop_snapshots_after(directory: Path, step: int) -> None:
    """Snapshots later than the step we (re)start from belong to another run: they will be redone."""
    for n in _snapshot_steps(directory):
        if n > step:
            (directory / f"step_{n}.pt").unlink()


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric records written after the checkpoint we resume from (they will be redone)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip() and json.loads(line)["step"] <= step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
