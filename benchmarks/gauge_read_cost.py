#!/usr/bin/env python3
"""What reading the running-requests gauge takes from the load generator's event loop, on the real default
server (vLLM on CPU serving SmolLM2-135M, booted here with the package's ServerHandle).

The gauge is read by a task on the loop that timestamps the round's chunks (``RunningGaugeSampler``), so a
read's CPU on that loop is time during which a chunk that arrives waits to be stamped. Measured here, with
the server idle and then while it streams a round's requests:

- the /metrics page's size;
- per read: wall time (send to parsed value) and this process's CPU (``time.process_time``), over ``--reads``
  reads one after another on a uvloop/asyncio loop (the plugin's ``run_loop``);
- the CPU share of the loop that sampling at ``GAUGE_SAMPLE_HZ`` costs (CPU per read x reads per second).

    python benchmarks/gauge_read_cost.py [--reads 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmserve.config import Workload  # noqa: E402
from pytest_llmserve.engines import embedded  # noqa: E402
from pytest_llmserve.load.runner import (  # noqa: E402
    GAUGE_SAMPLE_HZ,
    RunningGaugeSampler,
    event_loop_name,
    run_loop,
    run_workload_async,
)
from pytest_llmserve.load.transport import get_page  # noqa: E402
from pytest_llmserve.server.handle import ServerHandle  # noqa: E402

GAUGE = "vllm:num_requests_running"


async def reads(base_url: str, n: int) -> tuple[list[float], list[float], int]:
    """``n`` reads one after another: wall and CPU seconds of each, and the page's size."""
    sampler = RunningGaugeSampler(base_url, None, GAUGE)
    walls: list[float] = []
    cpus: list[float] = []
    size = 0
    for _ in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        page = await get_page(base_url, "/metrics", None)
        assert page is not None, "no /metrics page"
        assert sampler.read(page) is not None, f"{GAUGE} not on the page"
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        size = len(page.encode())
    return walls, cpus, size


async def busy(base_url: str, model: str, n: int) -> tuple[list[float], list[float], int]:
    """The same reads while a round of 4 concurrent 256-token requests streams on the same loop."""
    workload = Workload("busy", num_prompts=4, input_len=16, output_len=256, max_concurrency=4, warmup=0)
    round_ = asyncio.ensure_future(run_workload_async(base_url, model, workload, progress=False))
    await asyncio.sleep(1.0)  # the requests are decoding
    out = await reads(base_url, n)
    await round_
    return out


def show(label: str, walls: list[float], cpus: list[float], size: int) -> None:
    cpu_ms = statistics.median(cpus) * 1000
    print(f"{label}: page {size:,} bytes; per read: wall median {statistics.median(walls) * 1000:.2f} ms "
          f"(max {max(walls) * 1000:.2f}), this process's CPU median {cpu_ms:.2f} ms "
          f"(mean {statistics.mean(cpus) * 1000:.2f}); at {GAUGE_SAMPLE_HZ:g} Hz: "
          f"{cpu_ms * GAUGE_SAMPLE_HZ / 10:.2f} % of the loop")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=200)
    args = ap.parse_args()
    with ServerHandle(embedded.default_spec()) as server:
        print(f"server booted in {server.boot.boot_s:.1f} s; event loop {event_loop_name()}")
        show("idle server", *run_loop(reads(server.base_url, args.reads)))
        show("while streaming", *run_loop(busy(server.base_url, server.model_name, args.reads // 4)))


if __name__ == "__main__":
    main()
