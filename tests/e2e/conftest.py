"""End-to-end tests against the real vLLM CPU server (the embedded default, set up by `llmserve setup`).

Inner pytest runs (pytester, in a subprocess) whose case is about booting, sharing, tearing down or the
launch configuration boot their own server(s). The others attach to a server of ``shared_servers`` (one boot
per configuration for the whole test run, tests/e2e/shared.py). Inner runs use tiny workloads so a round
takes seconds. Each module marks itself ``slow``: a conftest's ``pytestmark`` marks no test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import CACHE_ENV, cache_dir
from pytest_llmserve.engines import embedded
from tests.e2e.shared import SharedServers
from tests.standins.helpers import server_toml

# pytester points HOME at a temporary directory; inner runs must still find the real cache.
REAL_CACHE = str(cache_dir())


@pytest.fixture(autouse=True)
def _real_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, REAL_CACHE)


@pytest.fixture(scope="session")
def shared_servers(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedServers]:
    """Real servers booted once per configuration for the whole run (tests/e2e/shared.py): every configuration
    the collected tests' modules name in ``SHARED_SERVERS``, booted together."""
    pool = SharedServers(tmp_path_factory.mktemp("shared-servers"), Path(REAL_CACHE) / "models" / "derived")
    _POOLS.append(pool)
    pool.start(sorted({name for item in request.session.items if _uses_shared_servers(item)
                       for name in getattr(getattr(item, "module", None), "SHARED_SERVERS", ())}))
    try:
        yield pool
    finally:
        pool.stop_all()
        _POOLS.remove(pool)
        for name, seconds in pool.boots.items():
            print(f"MEASURE shared server {name}: booted once in {seconds:.1f} s")


def _uses_shared_servers(item: pytest.Item | None) -> bool:
    return item is not None and "shared_servers" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not embedded.is_ready():
        skip = pytest.mark.skip(reason="embedded default not set up: run `llmserve setup` (CI does)")
        for item in items:
            if "/e2e/" in str(item.path):
                item.add_marker(skip)
    # The tests attached to the shared servers first, one after another: the servers (about 4 GB of memory
    # each) are then stopped before the tests that boot their own, which keeps memory on a 24 GB CI machine.
    items[:] = [item for item in items if _uses_shared_servers(item)] + \
               [item for item in items if not _uses_shared_servers(item)]


_POOLS: list[SharedServers] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the shared block, stop the shared servers (a later user would boot them again)."""
    if _uses_shared_servers(item) and not _uses_shared_servers(nextitem):
        for pool in _POOLS:
            pool.stop_all()


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


# No warm-up request in each round: the gate's warm-up rounds already discard a cold server's first rounds, and
# the one request, streamed alone before the timed eight, was a third of every round. Measured on the embedded
# default (2-core AMD EPYC, AVX2, float32, 2026-12-04), 7 rounds of each alternated on one server, the first of
# each dropped: round median 8.32 s with it, 5.30 s without; output throughput median 48.49 and 48.36 tok/s,
# CV 3.7 % and 3.3 %.
TINY_WORKLOAD = """
[workloads.tiny]
num_prompts = 8
input_len = 32
output_len = 32
max_concurrency = 8
warmup = 0
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


def expect_outcomes(result: pytest.RunResult, **counts: int) -> None:
    """``result.assert_outcomes(**counts)``, failing with the inner run's own account (its failures and short
    summary) instead of two dicts: a CI log is then enough to see why an inner test did not end as expected."""
    try:
        result.assert_outcomes(**counts)
    except AssertionError:
        out = result.stdout.str()
        start = out.find("= FAILURES =")
        if start < 0:
            start = out.find("= ERRORS =")
        account = out[start:] if start >= 0 else out
        raise AssertionError(f"inner run outcomes {result.parseoutcomes()} != {counts}; its account "
                             f"(last 12,000 characters):\n{account[-12000:]}") from None
