"""Stand-in: a server that listens but answers ``/health`` with 503 forever (never ready).

Fault: the startup deadline. A real engine either becomes ready or dies; one that stays "loading" for
as long as the test wants (a wedged weight load, a hung compile) cannot be produced on demand, and waiting
out a real engine's deadline is no test. With ``--exit-after S`` it instead crashes with exit code 3,
S seconds after binding: a crash at a chosen moment of readiness (as an OOM while loading weights),
which the real engine cannot be made to do at a chosen moment either.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import _http


def extra(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--exit-after", type=float, default=None, help="crash (exit 3) this long after binding")


def main() -> int:
    ns = _http.parse_args(__doc__ or "", extra)
    started = time.monotonic()

    async def handler(method: str, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        _http.respond(writer, 503, {"status": "loading", "detail": "model weights still loading"})
        return True

    async def crash() -> None:
        await asyncio.sleep(ns.exit_after)
        print(f"RuntimeError: out of memory while loading weights ({time.monotonic() - started:.1f} s after "
              "start)", flush=True)
        os._exit(3)

    return _http.run(ns, handler, crash if ns.exit_after is not None else None)


if __name__ == "__main__":
    sys.exit(main())
