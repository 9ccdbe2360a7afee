#!/usr/bin/env python3
"""A zero-cost OpenAI-compatible streaming endpoint: a measuring instrument for load-generator clients.

It answers ``/v1/completions`` with ``stream: true`` by writing pre-built SSE chunks (one token
``" tok"`` each, ``max_tokens`` of them, then a usage chunk and ``data: [DONE]``) as fast as it can,
so what limits a client talking to it is the client itself. It is NOT a stand-in for an engine in
correctness tests: it generates nothing.

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /tokenize`` (whitespace tokenizer),
``POST /detokenize``, ``GET /metrics`` (``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``
counters and the ``vllm:num_requests_running`` gauge of completions under way, shared by all workers),
``POST /v1/completions`` (streaming and not).

Fault knobs, only to make the client's invalid-run checks fire (applied to every ``--fault-every``-th
completion request of a worker process, default every one): ``--short K`` (K tokens fewer than
requested, truthfully reported in usage), ``--drop-after K`` (close the connection after K token
chunks), ``--one-chunk`` (all text in one event, as a buffering proxy would), ``--error-status S``
(answer HTTP S), ``--no-usage`` (omit the usage chunk).

Usage: ``python tools/zero_cost_server.py --port 8123 [--workers 2]``; ``--port 0`` picks a free
port. The first line on stdout is ``zero-cost server listening on http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import sys
import zlib
from typing import Any

TOKEN_TEXT = " tok"


class Counters:
    """Token counters shared by the worker processes (created before fork)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._lock = ctx.Lock()
        self._gen = ctx.RawValue("q", 0)
        self._prompt = ctx.RawValue("q", 0)
        self._requests = ctx.RawValue("q", 0)
        self._running = ctx.RawValue("q", 0)

    def running(self, change: int) -> None:
        """Count a completion starting (+1) or ending (-1)."""
        with self._lock:
            self._running.value += change

    def add(self, prompt: int, generated: int) -> None:
        with self._lock:
            self._gen.value += generated
            self._prompt.value += prompt
            self._requests.value += 1

    def snapshot(self) -> tuple[int, int, int, int]:
        """Generated and prompt tokens, requests served, and completions under way."""
        with self._lock:
            return self._gen.value, self._prompt.value, self._requests.value, self._running.value


class Options:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.model: str = ns.model
        self.short: int = ns.short
        self.drop_after: int | None = ns.drop_after
        self.one_chunk: bool = ns.one_chunk
        self.error_status: int | None = ns.error_status
        self.no_usage: bool = ns.no_usage
        self.fault_every: int = max(1, ns.fault_every)
        self.burst: int = max(1, ns.burst)
        self.token_delay_s: float = ns.token_delay_ms / 1000.0
        self.counter_prefix: str = ns.counter_prefix


def _chunk(payload: bytes) -> bytes:
    """One HTTP chunk holding one SSE event."""
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n" % len(event) + event + b"\r\n"


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Server:
    def __init__(self, opts: Options, counters: Counters) -> None:
        self.opts = opts
        self.counters = counters
        self.requests = 0
        self.vocab: dict[int, str] = {}
        base = {"id": "cmpl-zero-cost", "object": "text_completion", "created": 0, "model": opts.model}
        tok = dict(base, choices=[{"index": 0, "text": TOKEN_TEXT, "logprobs": None, "finish_reason": None,
                                   "stop_reason": None}], usage=None)
        self.base = base
        self.token_chunk = _chunk(_dumps(tok))
        self.token_burst = self.token_chunk * opts.burst
        self.done_tail = _chunk(b"[DONE]") + b"0\r\n\r\n"

    # ------------------------------------------------------------------ helpers
    def last_chunk(self, reason: str, text: str = TOKEN_TEXT) -> bytes:
        return _chunk(_dumps(dict(self.base, choices=[{"index": 0, "text": text, "logprobs": None,
                                                       "finish_reason": reason, "stop_reason": None}],
                                  usage=None)))

    def usage_chunk(self, prompt: int, generated: int) -> bytes:
        return _chunk(_dumps(dict(self.base, choices=[], usage={
            "prompt_tokens": prompt, "total_tokens": prompt + generated, "completion_tokens": generated})))

    @staticmethod
    def respond(writer: asyncio.StreamWriter, status: int, body: bytes,
                ctype: bytes = b"application/json") -> None:
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 411: b"Length Required"}.get(
            status, b"Error")
        writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
                     % (status, reason, ctype, len(body)) + body)

    def token_id(self, word: str) -> int:
        tid = 1000 + zlib.crc32(word.encode()) % 50000
        self.vocab.setdefault(tid, word)
        return tid

    # ------------------------------------------------------------------ connection loop
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    break
                request_line, _, header_block = head.partition(b"\r\n")
                parts = request_line.split(b" ")
                if len(parts) < 2:
                    break
                method, path = parts[0], parts[1].split(b"?", 1)[0]
                headers = header_block.lower()
                length = 0
                for line in headers.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line[15:].strip())
                if b"transfer-encoding: chunked" in headers:
                    self.respond(writer, 411, b'{"error":"send Content-Length"}')
                    break
                body = await reader.readexactly(length) if length else b""
                keep = await self.route(method, path, body, writer)
                if not keep or b"connection: close" in headers:
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            try:
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def route(self, method: bytes, path: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if path == b"/health":
            self.respond(writer, 200, b"")
        elif path == b"/v1/models":
            self.respond(writer, 200, _dumps({"object": "list", "data": [
                {"id": self.opts.model, "object": "model", "created": 0, "owned_by": "zero-cost",
                 "max_model_len": 1 << 20}]}))
        elif path == b"/metrics":
            gen, prompt, reqs, running = self.counters.snapshot()
            p = self.opts.counter_prefix
            m = f'model_name="{self.opts.model}"'
            text = (f"# HELP {p}generation_tokens_total Generation tokens streamed.\n"
                    f"# TYPE {p}generation_tokens_total counter\n{p}generation_tokens_total{{{m}}} {gen}.0\n"
                    f"# TYPE {p}prompt_tokens_total counter\n{p}prompt_tokens_total{{{m}}} {prompt}.0\n"
                    f"# TYPE {p}request_success_total counter\n{p}request_success_total{{{m}}} {reqs}.0\n"
                    f"# TYPE {p}num_requests_running gauge\n"
                    f"{p}num_requests_running{{{m}}} {running}.0\n")
            self.respond(writer, 200, text.encode(), b"text/plain; version=0.0.4")
        elif path == b"/tokenize" and method == b"POST":
            data = json.loads(body or b"{}")
            prompt = data.get("prompt", "")
            ids = [self.token_id(w) for w in str(prompt).split()]
            self.respond(writer, 200, _dumps({"count": len(ids), "max_model_len": 1 << 20, "tokens": ids}))
        elif path == b"/detokenize" and method == b"POST":
            data = json.loads(body or b"{}")
            text = " ".join(self.vocab.get(int(t), f"w{int(t)}") for t in data.get("tokens", []))
            self.respond(writer, 200, _dumps({"prompt": text}))
        elif path in (b"/v1/completions", b"/v1/chat/completions") and method == b"POST":
            return await self.completions(body, writer)
        else:
            self.respond(writer, 404, _dumps({"error": f"no route {path.decode(errors='replace')}"}))
        return True

    async def completions(self, body: bytes, writer: asyncio.StreamWriter) -> bool:
        self.counters.running(+1)
        try:
            return await self._completion(body, writer)
        finally:
            self.counters.running(-1)

    async def _completion(self, body: bytes, writer: asyncio.StreamWriter) -> bool:
        try:
            req = json.loads(body)
        except ValueError:
            self.respond(writer, 400, b'{"error":"body is not JSON"}')
            return True
        self.requests += 1
        o = self.opts
        fault = self.requests % o.fault_every == 0
        if fault and o.error_status:
            self.respond(writer, o.error_status, _dumps({"object": "error", "message": "injected fault",
                                                         "code": o.error_status}))
            return True
        prompt = req.get("prompt", req.get("messages", ""))
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        n = int(req.get("max_tokens") or 16)
        if fault and o.short:
            n = max(0, n - o.short)
        if not req.get("stream"):
            self.counters.add(n_prompt, n)
            self.respond(writer, 200, _dumps(dict(self.base, choices=[{
                "index": 0, "text": TOKEN_TEXT * n, "logprobs": None, "finish_reason": "length",
                "stop_reason": None}], usage={"prompt_tokens": n_prompt, "total_tokens": n_prompt + n,
                                              "completion_tokens": n})))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
        reason = "length" if not (fault and o.short) else "stop"
        if fault and o.one_chunk:
            writer.write(self.last_chunk(reason, TOKEN_TEXT * n))
        else:
            send = n - 1 if n > 0 else 0
            if fault and o.drop_after is not None:
                send = min(send, o.drop_after)
            if o.token_delay_s > 0:
                for _ in range(send):
                    writer.write(self.token_chunk)
                    await asyncio.sleep(o.token_delay_s)
            else:
                full, rest = divmod(send, o.burst)
                burst = self.token_burst
                for _ in range(full):
                    writer.write(burst)
                    await writer.drain()
                    await asyncio.sleep(0)  # let other streams interleave, as an engine's steps do
                if rest:
                    writer.write(self.token_chunk * rest)
            if fault and o.drop_after is not None and o.drop_after < n - 1:
                await writer.drain()
                return False  # close mid-stream: no last chunk, no usage, no [DONE]
            if n > 0:
                writer.write(self.last_chunk(reason))
        self.counters.add(n_prompt, n)
        tail = b"" if (fault and o.no_usage) else self.usage_chunk(n_prompt, n)
        writer.write(tail + self.done_tail)
        return True


async def serve(sock: socket.socket, opts: Options, counters: Counters, parent: int | None) -> None:
    server = Server(opts, counters)
    srv = await asyncio.start_server(server.handle, sock=sock, limit=1 << 20)
    async with srv:
        if parent is None:
            await srv.serve_forever()
        else:
            while os.getppid() == parent:  # a worker exits when its parent is gone
                await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123, help="0 picks a free port")
    ap.add_argument("--workers", type=int, default=1, help="processes sharing the listening socket")
    ap.add_argument("--model", default="zero-cost")
    ap.add_argument("--burst", type=int, default=1, help="token chunks written per event-loop turn")
    ap.add_argument("--token-delay-ms", type=float, default=0.0, help="sleep between tokens (realistic ITL)")
    ap.add_argument("--counter-prefix", default="vllm:", help="prefix of the /metrics counter names")
    ap.add_argument("--short", type=int, default=0, help="FAULT: send K tokens fewer than max_tokens")
    ap.add_argument("--drop-after", type=int, default=None, help="FAULT: close the stream after K chunks")
    ap.add_argument("--one-chunk", action="store_true", help="FAULT: all text in one event (buffered)")
    ap.add_argument("--error-status", type=int, default=None, help="FAULT: answer with this HTTP status")
    ap.add_argument("--no-usage", action="store_true", help="FAULT: omit the usage chunk")
    ap.add_argument("--fault-every", type=int, default=1, help="apply the fault to every N-th request")
    ns = ap.parse_args(argv)
    opts = Options(ns)
    counters = Counters()
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it Nagle + the client's delayed ACK hold chunks back for 40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((ns.host, ns.port))
    sock.listen(4096)
    sock.setblocking(False)
    port = sock.getsockname()[1]
    print(f"zero-cost server listening on http://{ns.host}:{port}", flush=True)
    parent = os.getpid()
    children: list[int] = []
    for _ in range(max(1, ns.workers) - 1):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            try:
                asyncio.run(serve(sock, opts, counters, parent))
            finally:
                os._exit(0)
        children.append(pid)

    def stop(signum: int, frame: Any) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        asyncio.run(serve(sock, opts, counters, None))
    except SystemExit:
        pass
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
