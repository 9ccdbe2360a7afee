"""Engine adapters, one module each. ``adapter_for(spec)`` picks the adapter for a ServerSpec."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_llmserve.errors import ConfigError

if TYPE_CHECKING:
    from pytest_llmserve.config import ServerSpec
    from pytest_llmserve.engines.base import EngineAdapter


def adapter_for(spec: ServerSpec) -> EngineAdapter:
    """The adapter of ``spec.engine``; modules are imported lazily so unused engines cost nothing."""
    if spec.engine == "vllm":
        from pytest_llmserve.engines.vllm.launch import VLLMAdapter

        return VLLMAdapter()
    if spec.engine == "sglang":
        from pytest_llmserve.engines.sglang.launch import SGLangAdapter

        return SGLangAdapter()
    if spec.engine == "llamacpp":
        from pytest_llmserve.engines.llamacpp.launch import LlamaCppAdapter

        return LlamaCppAdapter()
    if spec.engine == "external":
        from pytest_llmserve.engines.external import ExternalAdapter

        return ExternalAdapter()
    if spec.engine == "command":
        from pytest_llmserve.engines.command import CommandAdapter

        return CommandAdapter()
    raise ConfigError(f"server {spec.id}: unknown engine {spec.engine!r} (from {spec.source})")
