"""Corpora, subwords, token ids and batches: text to tensors, for any model (no model code)."""
