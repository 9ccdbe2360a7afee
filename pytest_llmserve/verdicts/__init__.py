"""Verdicts: pure decisions over evidence (oracle findings, statistics)."""
