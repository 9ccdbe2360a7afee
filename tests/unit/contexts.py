"""The benchmark context the unit tests build: one vLLM server spec and the context ``build_context`` records for it
(shared by the context, baseline-store and comparability tests, so that each compares the same context)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pytest_llmserve.config import CudaGraphSpec, ServerSpec, Workload
from pytest_llmserve.gates.context import build_context

#: A fixed host, so that no test probes this machine's hardware.
HW = {"cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}


def spec(**kw: Any) -> ServerSpec:
    """A vLLM server with CUDA graphs and a memory fraction; ``kw`` changes its fields."""
    base = ServerSpec(
        name="srv",
        engine="vllm",
        model="/models/smol",
        port=8123,
        cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4)),
        mem_fraction=0.9,
    )
    return replace(base, **kw)


def ctx(**kw: Any) -> dict[str, Any]:
    """The context of :func:`spec` (``kw`` changes the spec; ``engine_version`` the engine's version) on :data:`HW`."""
    engine_version = kw.pop("engine_version", "0.32.0")
    return build_context(
        spec(**kw),
        Workload("smoke", num_prompts=16),
        engine_version=engine_version,
        hardware=HW,
        plugin_version="0.1.0",
        python="CPython 3.11",
    )
