"""Store: what a user keeps between runs (baselines), written atomically under a lock."""
