"""One page reader and one place for the API key's header (:mod:`pytest_llmserve.evidence.pages`): every reader of a
server page and every request the package sends carry ``Authorization: Bearer <key>`` (an in-process server records
what each one sent, so a reader that stops taking the header from the one place fails here), and a page comes back as
a typed :class:`Page`: its status and text, or why nothing came back."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.engines.base import LaunchPlan
from pytest_llmserve.engines.external import _first_model
from pytest_llmserve.engines.llamacpp.launch import LlamaCppAdapter
from pytest_llmserve.errors import ServerStartError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.evidence.pages import Page, auth_header_lines, page_url, raw_get_request, read_page
from pytest_llmserve.load import transport
from pytest_llmserve.load.transport import StreamParser
from pytest_llmserve.server.handle import ServerHandle
from tests.unit.local_http import QuietHandler, serving, url_of

KEY = "sk-page-key-0123456789"
SSE = b'data: {"choices":[{"index":0,"text":"x"}]}\n\ndata: [DONE]\n\n'


class _Server(QuietHandler):
    """Pages of an OpenAI-compatible server; every request's method, path and Authorization header recorded."""

    protocol_version = "HTTP/1.1"
    PAGES: dict[str, tuple[int, str, bytes]] = {
        "/metrics": (200, "text/plain", b"vllm:num_requests_running 0\n"),
        "/health": (200, "text/plain", b""),
        "/version": (200, "application/json", b'{"version": "0.32.0"}'),
        "/v1/models": (200, "application/json", b'{"data": [{"id": "served-model"}]}'),
        "/props": (200, "application/json", b'{"n_ctx": 4096}'),
        "/slots": (200, "application/json", b'[{"id": 0}]'),
        "/warming": (503, "text/plain", b"still loading"),
    }

    def _record(self) -> None:
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))  # type: ignore[attr-defined]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._record()
        if self.path == "/slow":
            time.sleep(1.0)
        self.answer(*self.PAGES.get(self.path, (404, "text/plain", b"no such page")))

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.headers.get("accept") == "text/event-stream":
            self.answer(200, "text/event-stream", SSE)
        else:
            self.answer(200, "application/json", b'{"choices": [{"index": 0, "text": "hi", "finish_reason": "length"}]}')


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with serving(_Server, seen=[]) as httpd:
        yield httpd


def _handle(url: str, api_key: str | None, health: str = "/health", startup_s: float = 10.0) -> ServerHandle:
    handle = ServerHandle(ServerSpec(name="x", engine="external", url=url, api_key=api_key, startup_timeout_s=startup_s))
    handle.plan = LaunchPlan(argv=[], env={}, base_url=url, model_name="m", health_path=health)
    return handle


def _client(url: str, api_key: str | None) -> Any:
    client = LLMClient(url, "m", api_key=api_key)
    try:
        return client.metrics_text(), client.page("/version").json()
    finally:
        client.close()


async def _stream(kind: transport.Transport, url: str, api_key: str | None) -> StreamParser:
    sender = transport.make_transport(kind, url, api_key)
    parser = StreamParser()
    try:
        await sender.stream(b'{"prompt": "x"}', parser)
    finally:
        await sender.close()
    return parser


# Every reader of a page and every sender of a request: (what it is, call(url, key), what it sent).
READERS: list[tuple[str, Callable[[str, str | None], Any], list[tuple[str, str]]]] = [
    ("read_page", lambda url, key: read_page(url, "/metrics", key).body, [("GET", "/metrics")]),
    ("transport.fetch_text", lambda url, key: transport.fetch_text(url + "/v1", "/metrics", key), [("GET", "/metrics")]),
    ("transport.get_page (on the loop, no httpx)",
     lambda url, key: asyncio.run(transport.get_page(url, "/metrics", key)), [("GET", "/metrics")]),
    ("LLMClient.metrics_text and .page", _client, [("GET", "/metrics"), ("GET", "/version")]),
    ("ServerHandle.metrics_text", lambda url, key: _handle(url, key).metrics_text(), [("GET", "/metrics")]),
    ("ServerHandle readiness", lambda url, key: _handle(url, key).wait_ready(),
     [("GET", "/health"), ("POST", "/v1/completions")]),
    ("external: the first model", _first_model, [("GET", "/v1/models")]),
    ("llama.cpp server info", lambda url, key: LlamaCppAdapter().fetch_server_info(url, key),
     [("GET", "/props"), ("GET", "/slots")]),
    ("lean transport", lambda url, key: asyncio.run(_stream("lean", url, key)), [("POST", "/v1/completions")]),
    ("httpx transport", lambda url, key: asyncio.run(_stream("httpx", url, key)), [("POST", "/v1/completions")]),
]


@pytest.mark.parametrize(("call", "sent"), [(r[1], r[2]) for r in READERS], ids=[r[0] for r in READERS])
def test_every_reader_and_sender_carries_the_api_key_and_none_without_one(
        server: ThreadingHTTPServer, call: Callable[[str, str | None], Any], sent: list[tuple[str, str]]) -> None:
    call(url_of(server), KEY)
    assert server.seen == [(m, p, f"Bearer {KEY}") for m, p in sent]  # type: ignore[attr-defined]
    server.seen.clear()  # type: ignore[attr-defined]
    call(url_of(server), None)
    assert server.seen == [(m, p, None) for m, p in sent]  # type: ignore[attr-defined]


def test_what_each_reader_hands_back(server: ThreadingHTTPServer) -> None:
    url = url_of(server)
    assert transport.fetch_text(url, "/metrics", KEY) == "vllm:num_requests_running 0\n"
    assert _client(url, KEY) == ("vllm:num_requests_running 0\n", {"version": "0.32.0"})
    assert _first_model(url + "/v1", KEY) == "served-model"
    assert LlamaCppAdapter().fetch_server_info(url, KEY) == {"n_ctx": 4096, "slots": [{"id": 0}]}
    handle = _handle(url, KEY)
    assert handle.page("/version").json() == {"version": "0.32.0"} and handle.metrics_text() is not None
    handle.wait_ready()
    assert handle.last_readiness == "health 200, one-token generation 200"


def test_a_page_is_typed_its_status_and_text_or_why_nothing_came_back(server: ThreadingHTTPServer) -> None:
    url = url_of(server)
    ok = read_page(url + "/v1/", "/version", KEY)
    assert ok == Page(f"{url}/version", 200, '{"version": "0.32.0"}') and ok.body == ok.text
    assert ok.json() == {"version": "0.32.0"}
    warming = read_page(url, "/warming", KEY)
    assert (warming.status, warming.body, warming.json(), warming.failure()) == (
        503, None, None, "HTTP 503 'still loading'")
    assert read_page(url, "/metrics").json() is None  # 200, but not JSON
    slow = read_page(url, "/slow", KEY, timeout_s=0.2)
    assert (slow.status, slow.error) == (None, "ReadTimeout after 0.2 s") and slow.failure() == slow.error
    refused = read_page("http://127.0.0.1:9", "/metrics", KEY, timeout_s=1.0)
    assert (refused.ok, refused.error) == (False, "ConnectError")
    on_loop = asyncio.run(transport.read_page_on_loop(url, "/warming", KEY))
    assert (on_loop.url, on_loop.status, on_loop.body) == (f"{url}/warming", 503, None)
    late = asyncio.run(transport.read_page_on_loop(url, "/slow", KEY, timeout_s=0.2))
    assert (late.status, late.error) == (None, "TimeoutError after 0.2 s")


def test_a_failed_readiness_probe_says_what_came_back(server: ThreadingHTTPServer) -> None:
    handle = _handle(url_of(server), KEY, health="/warming", startup_s=0.6)
    with pytest.raises(ServerStartError, match=r"last readiness answer: GET /warming: HTTP 503 'still loading'"):
        handle.wait_ready()


def test_the_url_and_the_hand_written_request() -> None:
    assert page_url("http://h:8000/v1/", "/metrics") == page_url("http://h:8000", "/metrics") == "http://h:8000/metrics"
    assert page_url("https://h/proxy/v1", "/health") == "https://h/proxy/health"
    assert raw_get_request("http://h:8000/v1", "/metrics", KEY) == (
        b"GET /metrics HTTP/1.1\r\nHost: h:8000\r\nUser-Agent: pytest-llmserve\r\nConnection: close\r\n"
        + f"Authorization: Bearer {KEY}\r\n\r\n".encode())
    assert b"Authorization" not in raw_get_request("http://h:8000", "/metrics", None)
    assert auth_header_lines(None) == "" and json.dumps(auth_header_lines(KEY)).count("Bearer") == 1
