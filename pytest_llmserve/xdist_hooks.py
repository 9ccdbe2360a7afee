"""pytest-xdist hooks, in their own module (registered only when pytest-xdist is installed, since pytest
rejects hook implementations it has no specification for), and the tests of which process this is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_llmserve.gates.accounting import Accounting

#: The key of ``workerinput`` that carries the run directory from the controller to its workers.
RUN_DIR_KEY = "llmserve_run_dir"
#: The key of ``workeroutput`` that carries a worker's time accounting back to the controller.
ACCOUNTING_KEY = "llmserve_accounting"


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not is_worker(config)


def worker_run_dir(config: pytest.Config) -> str:
    return str(config.workerinput[RUN_DIR_KEY])  # type: ignore[attr-defined]


def keep_benchmarks_on_one_worker(config: pytest.Config) -> None:
    """``-n`` alone means ``--dist load``: switch it to ``loadgroup``, so the benchmarks, which carry
    ``xdist_group("llmserve-bench")``, run on one worker. An explicit other mode is left alone."""
    if is_controller(config) and getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"


class XdistHooks:
    """Controller side: hands the run directory (a path; created by whichever process boots first) to each
    worker, and collects each worker's time accounting when it finishes (the boots, requests and tests
    all happen in the workers, so the controller's own accounting is empty)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.worker_accounting: list[dict[str, Any]] = []

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_DIR_KEY] = self.run_dir

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        snapshot = getattr(node, "workeroutput", {}).get(ACCOUNTING_KEY)
        if isinstance(snapshot, dict):
            self.worker_accounting.append(snapshot)


class WorkerAccounting:
    """Worker side: sends this worker's accounting snapshot home in ``workeroutput``. pytest-xdist sends
    ``workeroutput`` after every ``pytest_sessionfinish`` implementation has run, this one included."""

    def __init__(self, accounting: Accounting) -> None:
        self.accounting = accounting

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        snapshot = self.accounting.snapshot()
        if snapshot["intervals"]:
            session.config.workeroutput[ACCOUNTING_KEY] = snapshot  # type: ignore[attr-defined]


def register(config: pytest.Config, run_dir: str) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(run_dir), "llmserve-xdist-hooks")


def register_worker(config: pytest.Config, accounting: Accounting) -> None:
    config.pluginmanager.register(WorkerAccounting(accounting), "llmserve-xdist-worker-accounting")


def workers_accounting(config: pytest.Config) -> list[dict[str, Any]]:
    """The accounting snapshots of the workers that finished (empty outside an xdist controller)."""
    hooks = config.pluginmanager.get_plugin("llmserve-xdist-hooks")
    return list(hooks.worker_accounting) if isinstance(hooks, XdistHooks) else []
