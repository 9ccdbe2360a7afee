"""The built-in suite, collected by ``pytest --llmserve-suite`` for every configured server."""
