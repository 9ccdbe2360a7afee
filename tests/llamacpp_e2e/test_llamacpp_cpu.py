"""End to end on a real CPU llama-server: boot through the plugin, generate with logprobs, read facts
back, tear down. Skipped (with the reason) where no llama-server is built (scripts/build_llamacpp_cpu.sh:
659 s of CPU time, ~5.5-6 min on two idle cores, 19-22 min on a loaded one). Without it the adapter is
covered by the recorded log lines and responses in tests/unit/engines/test_llamacpp.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec, cache_dir
from pytest_llmserve.engines.llamacpp.facts import LlamaCppFacts, check_llamacpp_execution
from pytest_llmserve.engines.llamacpp.launch import find_llama_server
from pytest_llmserve.server import procs
from pytest_llmserve.server.handle import ServerHandle

pytestmark = pytest.mark.slow

BINARY = find_llama_server()
GGUF = cache_dir() / "downloads" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
needs_server = pytest.mark.skipif(
    BINARY is None or not GGUF.is_file(),
    reason="no llama-server built (run scripts/build_llamacpp_cpu.sh, ~6 min on 2 idle cores, or set LLAMA_SERVER) "
    f"or no GGUF at {GGUF} (llmserve setup downloads it)",
)


def cpu_spec(**kwargs: object) -> ServerSpec:
    assert BINARY is not None
    base: dict[str, object] = {
        "name": "llamacpp-cpu",
        "engine": "llamacpp",
        "model": str(GGUF),
        "argv": tuple(BINARY),
        "parallel": 2,
        "context_size": 4096,
        "flash_attention": False,
        "cuda_graph": CudaGraphSpec(enabled=False),
        "startup_timeout_s": 300.0,
        "source": "tests/llamacpp_e2e",
    }
    base.update(kwargs)
    return ServerSpec(**base)  # type: ignore[arg-type]


@needs_server
def test_boot_generate_facts_teardown(tmp_path: Path) -> None:
    s = cpu_spec()
    with ServerHandle(s, log_dir=tmp_path) as server:
        with server.client() as client:
            out = client.complete("The capital of France is", 8, ignore_eos=True)
            assert out.ok, out.describe()
            assert out.completion_tokens == 8 and len(out.tokens) == 8
            assert all(t.logprob is not None and t.logprob <= 0 for t in out.tokens)
            assert out.text.strip().startswith("Paris"), out.describe()
        info = server.adapter.fetch_server_info(server.base_url)  # type: ignore[attr-defined]
        assert info is not None and info["total_slots"] == 2
        facts = server.adapter.parse_facts(server.log_text(), server.metrics_text(), info)
        pid = server.pid
    assert isinstance(facts, LlamaCppFacts)
    assert facts.tokens_predicted is not None and facts.tokens_predicted >= 8
    statuses = {r.name: r.status for r in check_llamacpp_execution(s, facts)}
    assert statuses == {
        "speculative": "pass",
        "seed": "pass",
        "cuda_graph.used_in_decode": "pass",
        "flash_attention": "pass",
        "context_size": "pass",
        "parallel": "pass",
    }, statuses
    assert pid is not None and not procs.pid_alive(pid)


@needs_server
def test_api_key_travels_in_the_environment_and_is_enforced(tmp_path: Path) -> None:
    import httpx
    import psutil

    s = cpu_spec(name="llamacpp-key", api_key="sk-llamacpp-e2e")
    with ServerHandle(s, log_dir=tmp_path) as server:  # readiness itself sends the key
        assert httpx.get(server.base_url + "/v1/models", timeout=30).status_code == 401
        with server.client() as client:
            assert client.complete("Hello", 2).ok
        assert server.pid is not None
        assert "sk-llamacpp-e2e" not in " ".join(psutil.Process(server.pid).cmdline())  # not visible in ps


@needs_server
def test_suite_items_through_the_plugin(pytester: pytest.Pytester) -> None:
    assert BINARY is not None
    pytester.makeini("[pytest]\n")  # pins the rootdir, where the plugin reads llmserve.toml
    pytester.makefile(
        ".toml",
        llmserve=textwrap.dedent(f"""
        [tool.llmserve.servers.cpu]
        engine = "llamacpp"
        model = "{GGUF}"
        argv = ["{BINARY[0]}"]
        parallel = 4
        context_size = 8192
        flash_attention = false
        startup_timeout_s = 300
    """),
    )
    result = pytester.runpytest_subprocess(
        "--llmserve-suite",
        "-k",
        "boots_and_generates or config_is_execution or no_nan",
        "-v",
        "-rs",
        timeout=900,
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 3 and outcomes.get("passed", 0) >= 2, (
        outcomes
    )
    if outcomes.get("skipped"):
        # Until ServerHandle.facts() passes /props to the adapter, the seed (reported only there) is
        # unverifiable; every other check must pass.
        unverifiable = [line for line in result.outlines if line.strip().startswith("UNVERIFIABLE ")]
        assert [line.split()[1] for line in unverifiable] == ["seed:"], result.outlines
