"""fairseq and headcount side by side: training tokens/s on the same data, model and token budget.

    python benchmarks/fairseq_side_by_side.py [--windows 3] [--window-seconds 75]

What it does (issue 19, item 1):
1. Sets up its own environment for fairseq under benchmarks/.fairseq-venv (git-ignored): `python -m venv`,
   torch 2.13.0 (CPU), numpy<2, cython, then `pip install --no-build-isolation fairseq-fixed` (an sdist
   whose build, left isolated, would pull the newest CUDA torch into its build environment). Where that
   fails, or fairseq does not import, it prints what failed and skips (exit status 0).
2. Encodes Multi30k en-de with headcount's own sentencepiece models (results/multi30k_en_de/subwords/,
   or --experiment-dir) and binarises it for fairseq with dictionaries made from those models, so both
   train on the same subword sequences (fairseq's ids are headcount's, renumbered).
3. Starts two workers, each in its own process and environment, both kept alive: fairseq (its Trainer,
   the loop fairseq-train runs) and headcount (the step of headcount.train.train: same batching,
   loss, schedule, clipping). Same architecture (6+6 layers, d_model 256, FFN 1024, 8 heads, pre-LN,
   tied target embeddings, dropout 0.1, attention dropout 0.1, ReLU dropout 0), label smoothing 0.1,
   Adam (0.9, 0.98, 1e-9), clip norm 1.0, the Noam schedule (fairseq: inverse_sqrt with the same peak
   and warm-up), max-tokens 1600, fp32 (headcount: --headcount-precision), 2 threads.
4. Alternates them in windows of --window-seconds of training each (fairseq, headcount, fairseq, ...),
   each continuing where it stopped, and reports each window's tokens/s (source + target tokens that are
   not padding, EOS included, counted the same way for both) and the ratio headcount / fairseq of each
   window pair, with its median and range. `uptime` is printed before and after every window.
5. With --bleu-every N, instead: trains each side N steps at a time (alternating, ABBA), translates the
   dev set greedily after each stretch (fairseq's SequenceGenerator, headcount's greedy search, the same
   length limits) and reports the training time each needed to reach the dev BLEU levels both reached.
The table is printed and written to benchmarks/fairseq_latest.md (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
VENV = HERE / ".fairseq-venv"
WORK = HERE / ".fairseq-work"
TORCH = "torch==2.13.0"

# The default experiment's model and training settings (config/config.yaml defaults), spelled out so
# the two sides cannot drift apart silently; the headcount worker checks them against headcount's config.
MODEL = {"d_model": 256, "n_heads": 8, "d_ff": 1024, "enc_layers": 6, "dec_layers": 6, "dropout": 0.1,
         "attn_dropout": 0.1, "relu_dropout": 0.0, "tie_target_embeddings": True, "max_len": 512,
         "dropout_masks": "fast"}  # as the default experiment trains (config/config.yaml)
TRAIN = {"max_tokens": 1600, "warmup_steps": 800, "lr_scale": 1.0, "adam_betas": (0.9, 0.98), "adam_eps": 1e-9,
         "label_smoothing": 0.1, "clip_norm": 1.0, "seed": 1}
DECODE = {"max_len_a": 1.5, "max_len_b": 10}  # the default experiment's length limits; greedy, as dev BLEU is
PEAK_LR = TRAIN["lr_scale"] * MODEL["d_model"] ** -0.5 * TRAIN["warmup_steps"] ** -0.5  # Noam's peak


def log(message: str) -> None:
    print(message, flush=True)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def cpu_description() -> dict:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    return {"model": fields.get("Model name", "?").strip(), "cpus": fields.get("CPU(s)", "?").strip(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
            "amx_bf16": "amx_bf16" in flags}


# --------------------------------------------------------------------------------------------
# The fairseq environment


class Skip(Exception):
    """fairseq cannot be set up here; the message says what failed."""


def _run(cmd: list[str], what: str, timeout: float = 1800) -> str:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise Skip(f"{what} failed (exit status {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


def fairseq_python(venv: Path, install: bool) -> Path:
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import torch, fairseq, fairseq.models.transformer, fairseq.trainer; "
             "print(torch.__version__, fairseq.__version__)"]
    if python.exists():
        proc = subprocess.run(check, capture_output=True, text=True)
        if proc.returncode == 0:
            log(f"fairseq environment {venv}: torch, fairseq = {proc.stdout.strip()}")
            return python
    if not install:
        raise Skip(f"no working fairseq in {venv} and --no-install was given")
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], "creating the fairseq virtual environment")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    # Build requirements first, torch pinned: fairseq-fixed's isolated build would install the newest
    # torch (with its CUDA wheels, gigabytes) just to compile its extensions.
    _run(pip + [TORCH, "numpy<2", "cython", "setuptools", "wheel"], "installing torch and fairseq's build requirements")
    _run(pip + ["--no-build-isolation", "fairseq-fixed"], "building and installing fairseq-fixed")
    proc = subprocess.run(check, capture_output=True, text=True)
    if proc.returncode:
        raise Skip("fairseq-fixed installed but does not import with " + TORCH + ":\n"
                   + "\n".join(proc.stderr.strip().splitlines()[-15:]))
    log(f"fairseq environment ready: torch, fairseq = {proc.stdout.strip()}")
    return python


# --------------------------------------------------------------------------------------------
# The data: headcount's sentencepiece segmentation, binarised for fairseq


def find_experiment_dir(given: str | None) -> Path:
    candidates = [Path(given)] if given else [REPO / "results" / "multi30k_en_de",
                                              Path("/work/run/headcount/results/multi30k_en_de")]
    for path in candidates:
        if (path / "subwords" / "src.model").exists() and (path / "data" / "train.src.txt").exists():
            return path
    raise SystemExit("no prepared Multi30k en-de found (looked in " + ", ".join(map(str, candidates))
                     + "); run `snakemake results/multi30k_en_de/subwords/src.model` first or pass --experiment-dir")


def prepare_fairseq_data(python: Path, exp: Path, work: Path) -> Path:
    import sentencepiece as spm

    bin_dir = work / "data-bin"
    stamp = bin_dir / "source.json"
    source = {"experiment": str(exp), **{name: os.path.getmtime(exp / name) for name in
              ("subwords/src.model", "subwords/tgt.model", "data/train.src.txt", "data/train.tgt.txt",
               "data/dev.src.txt", "data/dev.tgt.txt")}}
    if stamp.exists() and json.loads(stamp.read_text()) == source:
        return bin_dir
    text_dir = work / "text"
    text_dir.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        sp = spm.SentencePieceProcessor(model_file=str(exp / "subwords" / f"{side}.model"))
        specials = {i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)}
        # fairseq's dictionary: its own 4 specials, then every piece of the model (so the vocabularies
        # are the same size and every sequence maps one to one).
        with open(text_dir / f"dict.{side}.txt", "w", encoding="utf-8") as f:
            for i in range(sp.get_piece_size()):
                if i not in specials:
                    f.write(f"{sp.id_to_piece(i)} {sp.get_piece_size() - i}\n")
        for split, name in (("train", "train"), ("dev", "valid")):
            lines = (exp / "data" / f"{split}.{side}.txt").read_text(encoding="utf-8").splitlines()
            with open(text_dir / f"{name}.{side}", "w", encoding="utf-8") as f:
                for pieces in sp.encode(lines, out_type=str):
                    f.write(" ".join(pieces) + "\n")
    _run([str(python.parent / "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
          "--trainpref", str(text_dir / "train"), "--validpref", str(text_dir / "valid"),
          "--srcdict", str(text_dir / "dict.src.txt"), "--tgtdict", str(text_dir / "dict.tgt.txt"),
          "--destdir", str(bin_dir), "--workers", "2"], "fairseq-preprocess")
    stamp.write_text(json.dumps(source))
    return bin_dir


# --------------------------------------------------------------------------------------------
# Workers: one process per framework; commands on stdin, one JSON line of results per command on stdout


def fairseq_worker(bin_dir: str, threads: int, warmup_steps: int) -> None:
    import numpy as np
    import torch
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.logging import metrics
    from fairseq.trainer import Trainer

    torch.set_num_threads(threads)
    m = MODEL
    argv = [bin_dir, "--task", "translation", "--source-lang", "src", "--target-lang", "tgt",
            "--arch", "transformer", "--encoder-layers", str(m["enc_layers"]), "--decoder-layers", str(m["dec_layers"]),
            "--encoder-embed-dim", str(m["d_model"]), "--decoder-embed-dim", str(m["d_model"]),
            "--encoder-ffn-embed-dim", str(m["d_ff"]), "--decoder-ffn-embed-dim", str(m["d_ff"]),
            "--encoder-attention-heads", str(m["n_heads"]), "--decoder-attention-heads", str(m["n_heads"]),
            "--encoder-normalize-before", "--decoder-normalize-before", "--share-decoder-input-output-embed",
            "--dropout", str(m["dropout"]), "--attention-dropout", str(m["attn_dropout"]),
            "--activation-dropout", str(m["relu_dropout"]), "--activation-fn", "relu",
            "--max-source-positions", str(m["max_len"]), "--max-target-positions", str(m["max_len"]),
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", str(TRAIN["label_smoothing"]),
            "--optimizer", "adam", "--adam-betas", str(tuple(TRAIN["adam_betas"])),
            "--adam-eps", str(TRAIN["adam_eps"]),
            "--clip-norm", str(TRAIN["clip_norm"]), "--lr-scheduler", "inverse_sqrt", "--lr", str(PEAK_LR),
            "--warmup-updates", str(TRAIN["warmup_steps"]), "--warmup-init-lr", "0",
            "--max-tokens", str(TRAIN["max_tokens"]), "--required-batch-size-multiple", "1",
            "--seed", str(TRAIN["seed"]), "--cpu", "--num-workers", "0", "--no-progress-bar", "--log-format", "none",
            "--save-dir", str(Path(bin_dir).parent / "checkpoints")]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    cfg = convert_namespace_to_omegaconf(args)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    epoch_itr = trainer.get_train_iterator(epoch=1, load_dataset=True)
    pad = task.source_dictionary.pad()
    print(f"fairseq {sum(p.numel() for p in model.parameters()):,} parameters; source dictionary "
          f"{len(task.source_dictionary)}, target {len(task.target_dictionary)}", file=sys.stderr, flush=True)

    def batches():
        while True:
            trainer.begin_epoch(epoch_itr.epoch)
            yield from epoch_itr.next_epoch_itr(fix_batches_to_gpus=False, shuffle=True)

    stream = batches()

    def step():
        sample = next(stream)
        src = int(sample["net_input"]["src_tokens"].ne(pad).sum())
        tgt = int(sample["target"].ne(pad).sum())
        with metrics.aggregate("train_inner"):
            trainer.train_step([sample])
        return src, tgt, sample["target"].numel()

    def translate_dev(n: int) -> list[str]:
        """Greedy translations of the first n dev sentences, as space-separated pieces, in order."""
        from fairseq.sequence_generator import SequenceGenerator

        if "valid" not in task.datasets:
            task.load_dataset("valid")
        dataset = task.dataset("valid")
        ids = list(range(min(n, len(dataset))))
        generator = SequenceGenerator([trainer.model], task.target_dictionary, beam_size=1,
                                      max_len_a=DECODE["max_len_a"], max_len_b=DECODE["max_len_b"])
        out = {}
        trainer.model.eval()
        with torch.no_grad():
            for start in range(0, len(ids), 64):
                sample = dataset.collater([dataset[i] for i in ids[start:start + 64]])
                for sid, hypos in zip(sample["id"].tolist(), generator.generate([trainer.model], sample)):
                    out[sid] = task.target_dictionary.string(hypos[0]["tokens"])
        trainer.model.train()
        return [out[i] for i in ids]

    serve(step, warmup_steps, lambda: {"epoch": epoch_itr.epoch, "updates": trainer.get_num_updates(),
                                       "lr": trainer.get_lr()}, translate_dev)


def headcount_worker(exp: str, threads: int, warmup_steps: int, qkv_gain: float = 1.0,
                     precision: str = "fp32") -> None:
    sys.path.insert(0, str(REPO / "src"))
    import torch

    from headcount.data.batching import make_batches, source_tensor, target_tensors
    from headcount.data.subwords import Segmenter
    from headcount.io import read_lines
    from headcount.models.device import pick_autocast_dtype
    from headcount.models.transformer import ModelConfig, Transformer
    from headcount.training.loop import TrainConfig, parameter_groups, sequence_loss
    from headcount.training.schedules import noam_lr

    torch.set_num_threads(threads)
    exp = Path(exp)
    src_seg, tgt_seg = Segmenter(exp / "subwords" / "src.model"), Segmenter(exp / "subwords" / "tgt.model")
    src_data = src_seg.encode(read_lines(exp / "data" / "train.src.txt"))
    tgt_data = tgt_seg.encode(read_lines(exp / "data" / "train.tgt.txt"))
    cfg = TrainConfig(**{**TRAIN, "precision": precision, "device": "cpu", "threads": threads})
    autocast_dtype = pick_autocast_dtype(cfg.precision, torch.device("cpu"))  # as headcount.train.train
    torch.manual_seed(cfg.seed)
    model = Transformer(ModelConfig(src_vocab=len(src_seg), tgt_vocab=len(tgt_seg), **MODEL))
    if qkv_gain != 1.0:  # an experiment: fairseq initialises W^Q, W^K, W^V with Xavier x 1/sqrt(2)
        for name, module in model.named_modules():
            if name.endswith(("q_proj", "k_proj", "v_proj")):
                torch.nn.init.xavier_uniform_(module.weight, gain=qkv_gain)
    groups = parameter_groups(model)
    params = [p for group in groups for p in group["params"]]
    optimizer = torch.optim.Adam(groups, lr=0.0, betas=tuple(cfg.adam_betas), eps=cfg.adam_eps)
    src_lens, tgt_lens = [len(s) + 1 for s in src_data], [len(t) + 1 for t in tgt_data]
    print(f"headcount {sum(p.numel() for p in model.parameters()):,} parameters; vocabularies "
          f"{len(src_seg)}, {len(tgt_seg)}; {autocast_dtype or torch.float32}", file=sys.stderr, flush=True)
    state = {"step": 0, "epoch": 0, "batch": 0,
             "batches": make_batches(src_lens, tgt_lens, cfg.max_tokens, seed=cfg.seed * 1000)}
    pad_id = model.special.pad

    def step():  # the body of headcount.train.train's loop, without its logging and checkpoints
        if state["batch"] >= len(state["batches"]):
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
            state["batches"] = make_batches(src_lens, tgt_lens, cfg.max_tokens, seed=cfg.seed * 1000 + state["epoch"])
        batch = state["batches"][state["batch"]]
        model.train()
        src = source_tensor([src_data[i] for i in batch], model.special)
        tgt_in, tgt_out = target_tensors([tgt_data[i] for i in batch], model.special)
        lr = noam_lr(state["step"] + 1, model.d_model, cfg.warmup_steps, cfg.lr_scale)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        with torch.autocast("cpu", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss_sum, nll_sum, n_tokens = sequence_loss(model, src, tgt_in, tgt_out, cfg.label_smoothing)
        loss = loss_sum / n_tokens
        if not torch.isfinite(loss):
            raise RuntimeError(f"headcount loss {float(loss)} at step {state['step'] + 1}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm)
        optimizer.step()
        state["step"], state["batch"] = state["step"] + 1, state["batch"] + 1
        float(loss_sum.detach()), float(nll_sum)  # as train() reads them each step
        return int(src.ne(pad_id).sum()), n_tokens, tgt_out.numel()

    dev_src = src_seg.encode(read_lines(exp / "data" / "dev.src.txt"))

    def translate_dev(n: int) -> list[str]:
        """Greedy translations of the first n dev sentences, as space-separated pieces, in order."""
        from headcount.training.decode import translate

        hyps = translate(model, dev_src[:n], beam=1, max_len_a=DECODE["max_len_a"], max_len_b=DECODE["max_len_b"])
        return [" ".join(tgt_seg.sp.id_to_piece(i) for i in hyp) for hyp in hyps]

    serve(step, warmup_steps, lambda: {"epoch": state["epoch"], "updates": state["step"]}, translate_dev)


def serve(step, warmup_steps: int, status, translate_dev) -> None:
    """Warm up, say ready, then for each line {"seconds": s} or {"steps": n} on stdin train whole steps
    until s seconds have passed (or n steps are done) and answer with the counts; {"dev": n} answers
    with the greedy translations (pieces) of the first n dev sentences and the seconds they took."""
    for _ in range(warmup_steps):
        step()
    print(json.dumps({"ready": True, **status()}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if "dev" in command:
            start = time.perf_counter()
            pieces = translate_dev(command["dev"])
            print(json.dumps({"pieces": pieces, "seconds": time.perf_counter() - start}), flush=True)
            continue
        seconds, max_steps = command.get("seconds", float("inf")), command.get("steps", float("inf"))
        steps = src_tokens = tgt_tokens = padded_tgt = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and steps < max_steps:
            s, t, p = step()
            steps, src_tokens, tgt_tokens, padded_tgt = steps + 1, src_tokens + s, tgt_tokens + t, padded_tgt + p
        elapsed = time.perf_counter() - start
        print(json.dumps({"steps": steps, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens,
                          "padded_tgt": padded_tgt, "seconds": elapsed, **status()}), flush=True)


class Worker:
    def __init__(self, name: str, cmd: list[str], env: dict):
        self.name = name
        log(f"starting the {name} worker: {' '.join(cmd)}")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.ready = self._answer()
        log(f"{name} ready: {self.ready}")

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker exited (status {self.proc.wait()}); see its messages above")
        return json.loads(line)

    def train(self, command: dict) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


# --------------------------------------------------------------------------------------------
# Time to a dev BLEU


def seconds_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """Training seconds at which a (seconds, BLEU) curve, read as straight lines between its
    evaluations (starting at (0, 0)), first reaches target BLEU; None if it never does."""
    previous = (0.0, 0.0)
    for seconds, bleu in curve:
        if bleu >= target:
            (s0, b0), (s1, b1) = previous, (seconds, bleu)
            return s0 + (target - b0) / (b1 - b0) * (s1 - s0) if b1 > b0 else s1
        previous = (seconds, bleu)
    return None


def time_to_bleu(workers: dict, args, exp: Path, cpu: dict, started, versions: list[str]) -> str:
    """Train both sides --bleu-every steps at a time, alternating (ABBA), with a greedy dev BLEU
    after each stretch; report the curves and the training time each side needed to reach BLEU
    levels that both reached. Decoding time is measured but not counted as training time."""
    import sentencepiece as spm

    sys.path.insert(0, str(REPO / "src"))
    from headcount.training.evaluate import corpus_bleu

    sp = spm.SentencePieceProcessor(model_file=str(exp / "subwords" / "tgt.model"))
    refs = (exp / "data" / "dev.tgt.txt").read_text(encoding="utf-8").splitlines()[: args.dev_sentences]
    curves = {name: [] for name in workers}
    rows = []
    trained = dict.fromkeys(workers, 0.0)
    for k in range(1, args.bleu_evals + 1):
        order = ("headcount", "fairseq") if k % 2 == 0 else ("fairseq", "headcount")
        for name in order:
            before = uptime()
            result = workers[name].train({"steps": args.bleu_every})
            trained[name] += result["seconds"]
            dev = workers[name].train({"dev": args.dev_sentences})
            hyps = [sp.decode_pieces(line.split()) if line else "" for line in dev["pieces"]]
            bleu = corpus_bleu(hyps, refs)
            curves[name].append((trained[name], bleu))
            rows.append({"eval": k, "name": name, "updates": result["updates"], "train_seconds": trained[name],
                         "tokens_per_s": (result["src_tokens"] + result["tgt_tokens"]) / result["seconds"],
                         "bleu": bleu, "decode_seconds": dev["seconds"], "load": before.split("load average:")[-1]})
            log(f"eval {k} {name}: update {result['updates']}, {trained[name]:.0f} s of training, dev BLEU "
                f"{bleu:.2f} (greedy, {len(hyps)} sentences, decoded in {dev['seconds']:.1f} s)")
    command = "python benchmarks/fairseq_side_by_side.py " + " ".join(sys.argv[1:])
    lines = [
        f"fairseq side by side, time to a dev BLEU, {started:%Y-%m-%d %H:%M} UTC: `{command.strip()}`",
        f"CPU {cpu['model']}, {cpu['cpus']} CPUs, AVX2 {cpu['avx2']}, AVX512-BF16 {cpu['avx512_bf16']}; fairseq fp32, "
        f"headcount precision {args.headcount_precision}, "
        f"{args.threads} threads; fairseq env: torch {versions[0] if versions else '?'}, "
        f"fairseq {versions[1] if len(versions) > 1 else '?'}; data: {exp}",
        f"greedy dev BLEU (sacrebleu) on the first {len(refs)} dev sentences after every {args.bleu_every} "
        f"training steps (after {args.warmup_steps} untimed warm-up steps each); training seconds exclude decoding",
        "",
        "| eval | updates | fairseq s | fairseq BLEU | headcount s | headcount BLEU | fairseq / headcount s | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in range(1, args.bleu_evals + 1):
        f, h = (next(r for r in rows if r["eval"] == k and r["name"] == n) for n in ("fairseq", "headcount"))
        lines.append(f"| {k} | {h['updates']} | {f['train_seconds']:.0f} | {f['bleu']:.2f} | "
                     f"{h['train_seconds']:.0f} | {h['bleu']:.2f} | {f['train_seconds'] / h['train_seconds']:.2f} | "
                     f"{h['load'].strip()} |")
    reached = min(max(b for _, b in curve) for curve in curves.values())
    lines += ["", "| dev BLEU reached | fairseq s | headcount s | fairseq / headcount (time-to-BLEU speed-up) |",
              "|---|---|---|---|"]
    for target in [t for t in (2, 5, 10, 15, 20, 25, 30) if t <= reached]:
        f, h = seconds_to_reach(curves["fairseq"], target), seconds_to_reach(curves["headcount"], target)
        lines.append(f"| {target} | {f:.0f} | {h:.0f} | {f / h:.2f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=3, help="window pairs (fairseq, headcount)")
    ap.add_argument("--window-seconds", type=float, default=75.0, help="training seconds per window")
    ap.add_argument("--abba", action="store_true",
                    help="headcount first in every second pair (fairseq, headcount, headcount, fairseq, ...), "
                         "so a steady drift in the machine's load favours neither")
    ap.add_argument("--window-steps", type=int, default=0,
                    help="windows of this many steps instead of --window-seconds: short windows in many pairs "
                         "see the same load on both sides where the machine's load swings within a minute")
    ap.add_argument("--bleu-every", type=int, default=0,
                    help="time to a dev BLEU instead of windows: train each side this many steps between greedy "
                         "dev BLEU evaluations (alternating, ABBA), --bleu-evals times")
    ap.add_argument("--bleu-evals", type=int, default=4)
    ap.add_argument("--dev-sentences", type=int, default=1014, help="dev sentences translated for dev BLEU")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--headcount-qkv-gain", type=float, default=1.0,
                    help="re-initialise headcount's W^Q, W^K, W^V with Xavier x this gain (fairseq: 0.7071), to "
                         "test whether initialisation explains a difference in time to a dev BLEU")
    ap.add_argument("--headcount-precision", choices=["fp32", "auto", "bf16"], default="fp32",
                    help="headcount's training.precision: auto and bf16 train under bf16 autocast where the CPU has "
                         "AVX512-BF16 or AMX (fairseq's CPU path has no bf16 autocast: it stays fp32)")
    ap.add_argument("--warmup-steps", type=int, default=10, help="untimed steps each worker takes first")
    ap.add_argument("--experiment-dir", help="a prepared multi30k_en_de results directory (data/, subwords/)")
    ap.add_argument("--venv", default=str(VENV))
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--no-install", action="store_true", help="skip unless the fairseq environment already works")
    ap.add_argument("--out", default=str(HERE / "fairseq_latest.md"))
    ap.add_argument("--worker", choices=["fairseq", "headcount"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    headcount_python = REPO / ".venv" / "bin" / "python"
    if args.worker is None and headcount_python.exists() and Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        # headcount's side (and the sentencepiece encoding) runs in the project's environment
        os.execv(str(headcount_python), [str(headcount_python), str(Path(__file__).resolve()), *sys.argv[1:]])
    if args.worker == "fairseq":
        fairseq_worker(args.worker_data, args.threads, args.warmup_steps)
        return 0
    if args.worker == "headcount":
        headcount_worker(args.worker_data, args.threads, args.warmup_steps, args.headcount_qkv_gain,
                         args.headcount_precision)
        return 0

    started = datetime.datetime.now(datetime.timezone.utc)
    cpu = cpu_description()
    log(f"{started:%Y-%m-%d %H:%M} UTC; CPU {cpu['model']} ({cpu['cpus']} CPUs), AVX2 {cpu['avx2']}, "
        f"AVX512F {cpu['avx512f']}, AVX512-BF16 {cpu['avx512_bf16']}, AMX-BF16 {cpu['amx_bf16']}; fairseq fp32, "
        f"headcount precision {args.headcount_precision}, "
        f"{args.threads} threads")
    exp = find_experiment_dir(args.experiment_dir)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        python = fairseq_python(Path(args.venv), install=not args.no_install)
        bin_dir = prepare_fairseq_data(python, exp, work)
    except (Skip, subprocess.TimeoutExpired) as error:
        log(f"SKIPPED: fairseq side by side: {error}")
        return 0
    probe = "import torch, fairseq; print(torch.__version__, fairseq.__version__)"
    versions = subprocess.run([str(python), "-c", probe],
                              capture_output=True, text=True).stdout.split()

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    common = ["--threads", str(args.threads), "--warmup-steps", str(args.warmup_steps),
              "--headcount-qkv-gain", str(args.headcount_qkv_gain), "--headcount-precision", args.headcount_precision]
    here = str(Path(__file__).resolve())
    workers = {}
    try:
        workers["fairseq"] = Worker("fairseq", [str(python), here, "--worker", "fairseq", "--worker-data",
                                                str(bin_dir)] + common, env)
        workers["headcount"] = Worker("headcount", [sys.executable, here, "--worker", "headcount", "--worker-data",
                                                    str(exp)] + common, env)
        if args.bleu_every:
            text = time_to_bleu(workers, args, exp, cpu, started, versions)
            print("\n" + text)
            Path(args.out).write_text(text + "\n")
            return 0
        rows = []
        for window in range(1, args.windows + 1):
            pair = {}
            order = ("headcount", "fairseq") if args.abba and window % 2 == 0 else ("fairseq", "headcount")
            for name in order:
                before = uptime()
                result = workers[name].train({"steps": args.window_steps} if args.window_steps
                                             else {"seconds": args.window_seconds})
                after = uptime()
                result["tokens_per_s"] = (result["src_tokens"] + result["tgt_tokens"]) / result["seconds"]
                result["uptime_before"], result["uptime_after"] = before, after
                log(f"window {window} {name}: {result['tokens_per_s']:.0f} tokens/s, {result['steps']} steps in "
                    f"{result['seconds']:.1f} s ({result['steps'] / result['seconds']:.2f} steps/s, "
                    f"{(result['src_tokens'] + result['tgt_tokens']) / result['steps']:.0f} tokens/step), "
                    f"at update {result['updates']}, epoch {result['epoch']}\n  before: {before}\n  after:  {after}")
                pair[name] = result
            pair["order"] = order
            pair["ratio"] = pair["headcount"]["tokens_per_s"] / pair["fairseq"]["tokens_per_s"]
            log(f"window {window}: headcount / fairseq = {pair['ratio']:.2f}")
            rows.append(pair)
    finally:
        for worker in workers.values():
            worker.close()

    ratios = [r["ratio"] for r in rows]
    pooled = {name: sum(r[name]["src_tokens"] + r[name]["tgt_tokens"] for r in rows)
              / sum(r[name]["seconds"] for r in rows) for name in ("fairseq", "headcount")}
    command = "python benchmarks/fairseq_side_by_side.py " + " ".join(sys.argv[1:])
    lines = [
        f"fairseq side by side, {started:%Y-%m-%d %H:%M} UTC: `{command.strip()}`",
        f"CPU {cpu['model']}, {cpu['cpus']} CPUs, AVX2 {cpu['avx2']}, AVX512-BF16 {cpu['avx512_bf16']}, "
        f"AMX-BF16 {cpu['amx_bf16']}; fairseq fp32, headcount precision "
        f"{args.headcount_precision}, {args.threads} threads; {platform.python_version()}",
        f"headcount: torch {__import__('importlib.metadata').metadata.version('torch')}; fairseq env: "
        f"torch {versions[0] if versions else '?'}, fairseq {versions[1] if len(versions) > 1 else '?'}",
        f"data: {exp} (sentencepiece models and cleaned train set)",
        "",
        "| window | fairseq tokens/s | headcount tokens/s | headcount / fairseq | fairseq steps/s | headcount steps/s "
        "| tokens/step f / h | load average before / after the pair |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(rows, 1):
        f, h = r["fairseq"], r["headcount"]

        def load(text):
            return text.split("load average:")[-1].strip()
        lines.append(f"| {i} | {f['tokens_per_s']:.0f} | {h['tokens_per_s']:.0f} | {r['ratio']:.2f} | "
                     f"{f['steps'] / f['seconds']:.2f} | {h['steps'] / h['seconds']:.2f} | "
                     f"{(f['src_tokens'] + f['tgt_tokens']) / f['steps']:.0f} / "
                     f"{(h['src_tokens'] + h['tgt_tokens']) / h['steps']:.0f} | "
                     f"{load(r[r['order'][0]]['uptime_before'])} / {load(r[r['order'][1]]['uptime_after'])} |")
    lines.append("")
    lines.append(f"headcount / fairseq training tokens/s: median {statistics.median(ratios):.2f}, "
                 f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} window pairs of "
                 + (f"{args.window_steps} steps" if args.window_steps else f"{args.window_seconds:.0f} s")
                 + f"; all windows pooled: fairseq {pooled['fairseq']:.0f}, headcount {pooled['headcount']:.0f} "
                 f"tokens/s, ratio {pooled['headcount'] / pooled['fairseq']:.2f}")
    text = "\n".join(lines)
    print("\n" + text)
    Path(args.out).write_text(text + "\n\n```\n" + json.dumps(rows, indent=1) + "\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
