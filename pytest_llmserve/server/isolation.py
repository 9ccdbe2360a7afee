"""A server measured alone, and a server found again after its pytest was killed.

**Measured alone.** Every request of a run to one server goes through a per-server readers-writer lock
on a file in the run directory (shared by all pytest-xdist workers of the run): correctness requests
hold it *shared* (any number at once), a benchmark round holds it *exclusive*, so while a round runs no
other request of this run reaches its server. ``flock`` locks belong to an open file and are released
by the kernel when their process dies, so a crashed worker never leaves the server locked.

Writers are not starved: a reader passes a *gate* (a second lock file, taken exclusively and released
at once) before it takes the shared lock, and a waiting writer holds the gate, so new readers queue
behind the round instead of overtaking it forever. Within one process the shared lock is counted, not
re-taken: a batch of concurrent requests holds it once (a round cannot slip into the middle of a batch),
and a thread of that batch never queues at the gate behind a writer that waits for the batch.

**Found again.** Every launched server gets two variables in its environment, inherited by everything
it spawns (vLLM's ``VLLM::EngineCore`` / ``VLLM::Worker`` included, whatever their titles say):
``PYTEST_LLMSERVE_RUN=<run id>/<server key>`` names the server, ``PYTEST_LLMSERVE_RUN_OWNER=<pid>:<start
time>`` the pytest process responsible for it and ``PYTEST_LLMSERVE_RUN_REGISTRY`` the registry of
running servers it is recorded in. Processes are found by that marker in
``/proc/<pid>/environ``, and whether their run still lives is decided from the owner alone (a pid is
trusted only together with its start time), so a live run's server is never taken for an orphan.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from pytest_llmserve.server import procs

RUN_MARKER_ENV = "PYTEST_LLMSERVE_RUN"
RUN_OWNER_ENV = "PYTEST_LLMSERVE_RUN_OWNER"
#: The registry of running servers the run used: ``kill-stale`` looks after the orphans of its own
#: registry only, as it does for recorded servers (tests run with private registries side by side).
RUN_REGISTRY_ENV = "PYTEST_LLMSERVE_RUN_REGISTRY"


# ---------------------------------------------------------------------- the readers-writer lock

class RequestLock:
    """Per-server lock shared by the processes of one run: :meth:`shared` for correctness requests,
    :meth:`exclusive` for a benchmark round. One instance per server per process (the pool's handle)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gate_path = path.with_name(path.name + ".gate")
        self._mutex = threading.Lock()
        self._readers = 0  # requests of this process that hold the shared lock now
        self._fd: int | None = None
        self._exclusive = threading.local()

    def _open(self, path: Path) -> int:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def acquire_shared(self) -> None:
        if getattr(self._exclusive, "held", False):
            return  # this thread runs the round itself: its own requests are the round's
        with self._mutex:
            if self._readers == 0:
                fd = self._open(self.path)
                gate = self._open(self.gate_path)
                try:
                    fcntl.flock(gate, fcntl.LOCK_EX)  # waits while a round waits or runs
                    fcntl.flock(fd, fcntl.LOCK_SH)
                except BaseException:
                    os.close(fd)
                    raise
                finally:
                    os.close(gate)  # closing releases the gate
                self._fd = fd
            self._readers += 1

    def release_shared(self) -> None:
        if getattr(self._exclusive, "held", False):
            return
        with self._mutex:
            self._readers -= 1
            if self._readers == 0 and self._fd is not None:
                os.close(self._fd)  # closing releases the shared lock
                self._fd = None

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.acquire_shared()
        try:
            yield
        finally:
            self.release_shared()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[float]:
        """Hold the server alone; yields how long it waited for the requests in flight to end (s).

        Requests this process has in flight on other threads are waited for like any other (a thread's
        shared hold never spans a round it starts itself, so this cannot wait for its own thread)."""
        started = time.monotonic()
        gate = self._open(self.gate_path)
        fd = self._open(self.path)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._exclusive.held = True
            try:
                yield time.monotonic() - started
            finally:
                self._exclusive.held = False
        finally:
            os.close(fd)
            os.close(gate)


# ---------------------------------------------------------------------- the marker and orphans

def marker_env(run_id: str, server_key: str, owner_pid: int, registry: Path) -> dict[str, str]:
    """The variables a launched server carries: which run and server it is, who owns it, which registry."""
    created = procs.create_time(owner_pid)
    return {RUN_MARKER_ENV: f"{run_id}/{server_key}",
            RUN_OWNER_ENV: f"{owner_pid}:{created:.3f}" if created is not None else f"{owner_pid}:",
            RUN_REGISTRY_ENV: str(registry)}


def owner_alive(owner: str | None) -> bool:
    """True while the pytest named by a ``PYTEST_LLMSERVE_RUN_OWNER`` value (``pid:start time``) runs.

    An unreadable value is not proof of death, so it counts as alive: such a process is never killed.
    """
    if not owner:
        return True
    pid_text, _, created_text = owner.partition(":")
    try:
        pid = int(pid_text)
        created = float(created_text) if created_text else None
    except ValueError:
        return True
    return procs.pid_alive(pid, created)


@dataclass(frozen=True, slots=True)
class MarkedProcess:
    pid: int
    marker: str  # <run id>/<server key>
    owner: str | None
    registry: str | None
    description: str


def marked_processes(marker: str | None = None, registry: Path | None = None) -> list[MarkedProcess]:
    """Running processes (zombies excluded) that carry a server marker (``marker``: that one only;
    ``registry``: of runs that used that registry only).

    Never this process or one of its ancestors (a pytest started from inside a server's environment
    inherits its marker, and must not count as that server).
    """
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine.update(p.pid for p in psutil.Process().parents())
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        if proc.pid in mine or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue  # another user's process, or gone: not ours to find
        found = env.get(RUN_MARKER_ENV)
        if not found or (marker is not None and found != marker):
            continue
        if registry is not None and env.get(RUN_REGISTRY_ENV) != str(registry):
            continue
        out.append(MarkedProcess(proc.pid, found, env.get(RUN_OWNER_ENV), env.get(RUN_REGISTRY_ENV),
                                 procs.describe(proc)))
    return out


def group_of(pgid: int, created_after: float | None = None) -> list[psutil.Process]:
    """The live members (zombies excluded) of process group ``pgid``, started no earlier than
    ``created_after`` (the group leader's start: its engine processes came after it)."""
    out = []
    for proc in procs.group_members(pgid):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if created_after is not None:
                start = procs.start_on_clock_of(proc.pid, created_after)
                if start is None or start < created_after - procs.start_slack(created_after):
                    continue
            out.append(proc)
    return out


def with_their_groups(marked: list[MarkedProcess]) -> dict[int, str]:
    """pid -> description of the marked processes and the other members of their process groups.

    Retitled engine processes (``VLLM::EngineCore`` rewrites its command line over its environment, so
    ``/proc/<pid>/environ`` no longer holds the marker) are found through the group they share with a
    marked process. A group counts only when its leader is marked too or gone: the kernel keeps a group
    id from being reused while a member lives, so the members of a leaderless group that holds one of
    ours are ours; a group led by a live unmarked process is someone else's."""
    found = {m.pid: m.description for m in marked}
    pids = set(found)
    for m in marked:
        try:
            pgid = os.getpgid(m.pid)
        except OSError:
            continue
        if pgid in pids or not psutil.pid_exists(pgid):
            for proc in group_of(pgid):
                found.setdefault(proc.pid, procs.describe(proc))
    return found


def orphans(marker: str | None = None, registry: Path | None = None) -> list[MarkedProcess]:
    """Marked processes whose owning run is gone (``marker``: of that server only)."""
    return [p for p in marked_processes(marker, registry) if not owner_alive(p.owner)]


def kill_pids(pids: list[int], grace_s: float = 5.0) -> list[str]:
    """SIGTERM each process, SIGKILL what is left after ``grace_s``; the descriptions of survivors."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _gone, alive = psutil.wait_procs(found, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _gone, alive = psutil.wait_procs(alive, timeout=5.0)
    return [procs.describe(p) for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


__all__ = ["RUN_MARKER_ENV", "RUN_OWNER_ENV", "RUN_REGISTRY_ENV", "MarkedProcess", "RequestLock", "group_of",
           "kill_pids", "marked_processes", "marker_env", "orphans", "owner_alive", "with_their_groups"]
