"""Fixtures shared by the unit tests of more than one module."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmserve import weights


@pytest.fixture
def hashings(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file :func:`weights.file_sha256` reads, in order (it still hashes)."""
    seen: list[Path] = []
    real = weights.file_sha256

    def counting(path: Path) -> str:
        seen.append(path)
        return real(path)

    monkeypatch.setattr(weights, "file_sha256", counting)
    return seen
