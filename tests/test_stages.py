"""Stage functions over files: what the workflow's scripts call."""

import os
import shutil

import pytest
from conftest import toy_corpus

from headcount.data.subwords import train_bpe
from headcount.io import read_lines, write_lines
from headcount.pipeline.training_runs import train_translation_model
from headcount.pipeline.translation import translate_file

MODEL = dict(d_model=16, n_heads=4, d_ff=32, enc_layers=1, dec_layers=1, dropout=0.0, attn_dropout=0.0,
             relu_dropout=0.0, tie_target_embeddings=True, max_len=64)


def training(max_steps):
    return dict(max_tokens=200, max_steps=max_steps, warmup_steps=5, lr_scale=0.5, adam_betas=[0.9, 0.98],
                adam_eps=1e-9, label_smoothing=0.1, clip_norm=1.0, log_interval=5, eval_interval=10,
                checkpoint_interval=5, dev_bleu_sentences=10, select="last", seed=1, precision="fp32",
                device="cpu", threads=1)


@pytest.mark.slow
def test_a_run_resumes_after_its_files_were_moved_and_touched(tmp_path):
    data = tmp_path / "a"
    src, tgt = toy_corpus(200, seed=1)
    write_lines(data / "train.src.txt", src)
    write_lines(data / "train.tgt.txt", tgt)
    write_lines(data / "dev.src.txt", src[:10])
    write_lines(data / "dev.tgt.txt", tgt[:10])
    for side in ("src", "tgt"):
        train_bpe(data / f"train.{side}.txt", data / f"{side}.model", vocab_size=60)

    def run(folder, steps, log):
        return train_translation_model(
            str(folder / "train.src.txt"), str(folder / "train.tgt.txt"), str(folder / "dev.src.txt"),
            str(folder / "dev.tgt.txt"), str(folder / "src.model"), str(folder / "tgt.model"), MODEL,
            training(steps), False, str(folder / "work"), str(folder / "model.pt"), str(folder / "summary.json"),
            log=log)

    run(data, 10, log=lambda m: None)
    moved = tmp_path / "b"
    shutil.copytree(data, moved)  # new paths, new modification times, same content
    for path in moved.iterdir():
        if path.is_file():
            os.utime(path, (1, 1))
    messages = []
    summary = run(moved, 15, log=messages.append)
    assert any("resuming from" in m and "at step 10" in m for m in messages), messages
    assert summary["steps"] == 15

    translate_file(str(moved / "model.pt"), str(moved / "src.model"), str(moved / "tgt.model"),
                   str(moved / "dev.src.txt"), str(tmp_path / "hyp.txt"),
                   dict(beam=2, alpha=0.6, max_len_a=1.5, max_len_b=5, max_tokens=500), device="cpu",
                   log=lambda m: None)
    assert len(read_lines(tmp_path / "hyp.txt")) == 10
