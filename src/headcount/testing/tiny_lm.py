"""Tiny random language models of each hf_lm family, written as transformers' save_pretrained writes
a pretrained model, with a tokenizer trained on given lines by the `tokenizers` library: fixtures
standing in for hub models in tests and dry runs (nothing is downloaded), not analysis code.
`write_tiny_gpt2` (byte-level BPE), `write_tiny_gpt_neox` (Pythia's layout: byte-level BPE, partial
rotary, parallel residual), `write_tiny_opt` (byte-level BPE, </s> prepended as BOS by the
tokenizer), `write_tiny_llama` (sentencepiece-style BPE, grouped-query attention), `write_tiny_qwen2`
(Qwen2 or Qwen3: byte-level BPE, grouped-query attention), `write_tiny_bert` (WordPiece) and
`write_tiny_roberta` (byte-level BPE). hf_lm.load_pretrained_lm and import_pretrained_lm read the
directories offline.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def _save_tokenizer(tokenizer_object, directory: Path, **special_tokens):
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_object, **special_tokens)
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def _byte_level(lines: list[str], vocab_size: int, specials: list[str]):
    """A byte-level BPE (GPT-2's, RoBERTa's, Qwen's scheme) trained on the lines; its alphabet is the
    256 bytes, so vocab_size counts them."""
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=1, special_tokens=specials,
                                show_progress=False)
    return trainer._tokenizer


def write_tiny_gpt2(directory: str | os.PathLike, lines: list[str], vocab_size: int = 300, d_model: int = 16,
                    layers: int = 2, heads: int = 4, positions: int = 64, seed: int = 0) -> Path:
    """A random GPT-2 with a byte-level BPE trained on the lines (<|endoftext|> is BOS, EOS and,
    as for GPT-2, there is no pad token), written as save_pretrained writes one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(_byte_level(lines, vocab_size, ["<|endoftext|>"]), directory,
                                bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=positions, n_embd=d_model, n_layer=layers,
                        n_head=heads, bos_token_id=eot, eos_token_id=eot, resid_pdrop=0.1, embd_pdrop=0.1,
                        attn_pdrop=0.0)
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(str(directory))
    return directory


def write_tiny_gpt_neox(directory: str | os.PathLike, lines: list[str], vocab_size: int = 300, d_model: int = 16,
                        layers: int = 2, heads: int = 4, ffn: int = 32, positions: int = 64, rotary_pct: float = 0.5,
                        parallel_residual: bool = True, seed: int = 0) -> Path:
    """A random GPTNeoXForCausalLM (Pythia's layout: fused per-head Q/K/V, rotary positions on the
    first `rotary_pct` of each head's features, attention and feed-forward in parallel) with a
    byte-level BPE trained on the lines: <|endoftext|> (id 0) is BOS, EOS and unknown, <|padding|>
    (id 1) pads, as Pythia's tokenizer has them."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _save_tokenizer(_byte_level(lines, vocab_size, ["<|endoftext|>", "<|padding|>"]), directory,
                                bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>",
                                pad_token="<|padding|>")
    config = GPTNeoXConfig(vocab_size=len(tokenizer), hidden_size=d_model, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=positions,
                           rotary_pct=rotary_pct, use_parallel_residual=parallel_residual,
                           bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    GPTNeoXForCausalLM(config).save_pretrained(str(directory))
    return directory


def write_tiny_opt(directory: str | os.PathLike, lines: list[str], vocab_size: int = 300, d_model: int = 16,
                   layers: int = 2, heads: int = 4, ffn: int = 32, positions: int = 64, seed: int = 0) -> Path:
    """A random OPTForCausalLM (pre-LN, separate q/k/v projections with biases, learned positions
    offset by 2, output layer tied to the embeddings) with a byte-level BPE trained on the lines:
    <s> <pad> </s> <unk> are ids 0-3 as OPT's, and the tokenizer prepends </s> to every text (OPT's
    BOS)."""
    from tokenizers import processors
    from transformers import OPTConfig, OPTForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = _byte_level(lines, vocab_size, ["<s>", "<pad>", "</s>", "<unk>"])
    backend.post_processor = processors.TemplateProcessing(single="</s> $A", special_tokens=[
        ("</s>", backend.token_to_id("</s>"))])
    tokenizer = _save_tokenizer(backend, directory, bos_token="</s>", eos_token="</s>", unk_token="<unk>",
                                pad_token="<pad>")
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=d_model, num_hidden_layers=layers,
                       num_attention_heads=heads, ffn_dim=ffn, max_position_embeddings=positions,
                       word_embed_proj_dim=d_model, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    OPTForCausalLM(config).save_pretrained(str(directory))
    return directory


def _llama_like(directory: str | os.PathLike, lines: list[str], family: str, vocab_size: int, d_model: int,
                layers: int, heads: int, kv_heads: int, ffn: int, positions: int, seed: int) -> Path:
    import transformers
    from tokenizers import SentencePieceBPETokenizer, processors

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if family == "llama":  # sentencepiece-style BPE ('▁' marks a word start), <s> prepended by the tokenizer
        trainer = SentencePieceBPETokenizer(unk_token="<unk>")
        trainer.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=1,
                                    special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
        backend = trainer._tokenizer
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
            ("<s>", backend.token_to_id("<s>"))])
        tokenizer = _save_tokenizer(backend, directory, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
        ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        config = transformers.LlamaConfig
    else:  # Qwen2/Qwen3: byte-level BPE, <|endoftext|> ends a text and pads, no BOS
        tokenizer = _save_tokenizer(_byte_level(lines, vocab_size, ["<|endoftext|>"]), directory,
                                    eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        config = transformers.Qwen2Config if family == "qwen2" else transformers.Qwen3Config
    config = config(vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=ffn, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
                    tie_word_embeddings=False, **ids)
    torch.manual_seed(seed)
    model_class = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                   "qwen3": transformers.Qwen3ForCausalLM}[family]
    model_class(config).save_pretrained(str(directory))
    return directory


def write_tiny_llama(directory: str | os.PathLike, lines: list[str], vocab_size: int = 80, d_model: int = 16,
                     layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int = 32, positions: int = 64,
                     seed: int = 0) -> Path:
    """A random Llama (grouped-query attention: `kv_heads` KV heads) with a sentencepiece-style BPE
    trained on the lines, written as save_pretrained writes one."""
    return _llama_like(directory, lines, "llama", vocab_size, d_model, layers, heads, kv_heads, ffn, positions, seed)


def write_tiny_qwen2(directory: str | os.PathLike, lines: list[str], vocab_size: int = 300, d_model: int = 16,
                     layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int = 32, positions: int = 64,
                     seed: int = 0, family: str = "qwen2") -> Path:
    """A random Qwen2 (family="qwen3": Qwen3) with a byte-level BPE trained on the lines."""
    return _llama_like(directory, lines, family, vocab_size, d_model, layers, heads, kv_heads, ffn, positions, seed)


def write_tiny_bert(directory: str | os.PathLike, lines: list[str], vocab_size: int = 80, d_model: int = 16,
                    layers: int = 2, heads: int = 4, ffn: int = 32, positions: int = 64, seed: int = 0) -> Path:
    """A random BertForMaskedLM with a lowercasing WordPiece vocabulary trained on the lines."""
    from tokenizers import BertWordPieceTokenizer, models, processors
    from transformers import BertConfig, BertForMaskedLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(lines, vocab_size=vocab_size, min_frequency=1, show_progress=False)
    backend = trainer._tokenizer
    # The WordPiece trainer picks the same tokens every run but numbers them in hash order, so the
    # same lines gave different ids (and a different tiny model) per process: renumber them sorted.
    vocab = backend.get_vocab()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    ordered = specials + sorted(token for token in vocab if token not in specials)
    backend.model = models.WordPiece({token: i for i, token in enumerate(ordered)}, unk_token="[UNK]")
    backend.post_processor = processors.BertProcessing(("[SEP]", backend.token_to_id("[SEP]")),
                                                       ("[CLS]", backend.token_to_id("[CLS]")))
    tokenizer = _save_tokenizer(backend, directory, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                sep_token="[SEP]", mask_token="[MASK]")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=d_model, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=positions,
                        pad_token_id=tokenizer.pad_token_id, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(str(directory))
    return directory


def write_tiny_roberta(directory: str | os.PathLike, lines: list[str], vocab_size: int = 300, d_model: int = 16,
                       layers: int = 2, heads: int = 4, ffn: int = 32, positions: int = 64, seed: int = 0) -> Path:
    """A random RobertaForMaskedLM with a byte-level BPE trained on the lines (<s> <pad> </s> <unk>
    <mask>, ids 0-4 as RoBERTa's)."""
    from tokenizers import processors
    from transformers import RobertaConfig, RobertaForMaskedLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = _byte_level(lines, vocab_size, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    backend.post_processor = processors.RobertaProcessing(("</s>", backend.token_to_id("</s>")),
                                                          ("<s>", backend.token_to_id("<s>")))
    tokenizer = _save_tokenizer(backend, directory, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                pad_token="<pad>", cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    pad = tokenizer.pad_token_id
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=d_model, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=ffn,
                           max_position_embeddings=positions + pad + 1,
                           pad_token_id=pad, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                           attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    RobertaForMaskedLM(config).save_pretrained(str(directory))
    return directory
