"""Training: the one training loop, learning-rate schedules, decoding and translation scores."""
