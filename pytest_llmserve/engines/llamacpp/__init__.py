"""llama.cpp (llama-server): launch plan and facts parsing."""
