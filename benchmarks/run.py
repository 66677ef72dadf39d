"""headcount benchmarks: run `python benchmarks/run.py` (or `make bench`) and read the table.

Each part runs in its own process, so its peak memory (max RSS) is its own. Parts:
- matmul: the machine's measured matrix-product peak (fp32 and bf16), the MFU denominator
- train_headcount / train_torch: training throughput and peak memory of headcount's Transformer
  and of a plain torch.nn.Transformer of the same size on the same batches, each in its process
- train_pair: the two alternating in one process, for their ratio (the framework's ceiling)
- train_compiled: headcount's training under torch.compile (inductor), to see whether it pays
- train_profile: the share of a training step spent in matrix products, and the largest ops, in the
  framework comparison's configuration (dropout 0.1 everywhere, torch's masks), not the default's
- train_profile_experiment: the same for the default experiment's configuration
- train_experiment: headcount's training as the default experiment configures it (relu_dropout 0,
  fast dropout masks)
- train_masks: that configuration with torch's dropout masks against model.dropout_masks "fast",
  alternating in one process
- train_threads: the machine's cores as one training job with every thread against one single-thread
  training job per core running at once (what `resources.train_threads` chooses for the workflow),
  alternating; each job a process of its own
- train_loop_profile: a step exactly as training.loop takes it (its forward_loss, update, make_optimizer),
  per op: the matrix products' share, the milliseconds of everything else, the Adam update (--precision)
- train_loop_profile_before: the same for the step before issue 60 (for-loop Adam)
- train_fast_step: the step before issue 60 against now, alternating
- train_adam: that step with the fused Adam update against torch's for-loop one, alternating
- train_sdpa: the attention of that step through scaled_dot_product_attention against the explicit
  (need_weights) path, alternating
- lrp: LRP head relevance against one teacher-forced forward+backward on the same sentences
- lrp_trained: the same on the trained default model and the 500 sentences score_heads explains
- decode: beam-search sentences per second (the trained default model if results/ has it)
With --fairseq, also benchmarks/fairseq_side_by_side.py (fairseq-fixed against headcount on Multi30k,
alternating windows; it sets up its own fairseq environment, so it is opt-in), its table appended.
Results are printed as a Markdown table and written to benchmarks/latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# The trained default experiment that the lrp_trained, decode and pruned parts read; another run's
# results (a copy kept elsewhere, a clone's) with HEADCOUNT_BENCH_EXPERIMENT=<its results/multi30k_en_de>.
TRAINED_EXPERIMENT = Path(os.environ.get("HEADCOUNT_BENCH_EXPERIMENT", REPO / "results/multi30k_en_de"))

SIZES = {  # name: (d_model, d_ff, layers, vocab)
    "default": (256, 1024, 6, 6000),
    "transformer-base": (512, 2048, 6, 8000),
}


def synthetic_batches(vocab: int, n_batches: int, max_tokens: int = 1600, seed: int = 0):
    """Multi30k-like lengths (8-24 subwords), batched as training batches them."""
    from headcount.data.batching import make_batches, source_tensor, target_tensors
    from headcount.data.subwords import SPECIAL_IDS  # headcount's own model is what these batches feed

    rng = random.Random(seed)
    src = [[rng.randrange(4, vocab) for _ in range(rng.randint(8, 24))] for _ in range(n_batches * 120)]
    tgt = [[rng.randrange(4, vocab) for _ in range(max(1, len(s) + rng.randint(-3, 3)))] for s in src]
    batches = make_batches([len(s) + 1 for s in src], [len(t) + 1 for t in tgt], max_tokens, seed=seed)[:n_batches]
    return [(source_tensor([src[i] for i in b], SPECIAL_IDS), *target_tensors([tgt[i] for i in b], SPECIAL_IDS))
            for b in batches]


def autocast_dtype(precision: str = "auto"):
    """The dtype headcount's training autocasts to on this CPU for training.precision (None: fp32)."""
    import torch

    from headcount.models.device import pick_autocast_dtype

    return pick_autocast_dtype(precision, torch.device("cpu"))


def training_flops(d: int, ff: int, layers: int, vocab: int, batches) -> float:
    """Matrix-product FLOPs of training on the batches: 3x the forward (forward + backward)."""
    total = 0.0
    enc_params = layers * (4 * d * d + 2 * d * ff)
    dec_params = layers * (8 * d * d + 2 * d * ff)
    for src, tgt_in, tgt_out in batches:
        S, T = src.shape[1], tgt_in.shape[1]
        n_src, n_tgt = src.numel(), tgt_in.numel()
        real_tgt = int(tgt_out.ne(0).sum())
        forward = 2 * (enc_params * n_src + dec_params * n_tgt + d * vocab * real_tgt)
        forward += 2 * 2 * d * layers * (n_src * S + n_tgt * T / 2 + n_tgt * S)  # scores and weighted sums
        total += 3 * forward
    return total


def lrp_flop_floor(d: int, ff: int, layers: int, vocab: int, batches) -> float:
    """Matrix-product FLOPs that any exact implementation of the paper's per-step LRP ("ding" rule)
    must spend on the batches' sentences, taken alone (no padding, no wasted positions).

    One forward pass (with the vocabulary projection that finds each step's top-1 token), then for
    every target step t one backward pass to the activations (no weight gradients, so each matrix
    product costs what it costs forward) over only the positions its relevance reaches: in the top
    decoder layer position t alone, below it positions 1..t, in the encoder every source position (the
    cross-attention spreads it there). Attention probabilities are constants under the rule, so
    queries and keys get no backward pass; values and W^O do. The value projection of the lowest
    layers only leads to the embeddings, which no head needs, so it is not counted."""
    total = 0.0
    enc_layer, dec_layer = 2 * (4 * d * d + 2 * d * ff), 2 * (6 * d * d + 2 * d * ff)  # forward, per position
    for src, _, tgt_out in batches:
        for S, T in zip(src.ne(0).sum(dim=1).tolist(), tgt_out.ne(0).sum(dim=1).tolist()):
            forward = layers * (S * enc_layer + T * dec_layer + 2 * S * 2 * d * d)  # + cross K, V on memory
            forward += layers * 2 * 2 * d * (S * S + T * T / 2 + T * S) + 2 * d * vocab * T
            encoder = layers * S * (2 * d * d + 4 * d * ff + 2 * S * d) + (layers - 1) * S * 2 * d * d
            backward = 0.0
            for t in range(1, T + 1):
                top = 2 * d * d + 4 * d * ff + 2 * d * d + 2 * S * d + 2 * t * d + 2 * t * d * d  # FFN, cross, self
                below = t * (2 * d * d + 4 * d * ff + 2 * d * d + 2 * S * d + 2 * d * d) + t * (t + 1) * d
                memory = layers * 2 * S * d * d  # the cross-attention value projections, into the encoder
                backward += top + (layers - 1) * below - t * 2 * d * d + memory + encoder
            total += forward + backward
    return total


def matmul_flops_per_s(dtype, reps: int = 10) -> float:
    """FLOP/s of a 2048^3 matrix product in dtype, after a warm-up: the machine's matmul peak."""
    import torch

    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * 2048**3 * reps / (time.perf_counter() - start)


def part_matmul() -> dict:
    import torch

    return {f"{name}_gflops": matmul_flops_per_s(dtype) / 1e9
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}


def training_step(which: str, size: str, compiled: bool = False, relu_dropout: float = 0.1,
                  dropout_masks: str = "torch", precision: str = "auto"):
    """One optimizer step of headcount's Transformer or of a plain torch.nn.Transformer: step(batch)."""
    import torch
    import torch.nn.functional as F

    from headcount.models.transformer import ModelConfig, Transformer
    from headcount.training.loop import sequence_loss

    d, ff, layers, vocab = SIZES[size]
    dtype = autocast_dtype(precision)
    torch.manual_seed(0)
    if which == "headcount":
        # Dropout 0.1 everywhere by default, as torch.nn.Transformer applies it (the default
        # experiment's relu_dropout 0 would make headcount look faster than the framework for a
        # cheap reason); the train_experiment part measures that configuration on its own.
        model = Transformer(ModelConfig(vocab, vocab, d_model=d, n_heads=8, d_ff=ff, enc_layers=layers,
                                        dec_layers=layers, relu_dropout=relu_dropout, dropout_masks=dropout_masks))

        def loss_fn(src, tgt_in, tgt_out):
            loss, _, n = sequence_loss(model, src, tgt_in, tgt_out, 0.1)
            return loss / n
    else:
        core = torch.nn.Transformer(d, 8, layers, layers, ff, dropout=0.1, batch_first=True, norm_first=True)
        src_embed, tgt_embed = torch.nn.Embedding(vocab, d), torch.nn.Embedding(vocab, d)
        generator = torch.nn.Linear(d, vocab, bias=False)
        generator.weight = tgt_embed.weight
        model = torch.nn.ModuleList([core, src_embed, tgt_embed, generator])

        def loss_fn(src, tgt_in, tgt_out):
            T = tgt_in.shape[1]
            causal = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.bool)
            hidden = core(src_embed(src), tgt_embed(tgt_in), tgt_mask=causal, tgt_is_causal=True,
                          src_key_padding_mask=src.eq(0), memory_key_padding_mask=src.eq(0))
            real = tgt_out.ne(0)
            logits = generator(hidden[real]).float()
            return F.cross_entropy(logits, tgt_out[real], label_smoothing=0.1)

    if compiled:  # inductor; dynamic shapes, since every bucketed batch has its own lengths
        loss_fn = torch.compile(loss_fn, dynamic=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()

    def step(batch):
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(*batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step.precision = str(dtype or "fp32")
    return step


def _throughput(size: str, batches, seconds: float) -> dict:
    tokens = sum(int(s.ne(0).sum()) + int(o.ne(0).sum()) for s, _, o in batches)
    return {"tokens_per_s": tokens / seconds, "flops_per_s": training_flops(*SIZES[size], batches) / seconds}


def part_train(which: str, size: str, steps: int, profile: bool = False, relu_dropout: float = 0.1,
               dropout_masks: str = "torch") -> dict:
    """Training throughput of one model alone in its process (so the peak memory is its own)."""
    warmup = 3
    batches = synthetic_batches(SIZES[size][3], steps + warmup)
    step = training_step(which, size, relu_dropout=relu_dropout, dropout_masks=dropout_masks)
    if profile:
        return _matmul_share(step, batches)
    for batch in batches[:warmup]:
        step(batch)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        step(batch)
    return {**_throughput(size, batches[warmup:], time.perf_counter() - start), "precision": step.precision}


def alternate(size: str, steps: int, variants: dict, repeats: int = 3, precision: str = "auto") -> dict:
    """Throughput of several training setups on the same batches, alternating in one process.

    Each keeps its fastest pass over the batches, so a ratio between them is not disturbed by a
    change in the machine's load between two runs; the matmul peak (the MFU denominator) is
    measured between the passes too and its best kept, since this machine's speed drifts.
    variants: name -> step(batch).
    """
    import torch

    batches = synthetic_batches(SIZES[size][3], steps)
    best = dict.fromkeys(variants, float("inf"))
    peak = 0.0
    dtype = autocast_dtype(precision) or torch.float32
    for step in variants.values():
        step(batches[0])  # warm-up
    for _ in range(repeats):
        for name, step in variants.items():
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            best[name] = min(best[name], time.perf_counter() - start)
            peak = max(peak, matmul_flops_per_s(dtype))
    return {"peak_flops_per_s": peak, **{f"{name}_{what}": value for name, seconds in best.items()
                                         for what, value in _throughput(size, batches, seconds).items()}}


def part_train_pair(size: str, steps: int) -> dict:
    """headcount against torch.nn.Transformer, alternating: the ratio the issue's 0.95 is about."""
    return alternate(size, steps, {"headcount": training_step("headcount", size),
                                   "torch": training_step("torch", size)})


def part_train_compiled(size: str, steps: int) -> dict:
    """headcount eager against torch.compile, alternating; the first passes absorb the compiling."""
    return alternate(size, steps, {"eager": training_step("headcount", size),
                                   "compiled": training_step("headcount", size, compiled=True)}, repeats=4)


def part_train_masks(steps: int) -> dict:
    """The default experiment's config (relu_dropout 0) with torch's and with the fast dropout masks."""
    return alternate("default", steps, {masks: training_step("headcount", "default", relu_dropout=0.0,
                                                             dropout_masks=masks) for masks in ("torch", "fast")})


def part_profile_experiment(steps: int) -> dict:
    """Where a step of the default experiment's own config goes (relu_dropout 0, fast masks), at the
    precision `auto` picks on this CPU."""
    step = training_step("headcount", "default", relu_dropout=0.0, dropout_masks="fast")
    return {**_matmul_share(step, synthetic_batches(SIZES["default"][3], steps + 3)), "precision": step.precision}


def part_train_precision(steps: int) -> dict:
    """The default experiment's config in fp32 and under bf16 autocast, alternating (issue 19's fp32
    and bf16 tokens/s)."""
    return alternate("default", steps, {precision: training_step("headcount", "default", relu_dropout=0.0,
                                                                 dropout_masks="fast", precision=precision)
                                        for precision in ("fp32", "bf16")})


def loop_step(precision: str = "auto", fused: bool | None = None, seed: int = 0, explicit_attention: bool = False):
    """One step exactly as training.loop.train takes it (its forward_loss, update and make_optimizer:
    label smoothing, gradient clipping, Adam), on the default experiment's model (relu_dropout 0,
    fast dropout masks): step(batch). fused: the optimizer's choice (None: the loop's own).
    explicit_attention: every attention module takes its need_weights path (scores, softmax, dropout,
    products written out, as the analyses see them) instead of scaled_dot_product_attention."""
    import torch

    from headcount.models.transformer import ModelConfig, Transformer
    from headcount.training.loop import TrainConfig, forward_loss, make_optimizer, parameter_groups, update

    d, ff, layers, vocab = SIZES["default"]
    dtype = autocast_dtype(precision)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab, vocab, d_model=d, n_heads=8, d_ff=ff, enc_layers=layers,
                                    dec_layers=layers, relu_dropout=0.0, dropout_masks="fast", max_len=512))
    cfg, device = TrainConfig(), torch.device("cpu")
    groups = parameter_groups(model)
    params = [p for group in groups for p in group["params"]]
    optimizer = make_optimizer(groups, cfg, device, fused=fused)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    if explicit_attention:
        for module in (m for mods in model.attention_modules().values() for m in mods):
            def forced(*args, _forward=module.forward, **kwargs):
                return _forward(*args, **{**kwargs, "need_weights": True})
            module.forward = forced
    model.train()

    def step(batch):
        with torch.profiler.record_function("forward"):
            loss = forward_loss(model, batch, cfg, device, dtype)[0]
        with torch.profiler.record_function("backward_and_update"):
            update(optimizer, loss, params, cfg.clip_norm)

    step.precision = str(dtype or "fp32")
    step.model = model
    return step


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_matmul")


def part_train_loop_profile(steps: int, precision: str, before: bool = False) -> dict:
    """Where a step of training.loop.train goes on the default experiment's model, per op: the
    matrix products' share and milliseconds, the rest's milliseconds per step (what AMX leaves),
    the Adam update and the largest ops. Self CPU time, torch.profiler, after 2 warm-up steps.
    before: the step as it was before issue 60 (for-loop Adam)."""
    from torch.profiler import profile

    step = loop_step(precision, fused=False) if before else loop_step(precision)
    batches = synthetic_batches(SIZES["default"][3], steps + 2)
    for batch in batches[:2]:
        step(batch)
    start = time.perf_counter()
    for batch in batches[2:]:
        step(batch)
    seconds = (time.perf_counter() - start) / steps
    with profile() as prof:
        for batch in batches[2:]:
            step(batch)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS)
    adam = sum(e.cpu_time_total for e in events if e.key.startswith("Optimizer.step"))
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:16]
    per_step_ms = total / steps / 1000  # profiled time: the profiler adds its own overhead
    return {"precision": step.precision, "seconds_per_step": seconds, "matmul_share": matmul / total,
            "non_matmul_ms_per_step": (total - matmul) / total * seconds * 1000,
            "adam_share": adam / total, "profiled_ms_per_step": per_step_ms,
            "top_ops": {e.key: round(e.self_cpu_time_total / total, 3) for e in top}}


def part_train_adam(steps: int, precision: str) -> dict:
    """training.loop's step with the fused Adam update against torch's for-loop one, alternating."""
    return alternate("default", steps, {"loop": loop_step(precision, fused=False),
                                        "fused": loop_step(precision, fused=True)}, precision=precision)


def part_train_sdpa(steps: int, precision: str) -> dict:
    """training.loop's step with attention through scaled_dot_product_attention (need_weights=False,
    what training does) against the explicit need_weights path, alternating."""
    return alternate("default", steps, {"explicit": loop_step(precision, explicit_attention=True),
                                        "sdpa": loop_step(precision)}, precision=precision)


def part_train_fast_step(steps: int, precision: str) -> dict:
    """training.loop's step before issue 60 (for-loop Adam) against now, alternating: the changes kept."""
    return alternate("default", steps, {"before": loop_step(precision, fused=False),
                                        "after": loop_step(precision)}, precision=precision)


def part_train_worker(steps: int, seed: int) -> dict:
    """One training job of the default experiment's config, at the threads OMP_NUM_THREADS sets."""
    import torch

    step = training_step("headcount", "default", relu_dropout=0.0, dropout_masks="fast")
    batches = synthetic_batches(SIZES["default"][3], steps + 2, seed=seed)
    for batch in batches[:2]:  # warm-up
        step(batch)
    start = time.perf_counter()
    for batch in batches[2:]:
        step(batch)
    seconds = time.perf_counter() - start
    tokens = sum(int(s.ne(0).sum()) + int(o.ne(0).sum()) for s, _, o in batches[2:])
    return {"tokens": tokens, "seconds": seconds, "threads": torch.get_num_threads()}


def part_train_threads(steps: int, repeats: int = 3) -> dict:
    """Training throughput of the machine: one job using every core, against one single-thread job
    per core at once (the workflow's `resources.train_threads: 1`), alternating, best of each kept.

    A job's threads do not scale linearly (shared caches, memory bandwidth, serial element-wise
    work), so independent training jobs (seeds, the lambda grid, from-scratch runs) may finish
    sooner side by side. Throughput counts every job's tokens over the time the last one took."""

    cores = os.cpu_count() or 1

    def workers(n: int, threads: int) -> float:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        cmd = [sys.executable, __file__, "--part", "train_worker", "--steps", str(steps)]
        procs = [subprocess.Popen(cmd + ["--seed", str(i)], env=env, stdout=subprocess.PIPE, text=True)
                 for i in range(n)]
        results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        assert all(r["threads"] == threads for r in results), results
        return sum(r["tokens"] for r in results) / max(r["seconds"] for r in results)

    best_one, best_many = 0.0, 0.0
    for _ in range(repeats):
        best_one = max(best_one, workers(1, cores))
        best_many = max(best_many, workers(cores, 1))
    return {"cores": cores, "one_job_tokens_per_s": best_one, "jobs_per_core_tokens_per_s": best_many,
            "ratio": best_many / best_one}


def _matmul_share(step, batches) -> dict:
    """Share of a training step's CPU time spent in matrix products (forward and backward)."""
    from torch.profiler import profile

    for batch in batches[:3]:
        step(batch)
    with profile() as prof:
        for batch in batches[3:]:
            step(batch)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm",
                                                                     "aten::baddbmm", "aten::_mkldnn_matmul"))
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]
    return {"matmul_share": matmul / total, "top_ops": {e.key: round(e.self_cpu_time_total / total, 3) for e in top}}


def lrp_against_forward_backward(model, batches, repeats: int = 3, relevance=None) -> dict:
    """LRP head relevance ("ding") over the batches against one teacher-forced forward+backward.

    Both are warmed up, then alternated, keeping each one's fastest repeat: on a shared machine the
    minimum is the least disturbed measurement, and alternating exposes both to the same load.
    """
    from headcount.analysis.relevance import head_relevance
    from headcount.training.loop import sequence_loss

    relevance = relevance or head_relevance

    def forward_backward():
        for src, tgt_in, tgt_out in batches:
            loss, _, _ = sequence_loss(model, src, tgt_in, tgt_out, 0.0)
            loss.backward()
        model.zero_grad(set_to_none=True)

    forward_backward()
    relevance(model, batches[:1], rule="ding")
    pass_times, lrp_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        forward_backward()
        pass_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        relevance(model, batches, rule="ding")
        lrp_times.append(time.perf_counter() - start)
    pass_seconds, lrp_seconds = min(pass_times), min(lrp_times)
    steps = sum(int(o.ne(0).sum()) for _, _, o in batches)
    cfg = model.cfg
    dims = (cfg.d_model, cfg.d_ff, cfg.enc_layers, cfg.tgt_vocab)
    floor = lrp_flop_floor(*dims, batches) / training_flops(*dims, batches)
    return {"lrp_over_forward_backward": lrp_seconds / pass_seconds, "lrp_target_steps_per_s": steps / lrp_seconds,
            "lrp_seconds": lrp_seconds, "forward_backward_seconds": pass_seconds,
            "lrp_flop_floor_over_forward_backward_flops": floor}


def part_lrp(size: str) -> dict:
    """A random model of the size on synthetic Multi30k-like batches."""
    import torch

    from headcount.models.transformer import ModelConfig, Transformer

    d, ff, layers, vocab = SIZES[size]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab, vocab, d_model=d, n_heads=8, d_ff=ff, enc_layers=layers,
                                    dec_layers=layers)).eval()
    return lrp_against_forward_backward(model, synthetic_batches(vocab, 4, max_tokens=800))


def trained_lrp_inputs(sentences: int = 500, max_tokens: int = 2000):
    """The trained default model and what score_heads explains: its beam translations of the first
    `sentences` dev sentences, batched as score_heads batches them; None if results/ lacks them."""
    from headcount.analysis.importance import dev_batches
    from headcount.data.subwords import Segmenter
    from headcount.io import read_lines
    from headcount.models.loading import load_model

    base = TRAINED_EXPERIMENT
    if not (base / "baseline/translations/dev.txt").exists():
        return None
    model = load_model(base / "baseline/model.pt").eval()
    src = Segmenter(base / "subwords/src.model").encode(read_lines(base / "data/dev.src.txt")[:sentences])
    hyps = Segmenter(base / "subwords/tgt.model").encode(read_lines(base / "baseline/translations/dev.txt")[:sentences])
    return model, dev_batches(src, hyps, max_tokens, special=model.special)


def part_lrp_trained() -> dict:
    inputs = trained_lrp_inputs()
    if inputs is None:
        return {"skipped": f"no trained default model and dev translations in {TRAINED_EXPERIMENT}"}
    return lrp_against_forward_backward(*inputs, repeats=2)


def part_decode() -> dict:
    import torch

    from headcount.data.subwords import Segmenter
    from headcount.io import read_lines
    from headcount.models.loading import load_model
    from headcount.training.decode import translate

    base = TRAINED_EXPERIMENT
    if not (base / "baseline/model.pt").exists():
        return {"skipped": f"no trained default model in {TRAINED_EXPERIMENT}"}
    model = load_model(base / "baseline/model.pt").eval()
    src = Segmenter(base / "subwords/src.model").encode(read_lines(base / "data/test_2016_flickr.src.txt"))
    out = {}
    for beam in (1, 4):
        seconds = []
        for _ in range(2):  # the faster of two: the less disturbed by other load
            start = time.perf_counter()
            translate(model, src, beam=beam, max_tokens=8000, device=torch.device("cpu"))
            seconds.append(time.perf_counter() - start)
        out[f"beam{beam}_sentences_per_s"] = len(src) / min(seconds)
    return out


def part_pruned() -> dict:
    """Physical pruning: the full model against the same model with its pruned heads removed from
    Q/K/V/O; attention modules timed alone (hooks), encoder, teacher-forced decoder, beam search."""
    import glob

    import torch

    from headcount.data.batching import source_tensor, target_tensors
    from headcount.data.subwords import Segmenter
    from headcount.io import read_lines
    from headcount.models.loading import load_model
    from headcount.pruning.removal import attention_flops, remove_pruned_heads
    from headcount.training.decode import translate

    base = TRAINED_EXPERIMENT
    pruned_paths = sorted(glob.glob(str(base / "prune/all/lambda_*/model.pt")))
    if not pruned_paths:
        return {"skipped": f"no pruned default model in {TRAINED_EXPERIMENT} (run the prune stage)"}
    masked = [load_model(p).eval() for p in pruned_paths]
    masked_model = min(masked, key=lambda m: sum(int(x.sum()) for x in m.head_mask().values()))
    kept = {k: int(v.sum()) for k, v in masked_model.head_mask().items()}
    full = load_model(base / "baseline/model.pt").eval()
    physical = remove_pruned_heads(load_model(pruned_paths[masked.index(masked_model)]).eval())
    src_seg, tgt_seg = Segmenter(base / "subwords/src.model"), Segmenter(base / "subwords/tgt.model")
    src = src_seg.encode(read_lines(base / "data/test_2016_flickr.src.txt"))
    tgt = tgt_seg.encode(read_lines(base / "data/test_2016_flickr.tgt.txt"))
    batches = [(source_tensor(src[i:i + 64], full.special), *target_tensors(tgt[i:i + 64], full.special))
               for i in range(0, len(src), 64)]
    mean_src = sum(map(len, src)) / len(src) + 1
    mean_tgt = sum(map(len, tgt)) / len(tgt) + 1

    def timed(model, repeats=3):
        attention = [0.0]
        starts = {}

        def before(module, args):
            starts[id(module)] = time.perf_counter()

        def after(module, args, output):
            attention[0] += time.perf_counter() - starts[id(module)]

        handles = [m.register_forward_pre_hook(before) for mods in model.attention_modules().values() for m in mods]
        handles += [m.register_forward_hook(after) for mods in model.attention_modules().values() for m in mods]
        enc = dec = 0.0
        with torch.no_grad():
            for _ in range(repeats):
                for s, tin, _ in batches:
                    t0 = time.perf_counter()
                    memory, pad, _ = model.encode(s)
                    t1 = time.perf_counter()
                    model.decode(tin, memory, pad)
                    enc, dec = enc + t1 - t0, dec + time.perf_counter() - t1
        for h in handles:
            h.remove()
        start = time.perf_counter()
        hyps = translate(model, src, beam=4, max_tokens=8000, device=torch.device("cpu"))
        return {"attention": attention[0], "encoder": enc, "decoder": dec, "beam4": time.perf_counter() - start,
                "hyps": hyps}

    # Full and pruned alternate, twice; each keeps its faster run (the less disturbed by other load).
    runs = [(timed(full), timed(physical)) for _ in range(2)]
    keys = ("attention", "encoder", "decoder", "beam4")
    a, b = ({k: min(r[side][k] for r in runs) for k in keys} for side in (0, 1))
    same = timed(masked_model)["hyps"] == runs[0][1]["hyps"]
    flops_full = attention_flops(full, mean_src, mean_tgt)
    flops_pruned = attention_flops(physical, mean_src, mean_tgt)
    return {"model": pruned_paths[masked.index(masked_model)].split("results/")[-1], "kept": kept,
            "attention_flop_ratio": flops_full / flops_pruned, "same_translations": same,
            **{f"{k}_speedup": a[k] / b[k] for k in keys}}


PARTS = {
    "matmul": lambda a: part_matmul(),
    "train_headcount": lambda a: part_train("headcount", a.size, a.steps),
    "train_torch": lambda a: part_train("torch", a.size, a.steps),
    "train_compiled": lambda a: part_train_compiled(a.size, a.steps),
    "train_profile": lambda a: part_train("headcount", a.size, a.steps, profile=True),
    # The default experiment's model: relu_dropout 0 and fast masks (until 2026-11-28 this part kept
    # torch's masks, so its tokens/s, which issue 60 quotes, were not the default's).
    "train_experiment": lambda a: part_train("headcount", a.size, a.steps, relu_dropout=0.0, dropout_masks="fast"),
    "train_profile_experiment": lambda a: part_profile_experiment(a.steps),
    "train_masks": lambda a: part_train_masks(a.steps),
    "train_precision": lambda a: part_train_precision(a.steps),
    "train_pair": lambda a: part_train_pair(a.size, a.steps),
    "train_worker": lambda a: part_train_worker(a.steps, a.seed),
    "train_loop_profile": lambda a: part_train_loop_profile(a.steps, a.precision),
    "train_loop_profile_before": lambda a: part_train_loop_profile(a.steps, a.precision, before=True),
    "train_fast_step": lambda a: part_train_fast_step(a.steps, a.precision),
    "train_adam": lambda a: part_train_adam(a.steps, a.precision),
    "train_sdpa": lambda a: part_train_sdpa(a.steps, a.precision),
    "train_threads": lambda a: part_train_threads(a.steps),
    "lrp": lambda a: part_lrp(a.size),
    "lrp_trained": lambda a: part_lrp_trained(),
    "decode": lambda a: part_decode(),
    "pruned": lambda a: part_pruned(),
}


def _training_diagnostics(size: str, steps: int) -> list[str]:
    """Rows on where training time goes: the experiment's own config, torch.compile, the profile."""
    experiment = run_part("train_experiment", size, steps)
    compiled = run_part("train_compiled", size, steps)
    profile = run_part("train_profile", size, steps)
    own_profile = run_part("train_profile_experiment", size, steps)
    masks = run_part("train_masks", size, steps)
    threads = run_part("train_threads", size, steps)
    precision = run_part("train_precision", size, steps)
    return [
        f"| {size} | headcount training as the default experiment configures it (relu_dropout 0), tokens/s | "
        f"{experiment['tokens_per_s']:.0f} | {experiment['max_rss_mb']:.0f} |",
        f"| {size} | headcount training under torch.compile / eager, alternating, once compiled | "
        f"{compiled['compiled_tokens_per_s'] / compiled['eager_tokens_per_s']:.2f} | {compiled['max_rss_mb']:.0f} |",
        f"| {size} | share of a training step in matrix products | {profile['matmul_share']:.2f} | |",
        f"| {size} | share of a training step in torch's dropout masks (aten::bernoulli_), dropout 0.1 everywhere "
        f"and torch's masks (the framework comparison's configuration) | "
        f"{profile['top_ops'].get('aten::bernoulli_', 0.0):.2f} | |",
        f"| {size} | the same share in the default experiment's configuration (relu_dropout 0, fast masks: "
        f"attention dropout alone draws with bernoulli_) | "
        f"{own_profile['top_ops'].get('aten::bernoulli_', 0.0):.2f} | |",
        f"| {size} | the default experiment's config, torch's / fast dropout masks, tokens/s | "
        f"{masks['torch_tokens_per_s']:.0f} / {masks['fast_tokens_per_s']:.0f} | {masks['max_rss_mb']:.0f} |",
        f"| {size} | ... fast / torch's masks | {masks['fast_tokens_per_s'] / masks['torch_tokens_per_s']:.2f} | |",
        f"| {size} | ... MFU with torch's / fast masks (of the matmul peak measured between the passes) | "
        f"{masks['torch_flops_per_s'] / masks['peak_flops_per_s']:.2f} / "
        f"{masks['fast_flops_per_s'] / masks['peak_flops_per_s']:.2f} | |",
        f"| {size} | training tokens/s of the machine, one job on {threads['cores']} threads / {threads['cores']} "
        f"single-thread jobs at once | {threads['one_job_tokens_per_s']:.0f} / "
        f"{threads['jobs_per_core_tokens_per_s']:.0f} | |",
        f"| {size} | ... single-thread jobs at once / one job (`resources.train_threads: 1` against 0) | "
        f"{threads['ratio']:.2f} | |",
        f"| {size} | the default experiment's config in fp32 / under bf16 autocast, alternating, tokens/s | "
        f"{precision['fp32_tokens_per_s']:.0f} / {precision['bf16_tokens_per_s']:.0f} | "
        f"{precision['max_rss_mb']:.0f} |",
        f"| {size} | ... bf16 / fp32 | {precision['bf16_tokens_per_s'] / precision['fp32_tokens_per_s']:.2f} | |",
    ]


def run_part(name: str, size: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--part", name, "--size", size, "--steps", str(steps)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=sorted(PARTS))
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--seed", type=int, default=0, help="train_worker: the synthetic batches' seed")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="train_loop_profile, train_adam, ...: the autocast precision (auto: the loop's choice)")
    parser.add_argument("--fairseq", action="store_true",
                        help="also run fairseq_side_by_side.py (about 15 minutes; installs fairseq-fixed once)")
    args = parser.parse_args()
    if args.part:  # a child process: one part, one JSON line
        result = PARTS[args.part](args)
        result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return

    import torch

    lines = [f"machine: {platform.machine()}, {platform.processor() or 'cpu'}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}", ""]
    peak = run_part("matmul", "default", 0)
    lines += [f"matmul peak (2048^3): fp32 {peak['fp32_gflops']:.0f} GFLOP/s, bf16 {peak['bf16_gflops']:.0f} GFLOP/s",
              "", "| model | what | value | peak memory (MB) |", "|---|---|---|---|"]
    for size in args.sizes:
        ours, ref = run_part("train_headcount", size, args.steps), run_part("train_torch", size, args.steps)
        pair = run_part("train_pair", size, args.steps)
        lines += [
            f"| {size} | headcount training, tokens/s ({ours['precision']}) | {ours['tokens_per_s']:.0f} | "
            f"{ours['max_rss_mb']:.0f} |",
            f"| {size} | torch.nn.Transformer training, tokens/s | {ref['tokens_per_s']:.0f} | "
            f"{ref['max_rss_mb']:.0f} |",
            f"| {size} | headcount / torch.nn.Transformer, alternating in one process | "
            f"{pair['headcount_tokens_per_s'] / pair['torch_tokens_per_s']:.2f} | |",
            f"| {size} | headcount MFU (of the matmul peak measured between its passes) | "
            f"{pair['headcount_flops_per_s'] / pair['peak_flops_per_s']:.2f} | |",
        ]
        if size == "default":
            lines += _training_diagnostics(size, args.steps)
        lrp = run_part("lrp", size, 0)
        lines += [f"| {size} | LRP time / one forward+backward | {lrp['lrp_over_forward_backward']:.1f} | "
                  f"{lrp['max_rss_mb']:.0f} |",
                  f"| {size} | LRP target steps/s | {lrp['lrp_target_steps_per_s']:.0f} | |"]
    trained = run_part("lrp_trained", "default", 0)
    if "skipped" in trained:
        lines.append(f"| default (trained) | LRP | skipped: {trained['skipped']} | |")
    else:
        lines.append(f"| default (trained) | LRP time / one forward+backward, 500 dev sentences | "
                     f"{trained['lrp_over_forward_backward']:.1f} | {trained['max_rss_mb']:.0f} |")
    decode = run_part("decode", "default", 0)
    if "skipped" in decode:
        lines.append(f"| default (trained) | decoding | skipped: {decode['skipped']} | |")
    else:
        for beam in (1, 4):
            lines.append(f"| default (trained) | beam {beam}, test_2016_flickr sentences/s | "
                         f"{decode[f'beam{beam}_sentences_per_s']:.1f} | {decode['max_rss_mb']:.0f} |")
    pruned = run_part("pruned", "default", 0)
    if "skipped" in pruned:
        lines.append(f"| default (pruned) | physical pruning | skipped: {pruned['skipped']} | |")
    else:
        lines += [f"| {pruned['model']} | heads kept (enc-self/dec-self/dec-enc) | "
                  f"{'/'.join(str(v) for v in pruned['kept'].values())} | |",
                  f"| {pruned['model']} | attention FLOPs, full / pruned | "
                  f"{pruned['attention_flop_ratio']:.2f} | |",
                  f"| {pruned['model']} | same beam-4 translations as the masked model | "
                  f"{pruned['same_translations']} | |"]
        for part in ("attention", "encoder", "decoder", "beam4"):
            lines.append(f"| {pruned['model']} | {part} time, full / pruned | {pruned[f'{part}_speedup']:.2f} | |")
        lines.append(f"| {pruned['model']} | attention speedup / attention FLOP ratio | "
                     f"{pruned['attention_speedup'] / pruned['attention_flop_ratio']:.2f} | |")
    if args.fairseq:  # its own processes and environment; it prints why where it skips
        side_by_side = REPO / "benchmarks" / "fairseq_latest.md"
        side_by_side.unlink(missing_ok=True)
        subprocess.run([sys.executable, str(REPO / "benchmarks" / "fairseq_side_by_side.py")], check=True)
        lines += ["", side_by_side.read_text().split("\n```")[0] if side_by_side.exists()
                  else "fairseq side by side: skipped (see its output above)"]
    text = "\n".join(lines) + "\n"
    print(text)
    (REPO / "benchmarks/latest.md").write_text(text)


if __name__ == "__main__":
    main()
