"""A server the configuration names by url (launched by a cluster manager): attached through the pool, its facts
parsed by the configured engine's adapter from the named log (read when facts are taken), /metrics and
/server_info, nothing launched or stopped. A small in-process HTTP server plays the remote engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ServerError
from pytest_llmserve.server.handle import engine_of
from pytest_llmserve.server.pool import AttachedHandle, ServerPool, read_boots, url_key
from tests.unit.local_http import QuietHandler, serving, url_of

DATA = Path(__file__).resolve().parents[2] / "data" / "logs"
SGLANG_INFO = json.loads((DATA / "real_sglang_0.5.15_h200_cuda_graph.server_info.json").read_text())
SGLANG_METRICS = (DATA / "real_sglang_0.5.15_h200_cuda_graph.metrics.txt").read_text()

pytestmark = pytest.mark.usefixtures("private_registry")


class _Engine(QuietHandler):
    """/health, /v1/models, /v1/completions (one token), /server_info and /metrics of an SGLang server."""

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        self.answer(status, content_type, body.encode() if isinstance(body, str) else json.dumps(body).encode())

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/health":
            self._send(200, "")
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "glm5-served"}]})
        elif self.path == "/server_info":
            self._send(200, SGLANG_INFO)
        elif self.path == "/metrics":
            self._send(200, SGLANG_METRICS, "text/plain")
        else:
            self._send(404, {"error": self.path})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.models_asked.append(body.get("model"))  # type: ignore[attr-defined]
        self._send(200, {"choices": [{"index": 0, "text": " hi", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture
def remote() -> Iterator[ThreadingHTTPServer]:
    with serving(_Engine, models_asked=[]) as server:
        yield server


def _pool(tmp_path: Path) -> ServerPool:
    return ServerPool(tmp_path / "run", tmp_path / "logs")


def test_an_attached_sglang_server_gives_sglangs_facts_from_server_info_metrics_and_its_log(
        tmp_path: Path, remote: ThreadingHTTPServer) -> None:
    log = tmp_path / "node-a.log"
    log.write_text("")  # the cluster's server has written nothing yet
    spec = ServerSpec(name="glm5", engine="sglang", url=url_of(remote) + "/v1", log=str(log), max_batch_size=64,
                      variant=(("cuda_graph", "on"),))
    pool = _pool(tmp_path)
    handle = pool.get(spec)
    assert isinstance(handle, AttachedHandle) and handle.spec_for_checks == spec
    assert handle.model_name == "glm5-served"  # asked of the server: no model configured
    assert engine_of(handle).name == "sglang" and engine_of(handle).nan_log_patterns  # its NaN lines
    facts = handle.facts()
    assert (facts.engine, facts.version, facts.max_batch_size, facts.cuda_graph_enabled) == (
        "sglang", "0.5.15", 4096, True)
    # The log is read when facts are taken: what the server logs during the run counts.
    log.write_text((DATA / "real_sglang_0.5.15_h200_cuda_graph.log").read_text())
    assert any("server_args" in line for lines in handle.facts().evidence.values() for line in lines)
    assert handle.describe() == (f"attached server glm5[cuda_graph=on] at {spec.url} "
                                 f"(not launched by this run; log: {log})")
    [boot] = read_boots(tmp_path / "run")
    assert (boot["launched"], boot["ok"], boot["pid"], boot["log"]) == (False, True, None, str(log))
    assert pool.stop_all() == [] and not pool.handles and not (tmp_path / "run" / "launches.jsonl").exists()


def test_a_missing_log_is_a_server_error_naming_the_path_and_the_server(
        tmp_path: Path, remote: ThreadingHTTPServer) -> None:
    missing = tmp_path / "nowhere.log"
    spec = ServerSpec(name="ray", engine="vllm", url=url_of(remote), log=str(missing), source="llmserve.toml")
    pool = _pool(tmp_path)
    with pytest.raises(ServerError) as info:
        pool.get(spec)
    assert str(info.value).startswith(f"ray: log = '{missing}' (from llmserve.toml) does not exist")
    with pytest.raises(ServerError, match="ray could not be attached earlier in this run"):
        pool.get(spec)
    assert remote.models_asked == []  # type: ignore[attr-defined] # refused before any request


def test_configurations_naming_one_server_share_its_request_lock(tmp_path: Path,
                                                                 remote: ThreadingHTTPServer) -> None:
    assert url_key("http://node-a:8000") == url_key("http://node-a:8000/") == url_key("http://node-a:8000/v1")
    assert url_key("http://node-a:8000") != url_key("http://node-b:8000")
    pool = _pool(tmp_path)
    pool.max_alive = 1
    four = ServerSpec(name="ray", engine="vllm", url=url_of(remote), max_batch_size=4,
                      variant=(("max_batch_size", "4"),))
    eight = ServerSpec(name="ray", engine="vllm", url=url_of(remote) + "/", max_batch_size=8,
                       variant=(("max_batch_size", "8"),))
    a, b = pool.get(four), pool.get(eight)
    assert a.request_lock is b.request_lock
    assert len(pool.handles) == 2  # attaching one never stops the other (max_alive is for local boots)


def test_a_reference_is_got_beside_the_current_server_and_the_pool_s_size_is_restored(
        tmp_path: Path, remote: ThreadingHTTPServer) -> None:
    log = tmp_path / "a.log"
    log.write_text("")
    current = ServerSpec(name="a", engine="vllm", url=url_of(remote), log=str(log))
    reference = ServerSpec(name="b", engine="vllm", url=url_of(remote))
    pool = _pool(tmp_path)
    assert pool.max_alive == 1
    here = pool.get(current)
    there = pool.get_beside(reference, current)
    assert pool.max_alive == 1 and set(pool.handles.values()) == {here, there}  # both up, the bound as it was
    # The handle a test's report reads the server log of: only one with a log.
    assert pool.launched_handle(current) is here and pool.launched_handle(reference) is None
    assert pool.stop_all() == []


def test_a_worker_attaching_to_another_workers_server_gets_its_gpu_scope(tmp_path: Path,
                                                                         remote: ThreadingHTTPServer) -> None:
    """The worker that booted the server found its GPUs and GPU pids (server/GpuScope); a worker attaching to it
    reads them from the record, so its rounds count only other processes on those GPUs (without, every GPU counted,
    and the server's own GPU processes in another pid namespace against itself)."""
    from pytest_llmserve.server.gpu_scope import GpuScope
    from pytest_llmserve.server.pool import SharedServer

    scope = GpuScope((0, 1), frozenset({2_811_034}), "pid 2811034 (NVML's pid namespace, not this one)")
    spec = ServerSpec(name="glm5", engine="sglang")
    info: SharedServer = {"url": url_of(remote) + "/v1", "model": "glm5-served", "pid": None, "gpu_scope": scope.to_dict()}
    attached = _pool(tmp_path)._attach(spec, info)
    assert attached.gpu_scope == scope
    assert json.loads(json.dumps(scope.to_dict())) == scope.to_dict()  # what the record holds survives JSON
    without = _pool(tmp_path)._attach(spec, {**info, "gpu_scope": None})
    assert without.gpu_scope is None
