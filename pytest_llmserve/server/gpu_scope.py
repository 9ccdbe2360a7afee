"""A server's GPU scope: the GPUs it runs on and its processes there as NVML lists them, found once when it is ready.

Used by a round's host-contention sampler (:mod:`pytest_llmserve.load.contention`: only other processes on the
server's GPUs count, never the server's own) and by the teardown's memory check (the server's GPU processes must be
gone). Under pytest-xdist the scope travels in the server's record to the workers that attach to it
(:mod:`pytest_llmserve.server.pool`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypedDict

import psutil

from pytest_llmserve.server.gpu import GpuSnapshot

__all__ = ["GpuScope", "GpuScopeRecord", "server_gpu_scope"]


class GpuScopeRecord(TypedDict, total=False):
    """A :class:`GpuScope` as the server's record (JSON) carries it to the workers that attach."""

    devices: list[int]
    server_pids: list[int]
    how: str


@dataclass(frozen=True, slots=True)
class GpuScope:
    """Which GPU readings are someone else's during a server's benchmark: the GPUs the server runs on, and the
    pids NVML lists for the server's own processes there.

    NVML lists pids as the driver's (the host's) pid namespace sees them; inside a container those are not the
    numbers this process sees, so the server's tree (known here by our pids) cannot be matched to them. The
    server's GPU pids are therefore found once, when it is ready (:func:`server_gpu_scope`), and kept here.
    """

    devices: tuple[int, ...]  # GPU indices the server uses
    server_pids: frozenset[int]  # the server's processes as NVML lists them
    how: str  # how the server's GPU pids were found, in words (for the record)

    def counts(self, gpu_index: int, pid: int) -> bool:
        """Whether a reading of ``pid`` on ``gpu_index`` is contention: another process, on one of the server's
        GPUs. A job on a GPU the server does not use never is."""
        return gpu_index in self.devices and pid not in self.server_pids

    def describe(self) -> str:
        gpus = ", ".join(str(i) for i in self.devices) or "none"
        return f"GPU {gpus} (the server's); its own GPU processes: {self.how}"

    def to_dict(self) -> GpuScopeRecord:
        """For the record another xdist worker attaches with (it did not see the boot)."""
        return {"devices": list(self.devices), "server_pids": sorted(self.server_pids), "how": self.how}

    @classmethod
    def from_dict(cls, data: GpuScopeRecord) -> GpuScope:
        return cls(tuple(int(i) for i in data["devices"]), frozenset(int(p) for p in data["server_pids"]),
                   str(data.get("how", "")))


def server_gpu_scope(devices: Iterable[int], before_pids: Iterable[int], snap: GpuSnapshot, tree: Iterable[int],
                     *, visible: Callable[[int], bool] = psutil.pid_exists) -> GpuScope:
    """The server's :class:`GpuScope` once it is ready: ``devices`` (the preflight's), ``before_pids`` (every GPU
    process the preflight saw, before the boot), ``snap`` (the GPUs now) and ``tree`` (the server's process tree,
    our pids).

    A GPU process on the server's GPUs that was not there before the boot is the server's when its pid is in the
    server's tree, or when no process of that pid is visible here: NVML then speaks another pid namespace's
    numbers (a container), and the process appeared on the server's GPUs during its boot. One visible here and
    outside the tree (another job started meanwhile) is not the server's. ``visible`` is injectable for tests.
    """
    wanted = tuple(sorted(set(devices)))
    before = set(before_pids)
    mine = set(tree)
    ours: set[int] = set()
    foreign: set[int] = set()
    for proc in snap.processes:
        if proc.gpu_index not in wanted or proc.pid in before:
            continue
        if proc.pid in mine:
            ours.add(proc.pid)
        elif not visible(proc.pid):
            foreign.add(proc.pid)
    parts = []
    if ours:
        parts.append("pid " + ", ".join(map(str, sorted(ours))) + " (its process tree)")
    if foreign:
        parts.append("pid " + ", ".join(map(str, sorted(foreign))) + " (NVML's pid namespace, not this one: "
                     "appeared on its GPUs during the boot)")
    return GpuScope(wanted, frozenset(ours | foreign), "; ".join(parts) or "none listed by the driver")
