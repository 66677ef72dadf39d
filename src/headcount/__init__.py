"""headcount: which attention heads of a Transformer matter, what they do, how many can go."""

__version__ = "0.1.0"
