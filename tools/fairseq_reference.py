"""Train a fairseq transformer with fairseq's own code, and record fairseq's own outputs for it.

    python tools/fairseq_reference.py --out DIR --synthetic 3000 [--arch-preset tiny-pre] [--max-update 300]
    python tools/fairseq_reference.py --out DIR --text-dir results/multi30k_en_de/data \
        --spm-src results/multi30k_en_de/subwords/src.model --spm-tgt results/multi30k_en_de/subwords/tgt.model \
        --arch-preset multi30k --max-update 2400

What it does (issue 36, item 3a): headcount reads fairseq checkpoints (models/fairseq.py) without
fairseq installed; this tool produces checkpoints with fairseq itself, and what fairseq computes
with them, so that headcount's reading can be checked against the toolkit's own numbers.

1. Text: a seeded synthetic corpus (data.synthetic_language; what the test suite's cached models use)
   or the train/dev text of a prepared headcount experiment. Subwords: sentencepiece models trained
   here (--spm-vocab) or given (--spm-src/--spm-tgt); fairseq's dictionaries list every piece.
2. fairseq-preprocess, then fairseq-train with the preset's architecture flags (resumable: fairseq
   starts again from checkpoint_last.pt). fairseq runs in its own environment
   (benchmarks/fairseq_side_by_side.py makes it: fairseq-fixed built without build isolation).
3. A worker in fairseq's environment loads checkpoint_last.pt with fairseq's checkpoint_utils and
   writes reference.pt: for the first --reference-sentences dev sentences (one at a time, so no
   padding enters), the source and reference ids from fairseq's binarised data, fairseq's
   SequenceGenerator output with beam 1 (greedy), every head's attention probabilities of every layer
   (MultiheadAttention asked for per-head weights), each sentence's log-likelihood of its reference,
   and the same log-likelihoods with some heads' output-projection columns zeroed. It also writes
   checkpoint_slim.pt: checkpoint_last.pt without the optimizer state (what the tests keep).

The files a headcount experiment needs are then: checkpoints/checkpoint_last.pt, data-bin/dict.*.txt,
spm/{src,tgt}.model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAIRSEQ_VENV = REPO / "benchmarks" / ".fairseq-venv"

# Architectures: every variant headcount's reader must handle appears in one of them.
PRESETS = {
    # pre-LN, fairseq's sinusoids, separate vocabularies, tied target embeddings, ReLU
    "tiny-pre": ["--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
                 "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                 "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                 "--encoder-normalize-before", "--decoder-normalize-before", "--share-decoder-input-output-embed"],
    # post-LN, learned positions, one vocabulary shared by all embeddings, embedding LayerNorm, GELU,
    # no embedding scale
    "tiny-post": ["--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
                  "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                  "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
                  "--encoder-learned-pos", "--decoder-learned-pos", "--share-all-embeddings",
                  "--layernorm-embedding", "--activation-fn", "gelu", "--no-scale-embedding",
                  "--max-source-positions", "128", "--max-target-positions", "128"],
    # fairseq's own transformer defaults: post-LN, sinusoids, separate vocabularies and an output
    # layer of its own, ReLU, scaled embeddings; the architecture of the WMT19 models, which
    # transformers ports as FSMT (tests/test_fsmt_trained.py converts it to FSMT and checks that port)
    "tiny-fsmt": ["--arch", "transformer", "--encoder-layers", "2", "--decoder-layers", "2",
                  "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                  "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    # headcount's default model (benchmarks/fairseq_side_by_side.py): 6+6, d256, 8 heads, pre-LN
    "multi30k": ["--arch", "transformer", "--encoder-layers", "6", "--decoder-layers", "6",
                 "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                 "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "8", "--decoder-attention-heads", "8",
                 "--encoder-normalize-before", "--decoder-normalize-before", "--share-decoder-input-output-embed",
                 "--relu-dropout", "0.0"],
}
TINY_TRAINING = ["--max-tokens", "800", "--lr", "3e-3", "--warmup-updates", "100", "--dropout", "0.1",
                 "--attention-dropout", "0.1"]
# The default experiment's recipe (headcount's config/config.yaml): Noam peak d^-0.5 * 800^-0.5.
MULTI30K_TRAINING = ["--max-tokens", "1600", "--lr", str(256**-0.5 * 800**-0.5), "--warmup-updates", "800",
                     "--dropout", "0.1", "--attention-dropout", "0.1", "--required-batch-size-multiple", "1"]


# fairseq's checkpoint_utils loads its own checkpoints with torch.load's old default, which torch
# 2.6+ changed to weights-only; fairseq (resuming, and the worker) reads files it wrote itself.
FAIRSEQ_LOADS = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


def log(message: str) -> None:
    print(message, flush=True)


def run(cmd: list[str], **kwargs) -> None:
    log("$ " + " ".join(map(str, cmd)))
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


# --------------------------------------------------------------------------------------------
# Text and subwords (headcount's environment)


def write_text(args, out: Path) -> dict[str, Path]:
    """train/valid text of both sides under out/raw; returns their paths by name."""
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    paths = {f"{split}.{side}": raw / f"{split}.{side}" for split in ("train", "valid") for side in ("src", "tgt")}
    if all(p.exists() for p in paths.values()):
        return paths
    if args.synthetic:
        sys.path.insert(0, str(REPO / "src"))
        from headcount.data.synthetic_language import Grammar, generate

        sizes = {"train": args.synthetic, "dev": args.reference_sentences * 2}
        for split, sentences in generate(Grammar(names=200), args.seed, sizes):
            name = "train" if split == "train" else "valid"
            paths[f"{name}.src"].write_text("".join(s.source + "\n" for s in sentences), encoding="utf-8")
            paths[f"{name}.tgt"].write_text("".join(" ".join(s.target) + "\n" for s in sentences), encoding="utf-8")
    else:
        text = Path(args.text_dir)
        for side in ("src", "tgt"):
            shutil.copy(text / f"train.{side}.txt", paths[f"train.{side}"])
            shutil.copy(text / f"dev.{side}.txt", paths[f"valid.{side}"])
    return paths


def subword_models(args, out: Path, paths: dict[str, Path]) -> dict[str, Path]:
    import sentencepiece as spm

    spm_dir = out / "spm"
    spm_dir.mkdir(parents=True, exist_ok=True)
    models = {}
    joint = args.arch_preset == "tiny-post"  # --share-all-embeddings needs one vocabulary
    for side in ("src", "tgt"):
        model = spm_dir / f"{side}.model"
        given = getattr(args, f"spm_{side}")
        if given:
            shutil.copy(given, model)
        elif not model.exists():
            inputs = [paths[f"train.{s}"] for s in (("src", "tgt") if joint else (side,))]
            if joint and side == "tgt":
                shutil.copy(spm_dir / "src.model", model)
            else:
                spm.SentencePieceTrainer.train(
                    input=",".join(map(str, inputs)), model_prefix=str(model.with_suffix("")),
                    vocab_size=args.spm_vocab, character_coverage=1.0, model_type="unigram",
                    pad_id=-1, bos_id=-1, eos_id=-1, unk_id=0, hard_vocab_limit=False, minloglevel=2,
                    # the synthetic text is ASCII: no normalisation table (5 KB models, not 240 KB)
                    normalization_rule_name="identity" if args.synthetic else "nmt_nfkc")
        models[side] = model
    return models


def binarise(python: Path, out: Path, paths: dict[str, Path], models: dict[str, Path], joint: bool) -> Path:
    import sentencepiece as spm

    text, bin_dir = out / "text", out / "data-bin"
    if (bin_dir / "train.src-tgt.src.bin").exists():
        return bin_dir
    text.mkdir(parents=True, exist_ok=True)
    for side in ("src", "tgt"):
        sp = spm.SentencePieceProcessor(model_file=str(models[side]))
        specials = {i for i in range(sp.get_piece_size()) if sp.is_control(i) or sp.is_unknown(i)}
        with open(text / f"dict.{side}.txt", "w", encoding="utf-8") as f:  # every piece, in the model's order
            for i in range(sp.get_piece_size()):
                if i not in specials:
                    f.write(f"{sp.id_to_piece(i)} {sp.get_piece_size() - i}\n")
        for split in ("train", "valid"):
            lines = paths[f"{split}.{side}"].read_text(encoding="utf-8").splitlines()
            with open(text / f"{split}.{side}", "w", encoding="utf-8") as f:
                for pieces in sp.encode(lines, out_type=str):
                    f.write(" ".join(pieces) + "\n")
    dicts = (["--joined-dictionary", "--srcdict", text / "dict.src.txt"] if joint else
             ["--srcdict", text / "dict.src.txt", "--tgtdict", text / "dict.tgt.txt"])
    run([python.parent / "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", text / "train", "--validpref", text / "valid", *dicts, "--destdir", bin_dir,
         "--workers", "1"])
    return bin_dir


def train(python: Path, args, out: Path, bin_dir: Path) -> None:
    ckpt = out / "checkpoints"
    recipe = MULTI30K_TRAINING if args.arch_preset == "multi30k" else TINY_TRAINING
    cmd = [python.parent / "fairseq-train", bin_dir, "--source-lang", "src", "--target-lang", "tgt",
           *PRESETS[args.arch_preset], *recipe,
           "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", "1e-9", "--clip-norm", "1.0",
           "--lr-scheduler", "inverse_sqrt", "--warmup-init-lr", "0", "--criterion",
           "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-update", str(args.max_update),
           "--seed", str(args.seed), "--save-dir", ckpt, "--save-interval-updates", str(args.save_every),
           "--keep-interval-updates", str(args.keep_checkpoints), "--no-epoch-checkpoints",
           *(["--cpu"] if args.device == "cpu" else []), "--num-workers", "0", "--log-format", "simple",
           "--log-interval", "50", "--disable-validation"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), **FAIRSEQ_LOADS}
    run(cmd, env=env)


# --------------------------------------------------------------------------------------------
# The worker: fairseq's own outputs (fairseq's environment)

# The heads whose output-projection columns the masked log-likelihoods zero: (type, layer, head).
MASKED_HEADS = [("enc_self", 0, 1), ("enc_self", 1, 3), ("dec_self", 1, 0), ("dec_enc", 0, 2)]


def worker(out: Path, n: int, max_len_a: float, max_len_b: int, checkpoint: str = "checkpoint_last.pt",
           reference_name: str = "reference.pt", attention_sentences: int = 5) -> None:
    import torch
    from fairseq import checkpoint_utils
    from fairseq.sequence_generator import SequenceGenerator

    torch.manual_seed(0)
    ckpt = out / "checkpoints" / checkpoint
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(ckpt)], arg_overrides={"data": str(out / "data-bin")})
    model = models[0].eval()
    task.load_dataset("valid")
    data = task.dataset("valid")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    eos = tgt_dict.eos()

    modules = {"enc_self": [layer.self_attn for layer in model.encoder.layers],
               "dec_self": [layer.self_attn for layer in model.decoder.layers],
               "dec_enc": [layer.encoder_attn for layer in model.decoder.layers]}
    recorded: dict[str, list] = {}

    def recording(kind, i, module):
        original = module.forward

        # fairseq hands self-attention without a cache to torch's fused function, which can only
        # average the heads; this flag (meant for other dimension checks) sends it down fairseq's own
        # implementation, which returns every head's probabilities.
        module.skip_embed_dim_check = True

        def forward(*a, **kw):
            kw["need_weights"], kw["need_head_weights"] = True, True
            output, weights = original(*a, **kw)
            recorded.setdefault(kind, {})[i] = weights.detach().clone()  # (H, B, Tq, Tk)
            return output, weights

        return forward

    def teacher_forced(src, tgt):
        prev = torch.cat([torch.tensor([eos]), tgt[:-1]])[None]  # fairseq: EOS first, then the reference
        with torch.no_grad():
            logits, _ = model(src[None], torch.tensor([len(src)]), prev)
        logp = torch.log_softmax(logits.float(), dim=-1)[0]
        return logp.gather(1, tgt[:, None])[:, 0]  # (T,) each reference token's log-probability

    generator = SequenceGenerator([model], tgt_dict, beam_size=1, max_len_a=max_len_a, max_len_b=max_len_b)
    raw = {side: (out / "raw" / f"valid.{side}").read_text(encoding="utf-8").splitlines() for side in ("src", "tgt")}
    reference = {"sources": [], "targets": [], "greedy": [], "loglik": [], "loglik_masked": [], "attention": [],
                 "masked_heads": MASKED_HEADS, "max_len_a": max_len_a, "max_len_b": max_len_b,
                 "src_text": [], "tgt_text": [], "pad": src_dict.pad(), "eos": eos, "bos": src_dict.bos(),
                 "unk": src_dict.unk()}
    for idx in range(min(n, len(data))):
        item = data[idx]
        src, tgt = item["source"], item["target"]  # both end with EOS
        reference["sources"].append(src.tolist())
        reference["targets"].append(tgt.tolist())
        reference["src_text"].append(raw["src"][idx])  # the line fairseq-preprocess binarised (segmented first)
        reference["tgt_text"].append(raw["tgt"][idx])
        sample = {"net_input": {"src_tokens": src[None], "src_lengths": torch.tensor([len(src)])}}
        with torch.no_grad():
            hyp = generator.generate([model], sample)[0][0]["tokens"]
        reference["greedy"].append(hyp.tolist())  # ends with EOS
        reference["loglik"].append(teacher_forced(src, tgt))  # per token; a sentence's is the sum
        if idx < attention_sentences:  # every head's probabilities, fairseq's MultiheadAttention computing them
            originals = {}
            for kind, layers in modules.items():
                for i, m in enumerate(layers):
                    originals[(kind, i)] = m.forward
                    m.forward = recording(kind, i, m)
            recorded.clear()
            teacher_forced(src, tgt)
            for (kind, i), forward in originals.items():
                modules[kind][i].forward = forward
                modules[kind][i].skip_embed_dim_check = False
            reference["attention"].append({kind: [recorded[kind][i][:, 0] for i in range(len(layers))]
                                           for kind, layers in modules.items()})  # (H, Tq, Tk) per layer
    saved = {}
    for kind, layer, head in MASKED_HEADS:
        proj = modules[kind][layer].out_proj
        dh = proj.weight.shape[1] // modules[kind][layer].num_heads
        saved.setdefault((kind, layer), proj.weight.detach().clone())
        with torch.no_grad():
            proj.weight[:, head * dh:(head + 1) * dh] = 0
    for src, tgt in zip(reference["sources"], reference["targets"]):
        reference["loglik_masked"].append(teacher_forced(torch.tensor(src), torch.tensor(tgt)))
    for (kind, layer), weight in saved.items():
        with torch.no_grad():
            modules[kind][layer].out_proj.weight.copy_(weight)
    reference["checkpoint"] = checkpoint
    torch.save(reference, out / reference_name)
    if reference_name != "reference.pt":  # a later checkpoint's record: the cached test models stay as they are
        log(f"{reference_name}: {len(reference['sources'])} sentences of {checkpoint}")
        return
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state["last_optimizer_state"] = None
    torch.save(state, out / "checkpoint_slim.pt")
    log(f"reference.pt: {len(reference['sources'])} sentences; checkpoint_slim.pt written")
    omegaconf_copy(state, out / "omegaconf_cfg.pt")


def omegaconf_copy(state: dict, path: Path) -> None:
    """The checkpoint's configuration as omegaconf containers, as fairseq 0.10 pickled `cfg`, with
    the encoder's width in a nested group as fairseq's dataclass configs have it (no weights): what
    headcount's reader must read without omegaconf."""
    import torch
    from omegaconf import OmegaConf

    model = dict(vars(state["cfg"]["model"]))
    model["encoder"] = {"embed_dim": model.pop("encoder_embed_dim")}
    cfg = OmegaConf.create({"model": model, "task": dict(state["cfg"]["task"])})
    torch.save({"cfg": cfg, "model": {}}, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--synthetic", type=int, default=0, help="train on this many synthetic sentence pairs")
    ap.add_argument("--text-dir", help="a prepared experiment's data/ (train.{src,tgt}.txt, dev.{src,tgt}.txt)")
    ap.add_argument("--spm-src")
    ap.add_argument("--spm-tgt")
    ap.add_argument("--spm-vocab", type=int, default=120)
    ap.add_argument("--arch-preset", choices=sorted(PRESETS), default="tiny-pre")
    ap.add_argument("--max-update", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=200)
    ap.add_argument("--keep-checkpoints", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where fairseq-train trains")
    ap.add_argument("--reference-sentences", type=int, default=20)
    ap.add_argument("--max-len-a", type=float, default=1.5)
    ap.add_argument("--max-len-b", type=int, default=9, help="fairseq's; headcount's greedy_search takes one more "
                    "(fairseq counts EOS beyond max_len, headcount within)")
    ap.add_argument("--fairseq-venv", default=str(FAIRSEQ_VENV))
    ap.add_argument("--checkpoint", default="checkpoint_last.pt",
                    help="which of --out's checkpoints/ the reference is recorded for")
    ap.add_argument("--reference-only", metavar="NAME",
                    help="train nothing: record fairseq's outputs for --checkpoint of an existing --out into NAME")
    ap.add_argument("--attention-sentences", type=int, default=5, help="sentences whose attention is recorded")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    if args.worker:
        worker(out, args.reference_sentences, args.max_len_a, args.max_len_b, args.checkpoint,
               args.reference_only or "reference.pt", args.attention_sentences)
        return 0
    python = Path(args.fairseq_venv) / "bin" / "python"
    if args.reference_only:
        run([python, __file__, "--worker", "--out", out, "--reference-sentences", args.reference_sentences,
             "--max-len-a", args.max_len_a, "--max-len-b", args.max_len_b, "--checkpoint", args.checkpoint,
             "--reference-only", args.reference_only, "--attention-sentences", args.attention_sentences],
            env={**os.environ, **FAIRSEQ_LOADS})
        return 0
    if not (args.synthetic or args.text_dir):
        ap.error("give --synthetic N or --text-dir")
    if not python.exists():
        raise SystemExit(f"no fairseq environment at {args.fairseq_venv}; run "
                         f"`python benchmarks/fairseq_side_by_side.py --windows 0` once to make it")
    out.mkdir(parents=True, exist_ok=True)
    paths = write_text(args, out)
    models = subword_models(args, out, paths)
    bin_dir = binarise(python, out, paths, models, joint=args.arch_preset == "tiny-post")
    train(python, args, out, bin_dir)
    # fairseq's reference pass runs on the CPU; as many threads as training had, so that runs sharing
    # a machine (a lent GPU's 16 cores, three fairseq runs) do not each take every core
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), **FAIRSEQ_LOADS}
    run([python, __file__, "--worker", "--out", out, "--reference-sentences", args.reference_sentences,
         "--max-len-a", args.max_len_a, "--max-len-b", args.max_len_b], env=env)
    (out / "recipe.json").write_text(json.dumps({k: v for k, v in vars(args).items() if k != "worker"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
