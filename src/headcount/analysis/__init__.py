"""Analyses of a trained model's heads: importance measures, LRP relevance, roles, specialisation."""
