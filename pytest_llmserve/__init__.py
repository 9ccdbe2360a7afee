"""pytest-llmserve: boot LLM inference servers and gate their decode and throughput.

The names in ``__all__`` are the public API for scripts, loaded on first use (``import pytest_llmserve``
imports neither pytest nor numpy). The core modules (everything except the pytest face:
:mod:`pytest_llmserve.plugin`, ``face``, ``session``, ``collection``, ``xdist_hooks``, ``report_hooks``,
``bench_face`` and the built-in test files in ``suite/``) never import pytest; a check that fails raises
:class:`~pytest_llmserve.gates.decode.CheckFailed`, and a gate returns its outcome::

    from pytest_llmserve import DecodeCheck, ServerHandle, load_config

    cfg = load_config(Path("."))
    with ServerHandle(cfg.server("glm5")) as server:
        DecodeCheck(server).no_nan().coherent()  # raises CheckFailed naming what failed
        print(DecodeCheck(server).config_is_execution().finish() or "every check reached a verdict")
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    "ABRunner", "BaselineError", "BenchGate", "BenchSpec", "ConfigError", "CudaGraphSpec", "DecodeCheck",
    "LLMClient", "LLMServeConfig", "LLMServeError", "PreflightError", "RequestError", "RunningServer",
    "ServerDiedError", "ServerError", "ServerFacts", "ServerHandle", "ServerPool", "ServerSpec", "ServerStartError",
    "Settings", "Workload", "__version__", "load_config", "run_workload",
]

# Where each public name is defined; imported on first access (module __getattr__, PEP 562).
_DEFINED_IN = {
    "pytest_llmserve.config": ("load_config", "LLMServeConfig", "ServerSpec", "CudaGraphSpec", "Workload"),
    "pytest_llmserve.settings": ("Settings", "BenchSpec"),
    "pytest_llmserve.server.handle": ("RunningServer", "ServerHandle"),
    "pytest_llmserve.server.pool": ("ServerPool",),
    "pytest_llmserve.evidence.client": ("LLMClient",),
    "pytest_llmserve.evidence.facts": ("ServerFacts",),
    "pytest_llmserve.load.runner": ("run_workload",),
    "pytest_llmserve.gates.decode": ("DecodeCheck",),
    "pytest_llmserve.gates.bench": ("BenchGate",),
    "pytest_llmserve.gates.ab": ("ABRunner",),
    "pytest_llmserve.errors": ("LLMServeError", "ConfigError", "ServerError", "ServerStartError", "ServerDiedError",
                               "PreflightError", "RequestError", "BaselineError"),
    "pytest_llmserve.version": ("__version__",),
}
_MODULE_OF = {name: module for module, names in _DEFINED_IN.items() for name in names}

if TYPE_CHECKING:
    from pytest_llmserve.config import CudaGraphSpec, LLMServeConfig, ServerSpec, Workload, load_config
    from pytest_llmserve.errors import (
        BaselineError,
        ConfigError,
        LLMServeError,
        PreflightError,
        RequestError,
        ServerDiedError,
        ServerError,
        ServerStartError,
    )
    from pytest_llmserve.evidence.client import LLMClient
    from pytest_llmserve.evidence.facts import ServerFacts
    from pytest_llmserve.gates.ab import ABRunner
    from pytest_llmserve.gates.bench import BenchGate
    from pytest_llmserve.gates.decode import DecodeCheck
    from pytest_llmserve.load.runner import run_workload
    from pytest_llmserve.server.handle import RunningServer, ServerHandle
    from pytest_llmserve.server.pool import ServerPool
    from pytest_llmserve.settings import BenchSpec, Settings
    from pytest_llmserve.version import __version__


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_llmserve' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
