"""Fixtures of the fault tests (unit and plugin level): a private server registry and a leak check."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_llmserve.config import CACHE_ENV
from tests.standins.helpers import describe, kill_marked, marked_processes


@pytest.fixture
def private_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry of running servers of our own: other runs on this machine neither see nor disturb ours."""
    cache = tmp_path / "llmserve-cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    return cache / "running"


@pytest.fixture
def token() -> Iterator[str]:
    """A unique mark for this test's processes; whatever still carries it at the end is a leak."""
    mark = f"fault-{uuid.uuid4().hex[:12]}"
    yield mark
    left = marked_processes(mark)
    if left:
        kill_marked(mark)
    assert not left, f"processes left behind: {describe(left)}"
