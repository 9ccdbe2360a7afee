"""Engine adapters: one folder (or module) per engine, each listed once in
:data:`pytest_llmserve.engine_registry.ADAPTERS`; here, the adapter of an engine, found by its name, a
server's configuration, a ``/metrics`` page or a log (modules are imported only when their engine is used),
and the variables of the shell that a launched server's engine reads (:func:`engine_environment`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pytest_llmserve import engine_registry
from pytest_llmserve.engines.base import GENERIC_ENV_PREFIXES, EngineAdapter
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.redaction import redact_env

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec


def adapter_named(engine: str) -> EngineAdapter:
    """The adapter registered as ``engine``; KeyError for an unknown name."""
    module, _, cls = engine_registry.ADAPTERS[engine].adapter.partition(":")
    adapter: EngineAdapter = getattr(importlib.import_module(module), cls)()
    return adapter


def adapter_for(spec: ServerSpec) -> EngineAdapter:
    """The adapter of ``spec.engine``."""
    if spec.engine not in engine_registry.ADAPTERS:
        raise ConfigError(f"server {spec.id}: unknown engine {spec.engine!r} (from {spec.source}); "
                          f"known: {', '.join(sorted(engine_registry.ADAPTERS))}")
    return adapter_named(spec.engine)


def adapter_for_metrics(metrics_text: str) -> EngineAdapter | None:
    """The engine whose metric names a ``/metrics`` page uses (an attached server of unknown engine)."""
    for name in engine_registry.ADAPTERS:
        adapter = adapter_named(name)
        if adapter.metrics_prefix and adapter.metrics_prefix in metrics_text:
            return adapter
    return None


def adapter_for_log(log_text: str) -> EngineAdapter | None:
    """The engine whose own lines a server log holds (for ``llmserve facts`` without ``--engine``)."""
    for name in engine_registry.ADAPTERS:
        adapter = adapter_named(name)
        if adapter.log_signature is not None and adapter.log_signature.search(log_text):
            return adapter
    return None


# --------------------------------------------------------------------------- inherited environment

# Variables that say where things are, or which of the host's devices a server gets, not how it runs:
# they differ between users and CI runners of one set-up (the devices' model and count are in "hardware").
_PLACE_ONLY_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                             "CUDA_DEVICE_ORDER"})
_PLACE_ONLY_SUFFIXES = ("_HOME", "_CACHE", "_CACHE_DIR", "_CACHE_ROOT", "_CONFIG_ROOT", "_DIR", "_PATH")


def engine_env_prefixes(engine: str) -> tuple[str, ...]:
    """Prefixes of the variables a server of ``engine`` reads: the libraries' (:data:`GENERIC_ENV_PREFIXES`)
    and the engine's own (its adapter's ``env_prefixes``); every engine's for ``command``, which may run
    any of them; none for an engine that launches nothing (``external``: the shell here is not its shell)."""
    if engine not in engine_registry.ADAPTERS:
        return GENERIC_ENV_PREFIXES
    adapter = adapter_named(engine)
    if not adapter.launches:
        return ()
    own = adapter.env_prefixes
    if engine == "command":
        own = tuple(prefix for name in engine_registry.ADAPTERS for prefix in adapter_named(name).env_prefixes)
    return tuple(dict.fromkeys(GENERIC_ENV_PREFIXES + own))


def engine_environment(spec: ServerSpec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: this process's) that a launched ``spec`` server inherits and
    its engine reads, by prefix (``VLLM_CPU_KVCACHE_SPACE``, ``OMP_NUM_THREADS``...), secrets masked
    (:func:`~pytest_llmserve.redaction.redact_env`).

    Left out: those the spec's own ``env`` sets (they override the shell's and are in ``server_args``) and
    those that only name a place or a device (:data:`_PLACE_ONLY_ENV`, ``*_HOME``, ``*_CACHE_DIR``...).
    """
    prefixes = engine_env_prefixes(spec.engine)
    if not prefixes or spec.attached:  # attached: launched elsewhere, the shell here is not its shell
        return {}
    environ = os.environ if environ is None else environ
    own = {name for name, _ in spec.env}
    inherited = [(name, environ[name]) for name in sorted(environ)
                 if name.startswith(prefixes) and name not in own and name not in _PLACE_ONLY_ENV
                 and not name.endswith(_PLACE_ONLY_SUFFIXES)]
    return redact_env(inherited)
