"""The requests on the wire: the lean HTTP/1.1 + SSE client, the httpx fallback, and the SSE parser they share.

Every request streams ``/v1/completions`` with ``stream: true``, ``stream_options: {include_usage: true}``,
``ignore_eos: true``, ``temperature: 0``, ``max_tokens = output_len`` and the workload's seed, and is
never retried. Each SSE chunk is timestamped with :func:`time.perf_counter` as soon as its bytes are
read, before any parsing (parsing before timestamping is how sglang.bench_serving gets negative TPOT).

Two transports share the SSE parser: ``"lean"`` (a minimal HTTP/1.1 client over asyncio protocols with
keep-alive connections, chunked decoding and byte-level SSE splitting; JSON is parsed only for the
usage/finish/error events) and ``"httpx"`` (for proxies and to compare). The openai SDK costs ~10x more
CPU per streamed token, which on a small machine is taken from the server under test; the lean client
streams about twice as many tokens per core as vLLM's own benchmark client (benchmarks/client_ceiling.py),
so change its fast paths only with that benchmark at hand.

A server page (``/metrics``) is read through :mod:`pytest_llmserve.evidence.pages`, which builds every request's
API-key header as well: :func:`fetch_text` around a run, and :func:`read_page_on_loop` during one, over a connection
of its own and without httpx (the running-requests gauge: httpx's cost would be taken from the loop that timestamps
the round's chunks), sending the request that module writes and answering with its ``Page``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
import time
from typing import Literal
from urllib.parse import urlsplit

from pytest_llmserve.config import Workload
from pytest_llmserve.evidence.pages import (
    Page,
    auth_header_lines,
    auth_headers,
    page_url,
    raw_get_request,
    read_page,
    unanswered,
)
from pytest_llmserve.load.metrics import RequestRecord
from pytest_llmserve.load.prompts import WorkloadPrompt

__all__ = ["DEFAULT_TIMEOUT_S", "TEXT_SAMPLES", "HttpxTransport", "LeanTransport", "StreamParser",
           "TextKeepingParser", "Transport", "fetch_text", "get_page", "make_transport", "parser_for",
           "read_page_on_loop", "request_body"]

Transport = Literal["lean", "httpx"]

DEFAULT_TIMEOUT_S = 300.0


_DONE = b"[DONE]"
# Byte markers of events that the bulk path leaves to the per-event path.
_SPECIAL = (b'"finish_reason":"', b'"finish_reason": "', b'"completion_tokens"', b"data: [DONE]", b'"error"',
            b'"choices":[]')


class StreamParser:
    """Splits SSE bytes into ``data:`` events and keeps the timestamps of content chunks.

    A *content chunk* is an event whose ``choices`` list is not empty: one decode step. Its text may be
    empty (special tokens such as EOS under ``ignore_eos``; vLLM sends those chunks too), so every such
    chunk counts, as in vLLM's own client; empty ones are also counted apart (``empty_chunks``: a
    stream of empty text is what NaN logits give). A trailing chunk with empty text that only carries
    ``finish_reason`` and makes the count one more than ``usage.completion_tokens`` is a finish marker,
    not a token, and is removed from the count and the timings.

    Content chunks are recognised on bytes; JSON is parsed only for events that may carry usage, a
    finish reason or an error. Inside a JSON string every ``"`` is escaped, so these byte patterns
    cannot be produced by generated text.
    """

    __slots__ = ("pending", "first", "last", "prev_last", "itl", "chunks", "empty_chunks", "events", "done",
                 "completion_tokens", "prompt_tokens", "error", "finish_reason", "finish_only", "tail")

    def __init__(self) -> None:
        self.pending = b""
        self.first = -1.0
        self.last = -1.0
        self.prev_last = -1.0
        self.itl: list[float] = []
        self.chunks = 0
        self.empty_chunks = 0
        self.events = 0
        self.done = False
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.error: str | None = None
        self.finish_reason: str | None = None
        self.finish_only = False  # the last content chunk had empty text and a finish_reason
        self.tail = b""

    def feed(self, data: bytes, ts: float) -> None:
        if not data:
            return
        if (not self.pending and data[:5] == b"data:" and data.find(b"\n") == len(data) - 2
                and data[-1:] == b"\n" and data.rfind(b'"finish_reason":null') > 0
                and b'"completion_tokens"' not in data):
            # Fast path: the read is exactly one plain content chunk (one decode step, most reads). A
            # null finish_reason is only in a choice; an event without usage and error is then content.
            self.tail = data
            self.events += 1
            self._content(ts, b'"text":""' in data)
            self.finish_only = False
            return
        if self.pending:
            data = self.pending + data
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            self.pending = data
            return
        self.pending = data[cut:]
        if cut < len(data):
            data = data[:cut]
        self.tail = data  # sliced only when an error message needs its last bytes
        # Bulk path for the plain content chunks before the first event that needs a look (finish, usage,
        # [DONE], error): those all arrived at ``ts``, so only their number matters.
        if self._bulk(data, ts):
            return
        first_special = min((i for i in (data.find(m) for m in _SPECIAL) if i >= 0), default=-1)
        if first_special < 0:
            rest = data
        else:
            line_start = data.rfind(b"\n", 0, first_special) + 1
            if line_start and self._bulk(data[:line_start], ts):
                rest = data[line_start:]
            else:
                rest = data
        for line in rest.split(b"\n"):
            if line[:5] == b"data:":
                self._event(line[5:].strip(), ts)

    def _bulk(self, data: bytes, ts: float) -> bool:
        """Account for ``data`` (whole lines) at once if every event in it is a plain content chunk.
        Literal newlines and unescaped quotes never occur inside JSON strings, so counting is exact."""
        n = data.count(b"\ndata:") + (data[:5] == b"data:")
        if not n or data.count(b'"choices":[{') != n or \
                data.count(b'"finish_reason":null') + data.count(b'"finish_reason": null') != n:
            return False
        self.events += n
        if self.first < 0:
            self.first = ts
        else:
            self.itl.append(ts - self.last)
        if n > 1:
            self.itl.extend([0.0] * (n - 1))  # read together: the same arrival time
        self.prev_last = self.last if n == 1 else ts
        self.last = ts
        self.chunks += n
        self.empty_chunks += data.count(b'"text":""') + data.count(b'"text": ""')
        self.finish_only = False
        return True

    def close(self, ts: float) -> None:
        """The stream ended. An unterminated last line is an incomplete event (dropped, as SSE says),
        except a bare ``data: [DONE]`` that only lacks its newline."""
        if self.pending.strip() == b"data: " + _DONE:
            self.done = True
        self.pending = b""

    def interrupted(self, exc: BaseException) -> None:
        """The transport failed: mid-stream that is a truncated stream, with what was received."""
        if self.error is not None:
            return
        if self.events and not self.done:
            self.error = (f"stream ended after {self.events} chunks without [DONE]: last bytes "
                          f"{self.tail[-200:]!r} ({type(exc).__name__}: {exc})")
        else:
            self.error = f"{type(exc).__name__}: {exc} (after {self.events} chunks)"

    def _content(self, ts: float, empty: bool) -> None:
        if self.first < 0:
            self.first = ts
        else:
            self.itl.append(ts - self.last)
        self.prev_last = self.last
        self.last = ts
        self.chunks += 1
        if empty:
            self.empty_chunks += 1

    def _event(self, p: bytes, ts: float) -> None:
        if p == _DONE:
            self.done = True
            return
        self.events += 1
        if (b'"completion_tokens"' not in p and b'"choices":[{' in p
                and (b'"finish_reason":null' in p or b'"finish_reason": null' in p)):
            self._content(ts, b'"text":""' in p or b'"text": ""' in p)
            self.finish_only = False
            return
        self._slow_event(p, ts)

    def _slow_event(self, p: bytes, ts: float) -> None:
        try:
            data = json.loads(p)
        except ValueError:
            self.error = self.error or f"invalid JSON in stream after {self.events - 1} events: {p[:300]!r}"
            return
        if not isinstance(data, dict):
            self.error = self.error or f"unexpected stream event: {p[:300]!r}"
            return
        if "error" in data or data.get("object") == "error":
            self.error = self.error or f"server error in stream after {self.chunks} chunks: {p[:1000]!r}"
            return
        choices = data.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):
                text = choice["delta"].get("content")
            self._content(ts, not text)
            finish = choice.get("finish_reason")
            if finish is not None:
                self.finish_reason = str(finish)
            self.finish_only = finish is not None and not text
        usage = data.get("usage")
        if isinstance(usage, dict):
            ct, pt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if isinstance(ct, int):
                self.completion_tokens = ct
            if isinstance(pt, int):
                self.prompt_tokens = pt

    def _drop_finish_marker(self) -> None:
        if (self.finish_only and self.completion_tokens is not None
                and self.chunks == self.completion_tokens + 1):
            self.chunks -= 1
            self.empty_chunks -= 1
            if self.itl:
                self.itl.pop()
                self.last = self.prev_last
            else:
                self.first = self.last = -1.0
            self.finish_only = False

    def record(self, index: int, start: float, end: float, wall_offset: float) -> RequestRecord:
        """The request's record; ``wall_offset`` converts perf_counter to wall-clock seconds."""
        self._drop_finish_marker()
        error = self.error
        if error is None and not self.done:
            error = (f"stream ended after {self.events} chunks without [DONE]: "
                     f"last bytes {self.tail[-200:]!r}")
        ok_times = self.first >= 0
        return RequestRecord(
            index=index, start=start + wall_offset, end=end + wall_offset,
            ttft=(self.first - start) if ok_times else None, e2e=(self.last - start) if ok_times else None,
            itl=self.itl, output_tokens=self.completion_tokens, prompt_tokens=self.prompt_tokens,
            chunks=self.chunks, empty_chunks=self.empty_chunks, error=error, finish_reason=self.finish_reason)


class TextKeepingParser(StreamParser):
    """A :class:`StreamParser` that also keeps the stream's bytes, for the few sampled requests of a round
    whose generated text is judged (:func:`pytest_llmserve.load.metrics.sample_findings`).

    Keeping costs one list append per read; the bytes are decoded once, in :meth:`record`, after the
    request's end time was taken, so the timings of this and every other request are those of a plain
    StreamParser.
    """

    __slots__ = ("raw",)

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[bytes] = []

    def feed(self, data: bytes, ts: float) -> None:
        if data:
            self.raw.append(data)
        StreamParser.feed(self, data, ts)

    def record(self, index: int, start: float, end: float, wall_offset: float) -> RequestRecord:
        rec = StreamParser.record(self, index, start, end, wall_offset)
        rec.text, rec.token_texts, rec.bad_logprobs = decode_stream_text(b"".join(self.raw))
        self.raw = []
        return rec


def _stream_choice(line: bytes) -> dict[str, object] | None:
    """The first choice of one SSE line's event; None for a line that carries none (a comment, ``[DONE]``, JSON that
    does not parse, an event without choices)."""
    line = line.strip()
    if line[:5] != b"data:" or line[5:].strip() == _DONE:
        return None
    try:
        event = json.loads(line[5:])
    except ValueError:
        return None
    choices = event.get("choices") if isinstance(event, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0]


def _choice_text(choice: dict[str, object]) -> object:
    """A completions choice's ``text``, else a chat choice's ``delta.content`` (whatever the server put there)."""
    text = choice.get("text")
    delta = choice.get("delta")
    if text is None and isinstance(delta, dict):
        text = delta.get("content")
    return text


def _bad_logprobs(choice: dict[str, object]) -> int | None:
    """How many of a choice's ``token_logprobs`` are null or not finite; None when it has no such list."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict) or "token_logprobs" not in logprobs:
        return None
    values = logprobs.get("token_logprobs") or []
    return sum(1 for v in values if not isinstance(v, int | float) or v != v or v in (float("inf"), float("-inf")))


def decode_stream_text(stream: bytes) -> tuple[str, list[str], int | None]:
    """The generated text of an SSE stream of completions (or chat) chunks, each content chunk's text
    (one decode step: a token, or several under speculative decoding), and how many returned logprobs
    were null or not finite (None when the stream carried no logprobs)."""
    pieces: list[str] = []
    bad: int | None = None
    for line in stream.split(b"\n"):
        choice = _stream_choice(line)
        if choice is None:
            continue
        text = _choice_text(choice)
        if choice.get("finish_reason") is not None and not text:
            continue  # a finish marker, not a decode step
        pieces.append(text if isinstance(text, str) else "")
        count = _bad_logprobs(choice)
        if count is not None:
            bad = (bad or 0) + count
    return "".join(pieces), pieces, bad


# The timed requests whose text a round keeps and judges (global request indices, so one client process
# keeps them however the requests are spread): two are enough to see collapse, and cost nothing.
TEXT_SAMPLES = 2


def parser_for(index: int) -> StreamParser:
    """The parser of timed request ``index``: a :class:`TextKeepingParser` for the sampled few."""
    return TextKeepingParser() if 0 <= index < TEXT_SAMPLES else StreamParser()


class _Dechunker:
    """Incremental decoder of HTTP/1.1 ``Transfer-Encoding: chunked``. A chunk's data is released when
    the whole chunk has arrived (servers put one SSE event in a chunk, so this is when the event is)."""

    __slots__ = ("buf", "ended")

    def __init__(self) -> None:
        self.buf = b""
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        if not self.buf:
            # Fast path: a read that holds exactly one whole chunk (one SSE event per decode step).
            idx = data.find(b"\r\n")
            if 0 < idx <= 8:
                try:
                    size = int(data[:idx], 16)
                except ValueError:
                    size = 0
                if size and len(data) == idx + size + 4 and data[-2:] == b"\r\n":
                    return data[idx + 2:idx + 2 + size]
        buf = self.buf + data if self.buf else data
        end = len(buf)
        pos = 0
        parts: list[bytes] = []
        find = buf.find
        while True:
            idx = find(b"\r\n", pos)
            if idx < 0:
                break
            try:
                size = int(buf[pos:idx], 16)
            except ValueError:
                field_ = buf[pos:idx].split(b";", 1)[0]  # chunk extensions
                try:
                    size = int(field_, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size line {buf[pos:idx][:80]!r}") from None
            if size == 0:
                self.ended = True  # trailers, if any, are ignored
                pos = end
                break
            stop = idx + 2 + size
            if stop + 2 > end:
                break
            parts.append(buf[idx + 2:stop])
            pos = stop + 2
        self.buf = buf[pos:] if pos < end else b""
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else b"".join(parts)

# --------------------------------------------------------------------------- transports

class _Target:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        self.prefix = prefix
        self.netloc = parts.netloc


def _framing(headers: bytes) -> tuple[bool, int]:
    """How a response's body ends, from its lower-cased header block: chunked, and its Content-Length (-1 when
    it has none, or is chunked)."""
    chunked = b"transfer-encoding: chunked" in headers
    length = -1
    for line in headers.split(b"\r\n"):
        if line.startswith(b"content-length:") and not chunked:
            length = int(line[15:].strip())
    return chunked, length


class _HttpStream(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection. Response bytes are handled in ``data_received``, so each
    read is timestamped when the event loop gets it and the waiting request wakes up once, at the end
    of its stream, not once per read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser: StreamParser | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.reused = False
        self.last_used = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.head = bytearray()
        self.in_head = True
        self.status = 0
        self.chunked = False
        self.remaining = -1
        self.keep_alive = True
        self.dechunk = _Dechunker()
        self.error_body: bytearray | None = None
        self.got_bytes = False
        self.complete = False  # the response ended cleanly (connection reusable if keep_alive)

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None:
            self.parser.close(time.perf_counter())
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def data_received(self, data: bytes) -> None:
        ts = time.perf_counter()
        parser = self.parser
        if parser is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        self.got_bytes = True
        if self.in_head:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > 1 << 16:
                    parser.error = f"response head too long: {bytes(self.head[:200])!r}"
                    self.close()
                return
            if not self._parse_head(bytes(self.head[:end]), parser):
                self.close()
                return
            data = bytes(self.head[end + 4:])
            self.in_head = False
            if self.remaining == 0:
                self._end(parser, ts)
                return
            if not data:
                return
        if self.chunked:
            try:
                payload = self.dechunk.feed(data)
            except ValueError as exc:
                parser.error = f"bad chunked encoding after {parser.events} chunks: {exc}"
                self.close()
                return
            ended = self.dechunk.ended
        else:
            payload = data
            if self.remaining > 0:
                self.remaining -= len(data)
            ended = self.remaining == 0
        if self.error_body is not None:
            self.error_body += payload
        else:
            parser.feed(payload, ts)
        if ended:
            self._end(parser, ts)

    # -- helpers
    def _parse_head(self, head: bytes, parser: StreamParser) -> bool:
        status_line, _, header_block = head.partition(b"\r\n")
        try:
            self.status = int(status_line.split(b" ", 2)[1])
        except (IndexError, ValueError):
            parser.error = f"malformed HTTP status line {status_line[:200]!r}"
            return False
        headers = header_block.lower()
        self.chunked, self.remaining = _framing(headers)
        self.keep_alive = b"connection: close" not in headers and (self.chunked or self.remaining >= 0)
        if self.status != 200:
            self.error_body = bytearray()
        return True

    def _end(self, parser: StreamParser, ts: float) -> None:
        if self.error_body is not None:
            parser.error = f"HTTP {self.status}: {bytes(self.error_body[:2000]).decode('utf-8', 'replace')}"
        else:
            parser.close(ts)
        self.complete = True
        self.parser = None
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def start(self, request: bytes, parser: StreamParser) -> asyncio.Future[None]:
        self._reset()
        self.parser = parser
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def abort(self) -> None:
        self.closed = True
        self.parser = None
        if self.transport is not None:
            self.transport.abort()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One client TLS context for every https connection of this process (each round's transport, each page
    read): building one loads the CA store, 17.3 ms of CPU here."""
    return ssl.create_default_context()


class LeanTransport:
    """HTTP/1.1 over asyncio protocols with a keep-alive pool (one connection per concurrent request)."""

    name = "lean"
    IDLE_S = 4.0  # uvicorn closes idle keep-alive connections after 5 s

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.target = _Target(base_url)
        self._ssl = _tls_context() if self.target.scheme == "https" else None
        self._idle: list[_HttpStream] = []
        self._all: set[_HttpStream] = set()
        self._head = (f"POST {self.target.prefix}/v1/completions HTTP/1.1\r\nHost: {self.target.netloc}\r\n"
                      f"User-Agent: pytest-llmserve\r\nAccept: text/event-stream\r\n"
                      f"Content-Type: application/json\r\n{auth_header_lines(api_key)}").encode()

    async def _open(self) -> _HttpStream:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(_HttpStream, self.target.host, self.target.port,
                                                ssl=self._ssl)
        self._all.add(proto)
        return proto

    async def prewarm(self, n: int) -> None:
        """Open ``n`` keep-alive connections before the clock starts."""
        missing = n - len(self._idle)
        if missing > 0:
            conns = await asyncio.gather(*(self._open() for _ in range(missing)), return_exceptions=True)
            for c in conns:
                if isinstance(c, _HttpStream):
                    c.reused = True
                    self._idle.append(c)

    async def _acquire(self) -> _HttpStream:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.last_used < self.IDLE_S and not conn.closed:
                return conn
            conn.close()
        return await self._open()

    async def close(self) -> None:
        self._idle = []
        conns, self._all = self._all, set()
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.sleep(0)  # let the transports run connection_lost

    async def stream(self, body: bytes, parser: StreamParser) -> None:
        request = self._head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        conn = await self._acquire()
        try:
            await conn.start(request, parser)
            if conn.closed and not conn.got_bytes and conn.reused and parser.error is None:
                # A pooled connection the server had closed while idle: nothing was answered, so the
                # request never reached the engine; send it once on a fresh connection.
                self._all.discard(conn)
                conn = await self._open()
                await conn.start(request, parser)
            if conn.closed and not conn.got_bytes and parser.error is None:
                parser.error = "connection closed before any response"
        except BaseException:
            conn.abort()  # cancelled (timeout) or failed mid-stream: the connection is not reusable
            self._all.discard(conn)
            raise
        if conn.complete and conn.keep_alive and not conn.closed:
            conn.last_used = time.monotonic()
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)


class HttpxTransport:
    """The same requests through httpx (HTTP proxies, TLS set-ups, comparison with the lean path)."""

    name = "httpx"

    def __init__(self, base_url: str, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        # lazy: httpx takes ~120 ms to import (-X importtime)
        import httpx

        self.target = _Target(base_url)
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json",
                   "User-Agent": "pytest-llmserve", **auth_headers(api_key)}
        self._path = f"{self.target.prefix}/v1/completions"
        self._client = httpx.AsyncClient(
            base_url=f"{self.target.scheme}://{self.target.netloc}", headers=headers,
            timeout=httpx.Timeout(timeout_s), limits=httpx.Limits(max_connections=None,
                                                                 max_keepalive_connections=None))

    async def prewarm(self, n: int) -> None:
        return None

    async def close(self) -> None:
        await self._client.aclose()

    async def stream(self, body: bytes, parser: StreamParser) -> None:
        # lazy: httpx takes ~120 ms to import (-X importtime)
        import httpcore
        import httpx

        perf = time.perf_counter
        try:
            async with self._client.stream("POST", self._path, content=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread())[:2000].decode("utf-8", "replace")
                    parser.error = f"HTTP {resp.status_code}: {text}"
                    return
                async for data in resp.aiter_bytes():
                    parser.feed(data, perf())
                parser.close(perf())
        except (httpx.HTTPError, httpcore.ProtocolError, OSError, ValueError, RuntimeError) as exc:
            # httpcore's protocol errors can escape httpx's mapping inside a streamed body: the stream
            # was cut, which is what interrupted() records, never an exception out of the run.
            parser.interrupted(exc)


def make_transport(kind: Transport, base_url: str, api_key: str | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S) -> LeanTransport | HttpxTransport:
    if kind == "lean":
        return LeanTransport(base_url, api_key)
    if kind == "httpx":
        return HttpxTransport(base_url, api_key, timeout_s)
    raise ValueError(f"transport must be 'lean' or 'httpx', got {kind!r}")


def request_body(model: str, prompt: WorkloadPrompt, workload: Workload) -> bytes:
    """The JSON body of one streamed benchmark request."""
    return json.dumps({
        "model": model, "prompt": prompt.payload, "max_tokens": workload.output_len, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": workload.seed,
    }, separators=(",", ":")).encode()


def fetch_text(base_url: str, path: str, api_key: str | None, timeout_s: float = 10.0) -> str | None:
    """GET ``path`` under the server root (the /metrics scrapes around a run): its text, None unless it answered 200
    (:func:`pytest_llmserve.evidence.pages.read_page`)."""
    return read_page(base_url, path, api_key, timeout_s).body


async def read_page_on_loop(base_url: str, path: str, api_key: str | None, timeout_s: float = 5.0) -> Page:
    """:func:`~pytest_llmserve.evidence.pages.read_page` on the running event loop (the running-requests gauge, read
    while a round's requests stream on the same loop), within ``timeout_s``.

    One request (:func:`~pytest_llmserve.evidence.pages.raw_get_request`) on a fresh connection, which shares no pool
    with the round's; the body is framed by its Content-Length, by chunked encoding or by the close. No httpx: its
    per-request cost would be taken from the loop that timestamps the round's chunks. A status other than 200 is
    answered without reading the body."""
    target = _Target(base_url)
    url = page_url(base_url, path)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(
                target.host, target.port, ssl=_tls_context() if target.scheme == "https" else None)
            writer.write(raw_get_request(base_url, path, api_key))
            status_line, _, header_block = (await reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            if status != 200:
                return Page(url, status)
            chunked, length = _framing(header_block.lower())
            if chunked:
                dechunker = _Dechunker()
                parts: list[bytes] = []
                while not dechunker.ended:
                    data = await reader.read(65536)
                    if not data:
                        raise asyncio.IncompleteReadError(b"".join(parts), None)  # cut short
                    parts.append(dechunker.feed(data))
                body = b"".join(parts)
            elif length >= 0:
                body = await reader.readexactly(length)
            else:
                body = await reader.read()
    except TimeoutError as exc:
        return unanswered(url, exc, timeout_s)
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        return unanswered(url, exc)
    finally:
        if writer is not None:
            writer.close()
    return Page(url, 200, body.decode("utf-8", "replace"))


async def get_page(base_url: str, path: str, api_key: str | None, timeout_s: float = 5.0) -> str | None:
    """:func:`read_page_on_loop`'s text of a 200 answer, None otherwise (what the gauge sampler reads)."""
    return (await read_page_on_loop(base_url, path, api_key, timeout_s)).body
