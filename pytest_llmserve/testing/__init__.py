"""Testing aids: derived checkpoints (NaN, scrambled) and the API property checks."""
