"""Train the tiny positive-control models that tests/test_control.py analyses, and write them as a
committed test fixture (tests/data/control_tiny/, a few hundred kB):

    .venv/bin/python tools/make_control_fixture.py [--out tests/data/control_tiny]

Two Transformers (d_model 64, 4 heads, one decoder layer, no dropout) trained by headcount's own loop
on 4,000 pairs of the synthetic language (seed 1):
- `syntax`: a small lexicon without names, 3 encoder layers, 3,000 steps: the planted syntactic heads;
- `join`: the full syllable grid without names, 2 encoder layers, 1,500 steps: the head that joins a
  word's two pieces.

Each folder holds the encoder side of the model (source embeddings, encoder layers and norm: all
that the role analyses read) in float16 (safetensors: no pickle), and recipe.json (the
grammar, the model and training settings, the fingerprints of the two sentencepiece models, the torch
version and the CPU's instruction sets it was trained with). The tests regenerate the corpus from the
grammar and seed and the subword models from the corpus (`train_control_subwords`; a sentencepiece
model file is 240 kB, mostly its normalisation table, so it is not stored), and check both against
recipe.json: a changed recipe or segmentation fails until the fixture is made again. Training takes
about 4 minutes on one core; what it learns depends on the CPU's kernels, which is why the tests read
a stored model instead of training one. The fixture in the repository was made on an AVX2-only AMD
EPYC (recipe.json's cpu_flags).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from headcount.data.synthetic_language import PIECE_LENGTH, Grammar, write_corpus  # noqa: E402

SIZES = {"train": 4000, "dev": 200}
CORPUS_SEED, TORCH_SEED, BPE_VOCAB = 1, 1, 300
RECIPES = {
    "syntax": {"grammar": {"nouns": 6, "verbs": 3, "adjectives": 3, "adverbs": 3, "names": 300, "name_rate": 0.0},
               "enc_layers": 3, "steps": 3000},
    "join": {"grammar": {"name_rate": 0.0}, "enc_layers": 2, "steps": 1500},
}
MODEL = {"d_model": 64, "n_heads": 4, "d_ff": 128, "dec_layers": 1, "dropout": 0.0, "attn_dropout": 0.0,
         "relu_dropout": 0.0, "max_len": 128}
TRAINING = {"max_tokens": 800, "warmup_steps": 60, "lr_scale": 0.5, "label_smoothing": 0.0, "dev_bleu_sentences": 0,
            "select": "last", "precision": "fp32", "device": "cpu"}


def corpus_paths(folder: Path) -> dict:
    return {split: {side: str(folder / f"{split}.{side}.txt") for side in ("src", "tgt")}
            | {"conllu": str(folder / f"{split}.conllu")} for split in SIZES}


def write_control_corpus(name: str, folder: Path) -> dict:
    """The recipe's corpus (train and dev, text and gold parses) under folder -> its paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = corpus_paths(folder)
    write_corpus(Grammar(**RECIPES[name]["grammar"]), CORPUS_SEED, SIZES, paths, str(folder / "stats.json"),
                 log=lambda m: None)
    return paths


def model_config(name: str, src_vocab: int, tgt_vocab: int):
    from headcount.models.transformer import ModelConfig

    return ModelConfig(src_vocab=src_vocab, tgt_vocab=tgt_vocab, enc_layers=RECIPES[name]["enc_layers"], **MODEL)


def recipe(name: str) -> dict:
    """What recipe.json must say for the fixture `name` to be this script's output."""
    return {"name": name, "sizes": SIZES, "corpus_seed": CORPUS_SEED, "torch_seed": TORCH_SEED, "bpe_vocab": BPE_VOCAB,
            "max_piece_length": PIECE_LENGTH, **RECIPES[name], "model": MODEL, "training": TRAINING}


def train_control_subwords(paths: dict, folder: Path, sides=("src", "tgt")) -> dict:
    """The recipe's sentencepiece models of the corpus at `paths`, written to folder -> {side: path}."""
    from headcount.data.subwords import train_bpe

    models = {side: folder / f"{side}.model" for side in sides}
    for side, model in models.items():
        train_bpe(paths["train"][side], model, BPE_VOCAB, max_piece_length=PIECE_LENGTH)
    return models


ENCODER_SIDE = ("src_embed.", "encoder_layers.", "encoder_norm.")


def encoder_side(state: dict) -> dict:
    """The weights the encoder's analyses read, in float16: the fixture stays a few hundred kB."""
    return {k: v.detach().to(torch.float16).contiguous() for k, v in state.items() if k.startswith(ENCODER_SIDE)}


def train_one(name: str, out: Path, work: Path) -> dict:
    from safetensors.torch import save_file

    from headcount.data.subwords import Segmenter, pieces_fingerprint
    from headcount.io import read_lines
    from headcount.models.transformer import Transformer
    from headcount.training.loop import Corpus, DevSet, TrainConfig, train

    paths = write_control_corpus(name, work / "corpus")
    out.mkdir(parents=True, exist_ok=True)
    models = train_control_subwords(paths, work)
    segmenters = {side: Segmenter(model) for side, model in models.items()}
    data = {split: [segmenters[side].encode(read_lines(paths[split][side])) for side in ("src", "tgt")]
            for split in SIZES}
    torch.manual_seed(TORCH_SEED)
    cfg = model_config(name, len(segmenters["src"]), len(segmenters["tgt"]))
    model = Transformer(cfg)
    steps = RECIPES[name]["steps"]
    train(model, TrainConfig(max_steps=steps, log_interval=steps, eval_interval=steps, checkpoint_interval=steps,
                             **TRAINING), Corpus(*data["train"]), DevSet(*data["dev"]), work / "train",
          log=lambda m: None)
    save_file(encoder_side(model.state_dict()), str(out / "model.safetensors"))
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    made = {**recipe(name), "model_config": asdict(cfg), "torch": torch.__version__,
            "subwords": {side: pieces_fingerprint(model) for side, model in models.items()},
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2")))}
    (out / "recipe.json").write_text(json.dumps(made, indent=1) + "\n")
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "tests/data/control_tiny"))
    ap.add_argument("--only", choices=sorted(RECIPES), help="make one of the two models")
    ap.add_argument("--work", default="/tmp/control_fixture_work")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in [args.only] if args.only else sorted(RECIPES):
        made = train_one(name, Path(args.out) / name, Path(args.work) / name)
        print(f"{name}: {made['steps']} steps, {made['enc_layers']} encoder layers -> {Path(args.out) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
