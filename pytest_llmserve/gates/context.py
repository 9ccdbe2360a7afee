"""The context a benchmark records: everything that must match for two runs to be comparable.

The engine and its version, the model, the server arguments, the hardware (this host's identity,
:mod:`pytest_llmserve.server.hardware`), the workload, the plugin and the Python version, and the environment
variables a launched server inherits from the shell and its engine reads
(:func:`pytest_llmserve.engines.engine_environment`, under ``engine_env``; none for a server attached by url).
Before it is returned the context is made portable (paths under the plugin's cache are written
``<cache>/...``) and safe to store (secrets become ``***``) by :mod:`pytest_llmserve.evidence.environment`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.engines import engine_environment
from pytest_llmserve.evidence.environment import portable_paths, python_label, redact_context, server_args
from pytest_llmserve.server.hardware import hardware_context
from pytest_llmserve.version import __version__


def build_context(
    spec: ServerSpec,
    workload: Workload,
    *,
    engine_version: str | None,
    hardware: Mapping[str, Any] | None = None,
    plugin_version: str | None = None,
    python: str | None = None,
    extra: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Everything that must match for two benchmark runs to be comparable.

    ``hardware`` defaults to :func:`~pytest_llmserve.server.hardware.hardware_context`, ``plugin_version`` to
    this package's version, ``python`` to :func:`~pytest_llmserve.evidence.environment.python_label`,
    ``environ`` (the shell the server inherits) to ``os.environ``.
    ``extra`` adds keys (they take part in comparisons).
    """
    ctx: dict[str, Any] = {
        "engine": spec.engine,
        "engine_version": engine_version,
        "model": spec.model,
        "server_args": server_args(spec),
        "hardware": dict(hardware) if hardware is not None else hardware_context(),
        "workload": asdict(workload),
        "plugin_version": __version__ if plugin_version is None else plugin_version,
        "python": python or python_label(),
    }
    inherited = engine_environment(spec, environ)
    if inherited:  # only when there is one, so that baselines recorded without such variables still compare
        ctx["engine_env"] = inherited
    if extra:
        ctx.update(extra)
    return redact_context(portable_paths(ctx))
