"""Models: the contract every analysis sees (seq2seq), checkpoints, loading, devices, and the families."""
