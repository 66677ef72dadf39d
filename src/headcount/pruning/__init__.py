"""Pruning heads: the settings and methods registry, Hard Concrete fine-tuning, ranked curves, removal."""
