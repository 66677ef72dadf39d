"""Cross-check headcount's GPT-2 adapter (models/hf_lm.py) against TransformerLens on the same weights.

A tiny random GPT-2 (hf_lm_tiny.write_tiny_gpt2, a byte-level BPE trained on a few lines here; its
biases and LayerNorm gains made non-trivial) is loaded twice: by headcount (HFCausalLM, which runs
transformers' GPT-2 code with gates on W^O) and by TransformerLens' own implementation
(HookedTransformer built from a HookedTransformerConfig matching the GPT-2 config, weights through
TransformerLens' convert_gpt2_weights, no LayerNorm folding or centring, so that activations are
comparable). On a batch of texts of equal length it prints the max abs difference of

  pattern   every layer's attention probabilities: headcount's dec_self probs vs hook_pattern;
  loss      the mean next-token cross-entropy (TransformerLens' return_type="loss");
  ablation  for every head, the change of that loss when the head is removed: headcount's
            set_head_mask (a 0 gate on the head's context) vs zeroing the head's hook_z.

Needs TransformerLens with HookedTransformer (3.x; 4.0 removed it), in a separate environment that
shares this one's torch and transformers, e.g.

    python3 -m venv /tmp/tl-venv
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/tl-venv/lib/python3.11/site-packages/main.pth
    /tmp/tl-venv/bin/pip install -c constraints.txt "transformer-lens<4"
    PYTHONPATH=src /tmp/tl-venv/bin/python tools/crosscheck_transformer_lens.py
"""

from __future__ import annotations

import argparse
import tempfile

import torch

LINES = ["the cat sat on the mat", "a dog ran to the park and back", "Grüße aus Köln, sagte er.",
         "heads attend to the previous token", "some heads can be pruned without loss"] * 8


def tiny_gpt2(directory: str, layers: int, heads: int, d_model: int, seed: int):
    """headcount's adapter and the transformers model under it, with non-trivial biases and gains."""
    from headcount.models import hf_lm, hf_lm_tiny

    hf_lm_tiny.write_tiny_gpt2(directory, LINES, d_model=d_model, layers=layers, heads=heads, seed=seed)
    model = hf_lm.load_pretrained_lm(directory, offline=True)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.hf.named_parameters()):
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif "wte" in name or "wpe" in name or name.endswith("weight"):
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


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--length", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as directory:
        model = tiny_gpt2(directory, args.layers, args.heads, args.d_model, args.seed)
        from headcount.models.hf_lm import load_lm_tokenizer

        tokenizer = load_lm_tokenizer(directory, offline=True)
    rows = [[model.special.bos] + ids for ids in tokenizer.encode(LINES[:5])]
    tokens = torch.tensor([row[:1] + (row[1:] * args.length)[: args.length - 1] for row in rows])  # (B, T), BOS once
    tl = hooked_transformer(model)
    empty = tokens.new_zeros(tokens.shape[0], 0)
    with torch.no_grad():
        logits, attn = model(empty, tokens, need_weights=True)
        tl_logits, cache = tl.run_with_cache(tokens)
        errors = {"logits": (logits - tl_logits).abs().max().item(),
                  "pattern": max((attn["dec_self"][layer] - cache["pattern", layer]).abs().max().item()
                                 for layer in range(args.layers))}
        base, tl_base = next_token_loss(logits, tokens), tl(tokens, return_type="loss")
        errors["loss"] = (base - tl_base).abs().item()
        deltas, tl_deltas = [], []
        for layer in range(args.layers):
            for head in range(args.heads):
                mask = torch.ones(args.layers, args.heads)
                mask[layer, head] = 0
                model.set_head_mask({"dec_self": mask})
                deltas.append((next_token_loss(model(empty, tokens)[0], tokens) - base).item())

                def ablate(z, hook, head=head):  # z (B, T, H, Dh)
                    z[:, :, head] = 0
                    return z

                ablated = tl.run_with_hooks(tokens, return_type="loss", fwd_hooks=[(f"blocks.{layer}.attn.hook_z",
                                                                                    ablate)])
                tl_deltas.append((ablated - tl_base).item())
        model.set_head_mask({"dec_self": torch.ones(args.layers, args.heads)})
    deltas, tl_deltas = torch.tensor(deltas), torch.tensor(tl_deltas)
    errors["ablation"] = (deltas - tl_deltas).abs().max().item()
    print(f"GPT-2 {args.layers} layers x {args.heads} heads, d_model {args.d_model}, batch {tuple(tokens.shape)}")
    print(f"loss {base.item():.6f} (TransformerLens {tl_base.item():.6f}); single-head ablation loss changes "
          f"from {deltas.min().item():+.6f} to {deltas.max().item():+.6f}")
    for name, value in errors.items():
        print(f"max abs error {name:9s} {value:.3e}")
    return errors


if __name__ == "__main__":
    main()
