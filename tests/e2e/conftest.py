"""End-to-end tests against the real vLLM CPU server (the embedded default, set up by `llmserve setup`).

Each inner pytest run (pytester, in a subprocess) boots its own server(s), since booting, sharing and
tearing down is what these tests prove. Inner runs use tiny workloads so a round takes seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import CACHE_ENV, cache_dir
from pytest_llmserve.engines import embedded
from tests.standins.helpers import server_toml

pytestmark = pytest.mark.slow

# pytester points HOME at a temporary directory; inner runs must still find the real cache.
REAL_CACHE = str(cache_dir())


@pytest.fixture(autouse=True)
def _real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, REAL_CACHE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not embedded.is_ready():
        skip = pytest.mark.skip(reason="embedded default not set up: run `llmserve setup` (CI does)")
        for item in items:
            if "/e2e/" in str(item.path):
                item.add_marker(skip)


def default_server_toml(name: str = "default", **overrides: Any) -> str:
    """The embedded default server as a [servers.NAME] table, with overrides (None leaves a field out)."""
    spec = embedded.default_spec()
    fields: dict[str, Any] = {
        "engine": "vllm", "model": spec.model, "python": spec.python,
        "served_model_name": spec.served_model_name, "args": list(spec.args), "env": dict(spec.env),
        "eager": True, "startup_timeout_s": 600,
    }
    fields.update(overrides)
    return server_toml(name, **{key: value for key, value in fields.items() if value is not None})


TINY_WORKLOAD = """
[workloads.tiny]
num_prompts = 8
input_len = 32
output_len = 32
max_concurrency = 8
warmup = 1
"""


@pytest.fixture
def write_config(pytester: pytest.Pytester) -> Callable[[str], Path]:
    def write(body: str) -> Path:
        return Path(pytester.makefile(".toml", llmserve=body))

    return write


def boots_line(output: str) -> str:
    for line in output.splitlines():
        if line.startswith("server boots:"):
            return line
    return ""
