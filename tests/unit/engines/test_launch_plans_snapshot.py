"""Every engine's launch plan for a table of configurations (command line, environment, URL, model name, notes;
or the refusal's message) gives what tests/data/launch-plans-snapshot.json records: a regression guard for
rewrites of the adapters' ``launch_plan`` (the snapshot was taken from them as they were before issue 36 split
them into one step per option).

Regenerate it only when a plan is meant to change: ``python tests/unit/engines/test_launch_plans_snapshot.py``,
and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines.base import EngineAdapter
from pytest_llmserve.engines.llamacpp.launch import GRAPHS_ENV, LlamaCppAdapter
from pytest_llmserve.engines.sglang.launch import KNOWN_VERSIONS, SGLangAdapter, flagset_for_version
from pytest_llmserve.engines.vllm.launch import VLLMAdapter
from pytest_llmserve.errors import ConfigError

SNAPSHOT = Path(__file__).resolve().parents[2] / "data" / "launch-plans-snapshot.json"
LLAMA_BIN = "/opt/llama.cpp/bin/llama-server"

_GRAPH_ON = CudaGraphSpec(enabled=True)
_GRAPH_OFF = CudaGraphSpec(enabled=False)
_GRAPH_SIZES = CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4, 8))
_GRAPH_MAX = CudaGraphSpec(enabled=True, max_batch_size=16)
_GRAPH_MODE = CudaGraphSpec(enabled=True, mode="BREAKABLE")
_GRAPH_ALL = CudaGraphSpec(enabled=True, batch_sizes=(1, 4), max_batch_size=4, mode="full")

#: (name, the spec's fields, host) for llama.cpp.
LLAMACPP: list[tuple[str, dict[str, Any], str]] = [
    ("minimal", {}, "127.0.0.1"),
    ("every-option", {"parallel": 4, "context_size": 4096, "gpu_layers": 99, "flash_attention": True, "tp": 1,
                      "gpu": True, "served_model_name": "small", "api_key": "sk-x", "seed": 7,
                      "cuda_graph": _GRAPH_ON, "env": (("A", "1"),)}, "0.0.0.0"),
    ("off-switches", {"flash_attention": False, "cuda_graph": _GRAPH_OFF, "max_batch_size": 2}, "::1"),
    ("tensor-split", {"tp": 3, "gpu": True}, ""),
    ("same-slots", {"parallel": 2, "max_batch_size": 2}, "localhost"),
    ("user-verbosity-and-metrics", {"args": ("-lv", "5", "--metrics", "--temp", "0")}, "127.0.0.1"),
    ("user-verbosity-equals", {"args": ("--verbosity=3",)}, "127.0.0.1"),
    ("speculative-draft", {"speculative": "draft", "args": ("-md", "/d.gguf")}, "127.0.0.1"),
    ("no-model", {"model": None}, "127.0.0.1"),
    ("clash", {"args": ("-c", "8", "--port=1", "-ngl", "3")}, "127.0.0.1"),
    ("slots-disagree", {"parallel": 2, "max_batch_size": 4}, "127.0.0.1"),
    ("graphs-on-env-set", {"cuda_graph": _GRAPH_ON, "env": ((GRAPHS_ENV, "0"),)}, "127.0.0.1"),
    ("attention-backend", {"decode_attention_backend": "fa"}, "127.0.0.1"),
    ("graph-sizes", {"cuda_graph": _GRAPH_SIZES}, "127.0.0.1"),
    ("eager", {"eager": False}, "127.0.0.1"),
    ("mem-fraction", {"mem_fraction": 0.5}, "127.0.0.1"),
    ("deterministic", {"deterministic": True}, "127.0.0.1"),
    ("speculative-without-draft", {"speculative": "draft"}, "127.0.0.1"),
    ("draft-without-speculative", {"args": ("--model-draft=/d.gguf",)}, "127.0.0.1"),
]

#: (name, the spec's fields, host) for SGLang, planned with every built-in flag table.
SGLANG: list[tuple[str, dict[str, Any], str]] = [
    ("minimal", {}, "127.0.0.1"),
    ("every-option", {"tp": 8, "attention_backend": "triton", "prefill_attention_backend": "fa3",
                      "decode_attention_backend": "flashinfer", "nsa_prefill_backend": "flashmla_sparse",
                      "nsa_decode_backend": "flashmla_kv", "max_batch_size": 64, "mem_fraction": 0.85,
                      "deterministic": True, "served_model_name": "glm", "api_key": "sk-x", "seed": 3,
                      "cuda_graph": _GRAPH_SIZES, "env": (("SGLANG_X", "1"),), "args": ("--trust-remote-code",)},
     "::1"),
    ("graphs-off", {"cuda_graph": _GRAPH_OFF}, "127.0.0.1"),
    ("graphs-off-prefill-in-args", {"cuda_graph": _GRAPH_OFF, "args": ("--cuda-graph-backend-prefill", "full")},
     "127.0.0.1"),
    ("graphs-on", {"cuda_graph": _GRAPH_ON}, "127.0.0.1"),
    ("graphs-max", {"cuda_graph": _GRAPH_MAX}, "127.0.0.1"),
    ("graphs-mode", {"cuda_graph": _GRAPH_MODE}, "127.0.0.1"),
    ("graphs-all", {"cuda_graph": _GRAPH_ALL, "args": ("--decode-log-interval", "5", "--enable-metrics")},
     "[::1]"),
    ("speculative-name", {"speculative": "EAGLE"}, "127.0.0.1"),
    ("speculative-json", {"speculative": '{"algorithm": "EAGLE", "num_steps": 3, "speculative_eagle_topk": 1, '
                                         '"enable_multi_layer_eagle": true, "token_map": null, "off": false, '
                                         '"num_draft_tokens": [4]}'}, "127.0.0.1"),
    ("speculative-bad-json", {"speculative": "{nope"}, "127.0.0.1"),
    ("speculative-json-list", {"speculative": " [1] "}, "127.0.0.1"),
    ("speculative-json-not-object", {"speculative": "{}"}, "127.0.0.1"),
    ("no-model", {"model": None}, "127.0.0.1"),
    ("bad-backend", {"attention_backend": "nope"}, "127.0.0.1"),
    ("clash", {"args": ("--tp-size=2", "--random-seed", "1", "--host", "h")}, "127.0.0.1"),
]

#: (name, the spec's fields, host) for vLLM.
VLLM: list[tuple[str, dict[str, Any], str]] = [
    ("minimal", {}, "127.0.0.1"),
    ("every-option", {"tp": 2, "attention_backend": "FLASH_ATTN", "max_batch_size": 16, "mem_fraction": 0.8,
                      "served_model_name": "m", "api_key": "sk-x", "seed": 5, "context_size": 2048,
                      "cuda_graph": _GRAPH_ALL, "deterministic": True, "speculative": '{"method": "ngram"}',
                      "args": ("--x",)}, "0.0.0.0"),
    ("graphs-off", {"cuda_graph": _GRAPH_OFF}, "::1"),
    ("eager", {"eager": True}, "127.0.0.1"),
]


def _spec(engine: str, fields: dict[str, Any]) -> ServerSpec:
    base: dict[str, Any] = {"name": "s", "engine": engine, "model": "/models/m", "source": "llmserve.toml"}
    if engine == "llamacpp":
        base["argv"] = (LLAMA_BIN,)
    if engine == "sglang":
        base["python"] = "/venv/bin/python"
    if engine == "vllm":
        base["python"] = "/venv/bin/python"
    return ServerSpec(**{**base, **fields})


def _plan(adapter: EngineAdapter, engine: str, fields: dict[str, Any], host: str) -> dict[str, Any]:
    try:
        plan = adapter.launch_plan(_spec(engine, fields), host, 8080)
    except ConfigError as exc:
        return {"error": str(exc)}
    return {"argv": plan.argv, "env": plan.env, "base_url": plan.base_url, "model_name": plan.model_name,
            "health_path": plan.health_path, "generation_probe": plan.generation_probe, "notes": plan.notes}


def planned() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, fields, host in LLAMACPP:
        out[f"llamacpp/{name}"] = _plan(LlamaCppAdapter(), "llamacpp", fields, host)
    for version in KNOWN_VERSIONS:
        for name, fields, host in SGLANG:
            out[f"sglang-{version}/{name}"] = _plan(SGLangAdapter(flagset_for_version(version)), "sglang", fields,
                                                    host)
    for name, fields, host in VLLM:
        out[f"vllm/{name}"] = _plan(VLLMAdapter(), "vllm", fields, host)
    return out


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    monkeypatch.delenv("LLAMA_SERVER", raising=False)


def test_launch_plans_match_the_snapshot() -> None:
    recorded = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    got = planned()
    assert sorted(got) == sorted(recorded)
    for key, plan in got.items():
        assert plan == recorded[key], key


if __name__ == "__main__":
    os.environ.pop(GRAPHS_ENV, None)
    os.environ.pop("LLAMA_SERVER", None)
    SNAPSHOT.write_text(json.dumps(planned(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {SNAPSHOT}")
