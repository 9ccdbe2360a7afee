"""The package's version, in a module of its own at the bottom of the import layers: the results document and
the baseline context record it, and importing the package root for it would reach every layer through the
root's public API (``pytest_llmserve.__version__`` is this value, loaded on first access like the rest)."""

__version__ = "0.1.0"
