"""Attach to a real vLLM server that something else launched (a cluster manager: Ray, Slurm, Kubernetes).

The test plays the cluster manager: it launches one real vLLM CPU server itself (eager, ``--max-num-seqs 4``,
its log to a file), then runs an inner pytest whose configuration attaches both combinations of the matrix
``max_batch_size = [4, 8]`` to that URL with that log. The combination that declares 4 passes the
config-is-execution check, the one that declares 8 fails it with the log's evidence; nothing is booted; the
server is still running after the inner run (it is not the run's to stop), and then the test stops it and
checks that nothing carrying its token is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from pytest_llmserve.engines import embedded
from pytest_llmserve.server import procs
from tests.e2e.conftest import boots_line, expect_outcomes
from tests.standins.helpers import MARK_ENV, describe, kill_marked, marked_processes

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 600.0


@dataclass
class ClusterServer:
    url: str
    log: Path
    proc: subprocess.Popen[bytes]
    token: str
    boot_s: float


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, model: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"vLLM exited with {proc.returncode} while booting; log {log}:\n"
                                 + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200 and \
                    httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"vLLM not ready within {STARTUP_TIMEOUT_S:g} s; log {log}")


@pytest.fixture
def cluster_server(tmp_path: Path) -> Iterator[ClusterServer]:
    """One real vLLM server launched outside the run under test, as a cluster manager would."""
    spec = embedded.default_spec()
    token = f"attach-{uuid.uuid4().hex[:12]}"
    port = procs.free_port("127.0.0.1")
    log = tmp_path / "cluster" / "vllm-node-a.log"
    log.parent.mkdir()
    assert spec.python and spec.model and spec.served_model_name
    argv = [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
            "--served-model-name", spec.served_model_name, "--host", "127.0.0.1", "--port", str(port),
            *spec.args, "--enforce-eager", "--max-num-seqs", "4"]
    started = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **dict(spec.env), MARK_ENV: token, "PYTHONUNBUFFERED": "1"},
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, proc, log, spec.served_model_name)
        yield ClusterServer(url, log, proc, token, time.monotonic() - started)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # only after a failure: the test stops it itself
            proc.wait(30)
        kill_marked(token)


TESTS = """
def test_config_is_execution(decode_check):
    decode_check.config_is_execution()

def test_generates(llm_client):
    out = llm_client.chat("What is the capital of France? Answer in one word.", 8)
    assert "Paris" in out.text, out.describe()
"""


def test_matrix_attached_to_a_server_launched_elsewhere(pytester: pytest.Pytester,
                                                       cluster_server: ClusterServer) -> None:
    server = cluster_server
    print(f"MEASURE attached server boot (by the 'cluster manager', eager): {server.boot_s:.1f} s")
    entry = f'{{ url = "{server.url}", log = "{server.log}" }}'
    pytester.makefile(".toml", llmserve=f"""
[servers.ray]
engine = "vllm"
eager = true
[matrix.ray]
max_batch_size = [4, 8]
[matrix.ray.attach]
"max_batch_size=4" = {entry}
"max_batch_size=8" = {entry}
""")
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_attached=TESTS)
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=600)
    print(f"MEASURE inner run against the attached server: {time.monotonic() - started:.1f} s wall")
    out = result.stdout.str()
    expect_outcomes(result, passed=3, failed=1)
    assert "PASSED test_attached.py::test_config_is_execution[ray[max_batch_size=4]]" in out
    assert "FAILED test_attached.py::test_config_is_execution[ray[max_batch_size=8]]" in out
    # The evidence: configured 8, the server's own log says it runs with --max-num-seqs 4.
    assert "FAIL          max_batch_size: requested 8; observed 4" in out, out
    assert "'max_num_seqs': 4" in out  # the log line quoted as evidence
    assert boots_line(out) == "server boots: 0", out
    for combination in ("max_batch_size=4", "max_batch_size=8"):
        assert (f"attached: ray[{combination}] at {server.url}, not launched by this run (nor stopped by it); "
                f"log {server.log}") in out
    # Not the inner run's server: still running, and still serving.
    assert server.proc.poll() is None
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    # The cluster manager stops it; nothing carrying its token is left.
    tree = [p.pid for p in procs.tree_of(server.proc.pid)]
    report = procs.kill_tree(server.proc.pid, pgid=server.proc.pid)
    server.proc.wait(30)
    print(f"MEASURE stopped the attached server: {len(report.pids)} processes in {report.seconds:.1f} s")
    assert not report.survivors
    left = marked_processes(server.token)
    assert not left, f"left running: {describe(left)}"
    assert not [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
