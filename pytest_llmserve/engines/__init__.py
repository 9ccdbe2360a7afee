"""Engine adapters: one folder (or module) per engine, listed once in :data:`ADAPTERS`.

Adding an engine is one folder plus one entry here. Modules are imported only when their engine is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pytest_llmserve.errors import ConfigError

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec
    from pytest_llmserve.engines.base import EngineAdapter

#: engine name (the ``engine`` key of a server) -> "module:AdapterClass"
ADAPTERS: dict[str, str] = {
    "vllm": "pytest_llmserve.engines.vllm.launch:VLLMAdapter",
    "sglang": "pytest_llmserve.engines.sglang.launch:SGLangAdapter",
    "llamacpp": "pytest_llmserve.engines.llamacpp.launch:LlamaCppAdapter",
    "external": "pytest_llmserve.engines.external:ExternalAdapter",
    "command": "pytest_llmserve.engines.command:CommandAdapter",
}


def adapter_named(engine: str) -> EngineAdapter:
    """The adapter registered as ``engine``; KeyError for an unknown name."""
    module, _, cls = ADAPTERS[engine].partition(":")
    adapter: EngineAdapter = getattr(importlib.import_module(module), cls)()
    return adapter


def adapter_for(spec: ServerSpec) -> EngineAdapter:
    """The adapter of ``spec.engine``."""
    if spec.engine not in ADAPTERS:
        raise ConfigError(f"server {spec.id}: unknown engine {spec.engine!r} (from {spec.source}); "
                          f"known: {', '.join(sorted(ADAPTERS))}")
    return adapter_named(spec.engine)


def adapter_for_metrics(metrics_text: str) -> EngineAdapter | None:
    """The engine whose metric names a ``/metrics`` page uses (an attached server of unknown engine)."""
    for name in ADAPTERS:
        adapter = adapter_named(name)
        if adapter.metrics_prefix and adapter.metrics_prefix in metrics_text:
            return adapter
    return None


def adapter_for_log(log_text: str) -> EngineAdapter | None:
    """The engine whose own lines a server log holds (for ``llmserve facts`` without ``--engine``)."""
    for name in ADAPTERS:
        adapter = adapter_named(name)
        if adapter.log_signature is not None and adapter.log_signature.search(log_text):
            return adapter
    return None
