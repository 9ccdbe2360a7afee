"""On a real GPU: llama-server (CUDA build) booted, inspected and torn down, the GPU checks around it.

Run by ``scripts/gpu/run_gpu_suite.sh devtests`` on the lent GPU machine, which sets ``LLAMA_SERVER``
(the CUDA llama-server) and ``LLMSERVE_GGUF`` (the SmolLM2 GGUF). Everything here is skipped, with
the reason, where either is missing or no GPU is visible.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.engines.llamacpp.facts import LlamaCppFacts, check_llamacpp_execution
from pytest_llmserve.errors import PreflightError
from pytest_llmserve.server import gpu, procs
from pytest_llmserve.server.handle import ServerHandle

BINARY = os.environ.get("LLAMA_SERVER", "")
MODEL = os.environ.get("LLMSERVE_GGUF", "")
GPUS = gpu.list_gpus()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS, reason="no GPU visible (neither NVML nor nvidia-smi answered)"),
    pytest.mark.skipif(
        not (BINARY and Path(BINARY).is_file()), reason="LLAMA_SERVER (a CUDA llama-server) not set"
    ),
    pytest.mark.skipif(
        not (MODEL and Path(MODEL).is_file()), reason="LLMSERVE_GGUF (the SmolLM2 GGUF) not set"
    ),
]


def spec(**kwargs: object) -> ServerSpec:
    base: dict[str, object] = {
        "name": "gpu-llamacpp",
        "engine": "llamacpp",
        "model": MODEL,
        "argv": (BINARY,),
        "gpu": True,
        "gpu_layers": 99,
        "context_size": 8192,
        "parallel": 4,
        "flash_attention": True,
        "startup_timeout_s": 300.0,
        "env": (("CUDA_VISIBLE_DEVICES", "0"),),
        "source": "tests/gpu",
    }
    base.update(kwargs)
    return ServerSpec(**base)  # type: ignore[arg-type]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    out = Path(os.environ.get("LLMSERVE_GPU_LOGS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _decode(server: ServerHandle, tokens: int = 64) -> None:
    with server.client() as client:
        out = client.complete("The history of the printing press", tokens, ignore_eos=True)
    assert out.ok, out.describe()
    assert out.completion_tokens == tokens, out.describe()
    assert out.tokens and all(t.logprob is not None for t in out.tokens), "no logprobs came back"


def _facts(server: ServerHandle) -> LlamaCppFacts:
    info = server.adapter.fetch_server_info(server.base_url)  # type: ignore[attr-defined]
    facts = server.adapter.parse_facts(server.log_text(), server.metrics_text(), info)
    assert isinstance(facts, LlamaCppFacts)
    return facts


def test_inventory_nvml_and_nvidia_smi_agree() -> None:
    nvml = gpu.snapshot(prefer="nvml")
    smi = gpu.snapshot(prefer="nvidia-smi")
    assert nvml.gpus and smi.gpus
    assert [(g.index, g.name, g.memory_total_mib) for g in nvml.gpus] == [
        (g.index, g.name, g.memory_total_mib) for g in smi.gpus
    ], (nvml.source, smi.source)
    summary = gpu.gpu_summary(nvml)
    assert summary["gpu_count"] == len(GPUS) and summary["driver"] and summary["cuda"], summary


@pytest.fixture
def stale_server() -> Iterator[tuple[subprocess.Popen[bytes], dict[int, int]]]:
    """A llama-server left running on GPU 0 on purpose, as a crashed earlier run would leave it,
    and each GPU's used memory before it started."""
    before = gpu.snapshot().used_mib()
    port = procs.free_port()
    proc = subprocess.Popen(
        [BINARY, "-m", MODEL, "--port", str(port), "-ngl", "99", "-c", "4096"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "the deliberately stale llama-server exited"
        time.sleep(0.5)
    yield proc, before
    procs.kill_tree(proc.pid, pgid=proc.pid)
    proc.wait(timeout=10)


def test_stale_gpu_process_is_named_and_memory_comes_back(
    stale_server: tuple[subprocess.Popen[bytes], dict[int, int]],
) -> None:
    proc, before = stale_server
    result = gpu.preflight_gpus(spec())
    mine = [p for p in result.processes if p.pid == proc.pid]
    assert not result.ok
    assert mine, f"the stale llama-server (pid {proc.pid}) was not found: {result.processes}"
    assert "llama-server" in (mine[0].command or mine[0].name), mine[0]
    with pytest.raises(PreflightError, match=rf"stale GPU process: pid {proc.pid} on GPU 0"):
        gpu.gpu_check(spec())
    assert gpu.snapshot().used_mib()[0] > before[0] + 100, "the stale server holds no GPU memory?"
    procs.kill_tree(proc.pid, pgid=proc.pid)
    back = gpu.wait_memory_returned(before, devices=[0], timeout_s=30)
    assert back.ok, back.message()
    assert gpu.preflight_gpus(spec()).ok, "GPU 0 still not clean after the stale server was killed"


def _boot_and_check(s: ServerSpec, log_dir: Path, tokens: int = 64) -> tuple[LlamaCppFacts, list[str]]:
    pre = gpu.preflight_gpus(s)
    assert pre.ok, pre.problems
    with ServerHandle(s, log_dir=log_dir) as server:
        _decode(server, tokens)
        during = gpu.snapshot().used_mib()
        facts = _facts(server)
        results = check_llamacpp_execution(s, facts)
    grew = [i for i in pre.devices if during.get(i, 0) > pre.baseline_used_mib.get(i, 0) + 100]
    assert grew == pre.devices, f"memory did not grow on every device the server should use: {during}"
    back = gpu.wait_memory_returned(pre.baseline_used_mib, devices=pre.devices, timeout_s=30)
    assert back.ok, back.message()
    failed = [r.message for r in results if r.status == "fail"]
    assert not failed, "\n".join(failed)
    return facts, [f"{r.status} {r.name}" for r in results]


def test_one_gpu_facts_and_teardown(log_dir: Path) -> None:
    facts, results = _boot_and_check(spec(cuda_graph=CudaGraphSpec(enabled=True)), log_dir)
    assert facts.cuda_graphs_compiled is True and facts.cuda_archs, facts.evidence.get("cuda_graphs_compiled")
    assert facts.offloaded_layers == facts.total_layers, facts.evidence.get("offloaded_layers")
    assert facts.devices_used == ("CUDA0",)
    assert facts.flash_attention is True
    assert facts.gpus and facts.gpus[0]["name"]
    assert "pass flash_attention" in results and "pass gpu_layers" in results and "pass tp.devices" in results


@pytest.mark.parametrize("enabled", [True, False], ids=["graphs-on", "graphs-off"])
def test_cuda_graph_use_is_proven_at_debug_verbosity(log_dir: Path, enabled: bool) -> None:
    s = spec(cuda_graph=CudaGraphSpec(enabled=enabled), args=("-lv", "5"))
    facts, results = _boot_and_check(s, log_dir, tokens=48)
    assert "pass cuda_graph.used_in_decode" in results, results
    assert (facts.graph_warmups > 0) is enabled


def test_cuda_graph_off_is_unverifiable_at_default_verbosity(log_dir: Path) -> None:
    facts, results = _boot_and_check(spec(cuda_graph=CudaGraphSpec(enabled=False)), log_dir)
    assert "unverifiable cuda_graph.used_in_decode" in results, results
    assert facts.verbosity == 4


@pytest.mark.skipif(len(GPUS) < 2, reason="needs two GPUs (nvidia-h200-x2)")
def test_one_server_split_over_two_gpus(log_dir: Path) -> None:
    s = spec(tp=2, env=(("CUDA_VISIBLE_DEVICES", "0,1"),), cuda_graph=CudaGraphSpec(enabled=True))
    pre = gpu.preflight_gpus(s)
    assert pre.devices == [0, 1] and pre.ok, pre.problems
    facts, results = _boot_and_check(s, log_dir)
    assert facts.devices_used == ("CUDA0", "CUDA1"), facts.evidence.get("devices_used")
    assert {"CUDA0", "CUDA1"} <= set(facts.model_buffers), facts.model_buffers
    assert "pass tp.devices" in results
    assert gpu.preflight_gpus(s).ok, "a GPU is not clean after teardown"
