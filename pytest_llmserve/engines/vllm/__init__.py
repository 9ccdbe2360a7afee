"""vLLM: launch plan and facts parsing."""
