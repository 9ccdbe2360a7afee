"""vLLM / command / external adapters map logical options to argv without a shell."""

from __future__ import annotations

import json

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines import adapter_for
from pytest_llmserve.engines.vllm.launch import VLLMAdapter
from pytest_llmserve.errors import ConfigError


def test_vllm_cpu_launch_uses_module_entry_point_and_explicit_seed() -> None:
    spec = ServerSpec(name="d", engine="vllm", model="/m", python="/venv/bin/python", eager=True,
                      served_model_name="small", seed=7, max_batch_size=4, context_size=1024)
    plan = VLLMAdapter().launch_plan(spec, "127.0.0.1", 8123)
    argv = plan.argv
    assert argv[:5] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--port") + 1] == "8123"
    assert "--enforce-eager" in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert plan.base_url == "http://127.0.0.1:8123" and plan.model_name == "small"
    assert plan.health_path == "/health" and plan.generation_probe


def test_vllm_gets_the_api_key_through_its_environment_never_on_the_command_line() -> None:
    spec = ServerSpec(name="d", engine="vllm", model="/m", python="/venv/bin/python", api_key="sk-secret")
    plan = VLLMAdapter().launch_plan(spec, "127.0.0.1", 1)
    assert plan.env["VLLM_API_KEY"] == "sk-secret"
    assert not any("sk-secret" in arg for arg in plan.argv) and "--api-key" not in plan.argv


def test_vllm_cuda_graph_sizes_and_backend() -> None:
    spec = ServerSpec(name="g", engine="vllm", model="/m", python="/p",
                      cuda_graph=CudaGraphSpec(enabled=True, batch_sizes=(1, 2, 4)),
                      attention_backend="FLASH_ATTN", mem_fraction=0.8)
    argv = VLLMAdapter().launch_plan(spec, "127.0.0.1", 1).argv
    cc = json.loads(argv[argv.index("--compilation-config") + 1])
    assert cc == {"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 4}
    assert argv[argv.index("--attention-backend") + 1] == "FLASH_ATTN"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
    off = ServerSpec(name="g", engine="vllm", model="/m", python="/p", cuda_graph=CudaGraphSpec(enabled=False))
    argv = VLLMAdapter().launch_plan(off, "127.0.0.1", 1).argv
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {"cudagraph_mode": "NONE"}


def test_vllm_rejects_options_it_has_no_flag_for() -> None:
    spec = ServerSpec(name="n", engine="vllm", model="/m", python="/p", nsa_decode_backend="trtllm")
    with pytest.raises(ConfigError, match="nsa_decode_backend = 'trtllm' has no vLLM flag"):
        VLLMAdapter().launch_plan(spec, "127.0.0.1", 1)
    contradiction = ServerSpec(name="c", engine="vllm", model="/m", python="/p", eager=True,
                               cuda_graph=CudaGraphSpec(enabled=True))
    with pytest.raises(ConfigError, match="eager = true contradicts"):
        VLLMAdapter().launch_plan(contradiction, "127.0.0.1", 1)


def test_command_adapter_fills_placeholders_without_a_shell() -> None:
    spec = ServerSpec(name="c", engine="command", argv=("my-server", "--port={port}", "--host", "{host}", "; rm -rf /"))
    plan = adapter_for(spec).launch_plan(spec, "127.0.0.1", 9000)
    assert plan.argv == ["my-server", "--port=9000", "--host", "127.0.0.1", "; rm -rf /"]  # a literal argument


def test_external_adapter_launches_nothing() -> None:
    spec = ServerSpec(name="e", engine="external", url="http://127.0.0.1:1/v1", served_model_name="m")
    adapter = adapter_for(spec)
    assert adapter.launches is False
    plan = adapter.launch_plan(spec, "127.0.0.1", 0)
    assert plan.argv == [] and plan.base_url == "http://127.0.0.1:1" and plan.model_name == "m"
