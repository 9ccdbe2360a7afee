"""Stand-in: a server process that runs but never binds its port (never ready, connection refused).

Fault: the startup deadline while the process is alive and silent (a hung import, a distributed
init waiting for a peer). The real engine cannot be made to hang before binding on demand.
"""

from __future__ import annotations

import sys
import time

import _http


def main() -> int:
    ns = _http.parse_args(__doc__ or "")
    print("initializing distributed environment (waiting for peers)...", flush=True)
    time.sleep(ns.max_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
