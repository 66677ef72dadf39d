"""Pruning: gated fine-tuning (what trains, what stays frozen), folding the gates into a plain
model, the Michel curve's masks, from-scratch training with a fixed mask."""

import json

import pandas as pd
import pytest
import torch
from conftest import random_batch, toy_corpus
from test_stages import MODEL, training

from headcount.data.subwords import train_bpe
from headcount.io import HeadcountError, read_lines, write_lines
from headcount.models.checkpoint import load_checkpoint
from headcount.models.loading import load_model
from headcount.pipeline.training_runs import train_translation_model
from headcount.pruning.hard_concrete import fold_gates, gate_table, prepare_for_pruning
from headcount.pruning.ranked import masks_from_table, ranked_masks, retained_counts

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights

# the authors' recipe (restarted warm-up, no healing), which these tests were written for
PRUNE = dict(gate_lr_scale=10.0, log_alpha_init=None, lr_schedule="noam", heal_steps=0,
             training=dict(max_steps=12, warmup_steps=4, lr_scale=0.5, checkpoint_interval=4))


def test_fold_gates_gives_the_same_outputs_as_the_gated_model(tiny_model):
    gates, _ = prepare_for_pruning(tiny_model, "all", None, 1.0)
    with torch.no_grad():
        for i, g in enumerate(gates):  # some heads closed, some fractional, some fully open
            g.log_alpha.copy_(torch.tensor([-4.0, -1.0, 0.3, 4.0]).roll(i))
    tiny_model.eval()
    src, tgt = random_batch(tiny_model)
    with torch.no_grad():
        gated, _ = tiny_model(src, tgt)
    table = gate_table(tiny_model)
    fold_gates(tiny_model)
    assert all(m.hard_concrete is None for mods in tiny_model.attention_modules().values() for m in mods)
    with torch.no_grad():
        folded, _ = tiny_model(src, tgt)
    torch.testing.assert_close(folded, gated, atol=1e-5, rtol=1e-5)
    # the code's rule prunes exactly the zero evaluation gates; the paper's rule also log alpha < 0
    assert table["pruned"].sum() == len(gates)  # one log alpha of -4 per layer: gate 0
    assert table["pruned_paper"].sum() == 2 * len(gates)
    masks = masks_from_table(table, {"enc_self": 2, "dec_self": 2, "dec_enc": 2}, 4)
    assert retained_counts(masks) == {"enc_self": 6, "dec_self": 6, "dec_enc": 6}
    for kind, mask in tiny_model.head_mask().items():
        torch.testing.assert_close(mask, masks[kind])


def test_encoder_only_setting_trains_the_encoder_and_its_gates_only(tiny_model):
    gates, groups = prepare_for_pruning(tiny_model, "enc", 0.0, 5.0)
    trained = {id(p) for g in groups for p in g["params"]}
    names = {name for name, p in tiny_model.named_parameters() if id(p) in trained}
    assert all(n.startswith(("src_embed", "encoder_layers", "encoder_norm")) for n in names)
    assert any("hard_concrete" in n for n in names) and any("encoder_layers.1.ffn" in n for n in names)
    assert len(gates) == 2 and groups[1]["lr_scale"] == 5.0
    assert all(m.hard_concrete is None for m in tiny_model.attention_modules()["dec_self"])


def test_ranked_masks_remove_the_least_important_heads_first():
    rows = [{"type": t, "layer": layer, "head": h, "michel": float(10 * layer + h + (100 if t == "dec_enc" else 0))}
            for t in ("enc_self", "dec_self", "dec_enc") for layer in range(2) for h in range(4)]
    scores = pd.DataFrame(rows)
    steps = ranked_masks(scores, "michel", ("enc_self",), {"enc_self": 2, "dec_self": 2, "dec_enc": 2}, 4, step=0.25)
    assert [f for f, _ in steps] == [0.0, 0.25, 0.5, 0.75]
    fraction, masks = steps[1]  # 2 of 8 encoder heads: layer 0 heads 0 and 1 (lowest importance)
    assert masks["enc_self"][0].tolist() == [0, 0, 1, 1] and masks["enc_self"][1].sum() == 4
    assert masks["dec_self"].sum() == 8  # other types untouched in the encoder-only curve
    every = ranked_masks(scores, "michel", ("enc_self", "dec_self", "dec_enc"),
                         {"enc_self": 2, "dec_self": 2, "dec_enc": 2}, 4)
    removed = 24 - sum(every[3][1][k].sum() for k in every[3][1])  # 30% of 24 heads, ranked globally
    assert removed == round(0.3 * 24)
    assert every[3][1]["dec_enc"].sum() == 8  # the most important type is kept longest


@pytest.fixture
def toy_run(tmp_path):
    src, tgt = toy_corpus(300, seed=1)
    write_lines(tmp_path / "train.src.txt", src)
    write_lines(tmp_path / "train.tgt.txt", tgt)
    write_lines(tmp_path / "dev.src.txt", src[:10])
    write_lines(tmp_path / "dev.tgt.txt", tgt[:10])
    for side in ("src", "tgt"):
        train_bpe(tmp_path / f"train.{side}.txt", tmp_path / f"{side}.model", vocab_size=60)
    files = [str(tmp_path / f) for f in ("train.src.txt", "train.tgt.txt", "dev.src.txt", "dev.tgt.txt",
                                          "src.model", "tgt.model")]
    model = dict(MODEL, enc_layers=2, dec_layers=2)
    train_translation_model(*files, model, training(20), False, str(tmp_path / "base"), str(tmp_path / "base.pt"),
                            str(tmp_path / "base.json"), log=lambda m: None)
    return tmp_path, files, model


def run_pruning(tmp_path, files, setting, lam, name, log=lambda m: None):
    from headcount.pipeline.pruning_runs import prune_heads

    return prune_heads(str(tmp_path / "base.pt"), *files, setting=setting, lam=lam, prune_settings=PRUNE,
                       train_settings=training(20), work_dir=str(tmp_path / name / "train"),
                       model_out=str(tmp_path / name / "model.pt"), gates_out=str(tmp_path / name / "gates.json"),
                       trajectory_out=str(tmp_path / name / "trajectory.csv"), log=log)


def test_encoder_only_pruning_leaves_the_decoder_unchanged(toy_run):
    tmp_path, files, _ = toy_run
    record = run_pruning(tmp_path, files, "enc", 0.5, "enc")
    base, pruned = load_model(tmp_path / "base.pt"), load_model(tmp_path / "enc/model.pt")
    for (name, p0), (_, p1) in zip(base.state_dict().items(), pruned.state_dict().items()):
        if name.startswith(("decoder_layers", "tgt_embed", "generator", "decoder_norm")):
            assert torch.equal(p0, p1), name
    changed = [n for (n, p0), (_, p1) in zip(base.state_dict().items(), pruned.state_dict().items())
               if n.startswith("encoder_layers") and not torch.equal(p0, p1)]
    assert changed  # the encoder did train
    assert set(record["retained"]) == {"enc_self", "dec_self", "dec_enc"}
    assert record["retained"]["dec_self"] == 8 and record["retained"]["dec_enc"] == 8
    trajectory = pd.read_csv(tmp_path / "enc/trajectory.csv")
    assert set(trajectory["type"]) == {"enc_self"} and trajectory["step"].max() == 12
    assert trajectory["p_closed"].between(0, 1).all()
    saved = json.loads((tmp_path / "enc/gates.json").read_text())
    assert saved["lambda"] == 0.5 and "provenance" in saved and len(saved["heads"]) == 24


def test_a_larger_lambda_closes_more_gates(toy_run):
    tmp_path, files, _ = toy_run
    settings = dict(PRUNE, training=dict(PRUNE["training"], max_steps=40))
    from headcount.pipeline.pruning_runs import prune_heads

    closed = []
    for lam in (0.0, 20.0):
        name = f"all_{lam:g}"
        prune_heads(str(tmp_path / "base.pt"), *files, setting="all", lam=lam, prune_settings=settings,
                    train_settings=training(20), work_dir=str(tmp_path / name / "train"),
                    model_out=str(tmp_path / name / "model.pt"), gates_out=str(tmp_path / name / "gates.json"),
                    trajectory_out=str(tmp_path / name / "trajectory.csv"), log=lambda m: None)
        trajectory = pd.read_csv(tmp_path / name / "trajectory.csv")
        closed.append(trajectory[trajectory["step"] == 40]["p_closed"].mean())
    assert closed[1] > closed[0] + 0.3, closed


def test_negative_lambda_is_refused_before_any_work(toy_run):
    tmp_path, files, _ = toy_run
    with pytest.raises(HeadcountError, match="negative.*prune.lambdas.enc"):
        run_pruning(tmp_path, files, "enc", -0.1, "neg")
    assert not (tmp_path / "neg").exists()


def test_from_scratch_model_keeps_the_pruned_mask(toy_run):
    tmp_path, files, model = toy_run
    pruned = load_model(tmp_path / "base.pt")
    mask = torch.ones(2, 4)
    mask[0, 1] = mask[1, 3] = 0
    pruned.set_head_mask({"dec_enc": mask})
    torch.save({"model": pruned.state_dict(), "model_config": pruned.cfg.to_dict()}, tmp_path / "pruned.pt")
    train_translation_model(*files, model, training(10), False, str(tmp_path / "scratch"), str(tmp_path / "s.pt"),
                            str(tmp_path / "s.json"), head_mask_from=str(tmp_path / "pruned.pt"), log=lambda m: None)
    scratch = load_model(tmp_path / "s.pt")
    assert torch.equal(scratch.head_mask()["dec_enc"], mask)
    assert scratch.head_mask()["enc_self"].sum() == 8
    base = load_model(tmp_path / "base.pt")  # trained from random init, not from the baseline
    assert not torch.equal(scratch.src_embed.weight, base.src_embed.weight)
    assert len(read_lines(tmp_path / "dev.src.txt")) == 10


def killable_job(kind, files, out, base, prune, train, model):
    """The job the kill test runs in a process of its own: a pruning run or a from-scratch twin."""
    from headcount.pipeline.pruning_runs import prune_heads
    from headcount.pipeline.training_runs import train_translation_model

    if kind == "prune":
        prune_heads(base, *files, setting="all", lam=0.5, prune_settings=prune, train_settings=train,
                    work_dir=out + "/train", model_out=out + "/model.pt", gates_out=out + "/gates.json",
                    trajectory_out=out + "/trajectory.csv", log=lambda m: None)
    else:
        train_translation_model(*files, model, train, False, out + "/train", out + "/model.pt", out + "/summary.json",
                                head_mask_from=base, log=lambda m: None)


@pytest.mark.parametrize("kind", ["prune", "scratch"])
def test_a_job_killed_with_sigkill_resumes_to_the_same_result(toy_run, kind):
    """Start the job in its own process, SIGKILL it after a checkpoint, rerun it, and compare
    with an uninterrupted run: bitwise on CPU with the same seed. Each run is a fork of this
    process (torch already imported, one thread as here), not a new interpreter: the kill and
    the resume are the same, without three imports of torch."""
    import multiprocessing
    import os
    import signal
    import time

    tmp_path, files, model = toy_run
    prune = dict(PRUNE, training=dict(PRUNE["training"], max_steps=60, checkpoint_interval=5))
    train = dict(training(60), checkpoint_interval=5, eval_interval=30)
    fork = multiprocessing.get_context("fork")

    def start(out):
        process = fork.Process(target=killable_job, args=(kind, files, str(out), str(tmp_path / "base.pt"), prune,
                                                          train, model))
        process.start()
        return process

    clean, killed = tmp_path / f"{kind}_clean", tmp_path / f"{kind}_killed"
    process = start(clean)
    process.join(300)
    assert process.exitcode == 0
    process = start(killed)
    metrics = killed / "train/metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and process.is_alive() and not (metrics.exists() and '"step": 20,' in
                                                                  metrics.read_text()):
        time.sleep(0.05)
    assert process.is_alive(), "the job ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.join()
    assert process.exitcode == -signal.SIGKILL
    assert not (killed / "model.pt").exists()
    assert 0 < torch.load(killed / "train/checkpoint.pt", weights_only=False)["step"] < 60  # mid-run
    process = start(killed)
    process.join(300)
    assert process.exitcode == 0
    a, b = torch.load(clean / "model.pt", weights_only=False), torch.load(killed / "model.pt", weights_only=False)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    if kind == "prune":
        heads = [json.loads((d / "gates.json").read_text())["heads"] for d in (clean, killed)]
        assert heads[0] == heads[1]  # the same pruning decisions
        assert (clean / "trajectory.csv").read_text() == (killed / "trajectory.csv").read_text()


def test_precision_auto_follows_the_baseline_through_pruning_and_the_twin(toy_run, monkeypatch):
    # The baseline trained in fp32 (a machine without bf16); the pruning run and its twin run where
    # auto would pick bf16. Both must train as the run they continue did.
    tmp_path, files, model = toy_run
    assert load_checkpoint(tmp_path / "base.pt")["summary"]["precision"] == "fp32"
    monkeypatch.setattr("headcount.models.device.cpu_has_bf16", lambda: True)
    from headcount.pipeline.pruning_runs import prune_heads

    messages = []
    record = prune_heads(str(tmp_path / "base.pt"), *files, setting="enc", lam=0.5, prune_settings=PRUNE,
                         train_settings=dict(training(20), precision="auto"), work_dir=str(tmp_path / "p" / "train"),
                         model_out=str(tmp_path / "p" / "model.pt"), gates_out=str(tmp_path / "p" / "gates.json"),
                         trajectory_out=str(tmp_path / "p" / "trajectory.csv"), log=messages.append)
    assert record["summary"]["precision"] == "fp32" and record["train_config"]["precision"] == "fp32"
    assert any("precision auto: fp32, as the baseline trained" in m for m in messages)
    for twin, mask_from, expected in (("twin", tmp_path / "p" / "model.pt", "fp32"),
                                      ("unrecorded", tmp_path / "base.pt", "bf16")):  # nothing to follow: auto
        summary = train_translation_model(*files, model, dict(training(4), precision="auto"), False,
                                          str(tmp_path / twin), str(tmp_path / f"{twin}.pt"),
                                          str(tmp_path / f"{twin}.json"), head_mask_from=str(mask_from),
                                          log=lambda m: None)
        assert summary["precision"] == expected, twin


def test_physically_pruned_model_computes_the_same_as_the_masked_one(tiny_model):
    from headcount.pruning.removal import attention_flops, remove_pruned_heads
    from headcount.training.decode import translate

    masks = {"enc_self": torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 0]]),  # a layer with no head left
             "dec_self": torch.tensor([[1.0, 1, 1, 1], [0, 1, 0, 0]]),
             "dec_enc": torch.tensor([[0.0, 0, 1, 0], [1, 1, 0, 1]])}
    tiny_model.set_head_mask(masks)
    full_flops = attention_flops(tiny_model, 7, 5)
    src, tgt = random_batch(tiny_model)
    with torch.no_grad():
        expected, _ = tiny_model(src, tgt)
    sentences = [[5, 6, 7, 8], [9, 10, 4], [11, 12, 13, 14, 15, 16]]
    hyps = translate(tiny_model, sentences, beam=3, max_tokens=500, device=torch.device("cpu"))
    remove_pruned_heads(tiny_model)
    assert [m.n_heads for m in tiny_model.attention_modules()["enc_self"]] == [2, 0]
    assert tiny_model.encoder_layers[0].self_attn.q_proj.out_features == 2 * 4
    with torch.no_grad():
        got, _ = tiny_model(src, tgt)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert translate(tiny_model, sentences, beam=3, max_tokens=500, device=torch.device("cpu")) == hyps
    # per head and sentence pair (S=7, T=5, d=16, Dh=4): Q and O (Tq*d*Dh each), K and V (Tk*d*Dh
    # each), QK^T and PV (Tq*Tk*Dh each); 8 heads per type before pruning
    per_head = {kind: 2 * 4 * (tq * 16 + tk * 16 + tq * tk)
                for kind, (tq, tk) in {"enc_self": (7, 7), "dec_self": (5, 5), "dec_enc": (5, 7)}.items()}
    assert full_flops == sum(8 * f for f in per_head.values())
    assert attention_flops(tiny_model, 7, 5) == sum(int(masks[k].sum()) * per_head[k] for k in masks)


def test_training_only_the_kept_heads_is_masked_training(tiny_model):
    """removal.computing_kept_heads (a twin's training): Adam steps on the physically pruned model
    give the weights that the same steps on the masked model give, the masked heads left at their
    initial weights, and the full layout and mask come back."""
    import copy
    from dataclasses import replace

    from headcount.models.transformer import Transformer
    from headcount.pruning.removal import computing_kept_heads

    masks = {"enc_self": torch.tensor([[1.0, 0, 1, 0], [0, 0, 0, 0]]),  # a layer with no head left
             "dec_self": torch.tensor([[1.0, 1, 1, 1], [0, 1, 0, 0]]),
             "dec_enc": torch.tensor([[0.0, 0, 1, 0], [1, 1, 0, 1]])}
    torch.manual_seed(0)
    masked = Transformer(replace(tiny_model.cfg, dropout=0.0, attn_dropout=0.0))  # no random stream to differ
    masked.set_head_mask(masks)
    pruned, initial = copy.deepcopy(masked), copy.deepcopy(masked)

    def adam_steps(model):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for seed in range(4):
            src, tgt = random_batch(model, seed=seed)
            logits, _ = model(src, tgt)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.roll(-1, 1).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    adam_steps(masked)
    with computing_kept_heads(pruned):
        assert [m.n_heads for m in pruned.attention_modules()["enc_self"]] == [2, 0]
        adam_steps(pruned)
    assert [m.n_heads for m in pruned.attention_modules()["enc_self"]] == [4, 4]
    for kind, mask in pruned.head_mask().items():
        assert torch.equal(mask, masks[kind])
    got, expected, start = pruned.state_dict(), masked.state_dict(), initial.state_dict()
    assert got.keys() == expected.keys()
    for name in expected:
        if name.endswith("k_proj.bias"):
            # Softmax ignores a shift shared by all keys, so W^K's bias gets only rounding noise
            # as gradient, which Adam scales up to full steps: different noise, different values.
            continue
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    dead = slice(1 * 4, 2 * 4)  # head 1 of encoder layer 0: masked, so never trained
    assert torch.equal(got["encoder_layers.0.self_attn.q_proj.weight"][dead],
                       start["encoder_layers.0.self_attn.q_proj.weight"][dead])
    assert not torch.equal(got["encoder_layers.0.self_attn.q_proj.weight"][:4],
                           start["encoder_layers.0.self_attn.q_proj.weight"][:4])


Q0 = "encoder_layers.0.self_attn.q_proj.weight"  # a weight every setting trains


def prune_with(tmp_path, files, setting, lam, name, **recipe):
    from headcount.pipeline.pruning_runs import prune_heads

    settings = {**PRUNE, **recipe}
    return prune_heads(str(tmp_path / "base.pt"), *files, setting=setting, lam=lam, prune_settings=settings,
                       train_settings=training(20), work_dir=str(tmp_path / name / "train"),
                       model_out=str(tmp_path / name / "model.pt"), gates_out=str(tmp_path / name / "gates.json"),
                       trajectory_out=str(tmp_path / name / "trajectory.csv"), log=lambda m: None,
                       baseline_checkpoint=str(tmp_path / "base/checkpoint.pt"))


def test_the_control_trains_the_weights_with_gates_that_never_close(toy_run):
    """lambda = 0: log alpha pinned open and untrained, every sampled and evaluation gate 1, no
    head pruned by either rule; the weights did fine-tune."""
    from headcount.models.gates import OPEN_LOG_ALPHA

    tmp_path, files, _ = toy_run
    record = prune_with(tmp_path, files, "all", 0.0, "control")
    assert record["control"] and record["retained"] == {"enc_self": 8, "dec_self": 8, "dec_enc": 8}
    assert record["retained_paper_rule"] == record["retained"]
    heads = pd.DataFrame(record["heads"])
    assert (heads["log_alpha"] == OPEN_LOG_ALPHA).all() and (heads["eval_gate"] == 1.0).all()
    trajectory = pd.read_csv(tmp_path / "control/trajectory.csv")
    assert trajectory["step"].max() == 12 and (trajectory["p_closed"] == 0).all()
    base, tuned = load_model(tmp_path / "base.pt"), load_model(tmp_path / "control/model.pt")
    assert all(torch.equal(m, torch.ones_like(m)) for m in tuned.head_mask().values())
    assert not torch.equal(base.state_dict()[Q0], tuned.state_dict()[Q0])


def test_a_lower_weight_rate_leaves_the_gates_rate_alone(toy_run):
    """prune.weight_lr_scale 0.1: the weights fine-tune and heal at a tenth of the schedule's rate,
    the gates still at gate_lr_scale times it (read from the optimizer's own groups), and a twin on
    the pruned schedule follows the weights."""
    from headcount.config import scratch_schedule
    from headcount.training.schedules import baseline_last_lr, healing_lr, pruned_model_lr

    tmp_path, files, _ = toy_run
    record = prune_with(tmp_path, files, "all", 0.5, "slow", lr_schedule="constant", heal_steps=2,
                        weight_lr_scale=0.1)
    d_model = load_model(tmp_path / "base.pt").d_model
    last = baseline_last_lr(training(20), d_model)
    groups = load_checkpoint(tmp_path / "slow/train/checkpoint.pt")["optimizer"]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([0.1 * last, 10.0 * last])  # weights, gates
    assert record["lr"]["fine_tuning_last"] == pytest.approx(0.1 * last)
    healed = {r["step"]: r["lr"] for r in map(json.loads, read_lines(tmp_path / "slow/train/heal/metrics.jsonl"))
              if "lr" in r}
    assert healed and all(lr == pytest.approx(healing_lr(0.1 * last, 2)(step)) for step, lr in healed.items())
    prune = dict(PRUNE, scratch_schedule="pruned", lr_schedule="constant", heal_steps=2, weight_lr_scale=0.1)
    schedule = scratch_schedule(training(20), prune)
    twin = pruned_model_lr(schedule["baseline_training"], schedule["fine_tuning"], "constant", 12, 2, d_model,
                           schedule["weight_lr_scale"])
    assert twin(21) == pytest.approx(0.1 * last) and twin(20) == pytest.approx(last)
    assert scratch_schedule(training(20), dict(prune, weight_lr_scale=1.0))["weight_lr_scale"] == 1.0


@pytest.mark.parametrize("setting", ["all", "enc"])
def test_the_control_samples_only_open_gates_during_training(tiny_model, setting):
    from headcount.pruning.hard_concrete import prepare_for_pruning

    gates, groups = prepare_for_pruning(tiny_model, setting, None, 10.0, control=True)
    assert len(groups) == 1  # no gate is trained
    assert not any(g.log_alpha.requires_grad for g in gates)
    samples = []
    hooks = [g.register_forward_hook(lambda m, i, o: samples.append(o.detach())) for g in gates]
    tiny_model.train()
    for _ in range(20):
        tiny_model(*random_batch(tiny_model))
    for h in hooks:
        h.remove()
    assert len(samples) == 20 * len(gates) and all(torch.equal(s, torch.ones(4)) for s in samples)


def test_the_frozen_gate_phase_changes_no_gate(toy_run):
    """heal_steps: after the gated run, the gates are folded (fixed 0/1 mask) and the weights
    train on; the mask and the gates' record are those of the gated run's end."""
    tmp_path, files, _ = toy_run
    record = prune_with(tmp_path, files, "all", 2.0, "heal", heal_steps=6)
    gated = load_model(tmp_path / "base.pt")  # the gated run's last weights, folded here independently
    prepare_for_pruning(gated, "all", None, 10.0)
    gated.load_state_dict(torch.load(tmp_path / "heal/train/checkpoint.pt", weights_only=False)["model"])
    before = gate_table(gated)
    fold_gates(gated)
    healed = load_model(tmp_path / "heal/model.pt")
    assert before["pruned"].any() and not before["pruned"].all()  # a mask worth freezing
    assert before["pruned"].tolist() == pd.DataFrame(record["heads"])["pruned"].tolist()
    for kind, mask in gated.head_mask().items():
        assert torch.equal(healed.head_mask()[kind], mask), kind
    assert not torch.equal(gated.state_dict()[Q0], healed.state_dict()[Q0])
    # what the healing phase trained: no gate left to learn, the folded mask, no gate in its optimizer
    heal_state = torch.load(tmp_path / "heal/train/heal/checkpoint.pt", weights_only=False)
    assert not any("hard_concrete" in name for name in heal_state["model"])
    masks = {n: t for n, t in heal_state["model"].items() if n.endswith("head_mask")}
    assert masks and all(torch.equal(t, gated.state_dict()[n]) for n, t in masks.items())
    n_trained = sum(len(g["params"]) for g in heal_state["optimizer"]["param_groups"])
    assert n_trained == len(list(gated.parameters()))
    assert record["heal_summary"]["steps"] == 6
    assert record["steps"] == {"baseline": 20, "fine_tuning": 12, "heal": 6, "total": 38}


def test_a_longer_gated_phase_heals_again(toy_run):
    """Raising prune.training.max_steps resumes the gated phase from its checkpoint; the healing
    phase after it must then start afresh from the new gates, not resume the finished healing of
    the shorter run: the extended run ends with the weights of a run that was that long from the
    start."""
    tmp_path, files, _ = toy_run
    longer = {**PRUNE["training"], "max_steps": 16}
    straight = prune_with(tmp_path, files, "all", 2.0, "straight", heal_steps=4, training=longer)
    prune_with(tmp_path, files, "all", 2.0, "extended", heal_steps=4)
    extended = prune_with(tmp_path, files, "all", 2.0, "extended", heal_steps=4, training=longer)
    assert extended["steps"] == straight["steps"] == {"baseline": 20, "fine_tuning": 16, "heal": 4, "total": 40}
    a, b = load_model(tmp_path / "straight/model.pt"), load_model(tmp_path / "extended/model.pt")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_best_dev_bleu_selection_picks_among_checkpoints_with_the_final_heads(toy_run):
    tmp_path, files, _ = toy_run
    from headcount.pipeline.pruning_runs import prune_heads

    settings = {**PRUNE, "select": "best_dev_bleu", "training": {**PRUNE["training"], "eval_interval": 4}}
    record = prune_heads(str(tmp_path / "base.pt"), *files, setting="all", lam=0.0, prune_settings=settings,
                         train_settings=training(20), work_dir=str(tmp_path / "sel/train"),
                         model_out=str(tmp_path / "sel/model.pt"), gates_out=str(tmp_path / "sel/gates.json"),
                         trajectory_out=str(tmp_path / "sel/trajectory.csv"), log=lambda m: None)
    scores = {c["step"]: c["dev_bleu"] for c in record["selected"]["candidates"] if c["phase"] == "fine_tuning"}
    assert sorted(scores) == [4, 8, 12]  # the control's heads never change: every evaluation is a candidate
    best = max(scores.values())
    assert record["selected"]["dev_bleu"] == best
    assert record["selected"]["step"] == min(s for s, b in scores.items() if b == best)
    snapshot = torch.load(tmp_path / f"sel/train/snapshots/step_{record['selected']['step']}.pt", weights_only=False)
    saved = torch.load(tmp_path / "sel/model.pt", weights_only=False)["model"]
    assert torch.equal(saved[Q0], snapshot["model"][Q0])


def test_learning_rate_recipes_against_the_noam_formula():
    from headcount.training.schedules import baseline_last_lr, fine_tuning_lr, healing_lr, noam_lr

    base = {"max_steps": 3200, "warmup_steps": 800, "lr_scale": 1.0}
    last = 256 ** -0.5 * 3200 ** -0.5  # past the warm-up: scale * d^-0.5 * step^-0.5
    assert baseline_last_lr(base, 256) == pytest.approx(last)
    restart = fine_tuning_lr("noam", base, {"warmup_steps": 10, "lr_scale": 0.5}, 256)  # the authors' restart
    assert [restart(s) for s in (1, 10, 40)] == [noam_lr(s, 256, 10, 0.5) for s in (1, 10, 40)]
    constant = fine_tuning_lr("constant", base, {}, 256)
    assert constant(1) == constant(500) == pytest.approx(last)
    carried = fine_tuning_lr("continue", base, {}, 256)
    assert carried(1) == pytest.approx(256 ** -0.5 * 3201 ** -0.5) and carried(500) < carried(1) < last
    heal = healing_lr(1e-3, 4)
    assert [heal(s) for s in range(1, 5)] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


def test_baseline_adam_state_is_resumed_parameter_by_parameter(tiny_model):
    """The baseline optimizer's moments reach the same tensors after gates are attached and the
    decoder is frozen; the new gates start fresh."""
    from headcount.pruning.hard_concrete import optimizer_state_loader
    from headcount.training.loop import parameter_groups

    params = list(tiny_model.parameters())
    adam = torch.optim.Adam(params, lr=1e-3)
    loss = sum((p ** 2).sum() * (i + 1) for i, p in enumerate(params))
    loss.backward()
    adam.step()
    saved = adam.state_dict()
    gates, groups = prepare_for_pruning(tiny_model, "enc", None, 10.0)
    fresh = torch.optim.Adam(parameter_groups(groups), lr=0.0)
    optimizer_state_loader(saved, params, "baseline checkpoint")(fresh)
    position = {id(p): i for i, p in enumerate(params)}
    for group in fresh.param_groups:
        for p in group["params"]:
            if any(p is g.log_alpha for g in gates):
                assert p not in fresh.state
            else:
                torch.testing.assert_close(fresh.state[p]["exp_avg_sq"], saved["state"][position[id(p)]]["exp_avg_sq"])
    assert len(fresh.state) == len(groups[0]["params"]) < len(params)
    with pytest.raises(HeadcountError, match="not this model's checkpoint"):
        optimizer_state_loader(saved, params[:-1], "baseline checkpoint")


def test_a_recipe_run_resumes_the_baseline_optimizer_at_its_last_rate(toy_run):
    tmp_path, files, _ = toy_run
    record = prune_with(tmp_path, files, "enc", 0.5, "recipe", lr_schedule="constant", resume_optimizer=True)
    assert record["lr"]["fine_tuning_peak"] == pytest.approx(record["lr"]["baseline_last"])
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "recipe/train/metrics.jsonl").read_text().splitlines()
           if '"lr"' in line]
    assert lrs and all(lr == pytest.approx(record["lr"]["baseline_last"]) for lr in lrs)


def test_from_scratch_budget_matches_the_pruned_models_steps():
    from headcount.config import scratch_training

    base = training(3200)
    prune = {**PRUNE, "heal_steps": 100, "select": "best_dev_bleu"}
    assert scratch_training(base, prune) == {**base, "max_steps": 3200 + 12 + 100, "select": "best_dev_bleu"}
    assert scratch_training(base, PRUNE)["select"] == "last"



def _write_json(path, record):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def made_up_report(tmp_path):
    """Made-up runs of the all-types setting for pruning_report, under tmp_path: the baseline, the
    control (lambda 0), a pruned model (lambda 0.5, 19 of 24 heads kept) and its from-scratch twin,
    each with translations of 30 random references. Returns pruning_report's arguments but the
    ranked curves', the systems' translations, the references and `system(p)`, which makes up
    another system (each reference word replaced with probability p)."""
    import random

    rng = random.Random(3)
    words = "ein hund eine katze läuft über die wiese zwei kinder spielen im sand".split()
    refs = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(30)]

    def system(p):
        return [" ".join(w if rng.random() > p else "x" for w in r.split()) for r in refs]

    texts = {"baseline": system(0.1), "prune/all/lambda_0": system(0.1), "prune/all/lambda_0.5": system(0.5),
             "prune/all/lambda_0.5/scratch": system(0.3)}
    write_lines(tmp_path / "ref.txt", refs)
    inputs = {"gates": [], "pruned_scores": [], "scratch_scores": [], "pruned_translations": [],
              "scratch_translations": [], "scratch_training": [], "pruned_nll": [], "scratch_nll": []}
    tokens = [rng.randint(4, 9) for _ in refs]
    for model, hyps in texts.items():
        write_lines(tmp_path / model / "translations/test.txt", hyps)
        # each reference's NLL: more for the noisier systems, in proportion to its length
        noise = sum(h != r for h, r in zip(hyps, refs)) / len(refs)
        nll = [n * (1.5 + noise) + rng.random() for n in tokens]
        (tmp_path / model / "scores").mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"sentence": range(len(refs)), "nll": nll, "tokens": tokens}).to_csv(
            tmp_path / model / "scores/test.nll.tsv", sep="\t", index=False)
        if model.endswith("scratch"):
            inputs["scratch_nll"].append(str(tmp_path / model / "scores/test.nll.tsv"))
        elif model != "baseline":
            inputs["pruned_nll"].append(str(tmp_path / model / "scores/test.nll.tsv"))
        _write_json(tmp_path / model / "scores/test.json", {"bleu": 50.0, "chrf": 60.0, "split": "test",
                                                              "bleu_signature": "nrefs:1|case:mixed"})
    heads = [{"type": t, "layer": layer, "head": h, "pruned": False} for t in TYPES_ for layer in range(2)
             for h in range(4)]
    for lam, n_pruned in ((0.0, 0), (0.5, 5)):
        model = f"prune/all/lambda_{lam:g}"
        # P(open): the pruned heads near 0, two heads undecided (0.5 and 0.85), one at the band's edge (0.9)
        p_open = [0.01] * n_pruned + [0.5, 0.85, 0.9] + [0.99] * 24
        table = [dict(h, pruned=i < n_pruned, gated=lam > 0, p_open=p_open[i] if lam > 0 else 1.0)
                 for i, h in enumerate(heads)]
        retained = {t: sum(1 for h in table if h["type"] == t and not h["pruned"]) for t in TYPES_}
        paper = dict(retained, enc_self=retained["enc_self"] - 1)  # the paper's rule closes one more
        _write_json(tmp_path / model / "gates.json", {
            "setting": "all", "lambda": lam, "heads": table, "retained": retained, "retained_paper_rule": paper,
            "summary": {"steps": 12}, "recipe": {"select": "last"},
            "steps": {"baseline": 20, "fine_tuning": 12, "heal": 0, "total": 32}})
        inputs["gates"].append(str(tmp_path / model / "gates.json"))
        inputs["pruned_scores"].append(str(tmp_path / model / "scores/test.json"))
        inputs["pruned_translations"].append(str(tmp_path / model / "translations/test.txt"))
    scratch = tmp_path / "prune/all/lambda_0.5/scratch"
    _write_json(scratch / "training.json", {"steps": 32, "train_config": {"select": "last"}})
    inputs["scratch_scores"].append(str(scratch / "scores/test.json"))
    inputs["scratch_translations"].append(str(scratch / "translations/test.txt"))
    inputs["scratch_training"].append(str(scratch / "training.json"))
    _write_json(tmp_path / "baseline/training.json", {"steps": 20, "train_config": {"select": "best_dev_bleu"}})
    pd.DataFrame([{"layer": 0, "head": 0, "role": "positional"}]).to_csv(tmp_path / "roles.csv", index=False)
    out = {name: str(tmp_path / "report" / name)
           for name in ("table", "table2", "table2_csv", "claims", "claims_table", "encoder", "layers")}
    out.update({f"figure{n}": str(tmp_path / "report" / f"figure{n}.png") for n in (7, 8, 9, 10)})
    report = dict(experiment="toy", baseline_scores=str(tmp_path / "baseline/scores/test.json"),
                  roles=str(tmp_path / "roles.csv"), out=out, log=lambda m: None, references=str(tmp_path / "ref.txt"),
                  baseline_translations=str(tmp_path / "baseline/translations/test.txt"),
                  baseline_training=str(tmp_path / "baseline/training.json"),
                  baseline_nll=str(tmp_path / "baseline/scores/test.nll.tsv"), **inputs)
    return report, texts, refs, system


def write_curve_points(tmp_path, method: str, system) -> tuple[str, list[dict]]:
    """A ranked method's curve of the all-types setting as its translations file: all 24 heads, then
    18 (six encoder heads masked); the file's path and its points."""
    points = [{"removed_fraction": f, "retained": {"enc_self": 8 - n, "dec_self": 8, "dec_enc": 8},
               "translations": system(p)} for f, n, p in ((0.0, 0, 0.1), (0.25, 6, 0.3))]
    path = tmp_path / f"prune/all/{method}_translations.jsonl"
    write_lines(path, [json.dumps(point) for point in points])
    return str(path), points


def test_pruning_report_intervals_control_row_and_matched_budget(tmp_path):
    """A report over made-up runs: every difference carries sacrebleu's paired bootstrap interval,
    the control is its own row, and the steps the table states are those the runs recorded."""
    from headcount.report.pruning_report import pruning_report
    from headcount.training.evaluate import paired_bootstrap
    from headcount.training.perplexity import paired_bootstrap_nll

    report, texts, refs, system = made_up_report(tmp_path)
    out = report["out"]
    michel, michel_points = write_curve_points(tmp_path, "michel", system)
    table = pruning_report(ranked=[], ranked_translations=[michel], **report)
    saved = pd.read_csv(out["table"], sep="\t")
    pruned = saved[saved["lam"] == 0.5].iloc[0]
    control = saved[saved["lam"] == 0].iloc[0]
    assert bool(control["control"]) and not bool(pruned["control"]) and control["retained_total"] == 24
    expected = paired_bootstrap(texts["prune/all/lambda_0.5"], texts["baseline"], refs)
    assert pruned["d_baseline"] == pytest.approx(expected["difference"], abs=0.01)
    assert (pruned["d_baseline_low"], pruned["d_baseline_high"]) == pytest.approx((expected["low"], expected["high"]),
                                                                                   abs=0.01)
    expected = paired_bootstrap(texts["prune/all/lambda_0.5"], texts["prune/all/lambda_0.5/scratch"], refs)
    assert pruned["d_pruned_scratch_low"] == pytest.approx(expected["low"], abs=0.01)
    assert pruned["d_control"] < 0 and pd.isna(control["d_control"])
    # against Michel's ranking: the curve's point nearest 19 heads in all is the one with 18
    expected = paired_bootstrap(texts["prune/all/lambda_0.5"], michel_points[1]["translations"], refs)
    assert pruned["michel_heads"] == 18 and control["michel_heads"] == 24
    assert (pruned["d_michel"], pruned["d_michel_low"], pruned["d_michel_high"]) == pytest.approx(
        (expected["difference"], expected["low"], expected["high"]), abs=0.01)
    assert pruned["michel_bleu"] == pytest.approx(50.0 - expected["difference"], abs=0.01)
    # the matched budget: the pruned model's steps in all, its twin's, as the runs recorded them
    assert pruned["steps"] == 32 and pruned["steps_scratch"] == 32
    assert saved[saved["setting"] == "baseline"]["steps"].item() == 20
    markdown = (tmp_path / "report/table2").read_text()
    assert "| 0 (control) |" in markdown and "32 (20 + 12 + 0) / 32" in markdown
    # NLL beside BLEU: the same paired bootstrap over the references' per-sentence NLL
    nll = {m: pd.read_csv(tmp_path / m / "scores/test.nll.tsv", sep="\t") for m in texts}
    expected = paired_bootstrap_nll(nll["prune/all/lambda_0.5"]["nll"], nll["prune/all/lambda_0"]["nll"],
                                    nll["prune/all/lambda_0"]["tokens"])
    assert (pruned["dnll_control"], pruned["dnll_control_low"], pruned["dnll_control_high"]) == pytest.approx(
        (expected["difference"], expected["low"], expected["high"]))
    assert pruned["nll"] == pytest.approx(nll["prune/all/lambda_0.5"]["nll"].sum() / sum(nll["baseline"]["tokens"]))
    assert f"{expected['difference']:+.4f} [{expected['low']:+.4f}, {expected['high']:+.4f}]" in markdown
    # both counting rules and the gates left undecided (strictly inside 0.1-0.9: 2 of the 24 gated)
    assert pruned["gates_undecided"] == 2 and pruned["gates_gated"] == 24 and control["gates_gated"] == 0
    assert "| 3/8/8 | 2/8/8 | 2 of 24 | 0.5 |" in markdown
    rows = [line.split("|")[4].strip() for line in markdown.split("### Voita")[0].splitlines()[4:]
            if line.startswith("|")]
    assert rows == ["baseline", "0 (control)", "0.5"]
    control_line = next(line for line in markdown.splitlines() if "| 0 (control) |" in line)
    assert "no difference shown" in control_line.split("|")[6]  # same translations as the baseline
    pruned_line = next(line for line in markdown.splitlines() if "| 0.5 |" in line)
    assert ", difference |" in pruned_line.split("|")[6] + "|"
    assert (tmp_path / "report/figure7.png").stat().st_size > 0 and len(table) == 3
    claims = (tmp_path / "report/claims").read_text()
    assert "| Table 2: each pruned model" in claims and "pruned - from scratch" in claims
    # heads kept per layer: 5 of the 8 encoder heads closed at lambda 0.5 (the first 4 of layer 0, one of
    # layer 1); head 0.0, the one with a role, among them
    layers = pd.read_csv(out["layers"], sep="\t")
    enc = layers[(layers["lam"] == 0.5) & (layers["type"] == "enc_self")].set_index(["layer", "role"])
    assert enc.loc[(0, "positional"), ["heads", "kept"]].tolist() == [1, 0]
    assert enc.loc[(0, "none"), ["heads", "kept"]].tolist() == [3, 0]
    assert enc.loc[(1, "none"), ["heads", "kept"]].tolist() == [4, 3]
    assert layers[layers["type"] == "dec_self"]["role"].isna().all()  # decoder heads have no roles
    assert "| 8 | baseline | 50.00 |  |  |  |  | 20 | best_dev_bleu |" in (tmp_path / "report/encoder").read_text()


def test_seed_spread_pairs_each_seeds_control_with_its_own_baseline(tmp_path):
    """Mean and sd as the statistics module computes them; each seed's control - baseline interval
    is paired_bootstrap over that seed's own two translations, not another seed's."""
    import random
    import statistics

    from headcount.report.pruning_report import seed_spread
    from headcount.training.evaluate import paired_bootstrap

    rng = random.Random(5)
    words = "ein hund eine katze läuft über die wiese zwei kinder spielen im sand".split()
    refs = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(30)]
    write_lines(tmp_path / "ref.txt", refs)
    bleu = {("baseline", 1): 30.0, ("baseline", 2): 31.5, ("control", 1): 32.0, ("control", 2): 31.0}
    noise = {("baseline", 1): 0.4, ("baseline", 2): 0.1, ("control", 1): 0.2, ("control", 2): 0.5}
    texts, paths = {}, {}
    for (system, seed), p in noise.items():
        texts[system, seed] = [" ".join(w if rng.random() > p else "x" for w in r.split()) for r in refs]
        folder = tmp_path / f"{system}{seed}"
        write_lines(folder / "test.txt", texts[system, seed])
        _write_json(folder / "test.json", {"bleu": bleu[system, seed], "bleu_signature": "nrefs:1"})
        paths[system, seed] = folder
    table = seed_spread("toy", [1, 2], ["enc"], [str(paths["baseline", s] / "test.json") for s in (1, 2)],
                        [str(paths["control", s] / "test.json") for s in (1, 2)], str(tmp_path / "spread.tsv"),
                        str(tmp_path / "spread.md"), log=lambda m: None, references=str(tmp_path / "ref.txt"),
                        baseline_translations=[str(paths["baseline", s] / "test.txt") for s in (1, 2)],
                        control_translations=[str(paths["control", s] / "test.txt") for s in (1, 2)])
    row = table.set_index("system").loc["control enc - baseline"]
    assert row["mean"] == pytest.approx(statistics.mean([2.0, -0.5]))
    assert row["sd"] == pytest.approx(statistics.stdev([2.0, -0.5]))
    # the mean's 95% t-interval over the two seeds: t(0.975, 1 df) 12.706 times sd / sqrt(2)
    half = 12.706 * statistics.stdev([2.0, -0.5]) / 2**0.5
    assert (row["mean_low"], row["mean_high"]) == pytest.approx((0.75 - half, 0.75 + half))
    for seed in (1, 2):
        expected = paired_bootstrap(texts["control", seed], texts["baseline", seed], refs)
        assert (row[f"seed_{seed}_low"], row[f"seed_{seed}_high"]) == pytest.approx((expected["low"], expected["high"]))
    assert pd.isna(table.set_index("system").loc["baseline"].get("seed_1_low", float("nan")))
    line = next(x for x in (tmp_path / "spread.md").read_text().splitlines() if x.startswith("| control enc - "))
    expected = paired_bootstrap(texts["control", 2], texts["baseline", 2], refs)
    assert f"-0.50 [{expected['low']:+.2f}, {expected['high']:+.2f}]" in line.split("|")[3]
    assert line.split("|")[4].strip() == f"0.75 [{0.75 - half:.2f}, {0.75 + half:.2f}]"
    with pytest.raises(HeadcountError, match="translations"):
        seed_spread("toy", [1, 2], ["enc"], [str(paths["baseline", 1] / "test.json")] * 2,
                    [str(paths["control", 1] / "test.json")] * 2, str(tmp_path / "x.tsv"), str(tmp_path / "x.md"),
                    references=str(tmp_path / "ref.txt"),
                    baseline_translations=[str(paths["baseline", 1] / "test.txt")])
    assert not (tmp_path / "x.tsv").exists()


def test_encoder_table_states_intervals_the_control_and_the_michel_point():
    """The encoder-only table: its runs in lambda order after the baseline, the control labelled,
    each difference with its interval and verdict, the Michel point it was set against."""
    from headcount.report.pruning_report import encoder_markdown

    nan = float("nan")
    pruning = pd.DataFrame([
        {"setting": "baseline", "lam": nan, "control": False, "retained_enc_self": 48, "bleu": 36.0, "steps": 3200,
         "selection": "best_dev_bleu"},
        {"setting": "enc", "lam": 0.1, "control": False, "retained_enc_self": 9, "retained_paper_rule_enc_self": 7,
         "bleu": 35.5, "d_baseline": -0.5, "d_baseline_low": -1.2, "d_baseline_high": 0.2, "d_control": -1.0,
         "d_control_low": -1.8, "d_control_high": -0.3, "michel_heads": 10, "michel_bleu": 33.0, "d_michel": 2.5,
         "d_michel_low": 1.5, "d_michel_high": 3.5, "steps": 3900, "selection": "last"},
        {"setting": "enc", "lam": 0.0, "control": True, "retained_enc_self": 48, "retained_paper_rule_enc_self": 48,
         "bleu": 36.5, "d_baseline": 0.5, "d_baseline_low": 0.1, "d_baseline_high": 0.9, "steps": 3900,
         "selection": "last"},
        {"setting": "all", "lam": 0.1, "control": False, "retained_enc_self": 3, "bleu": 30.0},
    ])
    markdown = encoder_markdown("toy", pruning, "nrefs:1")
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in markdown.splitlines()
            if line.startswith("| ") and not line.startswith("| encoder heads")]
    assert [row[1] for row in rows] == ["baseline", "0 (control)", "0.1"]
    assert rows[0] == ["48", "baseline", "36.00", "", "", "", "", "3200", "best_dev_bleu"]
    assert rows[1][3:7] == ["+0.50 [+0.10, +0.90], difference", "", "", ""]
    assert rows[2][0] == "9 (7)"
    assert rows[2][3:7] == ["-0.50 [-1.20, +0.20], no difference shown", "-1.00 [-1.80, -0.30], difference",
                            "33.00 (10)", "+2.50 [+1.50, +3.50], difference"]


def test_a_run_is_set_against_the_michel_point_nearest_its_head_count():
    """Encoder heads for the encoder-only setting, all heads otherwise; more heads win a tie."""
    from headcount.report.pruning_report import curve_match

    def point(enc, dec):
        return {"retained": {"enc_self": enc, "dec_self": dec, "dec_enc": 48}}

    curve = [point(48, 48), point(10, 48), point(6, 48), point(4, 48)]
    assert curve_match("enc", {"enc_self": 8, "dec_self": 20, "dec_enc": 20}, curve) is curve[1]
    assert curve_match("enc", {"enc_self": 5, "dec_self": 48, "dec_enc": 48}, curve) is curve[2]
    curve = [point(48, 48), point(30, 30), point(10, 10)]  # 144, 108 and 68 heads in all
    assert curve_match("all", {"enc_self": 10, "dec_self": 48, "dec_enc": 48}, curve) is curve[1]
    assert curve_match("all", {"enc_self": 48, "dec_self": 48, "dec_enc": 48}, []) is None


TYPES_ = ("enc_self", "dec_self", "dec_enc")


def test_pruning_and_from_scratch_runs_stop_on_a_signal_like_the_baseline(toy_run):
    """Both jobs train with headcount.training.loop.train, the baseline's loop: a SIGTERM or SIGINT
    mid-run writes a checkpoint at the step reached and stops with TrainingStopped (the loop's
    tests cover resuming to the same weights)."""
    import os
    import signal

    from headcount.models.checkpoint import load_checkpoint
    from headcount.training.loop import TrainingStopped

    tmp_path, files, model = toy_run

    def signal_at_step_6(signum):
        def log(message):
            if message.startswith("step 6/"):
                os.kill(os.getpid(), signum)  # a real signal, as scancel or Ctrl-C sends it
        return log

    prune = dict(PRUNE, training=dict(PRUNE["training"], log_interval=1))
    from headcount.pipeline.pruning_runs import prune_heads

    with pytest.raises(TrainingStopped, match="SIGTERM at step 6 of 12"):
        prune_heads(str(tmp_path / "base.pt"), *files, setting="all", lam=0.5, prune_settings=prune,
                    train_settings=training(20), work_dir=str(tmp_path / "p/train"),
                    model_out=str(tmp_path / "p/model.pt"), gates_out=str(tmp_path / "p/gates.json"),
                    trajectory_out=str(tmp_path / "p/trajectory.csv"), log=signal_at_step_6(signal.SIGTERM))
    with pytest.raises(TrainingStopped, match="SIGINT at step 6 of 10"):
        train_translation_model(*files, model, dict(training(10), log_interval=1), False, str(tmp_path / "s/train"),
                                str(tmp_path / "s/model.pt"), str(tmp_path / "s/summary.json"),
                                head_mask_from=str(tmp_path / "base.pt"), log=signal_at_step_6(signal.SIGINT))
    for run in ("p", "s"):
        assert load_checkpoint(tmp_path / run / "train/checkpoint.pt")["step"] == 6  # not the interval's (4, 5)
        assert not (tmp_path / run / "model.pt").exists()


def test_a_twin_on_the_pruned_models_schedule(tmp_path):
    """prune.scratch_schedule: pruned. The twin trains from scratch on the pruned model's own learning
    rate: Noam for the baseline's steps, the fine-tuning's constant rate, then the healing decay; its
    summary says so, and a plain run says noam. (The mask is test_from_scratch_model_keeps_the_pruned_mask's.)"""
    from headcount.config import scratch_schedule
    from headcount.training.schedules import noam_lr, pruned_model_lr

    src, tgt = toy_corpus(120, seed=2)
    for name, lines in (("train.src.txt", src), ("train.tgt.txt", tgt), ("dev.src.txt", src[:5]),
                        ("dev.tgt.txt", tgt[:5])):
        write_lines(tmp_path / name, lines)
    for side in ("src", "tgt"):
        train_bpe(tmp_path / f"train.{side}.txt", tmp_path / f"{side}.model", vocab_size=60)
    files = [str(tmp_path / f) for f in ("train.src.txt", "train.tgt.txt", "dev.src.txt", "dev.tgt.txt",
                                          "src.model", "tgt.model")]
    model = dict(MODEL, enc_layers=1, dec_layers=1)
    base = dict(max_steps=4, warmup_steps=2, lr_scale=0.5)
    prune = dict(PRUNE, scratch_schedule="pruned", lr_schedule="constant", heal_steps=2,
                 training=dict(PRUNE["training"], max_steps=4))
    assert scratch_schedule(training(4), dict(prune, scratch_schedule="noam")) is None
    schedule = scratch_schedule({**training(4), **base}, prune)
    lr = pruned_model_lr(schedule["baseline_training"], schedule["fine_tuning"], "constant", 4, 2, 32)
    last = noam_lr(4, 32, 2, 0.5)
    assert [lr(s) for s in (1, 4)] == [noam_lr(1, 32, 2, 0.5), last]
    assert [lr(s) for s in (5, 8, 9, 10)] == pytest.approx([last, last, last, last / 2])  # constant, then healing
    summary = train_translation_model(*files, model, {**training(10), "schedule": schedule, "dev_bleu_sentences": 0},
                                      False, str(tmp_path / "matched"), str(tmp_path / "m.pt"),
                                      str(tmp_path / "m.json"), log=lambda m: None)
    assert summary["lr_schedule"] == "pruned" and summary["steps"] == 10
    logged = {r["step"]: r["lr"] for r in map(json.loads, read_lines(tmp_path / "matched/metrics.jsonl"))
              if "lr" in r}
    d_model = load_model(tmp_path / "m.pt").d_model
    expected = pruned_model_lr(schedule["baseline_training"], schedule["fine_tuning"], "constant", 4, 2, d_model)
    assert logged and all(value == pytest.approx(expected(step)) for step, value in logged.items())
    plain = train_translation_model(*files, model, {**training(1), "dev_bleu_sentences": 0}, False,
                                    str(tmp_path / "plain"), str(tmp_path / "p.pt"), str(tmp_path / "p.json"),
                                    log=lambda m: None)
    assert plain["lr_schedule"] == "noam"


def test_seed_spread_states_each_baselines_plateau_and_the_controls_nll_gain(tmp_path):
    """The plateau rule read from each seed's training record, and control - baseline in token NLL
    with its paired interval, seed by seed (issue 61)."""
    import numpy as np

    from headcount.report.pruning_report import seed_spread
    from headcount.training.perplexity import paired_bootstrap_nll

    rng = np.random.default_rng(7)
    tokens = rng.integers(4, 10, size=50)
    files = {}
    for seed, losses in ((1, [4.0, 3.0, 2.5, 2.499, 2.498, 2.497]), (2, [4.0, 3.0, 2.5, 2.2, 2.0, 1.8])):
        evaluations = [[500 * (i + 1), x] for i, x in enumerate(losses)]
        _write_json(tmp_path / f"training{seed}.json", {"dev_losses": evaluations})
        for system, shift in (("baseline", 0.0), ("control", -0.05 * seed)):
            _write_json(tmp_path / f"{system}{seed}.json", {"bleu": 30.0, "bleu_signature": "nrefs:1"})
            pd.DataFrame({"sentence": range(50), "nll": tokens * (2.0 + shift) + rng.random(50), "tokens": tokens}
                         ).to_csv(tmp_path / f"{system}{seed}.nll.tsv", sep="\t", index=False)
            files[system, seed] = tmp_path / f"{system}{seed}.nll.tsv"
    table = seed_spread("toy", [1, 2], ["enc"], [str(tmp_path / f"baseline{s}.json") for s in (1, 2)],
                        [str(tmp_path / f"control{s}.json") for s in (1, 2)], str(tmp_path / "spread.tsv"),
                        str(tmp_path / "spread.md"), log=lambda m: None,
                        baseline_training=[str(tmp_path / f"training{s}.json") for s in (1, 2)],
                        baseline_nll=[str(files["baseline", s]) for s in (1, 2)],
                        control_nll=[str(files["control", s]) for s in (1, 2)]).set_index("system")
    # seed 1: 2.5 -> 2.497 over the last three evaluations is below 0.01: plateau at step 3000; seed 2 still falls
    steps = table.loc["baseline plateau step"]
    assert steps["seed_1"] == 3000 and pd.isna(steps["seed_2"])
    assert list(table.loc["baseline at plateau", ["seed_1", "seed_2"]]) == [1.0, 0.0]
    for seed in (1, 2):
        c, b = (pd.read_csv(files[s, seed], sep="\t") for s in ("control", "baseline"))
        expected = paired_bootstrap_nll(c["nll"], b["nll"], b["tokens"])
        row = table.loc["control enc - baseline, NLL"]
        assert (row[f"seed_{seed}"], row[f"seed_{seed}_low"], row[f"seed_{seed}_high"]) == pytest.approx(
            (expected["difference"], expected["low"], expected["high"]))
    text = (tmp_path / "spread.md").read_text()
    assert "| baseline at plateau | yes | no |" in text and "| baseline plateau step | 3000 |  |" in text
