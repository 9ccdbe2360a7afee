"""Which servers are up: one boot per configuration, shared across pytest-xdist workers.

Without xdist the pool keeps at most ``max_alive`` servers (1 by default): asking for another
configuration stops the previous one first, so its processes (and GPU memory) are gone before the next
boot. Tests are ordered by configuration, so each configuration boots exactly once.

With xdist, every worker gets the same run directory from the controller. The first worker that
needs a configuration boots it under a file lock and writes ``<run_dir>/servers/<key>.json``; the others
attach to it. Workers never stop shared servers: the controller stops them all once, in
``pytest_unconfigure``, which also covers a worker that crashed (pytest-xdist's own advice: acquire and
release resources in the leader).

A worker on another host (``--tx ssh=...``) has a host-local run directory the controller cannot reach
(``host_local``, see :mod:`pytest_llmserve.server.hosts`): it owns what it boots, stops its previous
configuration before booting the next (as without xdist: one server's GPU memory at a time), and stops
its servers at its own session end (:meth:`ServerPool.stop_owned`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from filelock import FileLock

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ServerDiedError, ServerError
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.server import hosts, isolation, procs
from pytest_llmserve.server.gpu_scope import GpuScope, GpuScopeRecord
from pytest_llmserve.server.handle import ServerHandle, TimeAccount, engine_of, registry_dir

if TYPE_CHECKING:
    from pytest_llmserve.evidence.facts import ServerFacts


def spec_key(spec: ServerSpec) -> str:
    digest = hashlib.sha256(repr(spec).encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.id)[:60]
    return f"{safe}-{digest}"


def url_key(url: str) -> str:
    """The key of a server attached by url: several configurations may name one server (the same URL under
    two matrix combinations), and they must share its request lock, or one's benchmark round would not be
    alone on it."""
    base = url.rstrip("/").removesuffix("/v1")
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base.split("://", 1)[-1])[:60]
    return f"attached-{safe}-{digest}"


class SharedServer(TypedDict, total=False):
    """A server one xdist worker booted, as its record (``servers/<key>.json`` of the run directory) tells the
    others that attach to it; or why its boot failed (``error``)."""

    url: str
    model: str  # the name requests use
    pid: int | None
    port: int
    create_time: float | None
    log: str | None
    owner_pid: int  # the worker that booted it
    gpu_scope: GpuScopeRecord | None  # its GPUs and GPU pids, found at its boot
    error: str


class ServerPool:
    """Boots servers on demand, at most one per configuration for the whole run."""

    def __init__(self, run_dir: Path, log_dir: Path, *, shared: bool = False, max_alive: int = 1,
                 say: Callable[[str], None] | None = None, host_local: bool = False) -> None:
        self.run_dir = run_dir
        self.log_dir = log_dir
        self.shared = shared  # True under xdist: servers are shared through run_dir and stopped by the controller
        self.host_local = host_local  # a remote xdist worker: this process owns and stops what it boots
        self.max_alive = max_alive
        self.say = say or (lambda msg: None)
        self.handles: dict[str, ServerHandle] = {}
        self.accounting: TimeAccount | None = None  # where the suite's time goes
        self.failed: dict[str, str] = {}  # key -> error message: a boot that failed is not retried per test
        self.died: dict[str, str] = {}  # key -> "server died" message: later tests fail fast with it
        self.launched: list[str] = []  # keys this pool launched (its own teardown's business)
        self._locks: dict[str, isolation.RequestLock] = {}  # one per server, so this process counts its holds
        (run_dir / "servers").mkdir(parents=True, exist_ok=True)

    def request_lock(self, key: str) -> isolation.RequestLock:
        """The server's readers-writer lock, one file in the run directory that every worker shares."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = isolation.RequestLock(self.run_dir / "servers" / f"{key}.requests.lock")
        return lock

    # ------------------------------------------------------------------ acquire
    def get(self, spec: ServerSpec, *, keep: tuple[ServerSpec, ...] = ()) -> ServerHandle:
        """The running server for ``spec``; boots it (once) if needed. ``keep`` are not stopped."""
        key = spec_key(spec)
        if key in self.failed:
            what = "could not be attached" if spec.attached else "failed to boot"
            raise ServerError(f"{spec.id} {what} earlier in this run:\n{self.failed[key]}")
        if key in self.died:
            raise ServerDiedError(self.died[key])
        handle = self.handles.get(key)
        if handle is not None:
            try:
                handle.ensure_alive()
            except ServerDiedError as exc:
                self._bury(key, handle, str(exc))
                raise
            return handle
        if spec.attached:  # launched elsewhere: nothing of this host's to make room for, nothing to share
            handle = self._attach_declared(spec, key)
            self.handles[key] = handle
            return handle
        if not self.shared or self.host_local:
            keep_keys = {spec_key(s) for s in keep}
            others = [k for k in self.handles if k not in keep_keys]
            while others and len(self.handles) >= self.max_alive:
                self.stop(others.pop(0))
        handle = self._boot(spec, key) if not self.shared else self._get_shared(spec, key)
        self.handles[key] = handle
        return handle

    def get_beside(self, spec: ServerSpec, current: ServerSpec) -> ServerHandle:
        """``spec``'s server with ``current``'s kept up beside it (a decode check's reference): the pool
        holds two servers for this call only, whatever its ``max_alive``."""
        before = self.max_alive
        self.max_alive = max(before, 2)
        try:
            return self.get(spec, keep=(current,))
        finally:
            self.max_alive = before

    def launched_handle(self, spec: ServerSpec) -> ServerHandle | None:
        """The handle of ``spec``'s server if this pool holds it with a log (one it launched), else None."""
        for handle in self.handles.values():
            if handle.spec.id == spec.id and handle.log_path:
                return handle
        return None

    def _bury(self, key: str, handle: ServerHandle, message: str) -> None:
        """A server died mid-session: remember why (later tests fail fast with it, no reboot behind the
        user's back) and kill what is left of its tree now (engine workers may outlive the API process)."""
        self.died[key] = message
        self.handles.pop(key, None)
        if self.shared and not self.host_local or isinstance(handle, AttachedHandle):
            return  # the controller stops shared servers
        try:
            handle.stop()
        except ServerError as exc:
            self.say(f"teardown after death of {handle.spec.id}: {exc}")

    def _boot(self, spec: ServerSpec, key: str) -> ServerHandle:
        # Under xdist the controller (this worker's parent) is responsible for the server: while it runs,
        # the server is not stale for another run, even if this worker crashes. On another host the
        # controller is out of reach: this worker is, and if it dies its server is an orphan there.
        run_pid = os.getppid() if self.shared and not self.host_local else os.getpid()
        handle = ServerHandle(spec, log_dir=self.log_dir, say=self.say, on_launch=self._record_launch,
                              run_pid=run_pid, run_id=self.run_dir.name, server_key=key)
        handle.accounting = self.accounting
        handle.request_lock = self.request_lock(key)
        self.launched.append(key)
        return self._start_recorded(spec, handle, key, self.accounting.boot(key) if self.accounting is not None
                                    else contextlib.nullcontext())

    def _start_recorded(self, spec: ServerSpec, handle: ServerHandle, key: str,
                        timed_as: contextlib.AbstractContextManager[object]) -> ServerHandle:
        """Start ``handle`` (a launch, or an attachment's readiness check), timed as ``timed_as`` says, and
        record the outcome in boots.jsonl, a failure also in ``failed``."""
        started = time.time()
        try:
            with timed_as:
                handle.start()
        except Exception as exc:
            self.failed[key] = str(exc)
            self._record_boot(spec, handle, started, ok=False, error=str(exc).splitlines()[0])
            raise
        self._record_boot(spec, handle, started, ok=True)
        return handle

    def _attach_declared(self, spec: ServerSpec, key: str) -> ServerHandle:
        """A server the configuration names by ``url`` (launched by a cluster manager, or ``external``):
        attached after a readiness check, never launched, preflighted or stopped here. Each xdist worker
        attaches by itself (the check is one token); the log it names is read whenever facts are taken,
        by the adapter of its engine (:meth:`AttachedHandle.facts`)."""
        assert spec.url is not None
        log_path = Path(spec.log) if spec.log else None
        if log_path is not None and not log_path.is_file():
            what = "is not a file" if log_path.exists() else "does not exist"
            message = (f"{spec.id}: log = {spec.log!r} (from {spec.source}) {what}: name the log file the server "
                       f"at {spec.url} writes, as this machine sees it (a shared path), or leave log out "
                       "(facts then come from /metrics and /server_info only)")
            self.failed[key] = message
            raise ServerError(message)
        # Reached as ``external`` (nothing to launch); the model name in requests is the one it serves,
        # unless served_model_name says which: ``model`` may be a path on the cluster.
        reach = replace(spec, engine="external", model=spec.model if spec.engine == "external" else None)
        handle = AttachedHandle(reach, original=spec, pid=None, log_path=log_path)
        if spec.engine == "external":
            handle.spec_for_checks = None  # the spec is the configuration: an unknown engine, nothing declared
        handle.accounting = self.accounting
        handle.request_lock = self.request_lock(url_key(spec.url))
        # Its readiness check is a request, not a boot: this run boots nothing for it.
        return self._start_recorded(spec, handle, key, self.accounting.requests("other")
                                    if self.accounting is not None else contextlib.nullcontext())

    def _get_shared(self, spec: ServerSpec, key: str) -> ServerHandle:
        info_path = self.run_dir / "servers" / f"{key}.json"
        with FileLock(str(info_path) + ".lock"):
            if info_path.is_file():
                info = json.loads(info_path.read_text())
                if info.get("error"):
                    raise ServerError(f"{spec.id} failed to boot in another worker:\n{info['error']}")
                return self._attach(spec, info)
            try:
                handle = self._boot(spec, key)
            except Exception as exc:
                info_path.write_text(dumps({"error": str(exc)}))
                raise
            info_path.write_text(dumps({
                "url": handle.base_url, "model": handle.model_name, "pid": handle.pid, "port": handle.port,
                "create_time": procs.create_time(handle.pid) if handle.pid else None,
                "log": str(handle.log_path) if handle.log_path else None, "owner_pid": os.getpid(),
                # The server's GPUs and its GPU pids, found at its boot: the attaching workers' rounds count only
                # other processes on those GPUs as contention.
                "gpu_scope": handle.gpu_scope.to_dict() if handle.gpu_scope is not None else None}))
            return handle

    def _attach(self, spec: ServerSpec, info: SharedServer) -> ServerHandle:
        """Attach to a server booted by another worker: same spec, but nothing launched or killed here."""
        ext = replace(spec, engine="external", url=info["url"], served_model_name=info["model"])
        log = info.get("log")
        handle = AttachedHandle(ext, original=spec, pid=info.get("pid"), log_path=Path(log) if log else None,
                                created=info.get("create_time"))
        handle.accounting = self.accounting  # this worker's requests are this run's request time too
        handle.request_lock = self.request_lock(spec_key(spec))
        handle.start()  # readiness only
        scope = info.get("gpu_scope")
        if scope:
            handle.gpu_scope = GpuScope.from_dict(scope)
        return handle

    def _record_launch(self, handle: ServerHandle) -> None:
        """Written the moment a process starts, before readiness: if this worker dies mid-boot, the
        controller still finds (and stops) the server."""
        entry: hosts.BootEntry = {
            "server": handle.spec.id, "key": handle.server_key, "pid": handle.pid, "worker_pid": os.getpid(),
            "create_time": procs.create_time(handle.pid) if handle.pid else None,
            "log": str(handle.log_path) if handle.log_path else None}
        path = self.run_dir / "launches.jsonl"
        with FileLock(str(path) + ".lock"), open(path, "a") as fh:
            fh.write(dumps(entry) + "\n")

    def _record_boot(self, spec: ServerSpec, handle: ServerHandle, started: float, *, ok: bool,
                     error: str | None = None) -> None:
        entry: hosts.BootEntry = {
            "server": spec.id, "key": spec_key(spec), "pid": handle.pid, "worker_pid": os.getpid(),
            "started": started, "boot_s": round(handle.boot.boot_s, 2), "ok": ok, "error": error,
            "launched": handle.adapter.launches,
            "url": handle.plan.base_url if handle.plan else spec.url,
            "log": str(handle.log_path) if handle.log_path else None, "hostname": hosts.this_host()}
        with FileLock(str(self.run_dir / "boots.jsonl.lock")), open(self.run_dir / "boots.jsonl", "a") as fh:
            fh.write(dumps(entry) + "\n")

    # ------------------------------------------------------------------ release
    def stop(self, key: str) -> None:
        handle = self.handles.pop(key, None)
        if handle is None:
            return
        if self.shared and not self.host_local or isinstance(handle, AttachedHandle):
            return  # the controller stops shared servers; an attached one is not ours
        if self.shared:
            # Others on this host boot it afresh if they need it again, rather than attach to nothing.
            with contextlib.suppress(OSError):
                (self.run_dir / "servers" / f"{key}.json").unlink()
        with self.accounting.teardown() if self.accounting is not None else contextlib.nullcontext():
            report = handle.stop()
        if report is not None:
            self._record_stop(handle, report.seconds)

    def _record_stop(self, handle: ServerHandle, seconds: float) -> None:
        entry = {"server": handle.spec.id, "pid": handle.pid, "stop_s": round(seconds, 2)}
        with FileLock(str(self.run_dir / "stops.jsonl.lock")), open(self.run_dir / "stops.jsonl", "a") as fh:
            fh.write(dumps(entry) + "\n")

    def stop_owned(self) -> list[str]:
        """A host-local worker's session end: stop the servers it booted (not those it attached to), and
        whatever this worker launched that is still running (a boot it abandoned, an engine worker that
        left its group)."""
        errors = self.stop_all()
        errors += stop_shared_servers(self.run_dir, self.say, keys=set(self.launched))
        return errors

    def stop_all(self) -> list[str]:
        errors = []
        for key in list(self.handles):
            try:
                self.stop(key)
            except ServerError as exc:
                errors.append(str(exc))
        return errors


class AttachedHandle(ServerHandle):
    """A server this process did not launch: another worker's, or one the configuration names by ``url``
    (``original.attached``). Readiness and evidence work, with the facts parsed by the adapter of the
    configured engine; teardown is not ours."""

    def __init__(self, spec: ServerSpec, original: ServerSpec, pid: int | None, log_path: Path | None,
                 created: float | None = None) -> None:
        super().__init__(spec)
        self.original = original
        self._owner_pid = pid
        self._created = created
        self.log_path = log_path
        self.spec_for_checks = original

    def ensure_alive(self) -> None:
        if not self.is_alive():
            tail = self._tail() if self.log_path else ""
            raise ServerDiedError(f"{self.original.id} (pid {self._owner_pid}) is gone: server died "
                                  f"(log: {self.log_path})\n--- last lines ---\n{tail}")

    def is_alive(self) -> bool:
        return self._owner_pid is None or procs.pid_alive(self._owner_pid, self._created)

    @property
    def server_pid(self) -> int | None:
        """Another worker's server: the pid it launched (None for a server named by ``url``)."""
        return self._owner_pid

    def describe(self) -> str:
        if not self.original.attached:
            return super().describe()
        where = f"; log: {self.log_path}" if self.log_path else "; no log named"
        return f"attached server {self.original.id} at {self.spec.url} (not launched by this run{where})"

    def facts(self) -> ServerFacts:
        """What the log (read now), ``/metrics`` and the engine's server-info endpoint say, parsed by the
        configured engine's adapter."""
        return engine_of(self).parse_facts(self.log_text(), self.metrics_text(), self.server_info())

    def stop(self) -> procs.TeardownReport | None:
        return None


def _read_jsonl(path: Path) -> list[hosts.BootEntry]:
    if not path.is_file():
        return []
    out: list[hosts.BootEntry] = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def read_boots(run_dir: Path) -> list[hosts.BootEntry]:
    return _read_jsonl(run_dir / "boots.jsonl")


def stop_shared_servers(run_dir: Path, say: Callable[[str], None], *, keys: set[str] | None = None) -> list[str]:
    """Controller side: stop every server any process of this run launched; return leftover descriptions.

    Reads the launch records (written before readiness), so a server whose worker crashed mid-boot or
    mid-session is stopped too. A pid is only signalled while it is still the process that was launched.
    ``keys``: only those configurations (a host-local worker's own teardown: what it launched; the other
    workers of its host may still use theirs).
    """
    leftovers: list[str] = []
    seen: set[int] = set()
    entries = _read_jsonl(run_dir / "launches.jsonl") + read_boots(run_dir)
    if keys is not None:
        entries = [entry for entry in entries if entry.get("key") in keys]
    for entry in entries:
        pid = entry.get("pid")
        if not pid or int(pid) in seen or entry.get("launched") is False:
            continue
        pid = int(pid)
        seen.add(pid)
        if not procs.pid_alive(pid, entry.get("create_time")):
            continue
        report = procs.kill_tree(pid, pgid=pid)
        say(f"stopped shared server {entry['server']} (pid {pid}): {len(report.pids)} processes in "
            f"{report.seconds:.1f} s")
        leftovers.extend(report.survivors)
        if not report.survivors:
            with contextlib.suppress(OSError):
                (registry_dir() / f"{pid}.json").unlink()
    # What outlived its API process or left its group (a worker's server whose API process died) still
    # carries this run's marker.
    strays = [m for m in isolation.marked_processes() if m.marker.startswith(run_dir.name + "/")
              and (keys is None or m.marker.split("/", 1)[1] in keys)]
    if strays:
        say(f"stopping {len(strays)} leftover process(es) of this run's servers: "
            f"{', '.join(m.description for m in strays)}")
        leftovers.extend(isolation.kill_pids([m.pid for m in strays]))
    return leftovers
