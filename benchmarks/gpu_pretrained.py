"""The transformers adapters on a GPU (run on a lent one): do they compute on CUDA what they compute
on the CPU, and what do full-size pretrained models cost there, measured rather than assumed.

    python benchmarks/gpu_pretrained.py agreement [--devices cpu,cuda] [--out agreement.json]
    python benchmarks/gpu_pretrained.py cost [--device cuda] [--steps 3] [--models qwen2,gpt2,fsmt,marian,nllb]

agreement: small random models of each adapter family (GPT-2, Llama and Qwen2 with grouped-query
attention, BERT, RoBERTa; MarianMT, BART, mBART, M2M100, T5, FSMT), fp32 on both devices with TF32
off, the same weights and inputs: the largest difference of the logits, of the attention maps, of
the logits with half of the heads masked, of the LRP head relevance ("ding"), of Michel importance,
of the gradients of a gated loss (Hard Concrete gates in eval mode, so no sampling), and for the
encoder-decoders whether greedy translations agree; beside each, what scaling the weights by
1 + 1e-6 noise does on the first device. `--devices cpu,cpu` is a dry run anywhere.

cost: Qwen/Qwen2.5-0.5B, gpt2, facebook/wmt19-en-ru, Helsinki-NLP/opus-mt-en-de and
facebook/nllb-200-distilled-600M at full size with random weights, built from their public configs
(lm_cost.py, fsmt_cost.py, SEQ2SEQ here; nothing downloaded). Timed with the device
synchronised, the fastest of `--steps` after a warm-up: a forward (fp32, as evaluation runs), a
gated fine-tuning step as prune_heads takes one on CUDA (bf16 autocast, Hard Concrete gates and
their L0 penalty, Adam), Michel importance and LRP (fp32) on a batch of 1,600 tokens, and for
FSMT beam search; with each the peak GPU memory. The language models' stages (lm_cost.stages)
are then costed at the measured rates: the minutes of compute each stage needs on this GPU.
The encoder-decoders' EOS is made never to win, so beam search runs to its length limit: an upper
bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import fsmt_cost  # noqa: E402
import lm_cost  # noqa: E402

LINES = ["a dog runs over the green grass", "two children play in the sand", "the man reads a newspaper",
         "a woman rides a bicycle down the street", "three people sit on a bench in the park"] * 8


# --------------------------------------------------------------------------------------------
# Models and inputs


def small_models(workdir: Path) -> dict:
    """family -> (adapter, kind) of small random models: the language models through the same
    loading path as a downloaded one (tiny_lm writes them as save_pretrained does)."""
    import transformers
    from transformers import FSMTForConditionalGeneration

    from headcount.models.hf import HFSeq2Seq
    from headcount.models.hf_lm import load_pretrained_lm
    from headcount.testing.tiny_lm import (
        write_tiny_bert,
        write_tiny_gpt2,
        write_tiny_llama,
        write_tiny_qwen2,
        write_tiny_roberta,
    )

    torch.manual_seed(0)
    sizes = dict(d_model=64, layers=3, heads=4)
    writers = {"gpt2": write_tiny_gpt2, "llama": write_tiny_llama, "qwen2": write_tiny_qwen2, "bert": write_tiny_bert,
               "roberta": write_tiny_roberta}
    models = {family: load_pretrained_lm(write(workdir / family, LINES, **sizes), offline=True)
              for family, write in writers.items()}
    small_fsmt = dict(fsmt_cost.SMALL, d_model=64, layers=3, heads=4, ffn=256, src_vocab=512, tgt_vocab=512)
    models["fsmt"] = HFSeq2Seq(FSMTForConditionalGeneration(fsmt_cost.config(small_fsmt))).eval()
    common = dict(vocab_size=512, d_model=64, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64)
    seq2seq = {
        "marian": transformers.MarianMTModel(transformers.MarianConfig(
            **common, pad_token_id=511, decoder_start_token_id=511, eos_token_id=0)),
        "bart": transformers.BartForConditionalGeneration(transformers.BartConfig(**common)),
        "mbart": transformers.MBartForConditionalGeneration(transformers.MBartConfig(**common)),
        "m2m_100": transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**common)),
        "t5": transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=512, d_model=64, d_kv=16, d_ff=256, num_layers=3, num_decoder_layers=3, num_heads=4,
            relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)),
    }
    models.update({family: HFSeq2Seq(hf).eval() for family, hf in seq2seq.items()})
    return models


def inputs(model, batch: int = 6, length: int = 12, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """(src, tgt_in, tgt_out) of random ids the model's kind reads: a language model's text is its
    decoder input (src empty); a masked LM's src holds [MASK] at every third position."""
    from headcount.models.seq2seq import kind_of

    g = torch.Generator().manual_seed(seed)
    special, vocab = model.special, _vocab_size(model)
    specials = torch.tensor([s for s in (special.pad, special.bos, special.eos, special.mask) if s is not None])
    plain = next(i for i in range(vocab) if i not in specials)

    def draw(shape):  # random ids, none of them special
        ids = torch.randint(0, vocab, shape, generator=g)
        return torch.where(torch.isin(ids, specials), torch.full_like(ids, plain), ids)

    ids = draw((batch, length + 1))
    kind = kind_of(model).name
    if kind == "encoder_only":
        src = ids.clone()
        src[:, 0], src[:, -1] = special.bos, special.eos
        target = src.clone()
        src[:, 1:-1:3] = special.mask
        return src, src[:, :0], target
    if kind == "decoder_only":
        ids[:, 0] = special.bos
        return ids[:, :0], ids[:, :-1], ids[:, 1:]
    src = ids.clone()
    src[:, -1] = special.eos
    tgt = draw((batch, length + 1))
    tgt[:, 0] = special.bos
    return src, tgt[:, :-1], tgt[:, 1:]


def _vocab_size(model) -> int:
    hf = model.hf  # FSMT names its output vocabulary tgt_vocab_size
    return getattr(hf.config, "tgt_vocab_size", None) or hf.get_output_embeddings().weight.shape[0]


# --------------------------------------------------------------------------------------------
# Agreement


def outputs(model, src, tgt_in, tgt_out) -> dict[str, torch.Tensor | list]:
    """Everything compared, computed on the model's device, moved to the CPU."""
    from headcount.analysis.importance import michel_importance, summed_nll
    from headcount.models.gates import attach_gates, l0_penalty
    from headcount.models.lrp import step_relevance
    from headcount.models.seq2seq import kind_of
    from headcount.training.decode import greedy_search

    kind = kind_of(model).name
    out = {}
    with torch.no_grad():
        logits, attn = model.eval()(src, tgt_in, need_weights=True)
        out["logits"] = logits.cpu()
        out["attention"] = torch.cat([p.flatten().cpu() for probs in attn.values() for p in probs if p is not None])
        masks = {k: torch.tensor([[float(h % 2) for h in range(m.n_heads)] for m in mods])
                 for k, mods in model.attention_modules().items()}
        before = model.head_mask()
        model.set_head_mask(masks)
        out["logits, half the heads masked"] = model(src, tgt_in)[0].cpu()
        model.set_head_mask(before)
    relevance = step_relevance(model, src, tgt_in, rule="ding")
    out["LRP head relevance"] = torch.cat([r.flatten().cpu() for r in relevance.normalised().values()])
    if kind != "encoder_only":
        out["Michel importance"] = torch.tensor(michel_importance(model, [(src, tgt_in, tgt_out)])["michel_raw"]
                                                .to_numpy())
    if kind == "encoder_decoder":
        out["greedy"] = greedy_search(model, src)
    gates = attach_gates(model, init=1.0)
    model.eval()  # gates at their deterministic evaluation value: nothing sampled
    if kind == "encoder_only":
        logits, _ = model(src)
        masked = src.eq(model.special.mask)
        loss = torch.nn.functional.cross_entropy(logits[masked], tgt_out[masked], reduction="sum")
    else:
        loss, _ = summed_nll(model, src, tgt_in, tgt_out)
    (loss + l0_penalty(gates)).backward()
    out["gradients"] = torch.cat([p.grad.flatten().cpu() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    for kind_modules in model.attention_modules().values():
        for module in kind_modules:
            module.hard_concrete = None
    return out


def agreement(devices: tuple[str, str]) -> dict:
    import copy

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides, as the CPU computes
    torch.backends.cudnn.allow_tf32 = False
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family, model in small_models(Path(tmp)).items():
            batch = inputs(model)
            got = []
            for device in devices:
                moved = copy.deepcopy(model).to(device)
                got.append(outputs(moved, *(t.to(device) for t in batch)))
            row = {}
            for name, first in got[0].items():
                second = got[1][name]
                if isinstance(first, list):
                    row[name] = f"{sum(a == b for a, b in zip(first, second))} of {len(first)} identical"
                else:
                    row[name] = {"largest difference": float((first - second).abs().max()),
                                 "largest value": float(first.abs().max())}
            # The conditioning reference: the same outputs on the first device after every weight is
            # scaled by (1 + 1e-6 x noise), so that a device difference reads against what the model
            # itself does to a change in the sixth digit (LRP shares divide by small totals).
            nudged = copy.deepcopy(model).to(devices[0])
            generator = torch.Generator().manual_seed(2)
            with torch.no_grad():
                for p in nudged.parameters():
                    p.mul_(1 + 1e-6 * torch.randn(p.shape, generator=generator).to(p.device))
            reference = outputs(nudged, *(t.to(devices[0]) for t in batch))
            for name, value in row.items():
                if isinstance(value, dict):
                    value["after a 1e-6 nudge of the weights"] = float((got[0][name] - reference[name]).abs().max())
            report[family] = row
            print(f"{family}: " + "; ".join(
                f"{k} {v}" if isinstance(v, str) else
                f"{k} {v['largest difference']:.1e} (nudge {v['after a 1e-6 nudge of the weights']:.1e}, "
                f"largest {v['largest value']:.2g})" for k, v in row.items()), flush=True)
    return report


# --------------------------------------------------------------------------------------------
# Cost


def timed(fn, steps: int, device: torch.device) -> tuple[float, float]:
    """(fastest seconds of `steps` calls after a warm-up, peak GPU memory in GB over them)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    best = float("inf")
    for i in range(steps + 1):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if i:
            best = min(best, time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 1e9 if device.type == "cuda" else float("nan")
    return best, peak


def gated_step(model, batch, device: torch.device):
    """One prune_heads step on `device`: gates on every head, bf16 autocast where the device has it
    (precision auto), NLL per token plus lambda times the L0 penalty, Adam over weights and gates."""
    from headcount.analysis.importance import summed_nll
    from headcount.models.device import pick_autocast_dtype
    from headcount.models.gates import attach_gates, l0_penalty

    gates = attach_gates(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    dtype = pick_autocast_dtype("auto", device)

    def step():
        model.train()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss, n = summed_nll(model, *batch)
            loss = loss / n + 0.1 * l0_penalty(gates)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, dtype


def cost_lm(name: str, size: dict, device: torch.device, steps: int) -> dict:
    """Measured seconds and GPU memory of each kind of pass of the language-model workflow on the full
    model, then each stage of gpt2_en (lm_cost.stages) at the measured rates."""
    from headcount.analysis.importance import michel_importance
    from headcount.models.lrp import step_relevance

    T = lm_cost.TOKENS
    B = lm_cost.TRAIN_MAX_TOKENS // T  # the training and evaluation batches: 1,600 tokens
    torch.manual_seed(0)
    with torch.device(device):
        model = lm_cost.build(size)
    eot = lm_cost.EOT[size["family"]]
    x = torch.randint(0, eot, (B, T + 1), device=device)
    x[:, 0] = eot
    batch = (x[:, :0], x[:, :-1], x[:, 1:])
    result = {}

    def forward():
        with torch.no_grad():
            model.eval()(batch[0], batch[1])

    result["forward"] = timed(forward, steps, device)
    result["Michel"] = timed(lambda: michel_importance(model, [batch]), steps, device)
    result["LRP"] = timed(lambda: step_relevance(model, batch[0], batch[1], rule="ding"), steps, device)
    step, dtype = gated_step(model, batch, device)
    result["gated fine-tuning step"] = timed(step, steps, device)
    fwd, body = lm_cost.forward_flops(size, T), lm_cost.forward_flops(size, T, head=False)
    tokens = B * T
    rates = {"forward": tokens * fwd / result["forward"][0], "michel": tokens * 2 * fwd / result["Michel"][0],
             "lrp": B * (lm_cost.lrp_layer_token_passes(T) * body + T * 2 * size["hidden"] * size["vocab"])
             / result["LRP"][0],
             "train": tokens * 3 * fwd / result["gated fine-tuning step"][0]}
    kind = {"lm_quality": "forward", "confidence": "forward", "Michel": "michel", "ablation": "forward",
            "LRP": "lrp", "head_roles": "forward", "prune_heads": "train", "ranked_curve": "forward"}
    stages = [(stage, flops / rates[next(v for k, v in kind.items() if k in stage)] / 60)
              for stage, _, flops, _ in lm_cost.stages(size, T)]
    print(f"## {name}: {B} x {T} tokens a batch; fine-tuning under {dtype or torch.float32}\n")
    print("| pass | seconds | peak GPU memory (GB) | TFLOP/s achieved |\n|---|---|---|---|")
    for (label, (seconds, peak)), rate in zip(result.items(), (rates["forward"], rates["michel"], rates["lrp"],
                                                               rates["train"]), strict=True):
        print(f"| {label} | {seconds:.4f} | {peak:.1f} | {rate / 1e12:.1f} |")
    print("\n| stage of gpt2_en | minutes of compute on this device |\n|---|---|")
    for stage, minutes in stages:
        print(f"| {stage} | {minutes:.2f} |")
    print(f"| total | {sum(m for _, m in stages):.2f} |\n", flush=True)
    return {"passes": {k: {"seconds": s, "peak_gb": p} for k, (s, p) in result.items()},
            "tflops": {k: v / 1e12 for k, v in rates.items()}, "stage_minutes": dict(stages)}


# The encoder-decoders costed, at their public configs' sizes (dict keys as fsmt_cost's, whose FLOP
# count fits any of them): wmt19_en_ru's FSMT, opus_mt_en_de's MarianMT (one vocabulary shared by
# every embedding), nllb_en_de's M2M100 architecture. `fine_tunings` is each experiment's runs of
# 500 steps (its prune grid), read from config/config.yaml when this was written.
SEQ2SEQ = {
    "fsmt": ("facebook/wmt19-en-ru", fsmt_cost.WMT19, 12),
    "marian": ("Helsinki-NLP/opus-mt-en-de",
               dict(d_model=512, layers=6, heads=8, ffn=2048, src_vocab=58101, tgt_vocab=58101), 12),
    "nllb": ("facebook/nllb-200-distilled-600M",
             dict(d_model=1024, layers=12, heads=16, ffn=4096, src_vocab=256206, tgt_vocab=256206), 12),
}


def seq2seq_model(family: str, size: dict):
    """A random transformers model of the family at `size`."""
    import transformers

    if family == "fsmt":
        return transformers.FSMTForConditionalGeneration(fsmt_cost.config(size))
    common = dict(vocab_size=size["tgt_vocab"], d_model=size["d_model"], encoder_layers=size["layers"],
                  decoder_layers=size["layers"], encoder_attention_heads=size["heads"],
                  decoder_attention_heads=size["heads"], encoder_ffn_dim=size["ffn"], decoder_ffn_dim=size["ffn"],
                  scale_embedding=True)
    if family == "marian":
        pad = size["tgt_vocab"] - 1
        return transformers.MarianMTModel(transformers.MarianConfig(
            **common, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, activation_function="swish"))
    return transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(
        **common, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2))


def cost_seq2seq(family: str, device: torch.device, steps: int, size: dict, length: int = 30,
                 beam_batch: int = 32) -> dict:
    """An encoder-decoder of SEQ2SEQ: a forward, beam search (beam 4) of `beam_batch` random
    sentences, which runs to the length limit, and a gated fine-tuning step on 1,600 target tokens."""
    from headcount.models.hf import HFSeq2Seq
    from headcount.training.decode import beam_search

    name, _, fine_tunings = SEQ2SEQ[family]
    torch.manual_seed(0)
    with torch.device(device):
        model = HFSeq2Seq(seq2seq_model(family, size))
    B = lm_cost.TRAIN_MAX_TOKENS // length
    special = model.special
    with torch.no_grad():  # EOS never wins, so that every search runs to its length limit
        model.hf.get_output_embeddings().weight[special.eos] = 0
        if getattr(model.hf, "final_logits_bias", None) is not None:
            model.hf.final_logits_bias[..., special.eos] = -1e4
    low = max(special.pad, special.bos, special.eos) + 1 if family != "marian" else 1
    high = size["tgt_vocab"] - (1 if family == "marian" else 0)  # Marian's pad is its last id
    src = torch.randint(low, high, (B, length), device=device)
    tgt = torch.randint(low, high, (B, length + 1), device=device)
    src[:, -1] = special.eos
    tgt[:, 0] = special.bos
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    result = {}

    def forward():
        with torch.no_grad():
            model.eval()(batch[0], batch[1])

    result["forward"] = timed(forward, steps, device)
    lengths = []

    def search():
        lengths.append(sum(len(h) for h in beam_search(model, src[:beam_batch], beam=4)))

    result[f"beam search, {beam_batch} sentences"] = timed(search, max(1, steps - 1), device)
    step, dtype = gated_step(model, batch, device)
    result["gated fine-tuning step"] = timed(step, steps, device)
    flops = fsmt_cost.forward_flops(size, length, length)
    train_rate = 3 * flops * B / result["gated fine-tuning step"][0]
    search_seconds = result[f"beam search, {beam_batch} sentences"][0]
    print(f"## {name}: {B} pairs of {length}+{length} tokens; fine-tuning under {dtype or torch.float32}\n")
    print("| pass | seconds | peak GPU memory (GB) |\n|---|---|---|")
    for label, (seconds, peak) in result.items():
        print(f"| {label} | {seconds:.4f} | {peak:.1f} |")
    print(f"\nfine-tuning {train_rate / 1e12:.1f} TFLOP/s achieved; {fine_tunings} runs of 500 steps: "
          f"{fine_tunings * 500 * result['gated fine-tuning step'][0] / 60:.1f} min; beam search "
          f"{lengths[-1] / search_seconds:.0f} target tokens/s ({lengths[-1]} tokens, every sentence to its "
          f"length limit)\n", flush=True)
    return {"passes": {k: {"seconds": s, "peak_gb": p} for k, (s, p) in result.items()},
            "train_tflops": train_rate / 1e12, "beam_tokens": lengths[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["agreement", "cost"])
    parser.add_argument("--devices", default="cpu,cuda", help="agreement: the two devices compared")
    parser.add_argument("--device", default="cuda", help="cost: where the models run")
    parser.add_argument("--models", default="qwen2,gpt2,fsmt,marian,nllb", help="cost: which full-size models")
    parser.add_argument("--steps", type=int, default=3, help="cost: timed calls after a warm-up")
    parser.add_argument("--small", action="store_true", help="cost: lm_cost's and fsmt_cost's small stand-ins "
                        "instead of the full sizes (a dry run on a CPU)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}"
          + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"), flush=True)
    if args.what == "agreement":
        result = agreement(tuple(args.devices.split(",")))
    else:
        device = torch.device(args.device)
        result = {}
        for name in args.models.split(","):
            if name in SEQ2SEQ:
                label, size, _ = SEQ2SEQ[name]
                small = dict(fsmt_cost.SMALL, src_vocab=size["src_vocab"], tgt_vocab=size["tgt_vocab"])
                result[label] = cost_seq2seq(name, device, args.steps, small if args.small else size)
            else:
                label, size = {"qwen2": ("Qwen/Qwen2.5-0.5B", lm_cost.QWEN), "gpt2": ("gpt2", lm_cost.GPT2)}[name]
                result[label] = cost_lm(label, lm_cost.SMALL[size["family"]] if args.small else size, device,
                                        args.steps)
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the last model's memory, before the next is built
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
