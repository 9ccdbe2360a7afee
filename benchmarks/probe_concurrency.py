"""The built-in suite's request time with its independent probes sent one at a time vs together, side by side.

Boots the embedded default once (or attaches with ``--url``) and runs ``pytest --llmserve-suite
--llmserve-url URL`` against it, alternating ``--llmserve-probe-concurrency=1`` (the sequential path)
and the default (together, bounded by the server's batch capacity), ``--pairs`` times, order ABBA so each
variant goes first in half the pairs. Each run's closing ``time:`` line gives its wall time, its
request time and the request time by kind; the script prints them and the ratios after / before.

Attached, the runs skip nothing that sends requests except the server's own boot, which is measured
once here and is the same for both variants (``whole suite`` = boot + run wall time).

    python benchmarks/probe_concurrency.py [--pairs 2] [--url URL] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TIME_LINE = re.compile(r"time: wall ([\d.]+) s = server boots .*?\+ requests ([\d.]+) s \((\d+)%(?:: ([^)]*))?\)")
KIND = re.compile(r"([a-z ]+?) ([\d.]+) s")


def run_suite(url: str, concurrency: int | None, workdir: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "pytest", "--llmserve-suite", f"--llmserve-url={url}", "-p", "no:cacheprovider",
            "-q", "-rN"]
    if concurrency is not None:
        argv.append(f"--llmserve-probe-concurrency={concurrency}")
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    found = TIME_LINE.search(proc.stdout)
    if found is None:
        raise SystemExit(f"no time line in the run's output:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    kinds = {k.strip(): float(v) for k, v in KIND.findall(found.group(4) or "")}
    outcome = proc.stdout.strip().splitlines()[-1]
    return {"concurrency": concurrency or "auto", "process_wall_s": wall, "suite_wall_s": float(found.group(1)),
            "request_s": float(found.group(2)), "kinds": kinds, "outcome": outcome}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--url", help="attach to this server instead of booting the embedded default")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args()
    print(f"uptime at start: {os.popen('uptime').read().strip()}; cores: {os.cpu_count()}", flush=True)
    server = None
    boot_s = 0.0
    if args.url:
        url = args.url
    else:
        from pytest_llmserve.engines import embedded
        from pytest_llmserve.server.handle import ServerHandle

        server = ServerHandle(embedded.default_spec(), log_dir=Path(tempfile.mkdtemp(prefix="probe-conc-")))
        start = time.monotonic()
        server.start()
        boot_s = time.monotonic() - start
        url = server.base_url
        print(f"booted {url} in {boot_s:.1f} s (log {server.log_path})", flush=True)
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="probe-conc-suite-") as tmp:
            workdir = Path(tmp)
            (workdir / "pytest.ini").write_text("[pytest]\n")
            for pair in range(args.pairs):
                order: list[int | None] = [1, None] if pair % 2 == 0 else [None, 1]
                for concurrency in order:
                    row = run_suite(url, concurrency, workdir)
                    row["pair"] = pair + 1
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"uptime at end: {os.popen('uptime').read().strip()}")
    before = [r for r in runs if r["concurrency"] == 1]
    after = [r for r in runs if r["concurrency"] != 1]
    for pair in range(1, args.pairs + 1):
        b = next(r for r in before if r["pair"] == pair)
        a = next(r for r in after if r["pair"] == pair)
        print(f"pair {pair}: requests {b['request_s']:.1f} -> {a['request_s']:.1f} s "
              f"(ratio {a['request_s'] / b['request_s']:.3f}); correctness requests without benchmark rounds "
              f"{_correctness(b):.1f} -> {_correctness(a):.1f} s (ratio {_correctness(a) / _correctness(b):.3f}); "
              f"suite wall {b['suite_wall_s']:.1f} -> {a['suite_wall_s']:.1f} s (whole, boot {boot_s:.1f} s "
              f"included: {(a['suite_wall_s'] + boot_s) / (b['suite_wall_s'] + boot_s):.3f})")
    summary = {"boot_s": boot_s, "runs": runs,
               "median_request_ratio": statistics.median(
                   a["request_s"] / b["request_s"] for a, b in zip(after, before, strict=True))}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


def _correctness(run: dict[str, Any]) -> float:
    return float(run["request_s"]) - float(run["kinds"].get("benchmark rounds", 0.0))


if __name__ == "__main__":
    main()
