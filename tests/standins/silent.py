"""Stand-in: a server that accepts connections and never answers (a wedged engine).

Fault: request timeouts. vLLM keeps answering ``/health`` while its engine is wedged; a real engine
cannot be wedged on demand. By default it passes readiness (``/health`` 200 and the one-token
generation probe are answered) and then never answers any other request; with ``--silent-from-start``
it never answers anything, not even ``/health`` (the deadline must hold against a silent probe).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import _http


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--silent-from-start", action="store_true")


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        if not ns.silent_from_start:
            if path == "/health":
                _http.respond(writer, 200, b"")
                return True
            if path == "/v1/completions" and body.get("max_tokens") == 1 and not body.get("stream"):
                _http.respond(writer, 200, _http.completion(ns.model, 1))
                return True
        print(f"accepted {method} {path}; never answering", flush=True)
        await asyncio.sleep(ns.max_s)  # hold the connection open, say nothing
        return False

    return _http.run(ns, handler)


if __name__ == "__main__":
    sys.exit(main())
