"""The per-server readers-writer lock: correctness requests share it, a benchmark round holds it alone,
across processes (xdist workers are processes), and a waiting round is not starved by new requests."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pytest_llmserve.evidence.client import LLMClient, SharedLockTransport
from pytest_llmserve.server.isolation import RequestLock
from tests.standins.helpers import wait_for

HOLDER = textwrap.dedent("""
    import sys, time, pathlib
    from pytest_llmserve.server.isolation import RequestLock
    lock, mode, flag, hold_s = RequestLock(pathlib.Path(sys.argv[1])), sys.argv[2], pathlib.Path(sys.argv[3]), float(sys.argv[4])
    with (lock.shared() if mode == "shared" else lock.exclusive()):
        flag.write_text(str(time.time()))
        time.sleep(hold_s)
        # Stamped just before the lock goes: whoever enters next must see it, and later.
        pathlib.Path(str(flag) + ".released").write_text(str(time.time()))
""")


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(10)


def hold(holders: list[subprocess.Popen[bytes]], path: Path, mode: str, flag: Path, hold_s: float) -> None:
    """Another process (as another xdist worker would be) takes the lock and holds it ``hold_s``."""
    holders.append(subprocess.Popen([sys.executable, "-c", HOLDER, str(path), mode, str(flag), str(hold_s)]))


def test_a_round_waits_for_another_process_s_request_and_then_holds_the_server_alone(
        tmp_path: Path, holders: list[subprocess.Popen[bytes]]) -> None:
    path = tmp_path / "server.requests.lock"
    hold(holders, path, "shared", tmp_path / "reader", 1.5)
    wait_for(lambda: (tmp_path / "reader").exists(), 30, "the other process's request")
    lock = RequestLock(path)
    with lock.exclusive() as waited_s:
        entered = time.time()
        released = float((tmp_path / "reader.released").read_text())
        assert entered >= released  # the round started only after the request in flight had ended
        assert waited_s > 0
        # While the round runs, another process's request waits for it.
        hold(holders, path, "shared", tmp_path / "late", 0.0)
        time.sleep(1.0)
        assert not (tmp_path / "late").exists()
        round_ended = time.time()
    wait_for(lambda: (tmp_path / "late").exists(), 30, "the request after the round")
    assert float((tmp_path / "late").read_text()) >= round_ended


def test_requests_of_several_processes_share_the_server(tmp_path: Path,
                                                        holders: list[subprocess.Popen[bytes]]) -> None:
    path = tmp_path / "server.requests.lock"
    hold(holders, path, "shared", tmp_path / "a", 3.0)
    wait_for(lambda: (tmp_path / "a").exists(), 30, "the first request")
    with RequestLock(path).shared():  # not blocked by the other process's shared hold
        assert not (tmp_path / "a.released").exists()


def test_a_waiting_round_is_not_overtaken_by_new_requests(tmp_path: Path,
                                                          holders: list[subprocess.Popen[bytes]]) -> None:
    """Reader A holds; writer W waits; reader B arrives after W: B must run after W, not beside A."""
    path = tmp_path / "server.requests.lock"
    hold(holders, path, "shared", tmp_path / "A", 2.0)
    wait_for(lambda: (tmp_path / "A").exists(), 30, "reader A")
    hold(holders, path, "exclusive", tmp_path / "W", 0.5)
    time.sleep(0.5)  # W is now waiting at the gate
    hold(holders, path, "shared", tmp_path / "B", 0.0)
    wait_for(lambda: (tmp_path / "B.released").exists(), 30, "reader B")
    assert float((tmp_path / "B").read_text()) >= float((tmp_path / "W.released").read_text())
    assert float((tmp_path / "W").read_text()) >= float((tmp_path / "A.released").read_text())


def test_a_batch_holds_the_lock_once_and_its_threads_never_queue_behind_a_waiting_round(tmp_path: Path) -> None:
    lock = RequestLock(tmp_path / "server.requests.lock")
    order: list[str] = []

    def round_() -> None:
        with lock.exclusive():
            order.append("round")

    def batch_request() -> None:
        with lock.shared():
            order.append("batch request")

    with lock.shared():  # the batch's hold
        writer = threading.Thread(target=round_)
        writer.start()
        time.sleep(0.5)  # the round now waits for the batch, holding the gate
        # A request of the batch (another thread) joins the hold instead of queueing behind the round,
        # which waits for the batch: no deadlock.
        request = threading.Thread(target=batch_request)
        request.start()
        request.join(10)
        assert order == ["batch request"]
    writer.join(10)
    assert order == ["batch request", "round"]


def test_every_post_holds_the_lock_until_its_response_is_closed_streams_included(tmp_path: Path) -> None:
    lock = RequestLock(tmp_path / "server.requests.lock")
    seen: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(lock._readers)  # noqa: SLF001 - the count of this process's holds
        return httpx.Response(200, content=b'{"choices": [{"text": "hi"}]}')

    http = httpx.Client(transport=SharedLockTransport(httpx.MockTransport(answer), lock), base_url="http://x")
    http.post("/v1/completions", json={})
    assert seen == [1] and lock._readers == 0  # noqa: SLF001
    with http.stream("POST", "/v1/completions", json={}) as resp:
        assert lock._readers == 1  # noqa: SLF001 - held while the body streams
        resp.read()
    assert lock._readers == 0  # noqa: SLF001
    http.get("/metrics")
    assert seen == [1, 1, 0]  # a GET does not take it
    http.close()


def test_the_client_passes_its_lock_to_its_transport(tmp_path: Path) -> None:
    lock = RequestLock(tmp_path / "server.requests.lock")
    client = LLMClient("http://127.0.0.1:9", "m", request_lock=lock)
    assert isinstance(client._http._transport, SharedLockTransport)  # noqa: SLF001
    client.close()
    plain = LLMClient("http://127.0.0.1:9", "m")
    assert not isinstance(plain._http._transport, SharedLockTransport)  # noqa: SLF001
    plain.close()
