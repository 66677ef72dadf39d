"""headcount's version (provenance records it; the package re-exports it)."""

__version__ = "0.1.0"
