"""Test-suite conftest: pytester for plugin tests.

pytester's in-process runs restore ``sys.modules`` afterwards, dropping modules first imported inside
them. If httpcore were first imported there, later code would see a second copy of its exception
classes, which httpx (imported earlier) no longer maps: import the HTTP stack here, once, up front.
"""

from __future__ import annotations

import anyio  # noqa: F401
import httpcore  # noqa: F401
import httpx  # noqa: F401
import pytest

import pytest_llmserve.evidence.client  # noqa: F401
import pytest_llmserve.load.runner  # noqa: F401
import pytest_llmserve.server.handle  # noqa: F401

pytest_plugins = ["pytester", "tests.standins.fixtures"]  # the fault tests' private_registry and token


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """This repository's default ``pytest tests`` leaves out the long real-engine runs: the ``builds`` tests
    (real installs, tens of minutes) and the ``multihost`` tests (real boots over ssh); any ``-m`` expression
    takes over (``-m builds``, ``-m multihost``, tox -e builds / multihost). Here, not in addopts: the plugin
    registers no such rule for its users."""
    if config.option.markexpr:
        return
    long_runs = ("builds", "multihost")
    kept = [item for item in items if not any(item.get_closest_marker(m) for m in long_runs)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
