"""Host contention during a round: how much of the machine other processes took while it was measured.

A round's figure belongs to the host as much as to the server: on a 2-core machine one CPU-bound process
beside the benchmark takes half of it, and the round's throughput moves with it. So every measured round
samples, on its own thread, the CPU time of every process that is neither the server's process tree (its pid
and descendants) nor the load generator (this process, its threads and its multiprocessing client processes;
a test's own subprocess is not the load generator: a CPU-bound one beside the round is contention), and reports it
as a share of the machine::

    contention = CPU-seconds of the others / (wall seconds of the round x logical cores usable)

with the processes that took most (pid, command name, share). On GPUs the other processes' SM utilisation
and memory come from NVML's per-process accounting (:func:`pytest_llmserve.server.gpu.process_utilization`),
counted only on the server's GPUs and never for the server's own GPU processes, which are found when it is ready
(:class:`pytest_llmserve.server.gpu_scope.GpuScope`: NVML may number them in another pid namespace than ours).

This is *contention* (others' CPU or GPU on the host), not *contamination* (others' requests reaching the
server, :func:`pytest_llmserve.load.runner.judge_isolation`). A round above the bound (``contention_bound``,
:class:`pytest_llmserve.options.BenchDefaults`) is not a sample: the
gate (:mod:`pytest_llmserve.gates.bench`) discards it and measures again, and reports "confounded: host
busy" naming the processes when the host stays busy; it never blames the server for the machine.

Which processes are "the server": a launched server's pid, an xdist worker's attached server's owner pid,
else (a server named by URL) the process listening on the URL's port when the URL is on this host. A
server elsewhere has no processes here: everything but the load generator is counted. A local server whose
process cannot be found (another user's, in a container) would count itself as contention: the figure is
recorded but not judged, and says why.

Sampling: once per :data:`CONTENTION_SAMPLE_HZ` period, every process's user+system CPU time (psutil). A
process seen first during the round counts from its creation; one that ends between two samples loses what
it used since the last one (a burst of processes shorter than the period is undercounted).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import psutil

from pytest_llmserve.server.gpu_scope import GpuScope
from pytest_llmserve.server.procs import listener_pid, tree_of

__all__ = ["CONTENTION_SAMPLE_HZ", "BusyProcess", "GpuBusyProcess", "HostContention",
           "HostContentionSampler", "Settling", "contention_reason", "usable_cores", "wait_until_quiet"]

#: How often every process's CPU time is read during a round (Hz). One read cost 8 ms of CPU with 120 processes
#: on the 2-core development machine (docs/performance.md, section 8): at 1 Hz under 1 % of a core.
CONTENTION_SAMPLE_HZ = 1.0


TOP_PROCESSES = 3  # named in the record and in the reason


@dataclass(frozen=True, slots=True)
class BusyProcess:
    """A process other than the server's and the load generator's that used CPU during the round."""

    pid: int
    name: str
    cpu_s: float
    share: float  # of the machine: cpu_s / (wall seconds x usable cores)

    def describe(self) -> str:
        return f"pid {self.pid} {self.name} ({self.share:.1%})"


@dataclass(frozen=True, slots=True)
class GpuBusyProcess:
    """A process other than the server's that used a GPU during the round (NVML per-process accounting)."""

    pid: int
    name: str
    gpu_index: int
    sm_util: float  # mean SM utilisation over the round's samples, a fraction of the GPU
    memory_mib: int | None

    def describe(self) -> str:
        mem = f", {self.memory_mib} MiB" if self.memory_mib is not None else ""
        return f"pid {self.pid} {self.name} on GPU {self.gpu_index} ({self.sm_util:.1%} SM{mem})"


@dataclass(slots=True)
class HostContention:
    """What other processes took of the host during one round."""

    share: float  # CPU-seconds of the others / (seconds x cores)
    seconds: float  # the wall time sampled
    cores: int  # logical cores usable by this process
    samples: int  # reads of the process table
    top: list[BusyProcess] = field(default_factory=list)
    excluded: str = ""  # which processes were not counted, in words
    judged: bool = True  # False: the server's own processes may be among the others (see the module docstring)
    gpu_share: float | None = None  # the others' SM utilisation on the busiest GPU; None: no GPU accounting
    gpu_top: list[GpuBusyProcess] = field(default_factory=list)
    # Which GPUs were watched and which GPU processes were the server's, in words ("" with no GPU accounting).
    gpu_scope: str = ""
    # The others by command name (name, share, processes), largest first: many short processes (a test run's
    # subprocesses, a compiler's jobs) each take little, together much.
    by_command: list[tuple[str, float, int]] = field(default_factory=list)

    def commands(self) -> str:
        """``python 41.0% (14 processes), cc1plus 12.9% (2 processes)``."""
        return ", ".join(f"{name} {share:.1%} ({n} process{'es' if n != 1 else ''})"
                         for name, share, n in self.by_command)

    def describe(self) -> str:
        """``host contention 48.7% of the machine (2 cores, 11.2 s): pid 4242 python3 (48.5%), ...``."""
        who = ", ".join(p.describe() for p in self.top) or "no other process used CPU"
        text = f"host contention {self.share:.1%} of the machine ({self.cores} cores, {self.seconds:.1f} s): {who}"
        if self.gpu_share is not None:
            gpu_who = ", ".join(p.describe() for p in self.gpu_top) or "none"
            text += f"; other GPU processes {self.gpu_share:.1%} SM: {gpu_who} (watched: {self.gpu_scope})"
        return text

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def contention_reason(contention: HostContention | None, bound: float) -> str | None:
    """Why a round is not a sample when other processes took more than ``bound`` of the machine (CPU) or of
    a GPU (SM utilisation), else None. A figure that is not judged (:attr:`HostContention.judged`) never is."""
    if contention is None or not contention.judged:
        return None
    busy = []
    if contention.share > bound:
        who = ", ".join(p.describe() for p in contention.top)
        grouped = f"; by command: {contention.commands()}" if len(contention.by_command) > 0 else ""
        busy.append(f"other processes took {contention.share:.1%} of the machine's {contention.cores} cores "
                    f"during the round (bound {bound:.0%}): {who}{grouped}")
    if contention.gpu_share is not None and contention.gpu_share > bound:
        who = ", ".join(p.describe() for p in contention.gpu_top)
        busy.append(f"other processes took {contention.gpu_share:.1%} of a GPU's SM during the round "
                    f"(bound {bound:.0%}): {who}")
    return "confounded: host busy: " + "; ".join(busy) if busy else None


def usable_cores() -> int:
    """Logical cores this process may run on (its affinity), else all the machine's."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, psutil.cpu_count(logical=True) or 1)


def _tree_cpu_s(pid: int) -> float:
    """CPU-seconds (user + system) used so far by ``pid`` and its descendants (:func:`_tree`); those that ended are
    not counted."""
    total = 0.0
    for member in _tree(pid):
        with contextlib.suppress(psutil.Error, OSError):
            times = psutil.Process(member).cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True, slots=True)
class Settling:
    """How long :func:`wait_until_quiet` waited, and whether the process tree went quiet within its cap."""

    seconds: float
    settled: bool
    share: float  # the tree's share of the machine over the last window read


def wait_until_quiet(pid: int | None, *, bound: float, window_s: float = 0.25, cap_s: float = 5.0,
                     cores: int | None = None, cpu_s: Callable[[int], float] = _tree_cpu_s,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Settling:
    """Wait until the process tree of ``pid`` takes less than ``bound`` of the machine over ``window_s``, at most
    ``cap_s`` seconds. ``pid`` None (no process known on this host): nothing to wait for.

    Why: an engine's workers keep polling for work after their last request (vLLM 0.32's shared-memory queue
    busy-loops with sched_yield for 1 s after its last read), so in an A/B the server measured just before is,
    for the next round's first second, a process beside it. Seen on a 2-core AVX-512 host (fresh-clone rehearsal,
    2026-12-05): rounds of under a second, the other side's ``VLLM::Worker`` took 10-25 % of the machine during
    three of them, which were discarded as confounded and failed the A/B. Past the cap the round is measured
    anyway: its own contention is judged as always (:func:`contention_reason`)."""
    if pid is None:
        return Settling(0.0, True, 0.0)
    capacity = window_s * (cores or usable_cores())
    start = clock()
    while True:
        before = cpu_s(pid)
        sleep(window_s)
        share = max(0.0, cpu_s(pid) - before) / capacity
        waited = clock() - start
        if share < bound:
            return Settling(waited, True, share)
        if waited >= cap_s:
            return Settling(waited, False, share)


def _is_local(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "127.0.0.1", "::1", "0.0.0.0") or host.startswith("127.")


def _tree(pid: int | None) -> set[int]:
    """The pids of ``pid`` and its descendants (:func:`pytest_llmserve.server.procs.tree_of`); ``pid`` alone when
    they cannot be read."""
    if pid is None:
        return set()
    with contextlib.suppress(psutil.Error, OSError):
        return {pid, *(proc.pid for proc in tree_of(pid))}
    return {pid}


def _load_generator() -> set[int]:
    """This process and its client processes (multiprocessing children,
    :func:`pytest_llmserve.load.runner.run_workload_multiprocess`'s). Other children of this process are not the
    load generator: a test's own subprocess (a CPU-bound one beside the round) is contention like any other; a
    server launched from here is the server's tree."""
    me = os.getpid()
    pids = {me}
    with contextlib.suppress(psutil.Error, OSError):
        for child in psutil.Process(me).children(recursive=True):
            with contextlib.suppress(psutil.Error, OSError):
                if "multiprocessing" in " ".join(child.cmdline()):
                    pids.add(child.pid)
    return pids


ProcessTable = Callable[[], Iterable[Any]]


class GpuUse(Protocol):
    """One process's use of one GPU, as the GPU probe reads it (:class:`pytest_llmserve.server.gpu.ProcessUtilization`
    has these): its GPU, its pid and name, its SM utilisation (a fraction of the GPU) and the memory it holds."""

    @property
    def gpu_index(self) -> int: ...

    @property
    def pid(self) -> int: ...

    @property
    def name(self) -> str | None: ...

    @property
    def sm_util(self) -> float: ...

    @property
    def memory_mib(self) -> int | None: ...


GpuReader = Callable[[], Sequence[GpuUse] | None]


def _process_table() -> Iterable[Any]:
    table: Iterable[Any] = psutil.process_iter(["pid", "name", "cpu_times", "create_time"])
    return table


class HostContentionSampler:
    """Samples the other processes' CPU (and GPU) use on its own thread between :meth:`start` and :meth:`stop`.

    ``server_pid``: the server's main process (its descendants are found at every sample: an engine starts
    workers late); ``server_url``: used to find a local server's process when no pid is known. Stand-ins for
    tests: ``process_table`` (objects with psutil's ``info`` dict: pid, name, cpu_times, create_time),
    ``excluded`` (a callable giving the pids not to count), ``gpu_reader`` (the GPU probe's per-process
    readings), ``clock``/``wall`` and ``cores``.

    ``gpu_scope``: the server's GPUs and its GPU pids as NVML lists them
    (:class:`~pytest_llmserve.server.gpu_scope.GpuScope`); only other processes on the server's GPUs count, and the
    server's own GPU processes never do, even when NVML numbers them in another pid namespace. Without it (a
    server reached by URL) every GPU counts, and the record says so."""

    def __init__(self, server_pid: int | None, server_url: str | None = None, *, hz: float = CONTENTION_SAMPLE_HZ,
                 process_table: ProcessTable = _process_table, excluded: Callable[[], set[int]] | None = None,
                 gpu_reader: GpuReader | None = None, gpu_scope: GpuScope | None = None, cores: int | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.interval_s = 1.0 / hz
        self.process_table = process_table
        self.cores = cores or usable_cores()
        self.clock = clock
        self.wall = wall
        self.gpu_reader = gpu_reader
        self.gpu_scope = gpu_scope
        self.judged = True
        own = f"the load generator (pid {os.getpid()}, its threads and client processes)"
        if server_pid is None and server_url is not None and _is_local(server_url):
            server_pid = listener_pid(urlsplit(server_url).port or 80)
            if server_pid is None:
                self.judged = False
                self.excluded = (f"{own} only: the server at {server_url} is on this host but its process was not "
                                 "found, so its own CPU may be counted: not judged")
        if server_pid is not None:
            self.excluded = f"the server's process tree (pid {server_pid}) and {own}"
        elif self.judged:
            self.excluded = (f"{own} only: the server's processes are not on this host or not known "
                             f"({server_url or 'no URL'}), so every other process counts")
        self.server_pid = server_pid
        self._excluded = excluded or self._default_excluded
        self._first: dict[tuple[int, float], float] = {}
        self._last: dict[tuple[int, float], tuple[str, float]] = {}
        self._gpu: dict[tuple[int, int], list[GpuUse]] = {}
        self._gpu_read = False
        self._samples = 0
        self._t0 = 0.0
        self._wall0 = 0.0
        self._t1: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _default_excluded(self) -> set[int]:
        return _load_generator() | _tree(self.server_pid)

    def sample(self) -> None:
        """One read of the process table (and of the GPUs' per-process accounting)."""
        skip = self._excluded()
        seen: dict[tuple[int, float], tuple[str, float]] = {}
        for proc in self.process_table():
            with contextlib.suppress(psutil.Error, OSError, TypeError, AttributeError):
                info = proc.info
                pid = int(info["pid"])
                times = info.get("cpu_times")
                if pid in skip or times is None:
                    continue
                key = (pid, float(info.get("create_time") or 0.0))
                seen[key] = (str(info.get("name") or "?"), float(times.user) + float(times.system))
        with self._lock:
            first_read = self._samples == 0
            for key, (name, cpu) in seen.items():
                if key not in self._first:
                    # A process already running at the first read counts from there; one born later, from 0.
                    self._first[key] = cpu if first_read or key[1] < self._wall0 else 0.0
                self._last[key] = (name, cpu)
            self._samples += 1
        if self.gpu_reader is not None:
            with contextlib.suppress(Exception):
                readings = self.gpu_reader()
                if readings is not None:  # None: no GPU accounting on this host
                    self._gpu_read = True
                    for reading in readings:
                        if self._gpu_counts(reading, skip):
                            self._gpu.setdefault((int(reading.pid), int(reading.gpu_index)), []).append(reading)

    def _gpu_counts(self, reading: GpuUse, skip: set[int]) -> bool:
        """Whether a GPU reading is another process's use of a GPU the round depends on."""
        pid = int(reading.pid)
        if self.gpu_scope is not None:
            return pid not in skip and self.gpu_scope.counts(int(reading.gpu_index), pid)
        return pid not in skip

    def _gpu_scope_words(self) -> str:
        if self.gpu_scope is not None:
            return self.gpu_scope.describe()
        return "every GPU: the server's GPUs are not known here"

    def begin(self) -> None:
        """The round starts now: the first read of the process table (:meth:`start` then samples on a thread)."""
        self._t0 = self.clock()
        self._wall0 = self.wall()
        self.sample()

    def start(self) -> HostContentionSampler:
        self.begin()
        self._thread = threading.Thread(target=self._loop, name="llmserve-contention", daemon=True)
        self._thread.start()
        return self

    @property
    def started(self) -> bool:
        return self._thread is not None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> HostContention:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.sample()
        return self.result()

    def result(self, now: float | None = None) -> HostContention:
        seconds = max((now if now is not None else self.clock()) - self._t0, 1e-9)
        capacity = seconds * self.cores
        with self._lock:
            used = [(key[0], name, max(0.0, cpu - self._first[key])) for key, (name, cpu) in self._last.items()]
        used = [u for u in used if u[2] > 0]
        used.sort(key=lambda u: -u[2])
        top = [BusyProcess(pid, name, round(cpu, 3), cpu / capacity) for pid, name, cpu in used[:TOP_PROCESSES]]
        share = sum(u[2] for u in used) / capacity
        names: dict[str, tuple[float, int]] = {}
        for _pid, name, cpu in used:
            total, count = names.get(name, (0.0, 0))
            names[name] = (total + cpu, count + 1)
        by_command = sorted(((name, total / capacity, count) for name, (total, count) in names.items()),
                            key=lambda c: -c[1])[:TOP_PROCESSES]
        gpu_share: float | None = None
        gpu_top: list[GpuBusyProcess] = []
        if self._gpu_read:
            by_gpu: dict[int, float] = {}
            for (pid, index), readings in self._gpu.items():
                mean = sum(float(r.sm_util) for r in readings) / self._samples if self._samples else 0.0
                memory = [r.memory_mib for r in readings if r.memory_mib is not None]
                gpu_top.append(GpuBusyProcess(pid, str(readings[-1].name or "?"), index, mean,
                                              max(memory) if memory else None))
                by_gpu[index] = by_gpu.get(index, 0.0) + mean
            gpu_share = max(by_gpu.values(), default=0.0)
            gpu_top.sort(key=lambda p: (-p.sm_util, -(p.memory_mib or 0)))
            gpu_top = gpu_top[:TOP_PROCESSES]
        return HostContention(share=share, seconds=seconds, cores=self.cores, samples=self._samples, top=top,
                              excluded=self.excluded, judged=self.judged, gpu_share=gpu_share, gpu_top=gpu_top,
                              gpu_scope=self._gpu_scope_words() if self._gpu_read else "", by_command=by_command)
