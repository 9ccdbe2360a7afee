"""Evidence: what a server says about itself (facts from logs and /metrics) and the correctness client."""
