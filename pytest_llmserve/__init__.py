"""pytest-llmserve: boot LLM inference servers and gate their decode and throughput.

The core modules (everything except :mod:`pytest_llmserve.plugin`) never import pytest,
so they can be used from plain scripts.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
