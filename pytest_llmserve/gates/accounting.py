"""Where a suite's wall time went: server boots, requests, the test's own time, and the plugin's work.

The plugin marks the time it spends booting servers (:meth:`Accounting.boot`), stopping them
(:meth:`Accounting.teardown`) and sending requests (:meth:`Accounting.requests`), and the time a test's
own code runs (or sleeps) outside those (:meth:`Accounting.test_idle`; the plugin's calls made from
inside it are carved out again with :meth:`Accounting.plugin`). Whatever is left of the wall time is the
plugin's own work: collection, configuration, prompt building, verdicts, baselines, reports.

Overlaps are resolved, not summed: the wall clock is cut at every interval edge and each slice goes to
the highest-ranked category active in it (``boot`` > ``teardown`` > ``request`` > ``plugin`` >
``idle``), so concurrent requests from several threads count once and a readiness probe sent during a
boot counts as boot. Hence ``boot_s + teardown_s + request_s + idle_s + plugin_s == wall_s`` exactly.

Requests carry a kind (:data:`REQUEST_KIND_NAMES`: correctness probes, batch cases, properties, benchmark
rounds, other), kept as the interval's key; ``request_kinds`` splits ``request_s`` among them. Where
requests of several kinds are in flight at once (independent probes sent together), each slice is shared
in proportion to the number of requests of each kind in flight, so the kinds still sum to ``request_s``.

Intervals are kept on a wall clock (``time.time`` scale, derived from ``time.perf_counter``), so the
snapshots of several processes (pytest-xdist workers, the controller) can be merged with
:meth:`Accounting.merge`. Thread-safe; no pytest import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

Category = Literal["boot", "teardown", "request", "plugin", "idle"]
# Precedence when intervals overlap, first wins. "plugin" marks the plugin's own work inside a span
# marked "idle" (e.g. llm_bench.run() inside a test body); unmarked time is the plugin's too.
CATEGORIES: tuple[Category, ...] = ("boot", "teardown", "request", "plugin", "idle")
_RANK = {c: i for i, c in enumerate(CATEGORIES)}
#: Request kinds (see :data:`pytest_llmserve.evidence.client.REQUEST_KINDS`) as the summary names them, in its order.
REQUEST_KIND_NAMES = {"probes": "correctness probes", "batch": "batch cases", "properties": "properties",
                      "benchmark": "benchmark rounds", "other": "other requests"}


@dataclass(frozen=True, slots=True)
class Interval:
    category: Category
    start: float
    end: float
    key: str | None = None  # for boots: the configuration booted; for requests: their kind


class Accounting:
    """Thread-safe accumulator of timed intervals over one wall-clock span (:meth:`start` .. :meth:`stop`).

    ``clock`` returns seconds on any monotonic scale (default ``time.perf_counter``); intervals are
    stored shifted onto the wall clock.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, *, start: bool = True) -> None:
        self._clock = clock
        self._offset = time.time() - clock()
        self._lock = threading.Lock()
        self._intervals: list[Interval] = []
        self._open: dict[int, tuple[Category, float, str | None]] = {}
        self._next_id = 0
        self._started: float | None = None
        self._stopped: float | None = None
        if start:
            self.start()

    def now(self) -> float:
        return self._clock() + self._offset

    def start(self) -> None:
        with self._lock:
            self._started = self.now()
            self._stopped = None

    def stop(self) -> None:
        with self._lock:
            self._stopped = self.now()

    # ------------------------------------------------------------------ marking time
    @contextmanager
    def _span(self, category: Category, key: str | None) -> Iterator[None]:
        begin = self.now()
        with self._lock:
            ident = self._next_id
            self._next_id += 1
            self._open[ident] = (category, begin, key)
        try:
            yield
        finally:
            end = self.now()
            with self._lock:
                del self._open[ident]
                self._intervals.append(Interval(category, begin, end, key))

    def boot(self, key: str | None = None) -> AbstractContextManager[None]:
        """Context manager around one server boot (``key``: the configuration, e.g. the server id)."""
        return self._span("boot", key)

    def teardown(self) -> AbstractContextManager[None]:
        """Context manager around stopping a server (not counted as a boot)."""
        return self._span("teardown", None)

    def requests(self, kind: str = "other") -> AbstractContextManager[None]:
        """Context manager around requests sent to a server, of one kind (:data:`REQUEST_KIND_NAMES`)."""
        return self._span("request", kind)

    def test_idle(self) -> AbstractContextManager[None]:
        """Context manager around time that belongs to the test itself (its own code, sleeps); wrap a
        test's whole call phase in it and the plugin's calls made from the test in :meth:`plugin`."""
        return self._span("idle", None)

    def plugin(self) -> AbstractContextManager[None]:
        """Context manager around the plugin's own work inside a :meth:`test_idle` span."""
        return self._span("plugin", None)

    def add(self, category: Category, start: float, end: float, key: str | None = None) -> None:
        """Record an interval measured elsewhere, in wall-clock seconds (``time.time`` scale)."""
        if category not in _RANK:
            raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
        if end < start:
            raise ValueError(f"interval ends ({end}) before it starts ({start})")
        with self._lock:
            self._intervals.append(Interval(category, start, end, key))

    # ------------------------------------------------------------------ results
    def snapshot(self) -> dict[str, Any]:
        """Plain data (JSON-able): the span and every interval, open ones closed at now."""
        with self._lock:
            now = self.now()
            intervals = list(self._intervals) + [Interval(c, s, now, k) for c, s, k in self._open.values()]
            begin = self._started if self._started is not None else now
            end = self._stopped if self._stopped is not None else now
        return {"start": begin, "end": end,
                "intervals": [[i.category, i.start, i.end, i.key] for i in intervals]}

    @staticmethod
    def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """One snapshot from several (processes share the wall clock): the span covers them all."""
        snaps = list(snapshots)
        if not snaps:
            return {"start": 0.0, "end": 0.0, "intervals": []}
        return {"start": min(s["start"] for s in snaps), "end": max(s["end"] for s in snaps),
                "intervals": [i for s in snaps for i in s["intervals"]]}

    def report(self) -> dict[str, Any]:
        return report(self.snapshot())


def report(snapshot: dict[str, Any]) -> dict[str, Any]:
    """``wall_s``, ``boot_s``, ``teardown_s``, ``request_s``, ``idle_s`` (the test's own), ``plugin_s`` =
    wall − boot − teardown − request − idle, ``plugin_fraction`` = plugin_s / wall_s, ``request_kinds``
    (``request_s`` split by kind, only the kinds seen), and the boots (``boots``, ``boot_keys``,
    ``rebooted``: keys booted more than once, which should be empty: one boot per configuration)."""
    begin, end = float(snapshot["start"]), float(snapshot["end"])
    wall = max(0.0, end - begin)
    totals, kinds = _sweep(_clipped(snapshot["intervals"], begin, end))
    boot_s, teardown_s, request_s, _marked_plugin_s, idle_s = totals
    plugin_s = max(0.0, wall - boot_s - teardown_s - request_s - idle_s)
    keys = [k for c, _, _, k in snapshot["intervals"] if c == "boot"]
    named = [k for k in keys if k is not None]
    order = list(REQUEST_KIND_NAMES)
    return {
        "wall_s": wall, "boot_s": boot_s, "teardown_s": teardown_s, "request_s": request_s, "idle_s": idle_s,
        "plugin_s": plugin_s,
        "plugin_fraction": plugin_s / wall if wall > 0 else 0.0,
        "request_kinds": dict(sorted(kinds.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                                     else len(order), kv[0]))),
        "boots": len(keys), "boot_keys": sorted(set(named)),
        "rebooted": sorted({k for k in named if named.count(k) > 1}),
    }


def _clipped(intervals: Iterable[Sequence[Any]], begin: float, end: float) -> list[tuple[float, float, int, str]]:
    """The intervals inside [begin, end] as (start, end, the category's rank, a request's kind)."""
    clipped: list[tuple[float, float, int, str]] = []
    for category, s, e, key in intervals:
        s, e = max(float(s), begin), min(float(e), end)
        if e > s:
            kind = (key or "other") if category == "request" else ""
            clipped.append((s, e, _RANK[category], kind))
    return clipped


def _sweep(clipped: list[tuple[float, float, int, str]]) -> tuple[list[float], dict[str, float]]:
    """Each category's seconds, every slice of time given to the best-ranked category active in it (a sweep over the
    interval edges), and the request seconds split by kind in proportion to the requests of each kind in flight."""
    request_rank = _RANK["request"]
    totals = [0.0] * len(CATEGORIES)
    kinds: dict[str, float] = {}
    edges = sorted({t for s, e, _, _ in clipped for t in (s, e)})
    events: dict[float, list[tuple[int, int, str]]] = {}
    for s, e, rank, kind in clipped:
        events.setdefault(s, []).append((rank, +1, kind))
        events.setdefault(e, []).append((rank, -1, kind))
    active = [0] * len(CATEGORIES)
    in_flight: dict[str, int] = {}
    for left, right in zip(edges, edges[1:], strict=False):
        for rank, delta, kind in events.get(left, ()):
            active[rank] += delta
            if rank == request_rank:
                in_flight[kind] = in_flight.get(kind, 0) + delta
        best = next((r for r in range(len(CATEGORIES)) if active[r] > 0), None)
        if best is None:
            continue
        totals[best] += right - left
        if best == request_rank:
            for kind, count in in_flight.items():
                if count > 0:
                    kinds[kind] = kinds.get(kind, 0.0) + (right - left) * count / active[request_rank]
    return totals, kinds


def format_report(rep: dict[str, Any]) -> str:
    """One line for the terminal summary."""
    wall = rep["wall_s"] or 1.0
    line = (f"wall {rep['wall_s']:.1f} s = server boots {rep['boot_s']:.1f} s ({rep['boot_s'] / wall:.0%}, "
            f"{rep['boots']} boot{'s' if rep['boots'] != 1 else ''}) + teardown {rep['teardown_s']:.1f} s "
            f"+ requests {rep['request_s']:.1f} s "
            f"({rep['request_s'] / wall:.0%}{_kinds(rep)}) + tests' own {rep['idle_s']:.1f} s + plugin "
            f"{rep['plugin_s']:.1f} s ({rep['plugin_fraction']:.1%})")
    if rep.get("rebooted"):
        line += f"; booted more than once: {', '.join(rep['rebooted'])}"
    return line


def _kinds(rep: dict[str, Any]) -> str:
    """``: correctness probes 12.0 s, batch cases 30.1 s, ...`` (nothing when no request was made)."""
    kinds = {k: v for k, v in (rep.get("request_kinds") or {}).items() if v >= 0.05}
    if not kinds:
        return ""
    return ": " + ", ".join(f"{REQUEST_KIND_NAMES.get(k, k)} {v:.1f} s" for k, v in kinds.items())


__all__ = ["CATEGORIES", "REQUEST_KIND_NAMES", "Accounting", "Interval", "format_report", "report"]
