"""Stand-in: a ready OpenAI-compatible server whose first streamed completion answers HTTP 500.

Fault: one transient failure of a measured request (and, with ``--health-503 N``, N readiness polls
answered 503 first). The plugin must retry readiness but never a measured request: one failure makes the
benchmark round invalid, it is not retried into a success. A real engine cannot be made to fail exactly
one chosen request. ``GET /stats`` says how many streamed completions arrived, so a test can prove that
nothing was resent.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import _http


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--health-503", type=int, default=0, help="answer the first N /health polls with 503")


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)
    stats = {"health": 0, "streamed": 0, "failed": 0, "plain": 0}

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            stats["health"] += 1
            _http.respond(writer, 503 if stats["health"] <= ns.health_503 else 200, b"")
        elif path == "/stats":
            _http.respond(writer, 200, stats)
        elif path == "/v1/completions" and method == "POST":
            n = int(body.get("max_tokens") or 16)
            if not body.get("stream"):
                stats["plain"] += 1
                _http.respond(writer, 200, _http.completion(ns.model, n))
                return True
            stats["streamed"] += 1
            if stats["failed"] == 0:
                stats["failed"] += 1
                print("injected: HTTP 500 for the first streamed completion", flush=True)
                _http.respond(writer, 500, {"object": "error", "message": "injected transient failure"})
                return True
            await _http.stream_completion(writer, ns.model, n, prompt_tokens=len(str(body.get("prompt")).split()))
        else:
            _http.respond(writer, 404, {"error": f"no route {path}"})
        return True

    return _http.run(ns, handler)


if __name__ == "__main__":
    sys.exit(main())
