"""Plumbing shared by the stand-in servers in this directory (not a stand-in itself).

A minimal asyncio HTTP/1.1 server: enough of the OpenAI completions API (streamed and not) for the
plugin's readiness probe, its correctness client and its load generator. Every stand-in:

* takes ``--port`` (the plugin fills in ``{port}``) and ``--host``, and ignores unknown arguments;
* prints its argv first, so a test can see that a configuration value arrived literally;
* exits by itself after ``--max-s`` seconds, so a stand-in can never outlive a broken test for long.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[str, str, dict[str, Any], asyncio.StreamWriter], Awaitable[bool]]


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", default="standin")
    ap.add_argument("--max-s", type=float, default=300.0, help="exit after this long whatever happens")
    if extra:
        extra(ap)
    ns, _unknown = ap.parse_known_args()
    print(f"standin {os.path.basename(sys.argv[0])} pid {os.getpid()} argv {sys.argv!r}", flush=True)
    return ns


def respond(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                 % (status, len(body)) + body)


def completion(model: str, n: int, prompt_tokens: int = 1) -> dict[str, Any]:
    return {"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": " tok" * n, "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}}


def _chunk(obj: Any) -> bytes:
    event = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
    return b"%x\r\n" % len(event) + event + b"\r\n"


async def stream_completion(writer: asyncio.StreamWriter, model: str, n: int, prompt_tokens: int = 1,
                            delay_s: float = 0.002) -> None:
    """``n`` one-token SSE chunks, the usage chunk and ``[DONE]``, as vLLM streams them."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    base = {"id": "cmpl-standin", "object": "text_completion", "created": 0, "model": model}
    for i in range(n):
        writer.write(_chunk(dict(base, choices=[{"index": 0, "text": " tok", "logprobs": None,
                                                 "finish_reason": "length" if i == n - 1 else None}])))
        await writer.drain()
        await asyncio.sleep(delay_s)
    writer.write(_chunk(dict(base, choices=[], usage={"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                                      "total_tokens": prompt_tokens + n})))
    writer.write(_chunk(b"[DONE]") + b"0\r\n\r\n")
    await writer.drain()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, Any]] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    line, _, rest = head.partition(b"\r\n")
    parts = line.decode(errors="replace").split(" ")
    if len(parts) < 2:
        return None
    length = 0
    for header in rest.lower().split(b"\r\n"):
        if header.startswith(b"content-length:"):
            length = int(header[15:].strip())
    raw = await reader.readexactly(length) if length else b""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    return parts[0], parts[1].split("?", 1)[0], body if isinstance(body, dict) else {}


def run(ns: argparse.Namespace, handler: Handler,
        background: Callable[[], Awaitable[None]] | None = None) -> int:
    """Serve ``handler`` (return False to close the connection) until ``--max-s`` has passed, or until
    ``background`` (started once the port is bound) returns."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await read_request(reader)
                if req is None or not await handler(*req, writer):
                    break
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(connection, ns.host, ns.port)
        port = server.sockets[0].getsockname()[1]
        print(f"standin listening on http://{ns.host}:{port}", flush=True)
        async with server:
            if background is None:
                await asyncio.sleep(ns.max_s)
            else:
                await asyncio.wait_for(background(), ns.max_s)

    asyncio.run(main())
    return 0
