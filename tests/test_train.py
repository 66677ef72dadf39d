"""Training loop: schedule, learning, checkpoints, resumption after a kill, numerical faults."""

import json
import math
import os
import signal

import pytest
import torch
from conftest import tiny_config, toy_corpus

from headcount.io import CheckpointError, HeadcountError
from headcount.models.checkpoint import load_checkpoint
from headcount.models.transformer import Transformer
from headcount.training.loop import Corpus, DevSet, TrainConfig, TrainingStopped, evaluate_loss, sequence_loss, train
from headcount.training.schedules import noam_lr

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights


def test_noam_schedule_rises_linearly_then_decays_as_inverse_sqrt():
    d, warmup, scale = 512, 4000, 2.0
    peak = noam_lr(warmup, d, warmup, scale)
    assert peak == pytest.approx(scale * d**-0.5 * warmup**-0.5)
    assert noam_lr(warmup // 2, d, warmup, scale) == pytest.approx(peak / 2)
    assert noam_lr(4 * warmup, d, warmup, scale) == pytest.approx(peak / 2)
    assert max(noam_lr(s, d, warmup, scale) for s in range(1, 20000, 7)) <= peak + 1e-12


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_sequence_loss_equals_torch_cross_entropy_bitwise(label_smoothing):
    """One shared log-softmax must give F.cross_entropy's loss, NLL and gradients to the last bit."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab=40, tgt_vocab=50)).eval()
    src, tgt_out = torch.randint(4, 40, (5, 7)), torch.randint(4, 50, (5, 6))
    src[0, 5:], tgt_out[1, 3:] = 0, 0  # padding is left out of both
    tgt_in = torch.cat([torch.full((5, 1), 2), tgt_out[:, :-1]], dim=1)
    loss, nll, n = sequence_loss(model, src, tgt_in, tgt_out, label_smoothing)
    ours = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    memory, src_pad, _ = model.encode(src)
    hidden, _, _ = model.decode(tgt_in, memory, src_pad)
    real = tgt_out.ne(0)
    logits = model.generator(hidden[real]).float()
    reference = torch.nn.functional.cross_entropy(logits, tgt_out[real], label_smoothing=label_smoothing,
                                                  reduction="sum")
    reference_nll = torch.nn.functional.cross_entropy(logits, tgt_out[real], reduction="sum")
    theirs = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert n == int(real.sum()) == 5 * 6 - 3
    assert torch.equal(loss, reference) and torch.equal(nll, reference_nll)
    assert (loss != nll) == (label_smoothing > 0)  # the smoothing is applied, and only when asked
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ours, theirs))


def word_ids(lines, vocab):
    return [[vocab.setdefault(w, len(vocab)) for w in line.split()] for line in lines]


@pytest.fixture
def toy_data():
    return make_toy_data()


def make_toy_data():
    src_vocab, tgt_vocab = {f"<{i}>": i for i in range(4)}, {f"<{i}>": i for i in range(4)}
    src, tgt = toy_corpus(300, seed=1)
    dev_src, dev_tgt = toy_corpus(30, seed=2)
    data = Corpus(word_ids(src, src_vocab), word_ids(tgt, tgt_vocab))
    dev = DevSet(word_ids(dev_src, src_vocab), word_ids(dev_tgt, tgt_vocab), dev_tgt)
    return data, dev, len(src_vocab) + 8, len(tgt_vocab) + 8


def fresh_model(sizes, seed=0, dropout_masks="torch"):
    torch.manual_seed(seed)
    return Transformer(tiny_config(src_vocab=sizes[0], tgt_vocab=sizes[1], dropout=0.1, attn_dropout=0.1,
                                   relu_dropout=0.1, dropout_masks=dropout_masks))


def settings(**overrides):
    base = dict(max_tokens=120, max_steps=30, warmup_steps=10, lr_scale=2.0, log_interval=1, eval_interval=10,
                checkpoint_interval=5, select="last", seed=3, precision="fp32", device="cpu")
    base.update(overrides)
    return TrainConfig(**base)


def quiet(message):
    pass


@pytest.mark.parametrize("dropout_masks", ["torch", "fast"])
def test_training_lowers_the_dev_loss(toy_data, tmp_path, dropout_masks):
    data, dev, *sizes = toy_data
    model = fresh_model(sizes, dropout_masks=dropout_masks)
    before = evaluate_loss(model, Corpus(dev.src, dev.tgt), 200, torch.device("cpu"), None)
    summary = train(model, settings(max_steps=80), data, dev, tmp_path, log=quiet)
    after = evaluate_loss(model, Corpus(dev.src, dev.tgt), 200, torch.device("cpu"), None)
    assert summary["steps"] == 80
    assert after < before - 1.0, (before, after)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_loss" in r] == [10, 20, 30, 40, 50, 60, 70, 80]
    assert all(r["tokens_per_s"] > 0 for r in records if "train_loss" in r)


class Killed(Exception):
    pass


@pytest.mark.parametrize("dropout_masks", ["torch", "fast"])
def test_a_killed_run_resumes_to_the_same_weights(toy_data, tmp_path, dropout_masks):
    data, dev, *sizes = toy_data
    clean = fresh_model(sizes, dropout_masks=dropout_masks)
    clean_summary = train(clean, settings(), data, dev, tmp_path / "clean", log=quiet)
    assert clean_summary["attempts"] == 1
    assert clean_summary["train_seconds_all"] == pytest.approx(clean_summary["train_seconds"], abs=0.05)

    def kill_at_step_17(message):
        if message.startswith("step 17/"):
            raise Killed

    interrupted = fresh_model(sizes, dropout_masks=dropout_masks)
    with pytest.raises(Killed):
        train(interrupted, settings(), data, dev, tmp_path / "killed", log=kill_at_step_17)
    first = load_checkpoint(tmp_path / "killed/checkpoint.pt")
    assert first["step"] == 15 and first["time_so_far"]["attempts"] == 1 and first["time_so_far"]["seconds"] > 0
    resumed_from = []
    # A different init: the checkpoint must override it.
    resumed = fresh_model(sizes, seed=99, dropout_masks=dropout_masks)
    summary = train(resumed, settings(), data, dev, tmp_path / "killed", log=resumed_from.append)
    # The time of both attempts, up to the checkpoint the second resumed from.
    assert summary["attempts"] == 2
    assert summary["train_seconds_all"] == pytest.approx(first["time_so_far"]["seconds"] + summary["train_seconds"],
                                                         abs=0.05)
    assert summary["train_cpu_seconds_all"] > first["time_so_far"]["cpu_seconds"] > 0
    assert any("resuming from" in m and "step 15" in m for m in resumed_from)
    for (name, a), b in zip(clean.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name  # bitwise, on CPU with the same seed
    lines = (tmp_path / "killed/metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if "train_loss" in line]
    assert steps == list(range(1, 31))  # records after the checkpoint were dropped, then redone


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a lent GPU; CI has none)")
def test_a_killed_run_resumes_on_cuda(toy_data, tmp_path):
    # On a GPU the checkpoint is loaded onto the device, random-generator states too; torch takes
    # those back only as CPU byte tensors (this failed on an H200 before the loop moved them back).
    data, dev, *sizes = toy_data

    def kill_at_step_17(message):
        if message.startswith("step 17/"):
            raise Killed

    with pytest.raises(Killed):
        train(fresh_model(sizes).cuda(), settings(device="cuda"), data, dev, tmp_path, log=kill_at_step_17)
    resumed_from = []
    summary = train(fresh_model(sizes).cuda(), settings(device="cuda"), data, dev, tmp_path, log=resumed_from.append)
    assert summary["steps"] == 30 and summary["attempts"] == 2
    assert any("resuming from" in m and "step 15" in m for m in resumed_from)


def test_changed_settings_start_afresh(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    train(fresh_model(sizes), settings(max_steps=10), data, dev, tmp_path, log=quiet)
    messages = []
    train(fresh_model(sizes), settings(max_steps=10, lr_scale=1.0), data, dev, tmp_path, log=messages.append)
    assert any("another configuration" in m for m in messages)


def test_corrupted_checkpoint_is_named(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    (tmp_path / "checkpoint.pt").write_bytes(b"PK\x03\x04 not really a checkpoint")
    with pytest.raises(CheckpointError, match=r"checkpoint.pt: cannot be read as a checkpoint.*Delete it"):
        train(fresh_model(sizes), settings(), data, dev, tmp_path, log=quiet)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    calls = {"n": 0}

    def poisoned(model):
        calls["n"] += 1
        return torch.tensor(math.nan if calls["n"] == 8 else 0.0)

    with pytest.raises(HeadcountError, match=r"loss became nan at step 8.*step 5\) is kept"):
        train(fresh_model(sizes), settings(), data, dev, tmp_path, extra_loss=poisoned, log=quiet)
    state = load_checkpoint(tmp_path / "checkpoint.pt")
    assert state["step"] == 5
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_best_dev_bleu_selection_loads_the_best_weights(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    scores = iter([5.0, 9.0, 7.0])  # dev "BLEU" at steps 10, 20, 30
    model = fresh_model(sizes)
    summary = train(model, settings(select="best_dev_bleu"), data, dev, tmp_path,
                    dev_bleu=lambda m, d: next(scores), log=quiet)
    assert summary["selected_step"] == 20
    best = load_checkpoint(tmp_path / "best.pt")
    for name, value in model.state_dict().items():
        assert torch.equal(value, best["model"][name])


def test_a_finished_run_can_be_extended_without_starting_over(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    straight = fresh_model(sizes)
    train(straight, settings(max_steps=20), data, dev, tmp_path / "straight", log=quiet)
    extended = fresh_model(sizes)
    train(extended, settings(max_steps=10), data, dev, tmp_path / "extended", log=quiet)
    messages = []
    train(extended, settings(max_steps=20, eval_interval=7), data, dev, tmp_path / "extended", log=messages.append)
    assert any("resuming from" in m and "at step 10" in m for m in messages)
    for (name, a), b in zip(straight.state_dict().items(), extended.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_run_resumed_on_a_machine_with_bf16_keeps_the_precision_it_began_in(toy_data, tmp_path, monkeypatch):
    # precision auto picks bf16 only where the CPU has it: the first attempt runs on a machine without,
    # the second on one with. The resumed run must equal a run that never left the first machine.
    data, dev, *sizes = toy_data
    has_bf16 = {"now": False}
    monkeypatch.setattr("headcount.models.device.cpu_has_bf16", lambda: has_bf16["now"])
    straight = fresh_model(sizes)
    summary = train(straight, settings(max_steps=20, precision="auto"), data, dev, tmp_path / "straight", log=quiet)
    assert summary["precision"] == "fp32"
    moved = fresh_model(sizes)
    train(moved, settings(max_steps=10, precision="auto"), data, dev, tmp_path / "moved", log=quiet)
    has_bf16["now"] = True
    messages = []
    summary = train(moved, settings(max_steps=20, precision="auto"), data, dev, tmp_path / "moved",
                    log=messages.append)
    assert summary["precision"] == "fp32"
    assert any("began in fp32" in m for m in messages)
    for (name, a), b in zip(straight.state_dict().items(), moved.state_dict().values()):
        assert torch.equal(a, b), name
    # A fresh run on the second machine does take bf16 (so the check above could see a switch).
    assert train(fresh_model(sizes), settings(max_steps=2, precision="auto"), data, dev, tmp_path / "new",
                 log=quiet)["precision"] == "bf16"


@pytest.mark.parametrize("clip_norm", [0.05, 1e9])
def test_gradients_are_clipped_to_the_configured_norm(toy_data, tmp_path, clip_norm):
    """The gradient norm the optimizer sees, at every step, is at most `clip_norm` (with no
    effective limit the same steps exceed 0.05, so the check can fail)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    data, dev, *sizes = toy_data
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    handle = register_optimizer_step_pre_hook(record)
    try:
        train(fresh_model(sizes), settings(max_steps=5, clip_norm=clip_norm), data, dev, tmp_path, log=quiet)
    finally:
        handle.remove()
    assert len(norms) == 5
    if clip_norm < 1:
        assert max(norms) <= clip_norm * (1 + 1e-4)
    else:
        assert max(norms) > 0.05


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_the_current_step_and_the_run_resumes_to_the_same_weights(toy_data, tmp_path, signum):
    data, dev, *sizes = toy_data
    clean = fresh_model(sizes)
    train(clean, settings(), data, dev, tmp_path / "clean", log=quiet)

    def signal_at_step_17(message):
        if message.startswith("step 17/"):
            os.kill(os.getpid(), signum)  # a real signal, as scancel or Ctrl-C sends it

    handler_before = signal.getsignal(signum)
    stopped = fresh_model(sizes)
    with pytest.raises(TrainingStopped, match=f"{signal.Signals(signum).name} at step 17"):
        train(stopped, settings(), data, dev, tmp_path / "stopped", log=signal_at_step_17)
    assert load_checkpoint(tmp_path / "stopped/checkpoint.pt")["step"] == 17  # not the step-15 checkpoint
    assert signal.getsignal(signum) == handler_before  # the run's handlers are gone
    resumed = fresh_model(sizes, seed=99)
    train(resumed, settings(), data, dev, tmp_path / "stopped", log=quiet)
    for (name, a), b in zip(clean.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


# Two signals: e.g. a terminal's Ctrl-C reaches the job and Snakemake forwards another one.
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGTERM, signal.SIGINT]])
def test_a_signal_during_evaluation_stops_it_and_the_resumed_run_evaluates_that_step(toy_data, tmp_path, signals):
    data, dev, *sizes = toy_data
    clean = fresh_model(sizes)
    clean_scores = []
    train(clean, settings(), data, dev, tmp_path / "clean", log=quiet,
          dev_bleu=lambda model, dev: clean_scores.append(1.0) or float(len(clean_scores)))

    calls = []

    def bleu_interrupted_at_step_20(model, dev):
        calls.append(1)
        if len(calls) == 2:  # the evaluation at step 20
            for signum in signals:
                os.kill(os.getpid(), signum)
        return float(len(calls))

    stopped = fresh_model(sizes)
    with pytest.raises(TrainingStopped, match="at step 20"):
        train(stopped, settings(), data, dev, tmp_path / "stopped", log=quiet, dev_bleu=bleu_interrupted_at_step_20)
    state = load_checkpoint(tmp_path / "stopped/checkpoint.pt")
    assert state["step"] == 20 and state["eval_pending"]
    records = [json.loads(line) for line in (tmp_path / "stopped/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_loss" in r] == [10]  # the interrupted evaluation wrote nothing
    resumed = fresh_model(sizes, seed=99)
    train(resumed, settings(), data, dev, tmp_path / "stopped", log=quiet, dev_bleu=lambda model, dev: 0.0)
    records = [json.loads(line) for line in (tmp_path / "stopped/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "dev_loss" in r] == [10, 20, 30]
    for (name, a), b in zip(clean.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_checkpoint_is_written_when_the_wall_time_interval_has_passed(toy_data, tmp_path, monkeypatch):
    data, dev, *sizes = toy_data
    clock = iter(range(0, 10_000, 7))  # each reading of the clock is 7 s later
    monkeypatch.setattr("headcount.training.loop.time.monotonic", lambda: next(clock))
    steps = []
    monkeypatch.setattr("headcount.training.loop.save_checkpoint",
                        lambda path, state: steps.append(state["step"]) if "step" in state else None)
    train(fresh_model(sizes), settings(max_steps=12, checkpoint_interval=100, eval_interval=100,
                                       checkpoint_minutes=0.25), data, dev, tmp_path, log=quiet)
    # 15 s of wall time pass every ~2 steps (one clock reading per step, one per checkpoint)
    assert steps[-1] == 12 and len(steps) >= 4 and steps[:-1] == sorted(set(steps[:-1])), steps


def test_snapshots_are_kept_every_interval_and_listed(toy_data, tmp_path):
    data, dev, *sizes = toy_data
    summary = train(fresh_model(sizes), settings(max_steps=25, snapshot_interval=10), data, dev, tmp_path,
                    log=quiet)
    assert [s["step"] for s in summary["snapshots"]] == [10, 20, 25]
    for snapshot in summary["snapshots"]:
        state = load_checkpoint(snapshot["path"])
        assert state["step"] == snapshot["step"] and "optimizer" not in state


def test_the_output_is_the_mean_of_the_snapshots_ending_at_the_selected_step(toy_data, tmp_path):
    """training.average_snapshots: the weights of model.pt against the mean of the snapshot files,
    computed here parameter by parameter; the window ends at the selected step, not the last."""
    data, dev, *sizes = toy_data
    scores = iter([5.0, 6.0, 9.0, 7.0])  # dev "BLEU" at steps 10, 20, 30, 40: step 30 is selected
    model = fresh_model(sizes)
    summary = train(model, settings(max_steps=40, snapshot_interval=10, select="best_dev_bleu", average_snapshots=2),
                    data, dev, tmp_path, dev_bleu=lambda m, d: next(scores), log=quiet)
    assert summary["selected_step"] == 30 and summary["averaged_steps"] == [20, 30]
    snaps = [load_checkpoint(tmp_path / "snapshots" / f"step_{n}.pt")["model"] for n in (20, 30)]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, (snaps[0][name] + snaps[1][name]) / 2, rtol=0, atol=1e-7, msg=name)
    assert not torch.equal(snaps[0]["generator.weight"], snaps[1]["generator.weight"])  # a mean, not a copy


def test_averaging_needs_a_snapshot_at_the_selected_step_and_enough_before_it():
    from headcount.training.averaging import average_state_dicts, averaging_window

    assert averaging_window([500, 1000, 1500, 2000], 1500, 3) == [500, 1000, 1500]
    for available, selected in (([500, 1000, 2000], 1500), ([1000, 1500], 1500)):
        with pytest.raises(HeadcountError, match="training.average_snapshots is 3"):
            averaging_window(available, selected, 3)
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor([4])}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor([4])}
    out = average_state_dicts([a, b])
    assert out["w"].tolist() == [2.0, 4.0] and out["n"].tolist() == [4] and out["n"].dtype == torch.int64
    with pytest.raises(ValueError, match="n: a non-float tensor differs"):
        average_state_dicts([a, {**b, "n": torch.tensor([5])}])


# --------------------------------------------------------------------------------------------
# Untrusted checkpoints


class _Payload:
    """What a malicious checkpoint carries: unpickling it calls Path.touch(marker)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        from pathlib import Path

        return Path.touch, (Path(self.marker),)


def test_a_checkpoint_carrying_a_pickled_payload_is_refused_and_runs_nothing(toy_data, tmp_path):
    import shutil

    from headcount.models.loading import load_model

    data, dev, *sizes = toy_data
    model = fresh_model(sizes)
    marker = tmp_path / "payload_ran"
    evil = tmp_path / "run/checkpoint.pt"
    evil.parent.mkdir()
    torch.save({"model": model.state_dict(), "model_config": model.cfg.to_dict(), "step": 3,
                "extra": _Payload(marker)}, evil)
    # The payload is real: torch's full unpickler runs it.
    shutil.copy(evil, tmp_path / "copy.pt")
    torch.load(tmp_path / "copy.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()

    refused = (r"run/checkpoint.pt: refused, not loaded: it holds a pickled Python object \(.+\), and loading it "
               r"would run code")
    with pytest.raises(CheckpointError, match=refused):
        load_checkpoint(evil)
    with pytest.raises(CheckpointError, match=refused):
        load_model(evil)
    with pytest.raises(CheckpointError, match=refused):  # a run never resumes from it either
        train(fresh_model(sizes), settings(), data, dev, tmp_path / "run", log=quiet)
    assert not marker.exists()


def test_every_checkpoint_a_run_writes_loads_with_the_weights_only_loader(toy_data, tmp_path):
    """checkpoint.pt (optimizer, RNG state, tuples), best.pt and snapshots hold nothing the
    weights-only unpickler refuses; model.pt files are covered by the stage tests, which load them."""
    data, dev, *sizes = toy_data
    train(fresh_model(sizes), settings(max_steps=12, snapshot_interval=10, select="best_dev_bleu"), data, dev,
          tmp_path, log=quiet, dev_bleu=lambda model, dev: 1.0)
    files = sorted(tmp_path.rglob("*.pt"))
    assert {f.name for f in files} == {"checkpoint.pt", "best.pt", "step_10.pt", "step_12.pt"}
    for path in files:
        assert "model" in load_checkpoint(path)


def test_checkpoints_are_read_and_written_through_one_module():
    """Every torch.load in the library and the scripts is load_checkpoint's (weights only), and
    every torch.save is save_checkpoint's (atomic): every model family goes through models.checkpoint."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]

    def calls(pattern):
        return [(str(path.relative_to(repo)), line.strip())
                for folder in ("src", "workflow/scripts")
                for path in sorted((repo / folder).rglob("*.py"))
                for line in path.read_text(encoding="utf-8").splitlines()
                if re.search(pattern, line) and not re.match(r"\s*f?[\"']", line)]  # not a message's text

    loads = calls(r"torch\.load\(|\bload\(.*weights_only")
    assert len(loads) == 1 and loads[0][0] == "src/headcount/models/checkpoint.py", loads
    assert "weights_only=True" in loads[0][1], loads
    saves = calls(r"torch\.save\(")
    assert [path for path, _ in saves] == ["src/headcount/models/checkpoint.py"], saves


# A training job stopped by a real signal in its own process, through the workflow's job wrapper:
# tests/test_workflow.py's SIGTERM, SIGINT and SIGKILL test.


def test_token_corpus_holds_the_sentences_exactly_and_batches_alike(toy_data):
    import numpy as np

    from headcount.data.batching import make_batches
    from headcount.data.token_corpus import TokenCorpus, sequence_lengths

    data, *_ = toy_data
    seqs = data.src + [[], [70000, 2**31 - 1]]  # an empty sentence, ids beyond int16
    compact = TokenCorpus.from_sequences(iter(seqs), chunk=7)
    assert len(compact) == len(seqs) and list(compact) == seqs
    assert compact[-1] == seqs[-1] and compact[3:9] == seqs[3:9]
    assert [compact[i] for i in (5, 0, -1)] == [seqs[5], seqs[0], seqs[-1]]
    assert sequence_lengths(compact) == [len(s) for s in seqs] == compact.lengths().tolist()
    assert compact.tokens.dtype == np.int32 and compact.nbytes == 4 * sum(map(len, seqs)) + 8 * (len(seqs) + 1)
    with pytest.raises(IndexError):
        compact[len(seqs)]
    lines = [" ".join(map(str, s)) for s in seqs]
    encoded = TokenCorpus.encode_lines(lambda batch: [[int(w) for w in line.split()] for line in batch], lines,
                                       chunk=5)
    assert encoded == compact
    lens = [n + 1 for n in sequence_lengths(compact)]
    assert make_batches(lens, lens, 60, seed=4) == make_batches([len(s) + 1 for s in seqs],
                                                                [len(s) + 1 for s in seqs], 60, seed=4)


def test_training_on_a_token_corpus_takes_the_steps_training_on_lists_takes(toy_data, tmp_path):
    """The same batches, losses and weights whether the corpus is lists or a TokenCorpus."""
    from headcount.data.token_corpus import TokenCorpus

    data, dev, *sizes = toy_data
    compact = Corpus(TokenCorpus.from_sequences(data.src), TokenCorpus.from_sequences(data.tgt))
    runs = []
    for corpus, name in ((data, "lists"), (compact, "compact")):
        model = fresh_model(sizes)
        train(model, settings(max_steps=4, eval_interval=100, checkpoint_interval=100), corpus, dev,
              tmp_path / name, log=quiet)
        records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs.append(([(r["step"], r["train_loss"], r["train_nll"]) for r in records if "train_loss" in r],
                     model.state_dict()))
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == 4
    assert all(torch.equal(runs[0][1][k], runs[1][1][k]) for k in runs[0][1])


def no_dropout_model(sizes):
    torch.manual_seed(0)
    return Transformer(tiny_config(src_vocab=sizes[0], tgt_vocab=sizes[1]))


@pytest.mark.parametrize("compile_step,steps", [("buckets", 12), ("aot_eager", 3)])
def test_a_padded_step_learns_what_the_eager_step_learns(toy_data, tmp_path, compile_step, steps):
    """training.compile_step pads each batch to its bucket (and traces it, as the cudagraphs backend
    does on a GPU); the padding is masked out, so without dropout the weights after each step equal
    the eager loop's, and the logged losses too."""
    data, dev, *sizes = toy_data
    eager, padded = no_dropout_model(sizes), no_dropout_model(sizes)
    train(eager, settings(max_steps=steps), data, dev, tmp_path / "eager", log=quiet)
    train(padded, settings(max_steps=steps, compile_step=compile_step), data, dev, tmp_path / "padded", log=quiet)
    for (name, a), b in zip(eager.state_dict().items(), padded.state_dict().values()):
        if not name.endswith("k_proj.bias"):  # a zero gradient: Adam normalises its rounding noise
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=name)
    logged = [[json.loads(line)["train_loss"] for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()
               if "train_loss" in line] for run in ("eager", "padded")]
    assert len(logged[0]) == steps
    torch.testing.assert_close(torch.tensor(logged[1]), torch.tensor(logged[0]), rtol=1e-5, atol=1e-6)


def test_a_run_resumes_across_a_change_of_compile_step(toy_data, tmp_path):
    """compile_step changes the shapes a step runs on, not what it learns: a checkpoint written by
    the eager step (or by a version without the key) resumes under buckets."""
    data, dev, *sizes = toy_data
    train(no_dropout_model(sizes), settings(max_steps=6), data, dev, tmp_path, log=quiet)
    messages = []
    train(no_dropout_model(sizes), settings(max_steps=8, compile_step="buckets"), data, dev, tmp_path,
          log=messages.append)
    assert any("resuming from" in m and "at step 6" in m for m in messages), messages


@pytest.mark.parametrize("compile_step,says", [("cudagraphs", "CUDA graphs"), ("xla", "not one of")])
def test_a_compile_step_that_cannot_run_is_refused_by_its_key(toy_data, tmp_path, compile_step, says):
    data, dev, *sizes = toy_data
    with pytest.raises(HeadcountError, match=f"training.compile_step.*{says}"):
        train(no_dropout_model(sizes), settings(max_steps=2, compile_step=compile_step), data, dev, tmp_path,
              log=quiet)
    assert not (tmp_path / "checkpoint.pt").exists()
