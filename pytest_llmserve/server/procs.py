"""Process-tree helpers: kill a server and everything it spawned, and prove nothing is left.

Servers are started in their own session (``start_new_session=True``), so their process group id is
their pid. Tensor-parallel workers and engine cores may leave the group (some engines call setsid), so
the tree is also collected through psutil before anything is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class TeardownReport:
    """What teardown did: how many processes, whether SIGKILL was needed, and any survivors."""

    pids: tuple[int, ...]
    escalated: bool
    survivors: tuple[str, ...]
    seconds: float


def tree_of(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid:
                out.append(proc)
    return out


def describe(proc: psutil.Process, limit: int = 240) -> str:
    """``pid N (python3 /path/to/script.py --args...)``: the program by its base name, so the script that
    follows it survives the cut at ``limit`` characters."""
    try:
        argv = proc.cmdline()
        if argv:
            argv = [os.path.basename(argv[0]), *argv[1:]]
        line = " ".join(argv)
        if len(line) > limit:
            line = line[:limit - 1] + "…"
        return f"pid {proc.pid} ({line or proc.name()})"
    except psutil.Error:
        return f"pid {proc.pid}"


def kill_tree(pid: int, pgid: int | None = None, grace_s: float = 10.0, kill_wait_s: float = 5.0) -> TeardownReport:
    """SIGTERM the group and tree, wait ``grace_s``, SIGKILL what is left, then check for survivors."""
    start = time.monotonic()
    procs = {p.pid: p for p in tree_of(pid)}
    if pgid is not None:
        procs.update({p.pid: p for p in group_members(pgid)})
    # Refresh: children may have been spawned between the calls.
    for p in list(procs.values()):
        with contextlib.suppress(psutil.Error):
            procs.update({c.pid: c for c in p.children(recursive=True)})
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    _gone, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    escalated = bool(alive)
    if alive:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _gone, alive = psutil.wait_procs(alive, timeout=kill_wait_s)
    survivors = [p for p in procs.values() if _is_alive(p)]
    return TeardownReport(tuple(sorted(procs)), escalated, tuple(describe(p) for p in survivors),
                          time.monotonic() - start)


def _is_alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", highest: int = 65535) -> int:
    """A port the OS says is free now, at most ``highest`` (an engine may derive other ports from it).

    A race with another process is caught by the readiness check.
    """
    for _ in range(200):  # the OS hands out ephemeral ports from a high range: ask again when one is too high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port <= highest:
            return port
    for port in range(min(highest, 49151), 1024, -7):  # below the ephemeral range
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port at most {highest} on {host}")


def listener_pid(port: int) -> int | None:
    """The pid of the local process listening on ``port``, when psutil may see it."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return int(conn.pid)
    return None


def who_listens(port: int) -> str | None:
    """A description of the local process listening on ``port``, if psutil can see it."""
    pid = listener_pid(port)
    if pid is None:
        return None
    with contextlib.suppress(psutil.Error):
        return describe(psutil.Process(pid))
    return None


#: Clock ticks a second: the unit of the start time in /proc/<pid>/stat.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: A recorded start above this is seconds since the epoch (psutil's clock: a record written before starts were
#: counted from boot, or a host without /proc); below it, seconds since boot.
EPOCH_STARTS = 1e9
#: How far two readings of one process's start on psutil's clock may differ (it moves; see ``create_time``).
WALL_CLOCK_SLACK_S = 1.0


def _stat(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read()
    except OSError:
        return None


def _stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/<pid>/stat line after the command name (field 3, the state, first): the name
    may hold spaces and parentheses."""
    return stat.rsplit(")", 1)[1].split()


def create_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds since the machine booted, or None if it is gone: with the pid, a
    process identity that every process reads alike.

    Not psutil's ``create_time()`` on Linux: it adds /proc/stat's ``btime``, which the kernel recomputes at
    every read as the wall clock less the uptime, in whole seconds, so an NTP adjustment moves it and two
    processes can read one start a second or more apart (psutil issue #2526). CI, 2026-12-07: an xdist
    worker took the live server another worker had booted for dead, and ``kill-stale`` took a live run for
    gone. The start in /proc/<pid>/stat is counted in clock ticks since boot and never moves. Where there is
    no /proc, psutil's clock stands (seconds since the epoch; ``same_start`` reads either)."""
    stat = _stat(pid)
    if stat is not None:
        with contextlib.suppress(IndexError, ValueError):
            return int(_stat_fields(stat)[19]) / CLOCK_TICKS  # field 22, starttime
    return _start_on_psutil_clock(pid)


def _start_on_psutil_clock(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def start_on_clock_of(pid: int, recorded: float) -> float | None:
    """When ``pid`` started, on the clock ``recorded`` was taken on (see ``EPOCH_STARTS``)."""
    return create_time(pid) if recorded < EPOCH_STARTS else _start_on_psutil_clock(pid)


def start_slack(recorded: float) -> float:
    """How far a start read again may be from ``recorded`` and still be the same process's."""
    return 0.5 / CLOCK_TICKS if recorded < EPOCH_STARTS else WALL_CLOCK_SLACK_S


def same_start(pid: int, recorded: float) -> bool:
    """True when ``pid`` is the process whose start was recorded (a pid, once free, is given to another)."""
    now = start_on_clock_of(pid, recorded)
    return now is not None and abs(now - recorded) <= start_slack(recorded)


#: The kernel's flag on a task that has begun to exit (include/linux/sched.h), field 9 of /proc/<pid>/stat.
PF_EXITING = 0x4


def exiting(stat: str) -> bool:
    """True when a /proc/<pid>/stat line says its main thread has begun to exit: killed, it may still be
    tearing down its address space, not yet a zombie (seen in a fresh-clone run, 2026-12-05: a SIGKILLed
    server's sockets had closed, its main thread last out and not yet a zombie, and it was taken for alive)."""
    return bool(int(_stat_fields(stat)[6]) & PF_EXITING)


def pid_alive(pid: int, created: float | None = None) -> bool:
    """True when ``pid`` runs (not a zombie, not exiting) and, given ``created``, is still the process that
    started then.

    Pids are reused: a registry entry that outlived its process must not make an unrelated process
    look like a server (and be killed as stale) or look like a live owner (and hide a stale server).
    """
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if created is not None and not same_start(pid, created):
            return False
        if not _is_alive(proc):
            return False
    except (psutil.Error, OSError):
        return False
    stat = _stat(pid)
    try:
        return stat is None or not exiting(stat)  # no /proc (not Linux), or gone since: psutil's answer stands
    except (IndexError, ValueError):
        return True
