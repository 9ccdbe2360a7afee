"""The run's correctness failures, shared by every process of the run.

A benchmark of a server whose correctness checks failed in this run must not pass. The checks may run in
another xdist worker than the benchmark, so failures go to a file in the run directory every process of the
run shares (one JSON line each, appended with O_APPEND: small writes do not interleave). The decode check
writes (:meth:`pytest_llmserve.gates.decode.DecodeCheck.for_run`); the benchmark gate reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_llmserve.json_encoding import dumps

CORRECTNESS_FAILURES_FILE = "correctness-failures.jsonl"


def record_correctness_failure(run_dir: Path, server_id: str, test_id: str, summary: str) -> None:
    """Note that a correctness check of ``server_id`` failed in this run."""
    line = dumps({"server": server_id, "test": test_id, "summary": summary[:500]}) + "\n"
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(run_dir / CORRECTNESS_FAILURES_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)


def correctness_failures(run_dir: Path, server_id: str) -> list[dict[str, str]]:
    """The correctness failures of ``server_id`` recorded in this run (first line of each)."""
    try:
        text = (run_dir / CORRECTNESS_FAILURES_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("server") == server_id:
            found.append({k: str(item.get(k, "")) for k in ("server", "test", "summary")})
    return found
