"""Running a workload: the schedule, the executor, the event loop, client processes and progress.

Warm-up requests first (not timed), then the timed requests on the workload's schedule (all at once for
an infinite rate, else gamma/Poisson arrivals) under its concurrency limit, over connections opened
before the clock starts. When one core cannot keep up, :func:`run_workload_multiprocess` spreads the
requests over spawned client processes whose records are merged on one wall clock. The figures and the
validity of the records are :mod:`pytest_llmserve.load.metrics`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import queue as queue_mod
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from pytest_llmserve.config import Workload
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.evidence.prometheus import parse as parse_prometheus
from pytest_llmserve.load.contention import HostContentionSampler, contention_reason
from pytest_llmserve.load.metrics import (
    Blame,
    InvalidReason,
    RequestRecord,
    RunResult,
    evaluate,
    server_counter_throughput,
)
from pytest_llmserve.load.prompts import Detokenize, Tokenize, WorkloadPrompt, build_prompts
from pytest_llmserve.load.transport import (
    DEFAULT_TIMEOUT_S,
    StreamParser,
    Transport,
    fetch_text,
    get_page,
    make_transport,
    parser_for,
    request_body,
)
from pytest_llmserve.server.gpu import process_utilization
from pytest_llmserve.server.gpu_scope import GpuScope

if TYPE_CHECKING:
    from multiprocessing.context import SpawnProcess
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Barrier

__all__ = ["GAUGE_SAMPLE_HZ", "LOOP_ENV", "GaugeReading", "Progress", "RunningGaugeSampler", "arrival_offsets",
           "contamination", "event_loop_name", "judge_contention", "judge_isolation", "merge_records",
           "round_concurrency", "run_loop", "run_workload", "run_workload_async", "run_workload_multiprocess",
           "split_evenly"]

_R = TypeVar("_R")

# --------------------------------------------------------------------------- arrivals

def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s from the start) of ``n`` requests: all 0 for an infinite rate; otherwise the first
    at 0 and gamma-distributed gaps with shape ``burstiness`` and mean ``1/rate`` (1.0 = Poisson)."""
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"request rate ({rate}) and burstiness ({burstiness}) must be > 0")
    rng = random.Random(seed)
    scale = 1.0 / (rate * burstiness)
    out = [0.0]
    for _ in range(n - 1):
        out.append(out[-1] + rng.gammavariate(burstiness, scale))
    return out



# --------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress display on stderr (\\r-updated), silent when stderr is not a terminal."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(enabled and hasattr(self.stream, "isatty") and self.stream.isatty())
        self.total = total
        self.label = label
        self.started = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: int, failed: int, tokens: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        elapsed = now - self.started
        width = 24
        filled = int(width * done / self.total) if self.total else width
        rate = tokens / elapsed if elapsed > 0 else 0.0
        line = (f"\r[llmserve] {self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total}"
                f" failed={failed} {tokens} tok {rate:,.0f} tok/s {elapsed:.1f}s")
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()



# --------------------------------------------------------------------------- execution

@dataclass(slots=True)
class _Execution:
    records: list[RequestRecord]
    warmup: list[RequestRecord]
    cpu_s: float  # this process's CPU time during the timed phase


async def _execute(base_url: str, model: str, prompts: Sequence[WorkloadPrompt], workload: Workload, *,
                   api_key: str | None, transport: Transport, timeout_s: float,
                   on_done: Callable[[RequestRecord], None] | None = None,
                   between: Callable[[], Awaitable[None]] | None = None,
                   progress: Progress | None = None,
                   index_of: Sequence[int] | None = None, process: int = 0) -> _Execution:
    """Warm-up, then ``between()``, then the timed requests on the workload's schedule.

    ``on_done(record)`` is called as each timed request ends; ``progress`` (a shown bar) is updated
    every 0.2 s with the chunks streamed so far (in-flight requests included)."""
    client = make_transport(transport, base_url, api_key, timeout_s)
    warm = [p for p in prompts if p.warmup]
    timed = [p for p in prompts if not p.warmup]
    indices = list(index_of) if index_of is not None else list(range(len(timed)))
    wall_offset = time.time() - time.perf_counter()
    perf = time.perf_counter
    limit = workload.max_concurrency
    sem = asyncio.Semaphore(limit) if limit else None
    active: set[StreamParser] = set()
    tally = [0, 0, 0]  # done, failed, tokens of finished timed requests

    async def one(index: int, body: bytes) -> RequestRecord:
        parser = parser_for(index)  # a plain StreamParser, or one that keeps the text of a sampled request
        active.add(parser)
        start = perf()
        try:
            async with asyncio.timeout(timeout_s):
                await client.stream(body, parser)
        except TimeoutError:
            parser.error = parser.error or (f"timed out after {timeout_s:g} s (received {parser.events} "
                                            f"events, {parser.chunks} content chunks)")
        except (OSError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            parser.interrupted(exc)
        finally:
            active.discard(parser)
        rec = parser.record(index, start, perf(), wall_offset)
        rec.process = process
        return rec

    async def limited(index: int, body: bytes, at: float, t0: float, report: bool) -> RequestRecord:
        delay = t0 + at - perf()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is None:
            rec = await one(index, body)
        else:
            async with sem:
                rec = await one(index, body)
        if report:
            tally[0] += 1
            tally[1] += 0 if rec.ok else 1
            tally[2] += rec.chunks
            if on_done is not None:
                on_done(rec)
        return rec

    async def ticker() -> None:
        assert progress is not None
        while True:
            await asyncio.sleep(0.2)
            progress.update(tally[0], tally[1], tally[2] + sum(p.chunks for p in active))

    try:
        t0 = perf()
        warm_records = list(await asyncio.gather(*(
            limited(-1 - k, request_body(model, p, workload), 0.0, t0, False) for k, p in enumerate(warm))))
        bodies = [request_body(model, p, workload) for p in timed]
        offsets = arrival_offsets(len(timed), workload.request_rate, workload.burstiness, workload.seed)
        if between is not None:
            await between()
        # Connections for the timed requests are opened now, outside the clock (servers drop idle ones).
        await client.prewarm(min(limit or len(timed), len(timed), 1024))
        cpu0 = time.process_time()
        tick = asyncio.create_task(ticker()) if progress is not None else None
        t0 = perf()
        try:
            records = list(await asyncio.gather(*(limited(indices[k], bodies[k], offsets[k], t0, True)
                                                  for k in range(len(timed)))))
        finally:
            if tick is not None:
                tick.cancel()
        cpu_s = time.process_time() - cpu0
        if progress is not None:
            progress.update(tally[0], tally[1], tally[2], force=True)
    finally:
        await client.close()
    return _Execution(records, warm_records, cpu_s)



# --------------------------------------------------------------------------- measured alone

#: How often the server's running-requests gauge is read during a round (Hz).
GAUGE_SAMPLE_HZ = 4.0


@dataclass(frozen=True, slots=True)
class GaugeReading:
    """One read of the running-requests gauge: when the GET was sent and answered (wall-clock seconds,
    the scale of :class:`RequestRecord`'s ``start``/``end``) and the value the page held."""

    sent: float
    received: float
    value: float


class RunningGaugeSampler:
    """Reads the server's running-requests gauge (e.g. ``vllm:num_requests_running``) at
    :data:`GAUGE_SAMPLE_HZ` while a round runs, as a task on the event loop that sends the round's requests,
    over a connection of its own (:func:`pytest_llmserve.load.transport.get_page`). Only the gauge's lines of
    the page are parsed (by :mod:`pytest_llmserve.evidence.prometheus`).

    Why a task on the round's loop and not a thread of its own, as it was until 2026-12-06: in CI a sampler
    thread in an xdist worker read once per round, at the round's start or after its end, in six rounds
    running (each 2.5-2.8 s of timed requests, streaming normally on the loop), so no round could be verified
    alone; a task on the loop runs whenever the round's requests do. What it takes from the loop is measured
    in benchmarks/gauge_read_cost.py."""

    def __init__(self, base_url: str, api_key: str | None, gauge: str, hz: float = GAUGE_SAMPLE_HZ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.gauge = gauge
        self.interval_s = 1.0 / hz
        self.readings: list[GaugeReading] = []
        self.failed_reads = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> RunningGaugeSampler:
        """Start reading, on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="llmserve-gauge")
        return self

    async def stop(self) -> list[GaugeReading]:
        """Stop reading (a read under way is dropped: it would end after the round) and return the readings."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return list(self.readings)

    def read(self, page: str) -> float | None:
        """The gauge's value on one /metrics page (summed over label sets, e.g. data-parallel engines)."""
        lines = "\n".join(ln for ln in page.splitlines() if ln.startswith(self.gauge)) + "\n"
        values = parse_prometheus(lines).get(self.gauge)
        return sum(v for _, v in values) if values else None

    async def _loop(self) -> None:
        while True:
            sent = time.time()
            page = await get_page(self.base_url, "/metrics", self.api_key)
            value = self.read(page) if page is not None else None
            if value is None:
                self.failed_reads += 1
            else:
                self.readings.append(GaugeReading(sent, time.time(), value))
            await asyncio.sleep(self.interval_s)


def round_concurrency(workload: Workload) -> int:
    """The most requests a round itself can have running at once: its concurrency limit, else all of them."""
    return int(workload.max_concurrency or workload.num_prompts)


def contamination(values: Sequence[float], concurrency: int) -> str | None:
    """Why a round is invalid when the server's own gauge saw more requests running than the round sent
    at most (another client reached the server during it), else None."""
    peak = max(values, default=0.0)
    if peak > concurrency:
        return f"contaminated: {peak:g} running requests during a round of concurrency {concurrency}"
    return None


def judge_isolation(result: RunResult, gauge: str, readings: Sequence[GaugeReading],
                    failed_reads: int = 0) -> RunResult:
    """Record what the gauge showed during the round; a contaminated round becomes invalid (its figures
    move to ``diagnostics``, as for any invalid run).

    Any reading above the round's concurrency is contamination. The round is *verified* alone only by
    readings sent after its first timed request started and answered before its last one ended: a read
    taken before the requests reached the server (the first one usually is) shows 0 and proves nothing, and
    a read can take longer than the round, and then none verifies it (seen in CI with the reads on a thread of
    their own: one reading per round, none inside; :class:`RunningGaugeSampler` says why they no longer are)."""
    concurrency = round_concurrency(result.workload)
    if not readings:
        result.notes.append(f"{gauge} could not be read during the round ({failed_reads} attempts): "
                            "that no other client reached the server is not verified")
        return result
    timed = result.per_request
    first = min((r.start for r in timed), default=float("-inf"))
    last = max((r.end for r in timed), default=float("inf"))
    inside = [r.value for r in readings if r.sent >= first and r.received <= last]
    answered_in_time = [r.value for r in readings if r.received <= last]
    reason = contamination(answered_in_time, concurrency)
    if inside:
        peak = max(inside)
        result.diagnostics["server_running_requests_max"] = peak
        result.notes.append(f"{gauge} sampled {len(inside)} times during the round: at most {peak:g} running "
                            f"(the round's concurrency is {concurrency})")
    elif reason is None:
        # How long the slowest read took says whether /metrics answered only after the round.
        slowest = max(r.received - r.sent for r in readings)
        result.notes.append(f"{gauge} was read {len(readings)} times ({failed_reads} failed reads; the slowest "
                            f"answer took {slowest:.1f} s, the timed requests ran {max(last - first, 0.0):.1f} s) "
                            "but never while the round's requests ran: that no other client reached the server "
                            "is not verified")
    if reason is not None:
        result.diagnostics["server_running_requests_max"] = max(answered_in_time)
        _invalidate(result, InvalidReason(reason, Blame.MACHINE))  # another client's requests, not the server
    return result


def _invalidate(result: RunResult, reason: InvalidReason) -> None:
    """Make a round invalid for ``reason``: its figures move to ``diagnostics``, as for any invalid run."""
    if result.valid:
        result.diagnostics.update(result.metrics)
    result.valid = False
    result.metrics = {}
    result.summaries = {}
    result.invalid_reasons.append(reason)


def judge_contention(result: RunResult, bound: float) -> str | None:
    """Why the round is not a sample when other processes took more than ``bound`` of the host during it
    (:func:`pytest_llmserve.load.contention.contention_reason`): the round becomes invalid, its figures moved to
    ``diagnostics`` as for any invalid run, and the reason (naming the top processes) is returned; else None.
    This is host *contention* (others' CPU/GPU), not *contamination* (others' requests: :func:`judge_isolation`)."""
    reason = contention_reason(result.host_contention, bound)
    if reason is None:
        return None
    _invalidate(result, InvalidReason(reason, Blame.MACHINE))
    return reason


# --------------------------------------------------------------------------- entry points

async def run_workload_async(base_url: str, model: str, workload: Workload, *,
                             prompts: Sequence[WorkloadPrompt] | None = None, tokenize: Tokenize | None = None,
                             detokenize: Detokenize | None = None, api_key: str | None = None,
                             transport: Transport = "lean", progress: bool = True,
                             timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                             allow_multi_token_chunks: bool = False,
                             cross_check_bound: float = 0.03, running_gauge: str | None = None,
                             untrained: str | None = None, host_contention: bool = False,
                             server_pid: int | None = None, gpu_scope: GpuScope | None = None) -> RunResult:
    """Run ``workload`` against ``base_url`` (the server root, e.g. ``http://127.0.0.1:8000``).

    ``prompts`` (from :func:`build_prompts`) are built here when not given. ``server_counter`` (e.g.
    ``vllm:generation_tokens``) is scraped from ``/metrics`` after the warm-up and after the run, and
    the client's output throughput must agree with it within ``cross_check_bound``. ``running_gauge``
    (e.g. ``vllm:num_requests_running``) is sampled during the timed phase; a round during which it
    exceeded the round's concurrency is invalid (see :func:`judge_isolation`). ``untrained``: why the
    model is untrained, if it is (see :func:`pytest_llmserve.load.metrics.evaluate`). ``host_contention``:
    sample what other processes than the server's (``server_pid`` and its descendants; found from the URL's
    port when None) and this load generator's took of the host during the timed phase (on GPUs, only the
    server's GPUs, ``gpu_scope``, count), into ``result.host_contention``
    (:mod:`pytest_llmserve.load.contention`; judged by the caller).
    """
    plist = list(prompts) if prompts is not None else build_prompts(workload, tokenize, detokenize)
    n_timed = sum(1 for p in plist if not p.warmup)
    bar = Progress(n_timed, workload.name, progress)
    scrapes: list[str | None] = []
    sampler = RunningGaugeSampler(base_url, api_key, running_gauge) if running_gauge else None
    contention = _contention_sampler(base_url, server_pid, gpu_scope) if host_contention else None

    async def between() -> None:
        if server_counter is not None:
            scrapes.append(await asyncio.to_thread(fetch_text, base_url, "/metrics", api_key))
        if sampler is not None:
            sampler.start()  # after the warm-up: it may not overlap the timed requests of another round
        if contention is not None:
            contention.start()  # the timed phase only, as the gauge
        bar.started = time.monotonic()

    try:
        execution = await _execute(base_url, model, plist, workload, api_key=api_key, transport=transport,
                                   timeout_s=timeout_s, between=between,
                                   progress=bar if bar.enabled else None)
    finally:
        bar.close()
        gauge_readings = await sampler.stop() if sampler is not None else []
        busy = contention.stop() if contention is not None and contention.started else None
    server_tokens: float | None = None
    if server_counter is not None:
        after = await asyncio.to_thread(fetch_text, base_url, "/metrics", api_key)
        server_tokens = _counter_delta(scrapes[0] if scrapes else None, after, server_counter)
    result = evaluate(execution.records, workload, transport=transport, warmup=execution.warmup, prompts=plist,
                      allow_multi_token_chunks=allow_multi_token_chunks, server_counter=server_counter,
                      server_tokens=server_tokens, cross_check_bound=cross_check_bound,
                      client_cpu_s=execution.cpu_s, untrained=untrained)
    result.event_loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    result.host_contention = busy
    if sampler is not None and running_gauge is not None:
        judge_isolation(result, running_gauge, gauge_readings, sampler.failed_reads)
    return result


def _contention_sampler(base_url: str, server_pid: int | None, gpu_scope: GpuScope | None) -> HostContentionSampler:
    """The round's host-contention sampler, with the GPU probe's per-process accounting on the server's GPUs."""
    return HostContentionSampler(server_pid, base_url, gpu_reader=process_utilization, gpu_scope=gpu_scope)


def _counter_delta(before: str | None, after: str | None, counter: str) -> float | None:
    if before is None or after is None:
        return None
    tps = server_counter_throughput(before, after, counter, 1.0)
    return tps


def run_workload(base_url: str, model: str, workload: Workload, *, prompts: Sequence[WorkloadPrompt] | None = None,
                 tokenize: Tokenize | None = None, detokenize: Detokenize | None = None,
                 api_key: str | None = None, transport: Transport = "lean", progress: bool = True,
                 timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                 allow_multi_token_chunks: bool = False, cross_check_bound: float = 0.03,
                 running_gauge: str | None = None, untrained: str | None = None, host_contention: bool = False,
                 server_pid: int | None = None, gpu_scope: GpuScope | None = None) -> RunResult:
    """Synchronous :func:`run_workload_async` (in a helper thread when an event loop is already running)."""
    def coro() -> Awaitable[RunResult]:
        return run_workload_async(base_url, model, workload, prompts=prompts, tokenize=tokenize,
                                  detokenize=detokenize, api_key=api_key, transport=transport,
                                  progress=progress,
                                  timeout_s=timeout_s, server_counter=server_counter,
                                  allow_multi_token_chunks=allow_multi_token_chunks,
                                  cross_check_bound=cross_check_bound, running_gauge=running_gauge,
                                  untrained=untrained, host_contention=host_contention, server_pid=server_pid,
                                  gpu_scope=gpu_scope)
    return _run_sync(coro)


LOOP_ENV = "PYTEST_LLMSERVE_EVENT_LOOP"


def event_loop_name() -> str:
    """``uvloop`` when it is installed (``pip install pytest-llmserve[fast]``) and not turned off with
    ``$PYTEST_LLMSERVE_EVENT_LOOP=asyncio``; else ``asyncio``. uvloop halves the client's cost per read."""
    choice = os.environ.get(LOOP_ENV, "auto").strip().lower()
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"${LOOP_ENV} = {choice!r}: must be auto, uvloop or asyncio")
    if choice == "asyncio":
        return "asyncio"
    try:
        # lazy: uvloop takes ~50 ms to import (-X importtime), and is optional
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise ValueError(f"${LOOP_ENV} = 'uvloop' but uvloop is not installed "
                             "(pip install 'pytest-llmserve[fast]')") from None
        return "asyncio"
    return "uvloop"


def run_loop(main: Coroutine[object, object, _R]) -> _R:
    """``asyncio.run`` on the load generator's event loop (see :func:`event_loop_name`)."""
    if event_loop_name() == "uvloop":
        # lazy: uvloop takes ~50 ms to import (-X importtime), and is optional
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def _run_sync(coro: Callable[[], Awaitable[_R]]) -> _R:
    """``coro()`` run to its end from synchronous code: on the load generator's loop (:func:`run_loop`), in a
    helper thread when an event loop is already running in this one."""
    async def main() -> _R:
        return await coro()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_loop(main())
    box: list[_R] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(run_loop(main()))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=target, name="llmserve-load")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]



# --------------------------------------------------------------------------- several client processes

def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` integers differing by at most one (larger first)."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def merge_records(per_process: Sequence[Sequence[RequestRecord]]) -> list[RequestRecord]:
    """All processes' records in one list ordered by start (wall-clock aligned); every sample is kept, so
    percentiles and the duration are computed over the union, never averaged across processes."""
    merged = [r for recs in per_process for r in recs]
    merged.sort(key=lambda r: (r.start, r.index))
    return merged


# What a client process sends back: its number, its timed and warm-up records (as dicts), its CPU seconds in the timed
# phase, and the error that ended it (None: it ran its share).
_ChildResult = tuple[int, list[dict[str, Any]], list[dict[str, Any]], float, str | None]


@dataclass(slots=True)
class _ClientProcesses:
    """The spawned client processes of a round and what they share with the parent: the barrier each waits at after
    its warm-up (``ready``), the one that starts their timed requests together (``go``), the queue their results come
    back on and the count of timed requests done (for the progress line)."""

    procs: list[SpawnProcess]
    ready: Barrier
    go: Barrier
    results: Queue[_ChildResult]
    counter: Synchronized[int]

    def join(self) -> None:
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)


def _child_main(args: dict[str, Any], ready: Barrier, go: Barrier, results: Queue[_ChildResult],
                counter: Synchronized[int]) -> None:
    """Entry point of one client process (spawned): run its share, report records as dicts."""
    process = int(args["process"])
    try:
        prompts = [WorkloadPrompt(tuple(p[0]) if isinstance(p[0], list) else p[0], p[1], p[2], p[3])
                   for p in args["prompts"]]
        workload = Workload(**args["workload"])

        def on_done(rec: RequestRecord) -> None:
            with counter.get_lock():
                counter.value += 1

        async def between() -> None:
            await asyncio.to_thread(ready.wait, args["timeout_s"])
            await asyncio.to_thread(go.wait, args["timeout_s"])

        execution = run_loop(_execute(
            args["base_url"], args["model"], prompts, workload, api_key=args["api_key"],
            transport=args["transport"], timeout_s=args["timeout_s"], on_done=on_done, between=between,
            index_of=args["indices"], process=process))
        results.put((process, [r.to_dict() for r in execution.records],
                     [r.to_dict() for r in execution.warmup], execution.cpu_s, None))
    except BaseException as exc:  # reported to the parent, which fails the run with it
        with contextlib.suppress(Exception):
            ready.abort()
            go.abort()
        results.put((process, [], [], 0.0, f"{type(exc).__name__}: {exc}"))


def _client_share(workload: Workload, plist: Sequence[WorkloadPrompt], k: int, n: int) -> dict[str, Any]:
    """Client process ``k``'s part of the round, as the spawned process is handed it: the prompts dealt round-robin
    (warm-up and timed), its share of the concurrency limit and of the request rate, its own seed, and the global
    indices of its timed requests."""
    warm = [p for p in plist if p.warmup]
    timed = [p for p in plist if not p.warmup]
    conc = split_evenly(workload.max_concurrency, n) if workload.max_concurrency else [0] * n
    share = timed[k::n]
    warm_share = warm[k::n]
    sub = replace(workload, name=f"{workload.name}#{k}", num_prompts=len(share), warmup=len(warm_share),
                  max_concurrency=conc[k] or None, request_rate=workload.request_rate / n, seed=workload.seed + k)
    return {"workload": asdict(sub), "indices": list(range(len(timed)))[k::n],
            "prompts": [(list(p.prompt) if isinstance(p.prompt, tuple) else p.prompt, p.num_tokens, p.exact,
                         p.warmup) for p in warm_share + share]}


def _spawn_clients(workload: Workload, plist: Sequence[WorkloadPrompt], n: int,
                   common: dict[str, Any]) -> _ClientProcesses:
    """``n`` client processes started (spawned), each with its share of the round (``common``: what every one is
    handed alike: the server, the model, the key, the transport, the timeout)."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(n + 1)
    go = ctx.Barrier(n + 1)
    results: Queue[_ChildResult] = ctx.Queue()
    counter: Synchronized[int] = ctx.Value("i", 0)
    procs = []
    for k in range(n):
        args = {"process": k, **common, **_client_share(workload, plist, k, n)}
        proc = ctx.Process(target=_child_main, args=(args, ready, go, results, counter),
                           name=f"llmserve-load-{k}", daemon=True)
        proc.start()
        procs.append(proc)
    return _ClientProcesses(procs, ready, go, results, counter)


def _start_together(clients: _ClientProcesses, timeout_s: float, metrics_page: Callable[[], str | None] | None
                    ) -> str | None:
    """Wait for every client's warm-up, read the server's counters (``metrics_page``, if given), then start the timed
    requests of all together; returns the page read. A child that failed breaks the barriers: its message arrives
    through the queue."""
    before: str | None = None
    try:
        clients.ready.wait(timeout_s + 120)
        if metrics_page is not None:
            before = metrics_page()
        clients.go.wait(60)
    except threading.BrokenBarrierError:
        pass  # a child failed; its message arrives through the queue
    return before


def _collect_results(clients: _ClientProcesses, bar: Progress, sampler: RunningGaugeSampler | None,
                     timeout_s: float) -> tuple[dict[int, _ChildResult], list[GaugeReading]]:
    """The children's results by process, and the gauge's readings meanwhile."""
    got: dict[int, _ChildResult] = {}

    async def collect() -> list[GaugeReading]:
        # The children's results, polled on an event loop so that the gauge is read by a task on it, as in
        # a single-process round (RunningGaugeSampler says why not on a thread).
        if sampler is not None:
            sampler.start()
        try:
            deadline = time.monotonic() + timeout_s + 120
            while len(got) < len(clients.procs) and time.monotonic() < deadline:
                try:
                    result = clients.results.get_nowait()
                    got[result[0]] = result
                    continue
                except queue_mod.Empty:
                    if not any(p.is_alive() for p in clients.procs) and clients.results.empty():
                        break
                bar.update(clients.counter.value, 0, 0)
                await asyncio.sleep(0.1)
        finally:
            gauge_readings = await sampler.stop() if sampler is not None else []
        return gauge_readings

    return got, _run_sync(collect)


def _client_failures(got: dict[int, _ChildResult], procs: Sequence[SpawnProcess]) -> list[str]:
    """Each client process that reported an error or exited without results, in process order."""
    errors = [f"client process {k}: {error}" for k, (*_, error) in sorted(got.items()) if error]
    missing = [k for k in range(len(procs)) if k not in got]
    return errors + [f"client process {k} exited without results (exit code {procs[k].exitcode})" for k in missing]


def _records_of(got: dict[int, _ChildResult]) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Every client process's timed records merged (:func:`merge_records`), and their warm-up records in process
    order."""
    ordered = [got[k] for k in range(len(got))]
    merged = merge_records([[RequestRecord.from_dict(d) for d in timed] for _, timed, _, _, _ in ordered])
    return merged, [RequestRecord.from_dict(d) for _, _, warm, _, _ in ordered for d in warm]


def run_workload_multiprocess(base_url: str, model: str, workload: Workload, *, processes: int,
                              prompts: Sequence[WorkloadPrompt] | None = None, tokenize: Tokenize | None = None,
                              detokenize: Detokenize | None = None, api_key: str | None = None,
                              transport: Transport = "lean", progress: bool = True,
                              timeout_s: float = DEFAULT_TIMEOUT_S, server_counter: str | None = None,
                              allow_multi_token_chunks: bool = False,
                              cross_check_bound: float = 0.03, running_gauge: str | None = None) -> RunResult:
    """Run ``workload`` from ``processes`` client processes (spawned) when one core cannot keep up.

    Prompts are built here and dealt round-robin; each process gets its share of the concurrency limit
    and of the request rate (a sum of independent Poisson streams is Poisson), warms up, then all start
    together (barrier). Records are merged by :func:`merge_records` on a common wall clock.
    """
    plist = list(prompts) if prompts is not None else build_prompts(workload, tokenize, detokenize)
    n_timed = sum(1 for p in plist if not p.warmup)
    n = max(1, min(processes, n_timed, workload.max_concurrency or processes))
    if n == 1:
        return run_workload(base_url, model, workload, prompts=plist, api_key=api_key, transport=transport,
                            progress=progress, timeout_s=timeout_s, server_counter=server_counter,
                            allow_multi_token_chunks=allow_multi_token_chunks,
                            cross_check_bound=cross_check_bound, running_gauge=running_gauge)
    clients = _spawn_clients(workload, plist, n, {"base_url": base_url, "model": model, "api_key": api_key,
                                                  "transport": transport, "timeout_s": timeout_s})
    bar = Progress(n_timed, f"{workload.name} x{n} processes", progress)
    sampler = RunningGaugeSampler(base_url, api_key, running_gauge) if running_gauge else None

    def metrics_page() -> str | None:
        return fetch_text(base_url, "/metrics", api_key)

    try:
        before = _start_together(clients, timeout_s, metrics_page if server_counter is not None else None)
        got, gauge_readings = _collect_results(clients, bar, sampler, timeout_s)
    finally:
        bar.close()
        clients.join()
    errors = _client_failures(got, clients.procs)
    if errors:
        raise LLMServeError("multi-process load generation failed: " + "; ".join(errors))
    merged, warm_records = _records_of(got)
    server_tokens = None if server_counter is None else _counter_delta(before, metrics_page(), server_counter)
    result = evaluate(merged, workload, transport=transport, warmup=warm_records, prompts=plist,
                      allow_multi_token_chunks=allow_multi_token_chunks, processes=n,
                      server_counter=server_counter, server_tokens=server_tokens,
                      cross_check_bound=cross_check_bound, client_cpu_s=sum(v[3] for v in got.values()))
    result.event_loop = event_loop_name()  # what the client processes ran
    if sampler is not None and running_gauge is not None:
        judge_isolation(result, running_gauge, gauge_readings, sampler.failed_reads)
    return result
