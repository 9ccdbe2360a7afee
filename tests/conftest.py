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
    """This repository's default run leaves out the multi-host tests (minutes of real boots over ssh);
    ``-m multihost`` (tox -e multihost) runs them. Here, not in addopts, so no user run is affected."""
    if config.option.markexpr:
        return
    chosen = [item for item in items if item.get_closest_marker("multihost") is None]
    if len(chosen) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in chosen])
        items[:] = chosen
