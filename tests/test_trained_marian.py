"""headcount's HuggingFace adapter on a MarianMT model that transformers' own training code trained.

tools/train_marian_reference.py trains a tiny MarianMT model with `Seq2SeqTrainer` on a synthetic
corpus made here and saves it as opus-mt directories are laid out; tools/crosscheck_marian.py
loads it through the workflow's path (import_pretrained, load_model, open_tokenizer) and compares
headcount's greedy search, attention probabilities, log-likelihoods and head masks with
transformers' own outputs. test_hf_models.py does the same on random weights; here the weights
are trained (the first test makes sure), so the attention is peaked and the argmax decisive.
"""

import json
import random
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it (the dev extra)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import crosscheck_marian as crosscheck  # noqa: E402
import train_marian_reference as reference  # noqa: E402

pytestmark = pytest.mark.slow  # make test-fast leaves this file out: it trains, or loads real weights

TOLERANCE = 1e-5
N_WORDS, N_NOUNS = 160, 120


# --------------------------------------------------------------------------------------------
# A synthetic language pair with a few hundred subwords


def lexicon(seed: int = 0):
    """Nouns and adjectives of one to three consonant-vowel syllables; a word's translation spells
    each syllable with other letters (a syllable cipher), so subwords carry over."""
    rng = random.Random(seed)
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    their_consonants, their_vowels = "ptkbdgmnlrsfhw", "aeiuo"
    cipher = {c + v: tc + tv for c, tc in zip(consonants, their_consonants) for v, tv in zip(vowels, their_vowels)}
    syllables = sorted(cipher)
    words: set[str] = set()
    while len(words) < N_WORDS:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((1, 2, 2, 3)))))
    ordered = sorted(words)
    rng.shuffle(ordered)

    def translate(word: str) -> str:
        return "".join(cipher[word[i:i + 2]] for i in range(0, len(word), 2))

    return ordered[:N_NOUNS], ordered[N_NOUNS:], translate


def synthetic_corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    """1-4 noun phrases a sentence; the target puts the adjective after its noun."""
    nouns, adjectives, translate = lexicon()
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        s, t = [], []
        for _ in range(rng.randint(1, 4)):
            noun = rng.choice(nouns)
            if rng.random() < 0.5:
                adjective = rng.choice(adjectives)
                s += [adjective, noun]
                t += [translate(noun), translate(adjective)]
            else:
                s.append(noun)
                t.append(translate(noun))
        src.append(" ".join(s) + " .")
        tgt.append(" ".join(t) + " .")
    return src, tgt


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("synthetic")
    files = {}
    for split, (n, seed) in {"train": (800, 1), "dev": (40, 2)}.items():
        src, tgt = synthetic_corpus(n, seed)
        for side, lines in (("src", src), ("tgt", tgt)):
            files[f"{side}_{split}"] = str(directory / f"{split}.{side}")
            Path(files[f"{side}_{split}"]).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def tiny_config(corpus: dict[str, str], out: Path, **changes) -> reference.ReferenceConfig:
    settings = dict(encoder_layers=2, decoder_layers=2, d_model=32, heads=4, ffn=64, vocab_size=200,
                    max_positions=64, max_length=64, max_steps=300, batch_size=32, lr=1e-2, warmup_steps=100,
                    save_steps=150, eval_steps=1000, logging_steps=1000, seed=1, quiet=True)
    settings.update(changes)
    return reference.ReferenceConfig(**corpus, out=str(out), **settings)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """-> (the opus-mt-shaped directory, the tool's summary)."""
    out = tmp_path_factory.mktemp("reference") / "opus-mt-synthetic"
    return out, reference.train(tiny_config(corpus, out))


@pytest.fixture(scope="module")
def checks(trained, corpus, tmp_path_factory):
    model_dir, _ = trained
    src = reference.read_lines(corpus["src_dev"])
    tgt = reference.read_lines(corpus["tgt_dev"])
    result = crosscheck.crosscheck(model_dir, src, tgt, work_dir=tmp_path_factory.mktemp("imported"), batch_size=16)
    print("\n" + crosscheck.report(result))
    return result


# --------------------------------------------------------------------------------------------
# The reference itself


def test_the_reference_is_an_opus_mt_directory_of_a_trained_model(trained, checks, record_property):
    model_dir, summary = trained
    for name in ("config.json", "model.safetensors", "generation_config.json", "source.spm", "target.spm",
                 "vocab.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "marian" and config["decoder_start_token_id"] == config["pad_token_id"]
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
    ordered = sorted(vocab, key=vocab.get)
    assert ordered[:2] == ["</s>", "<unk>"] and ordered[-1] == "<pad>" and config["pad_token_id"] == len(vocab) - 1
    assert 200 <= len(vocab) <= 400 and config["vocab_size"] == len(vocab)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert generation["bad_words_ids"] == [[config["pad_token_id"]]]
    # It learned: the dev loss (label-smoothed, as the Trainer reports it) and the plain NLL.
    record_property("dev_loss_untrained", summary["dev_loss_untrained"])
    record_property("dev_loss", summary["dev_loss"])
    print(f"\ndev loss {summary['dev_loss_untrained']:.3f} untrained, {summary['dev_loss']:.3f} after "
          f"{summary['steps']} steps; NLL {checks['nll_per_token']:.3f} per token")
    assert summary["steps"] == 300 and summary["resumed_from"] is None
    assert summary["dev_loss"] < 0.5 * summary["dev_loss_untrained"]
    assert checks["nll_per_token"] < 0.3 * checks["uniform_nll_per_token"]


# --------------------------------------------------------------------------------------------
# headcount against transformers


def test_tokens_are_the_marian_tokenizers(checks):
    assert checks["token_sequences_identical"] == checks["token_sequences"] == 80


def test_greedy_search_equals_generate(checks, record_property):
    record_property("greedy_identical", f"{checks['greedy_identical']}/{checks['greedy_sentences']}")
    record_property("short_greedy_identical", f"{checks['short_greedy_identical']}/{checks['sentences']}")
    assert checks["greedy_identical"] == checks["greedy_sentences"] == 40, checks.get("greedy_first_difference")
    assert checks["short_greedy_identical"] == 40, checks.get("short_greedy_first_difference")
    assert checks["short_greedy_at_limit"] >= 20  # the second pass does test the limit


def test_attention_probabilities_equal_output_attentions(checks, record_property):
    errors = checks["attention_max_abs_error"]
    for kind, error in errors.items():
        record_property(f"attention_max_abs_error_{kind}", error)
    record_property("logits_max_abs_error", checks["logits_max_abs_error"])
    assert set(errors) == {"enc_self", "dec_self", "dec_enc"}
    assert checks["attention_maps"] == 3 * 2 * 4 * 40  # every layer and head of every sentence
    assert max(errors.values()) < TOLERANCE, errors
    assert checks["logits_max_abs_error"] < 1e-4


def test_log_likelihoods_equal_transformers(checks, record_property):
    record_property("loglik_max_abs_error", checks["loglik_max_abs_error"])
    record_property("loss_max_abs_error", checks["loss_max_abs_error"])
    assert checks["loglik_max_abs_error"] < TOLERANCE
    assert checks["loss_max_abs_error"] < TOLERANCE


def test_head_mask_equals_zeroed_output_projection_columns(checks, record_property):
    record_property("head_mask_logits_max_abs_error", checks["head_mask_logits_max_abs_error"])
    record_property("head_mask_loglik_max_abs_error", checks["head_mask_loglik_max_abs_error"])
    assert all(0 < checks["masked_heads"][k] < checks["heads"][k] for k in ("enc_self", "dec_self", "dec_enc"))
    assert checks["head_mask_logits_moved_by"] > 0.5  # masking changed the model's outputs
    assert checks["head_mask_logits_max_abs_error"] < TOLERANCE
    assert checks["head_mask_loglik_max_abs_error"] < TOLERANCE
    assert checks["head_mask_greedy_identical"] == 40, checks.get("head_mask_greedy_first_difference")


# --------------------------------------------------------------------------------------------
# The tool: resumable and reproducible


def test_a_rerun_resumes_from_the_last_checkpoint_as_if_never_stopped(corpus, tmp_path):
    """Without dropout an interrupted run ends with the weights of an uninterrupted one: data order,
    optimiser, schedule and step come back from the checkpoint. (With dropout they differ a little:
    the Trainer restores the random state one draw off.)"""
    from safetensors.torch import load_file

    small = dict(dropout=0.0, d_model=16, ffn=32, save_steps=6, warmup_steps=4)
    straight = reference.train(tiny_config(corpus, tmp_path / "straight", max_steps=12, **small))
    first = reference.train(tiny_config(corpus, tmp_path / "stopped", max_steps=6, **small))
    again = reference.train(tiny_config(corpus, tmp_path / "stopped", max_steps=12, **small))
    assert first["resumed_from"] is None and straight["steps"] == again["steps"] == 12
    assert Path(again["resumed_from"]).name == "checkpoint-6"
    assert again["dev_loss_untrained"] == straight["dev_loss_untrained"]  # kept from the first run
    a, b = load_file(tmp_path / "straight/model.safetensors"), load_file(tmp_path / "stopped/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit, match="other settings"):
        reference.train(tiny_config(corpus, tmp_path / "stopped", max_steps=12, **{**small, "lr": 1e-3}))
