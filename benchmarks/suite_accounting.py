#!/usr/bin/env python3
"""How the built-in suite's wall time splits between server boots, requests and the plugin's own work.

Runs ``pytest --llmserve-suite`` in this process (in an empty temporary directory, so the embedded
default server and the ``smoke`` workload are used unless ``--config`` gives an ``llmserve.toml``), with
:class:`pytest_llmserve.gates.accounting.Accounting` attached from outside by wrapping:

* ``ServerHandle.start`` -> ``boot(spec id)``, ``ServerHandle.stop`` -> ``teardown()``;
* every HTTP exchange -> ``requests()``: ``httpx.Client.send`` / ``httpx.AsyncClient.send`` (the
  correctness client, the openai SDK, scrapes of ``/metrics``), ``httpx.Client.stream`` /
  ``httpx.AsyncClient.stream`` (whole streamed bodies) and ``load.runner._execute`` (the load generator's
  lean transport, whole runs).

The plugin marks its own time at the same places (its boots, teardowns and requests: the ``time:`` line at the
end of a run; docs/performance.md, section 3). While nothing is marked, a sampler counts the main thread's
innermost ``pytest_llmserve`` frame every 20 ms, which says where the plugin's own time goes. Prints the split
and writes JSON.

    python benchmarks/suite_accounting.py [--json OUT.json] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", default=None, help="default: RUN_DIR/suite_accounting.json")
    ap.add_argument("--config", default=None, help="an llmserve.toml to copy into the run directory")
    ap.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = ap.parse_args(argv)

    import httpx
    import pytest

    from pytest_llmserve.gates.accounting import Accounting, format_report
    from pytest_llmserve.load import runner
    from pytest_llmserve.server.handle import ServerHandle

    acc = Accounting(start=False)
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(make(original)))

    def boot(original: Any) -> Any:
        def start(self: Any, *a: Any, **k: Any) -> Any:
            with acc.boot(self.spec.id):
                return original(self, *a, **k)
        return start

    def teardown(original: Any) -> Any:
        def stop(self: Any, *a: Any, **k: Any) -> Any:
            with acc.teardown():
                return original(self, *a, **k)
        return stop

    def sync_request(original: Any) -> Any:
        def send(*a: Any, **k: Any) -> Any:
            with acc.requests():
                return original(*a, **k)
        return send

    def async_request(original: Any) -> Any:
        async def send(*a: Any, **k: Any) -> Any:
            with acc.requests():
                return await original(*a, **k)
        return send

    patch(ServerHandle, "start", boot)
    patch(ServerHandle, "stop", teardown)
    patch(httpx.Client, "send", sync_request)
    patch(httpx.AsyncClient, "send", async_request)
    patch(runner, "_execute", async_request)

    def sync_stream(original: Any) -> Any:
        @contextlib.contextmanager
        def stream(*a: Any, **k: Any) -> Any:
            with acc.requests(), original(*a, **k) as resp:
                yield resp
        return stream

    def async_stream(original: Any) -> Any:
        @contextlib.asynccontextmanager
        async def stream(*a: Any, **k: Any) -> Any:
            with acc.requests():
                async with original(*a, **k) as resp:
                    yield resp
        return stream

    patch(httpx.Client, "stream", sync_stream)  # the whole streamed body, not only until the headers
    patch(httpx.AsyncClient, "stream", async_stream)

    # Where the unaccounted (plugin) time goes: every 20 ms while no interval is open, the main
    # thread's innermost frame in pytest_llmserve (or the innermost frame, when none) is counted.
    main_ident = threading.main_thread().ident
    where: collections.Counter[str] = collections.Counter()
    stop_sampling = threading.Event()

    def sample_plugin_time() -> None:
        while not stop_sampling.wait(0.02):
            if acc._open:  # boot/teardown/request in progress: not the plugin's own time
                continue
            frame = sys._current_frames().get(main_ident or 0)
            label = None
            top = frame
            while frame is not None:
                name = frame.f_code.co_filename
                if "pytest_llmserve" in name and label is None:
                    label = f"{Path(name).name}:{frame.f_code.co_name}"
                frame = frame.f_back
            if label is None and top is not None:
                label = f"(outside the plugin) {Path(top.f_code.co_filename).name}:{top.f_code.co_name}"
            where[label or "?"] += 1

    sampler = threading.Thread(target=sample_plugin_time, name="where-sampler", daemon=True)
    run_dir = Path(tempfile.mkdtemp(prefix="suite-accounting-"))
    if args.config:
        shutil.copy(args.config, run_dir / "llmserve.toml")
    cwd = os.getcwd()
    json_path = Path(args.json).resolve() if args.json else None
    os.chdir(run_dir)
    cpu0 = time.process_time()
    acc.start()
    sampler.start()
    try:
        code = pytest.main(["--llmserve-suite", "-p", "no:cacheprovider", "-q", "--rootdir", str(run_dir),
                            *args.pytest_args])
    finally:
        acc.stop()
        stop_sampling.set()
        sampler.join(timeout=2)
        cpu = time.process_time() - cpu0
        os.chdir(cwd)
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
    rep = acc.report()
    rep["pytest_exit_code"] = int(code)
    rep["pytest_process_cpu_s"] = cpu
    print("\nsuite accounting: " + format_report(rep))
    print(f"pytest process CPU: {cpu:.1f} s (plugin, test code and client; the server has its own processes)")
    total = sum(where.values()) or 1
    print("plugin's own time by innermost plugin function (20 ms samples while nothing else was marked):")
    for label, n in where.most_common(12):
        print(f"  {n * 0.02:6.2f} s  {n / total:5.1%}  {label}")
    rep["plugin_time_by_function_s"] = {k: round(v * 0.02, 2) for k, v in where.most_common(30)}
    json_path = json_path or run_dir / "suite_accounting.json"
    json_path.write_text(json.dumps({"report": rep, "snapshot": acc.snapshot(), "run_dir": str(run_dir)},
                                    indent=2))
    print(f"wrote {json_path}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
