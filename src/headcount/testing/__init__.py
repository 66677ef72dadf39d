"""Fixtures for tests and dry runs, not analysis code: tiny random transformers models with
tokenizers trained on given lines (tiny_lm: decoder-only and encoder-only language models;
tiny_seq2seq: encoder-decoders), written as save_pretrained writes a hub model."""
