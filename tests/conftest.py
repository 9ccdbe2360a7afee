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
    (real installs, tens of minutes), the ``multihost`` tests (real boots over ssh) and the fault catalogue's
    real-engine part (``power``: a dozen boots); any ``-m`` expression takes over (``-m builds``, ``-m multihost``,
    ``-m power``, tox -e builds / multihost / power). Here, not in addopts: the plugin
    registers no such rule for its users."""
    if config.option.markexpr:
        return
    long_runs = ("builds", "multihost", "power")
    kept = [item for item in items if not any(item.get_closest_marker(m) for m in long_runs)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


# --------------------------------------------------------------------------- the suite's own time split
# Printed at the end of every run of this repository's tests (CI's log included), so that a change in test time
# shows where it came from: seconds per group (the top folder under tests/) and the slowest files, each summed
# over set-up, call and tear-down. Measured per report, so it holds under xdist on the controller as well.
_TEST_SECONDS: dict[str, float] = {}
_TEST_COUNTS: dict[str, int] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _TEST_SECONDS[path] = _TEST_SECONDS.get(path, 0.0) + report.duration
    if report.when == "call":
        _TEST_COUNTS[path] = _TEST_COUNTS.get(path, 0) + 1


def _group(path: str) -> str:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _TEST_SECONDS:
        return
    groups: dict[str, list[float]] = {}
    for path, seconds in _TEST_SECONDS.items():
        entry = groups.setdefault(_group(path), [0.0, 0.0])
        entry[0] += seconds
        entry[1] += _TEST_COUNTS.get(path, 0)
    total = sum(_TEST_SECONDS.values())
    terminalreporter.section("test time by group (set-up + call + tear-down)")
    for name, (seconds, count) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{name:<16} {seconds:8.1f} s  {seconds / total:6.1%}  {int(count)} tests")
    terminalreporter.write_line(f"{'total':<16} {total:8.1f} s")
    terminalreporter.write_line("slowest files:")
    for path, seconds in sorted(_TEST_SECONDS.items(), key=lambda kv: -kv[1])[:12]:
        terminalreporter.write_line(f"  {seconds:8.1f} s  {path} ({_TEST_COUNTS.get(path, 0)} tests)")
