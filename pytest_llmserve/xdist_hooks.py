"""pytest-xdist hooks, in their own module (registered only when pytest-xdist is installed, since pytest
rejects hook implementations it has no specification for), and the tests of which process this is."""

from __future__ import annotations

from typing import Any

import pytest

#: The key of ``workerinput`` that carries the run directory from the controller to its workers.
RUN_DIR_KEY = "llmserve_run_dir"


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
    """Hands the controller's run directory (a path; created by whichever process boots first) to each worker."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[RUN_DIR_KEY] = self.run_dir


def register(config: pytest.Config, run_dir: str) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(run_dir), "llmserve-xdist-hooks")
