"""The ``llmserve`` command line."""
