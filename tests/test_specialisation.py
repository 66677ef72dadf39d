"""Head specialisation over training: per-snapshot statistics against explicit computations,
and the snapshot loop on a tiny training run."""

import json
import random

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_config, toy_corpus

from headcount.analysis.importance import dev_batches
from headcount.analysis.roles.statistics import PositionalStats
from headcount.analysis.specialisation import layer_column, layer_columns, model_statistics
from headcount.data.subwords import BOS_ID, EOS_ID, SPECIAL_IDS, Segmenter, train_bpe
from headcount.io import HeadcountError, read_lines, write_lines
from headcount.models.loading import load_model
from headcount.models.lrp import step_relevance
from headcount.models.transformer import Transformer
from headcount.pipeline.specialisation import specialisation_over_training
from headcount.training.decode import translate
from headcount.training.evaluate import corpus_bleu

torch.set_num_threads(1)


def sentences(n, vocab, seed, low=3, high=9):
    rng = random.Random(seed)
    return [[rng.randrange(4, vocab) for _ in range(rng.randint(low, high))] for _ in range(n)]


def planted_model():
    """A tiny random model whose encoder layer 2, head 3 attends only to itself (a perfect
    positional head, offset 0, confidence 1) and whose encoder layer 1 keeps head 2 alone (the
    others gated off: it gets all of that layer's LRP relevance)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config()).eval()
    mask = torch.ones(2, 4)
    mask[0] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    model.set_head_mask({"enc_self": mask})
    def planted_map(module, inputs, output):  # the map layer 2 reports (the analyses read it as it is made)
        out, probs = output
        if probs is None:
            return None
        self_only = torch.eye(probs.shape[-1]).expand_as(probs[:, 2])
        return out, torch.cat([probs[:, :2], self_only[:, None], probs[:, 3:]], dim=1)

    model.encoder_layers[1].self_attn.register_forward_hook(planted_map)  # confidence and positional statistics
    return model


def test_statistics_of_a_model_with_planted_heads_match_an_explicit_computation():
    model = planted_model()
    src, ref, hyp = sentences(7, 23, 1), sentences(7, 19, 2, 1, 6), sentences(7, 19, 3, 1, 6)
    row = model_statistics(model, dev_batches(src, ref, max_tokens=40, special=model.special),
                           dev_batches(src, hyp, max_tokens=40, special=model.special))

    # One sentence at a time, no padding: src + EOS, BOS + target.
    n_layers, n_heads = 2, 4
    conf_sum, conf_queries = np.zeros((n_layers, n_heads)), 0
    positional = PositionalStats()
    lrp_sum, lrp_steps = {}, 0
    for s, r, h in zip(src, ref, hyp):
        s_t = torch.tensor([s + [EOS_ID]])
        with torch.no_grad():
            _, attentions = model(s_t, torch.tensor([[BOS_ID] + r]), need_weights=True)
        n = len(s)  # queries and keys: the subwords, EOS left out
        for layer, p in enumerate(attentions["enc_self"]):
            conf_sum[layer] += p[0, :, :n, :n].max(dim=-1).values.sum(dim=-1).numpy()
        conf_queries += n
        positional.update([p[:, :, :n + 1, :n + 1] for p in attentions["enc_self"]], [n + 1])
        result = step_relevance(model, s_t, torch.tensor([[BOS_ID] + h]))
        for kind, r_k in result.heads.items():  # (T, 1, L, H): normalise each step over a layer's heads
            shares = (r_k[:, 0] / r_k[:, 0].sum(dim=-1, keepdim=True)).double().sum(dim=0)
            lrp_sum[kind] = lrp_sum.get(kind, 0) + shares
        lrp_steps += len(h) + 1

    confidence = conf_sum / conf_queries
    assert confidence[1, 2] == pytest.approx(1.0)  # the planted head
    for layer in range(n_layers):
        assert row[layer_column("confidence", "enc_self", layer)] == pytest.approx(confidence[layer].mean())
        assert row[layer_column("lrp_concentration", "enc_self", layer)] == pytest.approx(
            float(lrp_sum["enc_self"][layer].max() / lrp_steps))
    for layer in range(2):
        assert row[layer_column("lrp_concentration", "dec_enc", layer)] == pytest.approx(
            float(lrp_sum["dec_enc"][layer].max() / lrp_steps))
    assert row[layer_column("lrp_concentration", "enc_self", 0)] == pytest.approx(1.0)  # one head left
    assert row[layer_column("lrp_concentration", "enc_self", 1)] < 0.9
    assert row["lrp_steps"] == lrp_steps

    per_head = positional.table().groupby("layer")["fraction"].max()
    assert row[layer_column("positional_share", "enc_self", 1)] == pytest.approx(1.0)  # the planted head
    assert row[layer_column("positional_share", "enc_self", 0)] == pytest.approx(per_head[0])
    assert per_head[0] < 1.0
    assert row["positional_share"] == pytest.approx(1.0)
    assert row["n_heads"] == 4


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny baseline trained with snapshots every 5 steps, evaluated every 10, to step 15."""
    from headcount.pipeline.training_runs import train_translation_model

    root = tmp_path_factory.mktemp("snapshots")
    src, tgt = toy_corpus(200, seed=1)
    dev_src, dev_tgt = toy_corpus(12, seed=2)
    write_lines(root / "train.src.txt", src)
    write_lines(root / "train.tgt.txt", tgt)
    write_lines(root / "dev.src.txt", dev_src)
    write_lines(root / "dev.tgt.txt", dev_tgt)
    for side in ("src", "tgt"):
        train_bpe(root / f"train.{side}.txt", root / f"{side}.model", vocab_size=60)
    model = dict(d_model=16, n_heads=4, d_ff=32, enc_layers=2, dec_layers=1, dropout=0.0, attn_dropout=0.0,
                 relu_dropout=0.0, tie_target_embeddings=True, max_len=64)
    training = dict(max_tokens=200, max_steps=15, warmup_steps=5, lr_scale=0.5, adam_betas=[0.9, 0.98],
                    adam_eps=1e-9, label_smoothing=0.1, clip_norm=1.0, log_interval=5, eval_interval=10,
                    checkpoint_interval=5, snapshot_interval=5, dev_bleu_sentences=10, select="last", seed=1,
                    precision="fp32", device="cpu", threads=1)
    files = {k: str(root / f"{k.replace('_', '.')}.txt") for k in ("train_src", "train_tgt", "dev_src", "dev_tgt")}
    summary = train_translation_model(**files, src_spm=str(root / "src.model"), tgt_spm=str(root / "tgt.model"),
                                      model_settings=model, train_settings=training, lowercase=False,
                                      work_dir=str(root / "work"), model_out=str(root / "model.pt"),
                                      summary_out=str(root / "training.json"), log=lambda m: None)
    return root, summary


def run_statistics(root, out):
    return specialisation_over_training(
        str(root / "training.json"), str(root / "src.model"), str(root / "tgt.model"), str(root / "dev.src.txt"),
        str(root / "dev.tgt.txt"), str(root / "dev.src.txt"), str(root / "dev.tgt.txt"), max_sentences=8,
        dev_bleu_sentences=10, lrp_rule="ding", max_tokens=200, lowercase=False, out_csv=str(out / "snapshots.csv"),
        out_figure=str(out / "specialisation.png"), device="cpu", log=lambda m: None)


@pytest.mark.slow
def test_the_snapshots_of_a_tiny_run_give_one_row_each_with_dev_bleu(tiny_run, tmp_path):
    root, summary = tiny_run
    snapshots = root / "work" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == ["step_10.pt", "step_15.pt", "step_5.pt"]
    assert [s["step"] for s in summary["snapshots"]] == [5, 10, 15]

    run_statistics(root, tmp_path)
    table = pd.read_csv(tmp_path / "snapshots.csv")
    assert table["step"].tolist() == [5, 10, 15]
    assert list(layer_columns(table, "confidence", "enc_self")) == [1, 2]
    assert list(layer_columns(table, "lrp_concentration", "dec_self")) == [1]
    metrics = [json.loads(line) for line in (root / "work" / "metrics.jsonl").read_text().splitlines()]
    evaluated = {r["step"]: r["dev_bleu"] for r in metrics if "dev_bleu" in r}
    assert set(evaluated) == {10, 15}
    assert table["dev_bleu_from"].tolist() == ["greedy", "metrics", "metrics"]
    assert table["dev_bleu"].iloc[1:].tolist() == pytest.approx([evaluated[10], evaluated[15]], abs=1e-5)
    # Step 5 was not evaluated by training: greedy BLEU on its first 10 dev sentences, as training does.
    model = load_model(snapshots / "step_5.pt")
    src_seg, tgt_seg = Segmenter(str(root / "src.model")), Segmenter(str(root / "tgt.model"))
    hyps = translate(model, src_seg.encode(read_lines(root / "dev.src.txt")[:10]), beam=1)
    expected = corpus_bleu(tgt_seg.decode(hyps), read_lines(root / "dev.tgt.txt")[:10])
    assert table["dev_bleu"].iloc[0] == pytest.approx(expected, abs=1e-5)
    # The last snapshot is the trained model (select: last): same statistics.
    last = model_statistics(load_model(root / "model.pt"), *statistics_batches(root, load_model(root / "model.pt")))
    assert table.iloc[-1][list(last)].astype(float).tolist() == pytest.approx(list(last.values()), abs=1e-5)
    figure = (tmp_path / "specialisation.png").read_bytes()
    assert figure.startswith(b"\x89PNG") and len(figure) > 10_000


def statistics_batches(root, model):
    src_seg, tgt_seg = Segmenter(str(root / "src.model")), Segmenter(str(root / "tgt.model"))
    src = src_seg.encode(read_lines(root / "dev.src.txt")[:8])
    ref = tgt_seg.encode(read_lines(root / "dev.tgt.txt")[:8])
    hyps = translate(model, src, beam=1, max_tokens=8000)
    return dev_batches(src, ref, 200, special=SPECIAL_IDS), dev_batches(src, hyps, 200, special=SPECIAL_IDS)


def test_a_run_without_snapshots_is_named_with_the_fix(tmp_path):
    (tmp_path / "training.json").write_text(json.dumps({"steps": 10}))
    with pytest.raises(HeadcountError, match="training.snapshot_interval"):
        run_statistics(tmp_path, tmp_path)
