"""The SSE parser and the chunked decoder of the lean client: arbitrary read boundaries, the one-event fast
paths, empty-text chunks, errors and the trailing finish marker (on synthetic bytes); and the page reader
the running-requests gauge is read with."""

from __future__ import annotations

import asyncio
import random
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from pytest_llmserve.load import transport
from pytest_llmserve.load.metrics import RequestRecord
from pytest_llmserve.load.transport import StreamParser, _Dechunker, get_page


def sse_body(n: int, *, spaced: bool = False) -> bytes:
    sep = b": " if spaced else b":"
    events = []
    for i in range(n):
        finish = b'"length"' if i == n - 1 else b"null"
        events.append(b'data: {"choices":[{"index":0,"text"' + sep + b'" t\\"ok\\n"' + b',"finish_reason"'
                      + sep + finish + b"}],\"usage\":null}\n\n")
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\n' % n)
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def chunked(body: bytes, rng: random.Random) -> bytes:
    out = b""
    pos = 0
    while pos < len(body):
        size = rng.randint(1, 300)
        piece = body[pos:pos + size]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        pos += size
    return out + b"0\r\n\r\n"


@pytest.mark.parametrize("spaced", [False, True])
def test_parser_and_dechunker_survive_arbitrary_splits(spaced: bool) -> None:
    rng = random.Random(0)
    body = sse_body(50, spaced=spaced)
    for _ in range(30):
        wire = chunked(body, rng)
        dechunk, parser = _Dechunker(), StreamParser()
        pos, ts = 0, 0.0
        while pos < len(wire):
            step = rng.randint(1, 97)
            ts += 0.001
            parser.feed(dechunk.feed(wire[pos:pos + step]), ts)
            pos += step
        parser.close(ts)
        assert dechunk.ended
        assert parser.done
        assert parser.error is None
        assert parser.chunks == 50
        assert parser.completion_tokens == 50
        assert parser.prompt_tokens == 3
        assert len(parser.itl) == 49
        assert parser.finish_reason == "length"
        record = parser.record(0, 0.0, ts, 0.0)
        assert record.ok
        assert record.ttft is not None
        assert record.ttft > 0


@pytest.mark.parametrize("spaced", [False, True])
def test_one_event_per_read_takes_the_fast_paths_and_agrees_with_split_reads(spaced: bool) -> None:
    events = [e + b"\n\n" for e in sse_body(40, spaced=spaced).split(b"\n\n") if e]
    events.insert(3, b'data: {"choices":[{"index":0,"text":"","finish_reason":null}],"usage":null}\n\n')  # empty
    wire = [b"%x\r\n" % len(e) + e + b"\r\n" for e in events]  # one event per chunk, one chunk per read
    whole = b"".join(wire) + b"0\r\n\r\n"

    def run(reads: list[bytes]) -> tuple[RequestRecord, bool]:
        dechunk, parser = _Dechunker(), StreamParser()
        for i, read in enumerate(reads):
            parser.feed(dechunk.feed(read), float(i + 1))
        parser.close(float(len(reads)))
        return parser.record(0, 0.0, float(len(reads)), 0.0), dechunk.ended

    fast, ended = run([*wire, b"0\r\n\r\n"])
    rng = random.Random(1)
    cuts = sorted(rng.sample(range(1, len(whole)), 200))
    split, split_ended = run([whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)])
    assert ended and split_ended
    assert fast.ok and split.ok, (fast.error, split.error)
    assert (fast.chunks, fast.empty_chunks, fast.output_tokens, fast.finish_reason) == (41, 1, 40, "length")
    assert (split.chunks, split.empty_chunks, split.output_tokens) == (41, 1, 40)
    assert len(fast.itl) == 40 and all(x == 1.0 for x in fast.itl)  # one read per event: one step apart


def test_parser_counts_empty_text_chunks_and_reports_errors() -> None:
    parser = StreamParser()
    parser.feed(b'data: {"choices":[{"text":"","finish_reason":null}],"usage":null}\n\n', 1.0)
    parser.feed(b'data: {"choices":[{"text":"a","finish_reason":null}],"usage":null}\n\n', 2.0)
    parser.feed(b'data: {"error":{"message":"NaN happened"}}\n\n', 3.0)
    assert parser.chunks == 2  # a special token's chunk has empty text but is a decode step
    assert parser.empty_chunks == 1
    rec_ = parser.record(0, 0.0, 3.0, 0.0)
    assert rec_.error is not None
    assert "NaN happened" in rec_.error
    cut = StreamParser()
    cut.feed(b'data: {"choices":[{"text":"a","finish_reason":null}],"usage":null}\n\ndata: {"cho', 1.0)
    cut.close(1.0)
    error = cut.record(0, 0.0, 1.0, 0.0).error
    assert error is not None
    assert error.startswith("stream ended after 1 chunks without [DONE]")
    assert "cho" in error


def finish_marker_stream(last_text: str) -> bytes:
    token = b'data: {"choices":[{"text":"x","finish_reason":null}],"usage":null}\n\n'
    last = b'data: {"choices":[{"text":"%s","finish_reason":"length"}],"usage":null}\n\n' % last_text.encode()
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
    return token * 3 + last + usage


def test_trailing_finish_marker_is_not_a_token() -> None:
    parser = StreamParser()
    for i, line in enumerate(finish_marker_stream("").split(b"\n\n")):
        parser.feed(line + b"\n\n", float(i + 1))
    record = parser.record(0, 0.0, 9.0, 0.0)
    assert record.ok
    assert record.chunks == 3  # 3 tokens + a pure finish marker
    assert record.itl == [1.0, 1.0]
    assert record.e2e == 3.0
    assert record.finish_reason == "length"
    # the same shape where the last chunk carries text is one chunk too many: a real mismatch
    parser = StreamParser()
    parser.feed(finish_marker_stream("y"), 1.0)
    assert parser.record(0, 0.0, 2.0, 0.0).chunks == 4


PAGE = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2.0\n" * 300  # ~20 KB, many reads


def serve_once(response: bytes, *, close: bool = True, pause_s: float = 0.0,
               tls: ssl.SSLContext | None = None) -> str:
    """``get_page``'s answer from a server that writes ``response`` in pieces to each connection and closes it
    (when ``close``; else only after the client has, as a keep-alive server does), over TLS with ``tls``. A
    canned responder: the real engines each frame their /metrics one way (uvicorn: chunked or Content-Length;
    llama.cpp: Content-Length), and the framings and failures are tested here."""
    async def main() -> str | None:
        seen: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                seen.append(await reader.readuntil(b"\r\n\r\n"))
                for k in range(0, len(response), 4096):
                    writer.write(response[k:k + 4096])
                    await writer.drain()
                await asyncio.sleep(pause_s)
                if not close:
                    await reader.read()  # a keep-alive server: it closes only after the client has
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        scheme = "https" if tls else "http"
        async with server:
            page = await get_page(f"{scheme}://127.0.0.1:{port}/v1", "/metrics", "key", timeout_s=1.0)
        for request in seen:  # none when the TLS handshake was refused
            assert request.startswith(b"GET /metrics HTTP/1.1\r\n") and b"Authorization: Bearer key\r\n" in request
        return page

    return repr(asyncio.run(main()))


def test_get_page_reads_each_framing_and_nothing_from_a_failed_answer() -> None:
    ok = repr(PAGE.decode())
    length = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(PAGE) + PAGE
    assert serve_once(length, close=False) == ok  # framed by its length: no wait for a close
    assert serve_once(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(PAGE, random.Random(1)),
                      close=False) == ok
    assert serve_once(b"HTTP/1.0 200 OK\r\n\r\n" + PAGE) == ok  # framed by the close
    assert serve_once(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 2\r\n\r\nno") == "None"
    assert serve_once(length[:-10]) == "None"  # closed before the whole length
    assert serve_once(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(PAGE, random.Random(1))[:-7]
                      ) == "None"  # closed before the last chunk
    assert serve_once(b"HTTP/1.0 200 OK\r\n\r\n" + PAGE, close=False, pause_s=2.0) == "None"  # timed out


def test_get_page_over_tls_trusts_only_what_the_client_context_trusts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(PAGE) + PAGE
    assert serve_once(answer, tls=server_tls) == "None"  # the default trust store does not know this certificate
    trusting = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(transport, "_tls_context", lambda: trusting)
    assert serve_once(answer, tls=server_tls) == repr(PAGE.decode())
