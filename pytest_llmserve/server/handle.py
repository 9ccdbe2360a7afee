"""Server lifecycle: preflight, launch in its own session, readiness, log capture, teardown of the tree.

Readiness means the server can *generate*: the engine's health endpoint answers 200 AND one real
one-token generation succeeds (vLLM keeps answering /health while wedged; SGLang's /v1/models answers
before warm-up). Polling stops at once when the process exits, with the log tail and the log path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

import httpx
import psutil
import tenacity

from pytest_llmserve.builds import install_build
from pytest_llmserve.config import ServerSpec, cache_dir
from pytest_llmserve.engines import adapter_for
from pytest_llmserve.engines.base import EngineAdapter, LaunchPlan
from pytest_llmserve.errors import PreflightError, ServerDiedError, ServerError, ServerStartError
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.evidence.pages import PAGE_TIMEOUT_S, Page, answer, auth_headers, read_page
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.redaction import redact_argv, redact_text, secret_strings
from pytest_llmserve.server import gpu, isolation, procs
from pytest_llmserve.server.gpu import PreflightResult
from pytest_llmserve.server.gpu_scope import GpuScope, server_gpu_scope

if TYPE_CHECKING:
    from pytest_llmserve.evidence.facts import ServerFacts

LOG_TAIL_LINES = 40
#: How long a server no longer running, whose exit status is not reported yet, is waited for. A SIGKILLed
#: multi-threaded process (the engine's API server) shows as a zombie as soon as its main thread is gone, while
#: ``waitpid`` reports it only once its last thread has exited: seen in a fresh-clone run, 2026-12-03, /proc said
#: Z 4 ms after the kill while ``poll()`` still said running, so a test whose server died under it was not told.
ZOMBIE_REAP_S = 30.0


class TimeAccount(Protocol):
    """What a server records of the suite's time: its boots, its teardowns and the requests sent to it. The
    plugin hands in its :class:`pytest_llmserve.gates.accounting.Accounting` (a layer above this one, so it
    is named here by what the servers call, not imported)."""

    def boot(self, key: str | None = None) -> AbstractContextManager[object]: ...

    def teardown(self) -> AbstractContextManager[object]: ...

    def requests(self, kind: str = "other") -> AbstractContextManager[object]: ...


@runtime_checkable
class RunningServer(Protocol):
    """What tests, gates and the plugin use of a ready server, whoever started it: a :class:`ServerHandle`
    that launched it, one attached to a running server (engine ``external``, ``--llmserve-url``) or one
    attached to the server another pytest-xdist worker launched (:class:`pytest_llmserve.server.pool.AttachedHandle`).
    """

    spec: ServerSpec
    #: The configuration to check the server against when ``spec`` describes how it is reached instead
    #: (an xdist worker attached to another worker's server); None when ``spec`` is that configuration.
    spec_for_checks: ServerSpec | None
    adapter: EngineAdapter
    accounting: TimeAccount | None  # where request time is counted, when the suite accounts for it
    #: Shared by correctness requests, exclusive for a benchmark round (None: a script's own server).
    request_lock: isolation.RequestLock | None
    log_path: Path | None  # None: not launched here, no log
    port: int
    #: The server's GPU processes, found once when it is ready (None: no GPU, or not launched here).
    gpu_scope: GpuScope | None

    @property
    def server_pid(self) -> int | None: ...  # the launched process (None: a server named by url)

    @property
    def base_url(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    def describe(self) -> str: ...

    def ensure_alive(self) -> None: ...

    def is_alive(self) -> bool: ...

    def death_report(self) -> str | None: ...

    def client(self) -> LLMClient: ...

    def log_text(self) -> str: ...

    def metrics_text(self) -> str | None: ...

    def server_info(self) -> dict[str, object] | None: ...

    def facts(self) -> ServerFacts: ...


def engine_of(server: RunningServer) -> EngineAdapter:
    """The adapter of the engine the server runs, for its log lines, NaN patterns and checks: an attached
    server is reached as ``external`` (``server.adapter``), but its engine is the configured one
    (``spec_for_checks``: a server attached by url, or another xdist worker's)."""
    configured = server.spec_for_checks
    return adapter_for(configured) if configured is not None else server.adapter


def read_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log, with ``\\r``-updated progress bars split into lines."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return "<no log>"
    parts = data.replace("\r", "\n").splitlines()
    return "\n".join(p for p in parts[-lines:])


def secret_values(spec: ServerSpec, argv: list[str] | None = None) -> list[str]:
    """Secret strings ``spec``'s server may echo into its own log (:func:`~pytest_llmserve.redaction.secret_strings`):
    its API key, secret flags' values in ``argv`` (default: the spec's), and the secret-named variables it is given or
    inherits (HF_TOKEN...)."""
    args = argv if argv is not None else [*spec.argv, *spec.args]
    return secret_strings(spec.api_key, args, {**os.environ, **dict(spec.env)})


@dataclass
class BootRecord:
    """Timing and identity of one boot, for the suite's accounting and for reports."""

    server_id: str
    pid: int | None
    port: int
    log_path: str | None
    boot_s: float = 0.0
    stop_s: float = 0.0
    teardown: dict[str, object] = field(default_factory=dict)


class ServerHandle:
    """One server: launched by us (``start``/``stop``) or attached to (engine ``external``).

    Usable from plain scripts::

        with ServerHandle(spec, log_dir=Path("logs")) as server:
            print(server.client().complete("Hello", 8).text)
    """

    def __init__(self, spec: ServerSpec, log_dir: Path | None = None, adapter: EngineAdapter | None = None,
                 say: Callable[[str], None] | None = None,
                 on_launch: Callable[[ServerHandle], None] | None = None, run_pid: int | None = None,
                 run_id: str | None = None, server_key: str | None = None) -> None:
        self.spec = spec
        # Called right after the process starts (before readiness), so whoever cleans up after a crash
        # of this process (the xdist controller) knows the server even if the boot never finished.
        self.on_launch = on_launch
        # The pytest process responsible for this server (the xdist controller for a worker's boot): while
        # it lives, the server is not stale, even if the launching worker crashed.
        self.run_pid = run_pid or os.getpid()
        self.server_key = server_key or spec.id
        # The marker the server's processes carry in their environment: found again by it when the
        # pytest that launched them was killed (SIGKILL, the OOM killer) and no teardown ran.
        self.marker_env = isolation.marker_env(run_id or f"script-{uuid.uuid4().hex[:12]}", server_key or spec.id,
                                               self.run_pid, registry_dir())
        self.request_lock: isolation.RequestLock | None = None  # set by the pool
        self._launched_at: float | None = None
        self.adapter = adapter or adapter_for(spec)
        self.log_dir = Path(log_dir) if log_dir else cache_dir() / "logs"
        self.say = say or (lambda msg: None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.plan: LaunchPlan | None = None
        self.log_path: Path | None = None
        self.port: int = spec.port or 0
        self.boot = BootRecord(spec.id, None, 0, None)
        self._log_fh: IO[bytes] | None = None
        self.last_readiness: str = "not polled yet"
        self.spec_for_checks: ServerSpec | None = None
        self.accounting: TimeAccount | None = None  # set by the pool: request time is accounted there
        # The GPU preflight result of a ``gpu = true`` server, for the teardown check.
        self.gpu_pre: PreflightResult | None = None
        # Its GPUs and its processes there as NVML lists them (found when ready): what a round's GPU contention
        # leaves out, and what must be gone at teardown.
        self.gpu_scope: GpuScope | None = None
        self.ready_at: float | None = None  # time.monotonic() when it became ready

    # ------------------------------------------------------------------ identity
    @property
    def base_url(self) -> str:
        if self.plan is None:
            raise ServerError(f"server {self.spec.id} is not started")
        return self.plan.base_url

    @property
    def model_name(self) -> str:
        if self.plan is None:
            raise ServerError(f"server {self.spec.id} is not started")
        return self.plan.model_name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def server_pid(self) -> int | None:
        """The server's main process on this host (its descendants are the rest of it), for what a round
        counts as host contention; None when not known here (a server reached by URL)."""
        return self.pid

    @property
    def marker(self) -> str:
        """``<run id>/<server key>``: the value of ``PYTEST_LLMSERVE_RUN`` in the server's environment."""
        return self.marker_env[isolation.RUN_MARKER_ENV]

    def describe(self) -> str:
        where = f" (log: {self.log_path})" if self.log_path else ""
        return f"server {self.spec.id} at {self.plan.base_url if self.plan else '?'}{where}"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ServerHandle:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ServerHandle:
        # A combination's engine build not installed yet (a script's server: the plugin installs the builds when
        # it loads the configuration) is installed first, outside the boot's clock: a boot never waits on pip.
        self.spec = install_build(self.spec)
        start = time.monotonic()
        host = self.spec.host
        if self.adapter.launches:
            self.port = self.spec.port or procs.free_port(host, highest=self.adapter.highest_port)
            preflight(self.spec, host, self.port)
            if self.spec.gpu:
                # Enough GPUs, enough free memory, no stale GPU process; servers of this run are not stale.
                self.gpu_pre = gpu.gpu_check(self.spec, ignore_pids=_live_server_pids())
                used = [(g.label, g.compute_capability) for g in self.gpu_pre.gpus if g.index in self.gpu_pre.devices]
                problems = self.adapter.preflight_problems(self.spec, used)
                if problems:
                    raise PreflightError(f"{self.spec.id} cannot run here:\n  " + "\n  ".join(problems))
        self.plan = self.adapter.launch_plan(self.spec, host, self.port)
        if self.adapter.launches:
            self._launch(self.plan)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.boot.boot_s = time.monotonic() - start
        self.ready_at = time.monotonic()  # a benchmark's context says how long the server had been ready
        if self.gpu_pre is not None and self.proc is not None:
            self.gpu_scope = server_gpu_scope(self.gpu_pre.devices, self.gpu_pre.baseline_pids, gpu.snapshot(),
                                                  [p.pid for p in procs.tree_of(self.proc.pid)])
        self.say(f"{self.spec.id} ready in {self.boot.boot_s:.1f} s at {self.plan.base_url}"
                 + (f", log {self.log_path}" if self.log_path else ""))
        return self

    def _launch(self, plan: LaunchPlan) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.spec.id)
        self.log_path = self.log_dir / f"{safe_id}-{stamp}-{os.getpid()}-{self.port}.log"
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - kept open for the server's lifetime
        header = {"server": self.spec.id, "argv": redact_argv(plan.argv), "port": self.port,
                  "env_added": sorted(plan.env), "notes": plan.notes}
        self._log_fh.write(("# llmserve launch " + dumps(header) + "\n").encode())
        self._log_fh.flush()
        env = {**os.environ, **plan.env, **self.marker_env}
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.say(f"booting {self.spec.id}: {' '.join(redact_argv(plan.argv))}")
        try:
            # A list argv, never a shell: nothing in the configuration is interpreted by /bin/sh.
            self.proc = subprocess.Popen(plan.argv, stdout=self._log_fh, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise ServerStartError(f"cannot launch {self.spec.id}: {plan.argv[0]}: {exc} "
                                   f"(log: {self.log_path})") from exc
        self._launched_at = time.monotonic()
        self.boot.pid = self.proc.pid
        self.boot.port = self.port
        self.boot.log_path = str(self.log_path)
        register_running(self)
        if self.on_launch is not None:
            self.on_launch(self)

    def wait_ready(self) -> None:
        """Poll health + one generation until ready; fail fast on exit; hard deadline.

        This is the only place that retries: a measured request is never retried. Each probe's own
        timeout is cut to the time left, so the deadline holds even against a server that accepts
        connections and never answers.
        """
        assert self.plan is not None
        deadline_s = self.spec.startup_timeout_s
        start = time.monotonic()
        deadline = start + deadline_s
        http = httpx.Client(timeout=10.0, headers=auth_headers(self.spec.api_key))

        def attempt() -> bool:
            self._raise_if_exited(during="boot")
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = self._probe(http, left)
            if ready:
                # The answer may come from another process that holds the port: ours must still run.
                self._raise_if_exited(during="boot")
            return ready

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda ok: ok is not True),
            stop=lambda _state: time.monotonic() >= deadline,
            wait=lambda _state: max(0.0, min(0.5, deadline - time.monotonic())),
            reraise=True,
        )
        try:
            retrying(attempt)
        except tenacity.RetryError:
            raise ServerStartError(
                f"{self.spec.id} was not ready within its startup deadline of {deadline_s:g} s "
                f"(startup_timeout_s from {self.spec.source}); last readiness answer: {self.last_readiness}\n"
                f"log: {self.log_path or '<attached server, no log>'}\n--- last lines ---\n{self._tail()}"
            ) from None
        finally:
            http.close()
        self.say(f"{self.spec.id} readiness passed after {time.monotonic() - start:.1f} s")

    def _probe(self, http: httpx.Client, budget_s: float = 120.0) -> bool:
        plan = self.plan
        assert plan is not None
        health = plan.health_path
        health_timeout = min(5.0 if health != "/health_generate" else 60.0, budget_s)
        if not self._probe_step(f"GET {health}", health_timeout,
                                lambda t: read_page(plan.base_url, health, timeout_s=t, http=http)):
            return False
        if not plan.generation_probe:
            self.last_readiness = f"GET {health}: 200"
            return True
        body = {"model": plan.model_name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        url = plan.base_url + "/v1/completions"
        # A worker attaching to a server another worker benchmarks must not probe it mid-round.
        with self.request_lock.shared() if self.request_lock is not None else contextlib.nullcontext():
            ready = self._probe_step("health 200, generation probe", max(0.1, min(120.0, budget_s)),
                                     lambda t: answer(url, t, lambda: http.post(url, json=body, timeout=t)),
                                     limit=300)
        if not ready:
            return False
        self.last_readiness = "health 200, one-token generation 200"
        return True

    def _probe_step(self, label: str, timeout_s: float, send: Callable[[float], Page], limit: int = 200) -> bool:
        """One readiness request: True on HTTP 200, else False with what came back in ``last_readiness``."""
        page = send(timeout_s)
        if not page.ok:
            self.last_readiness = f"{label}: {page.failure(limit)}"
        return page.ok

    def _tail(self) -> str:
        """The log's last lines for an error message, with secrets the engine may have echoed masked
        (some engines print their full arguments, API key included)."""
        if not self.log_path:
            return "<attached server: no log captured>"
        argv = self.plan.argv if self.plan else None
        return redact_text(read_tail(self.log_path), secret_values(self.spec, argv))

    def _raise_if_exited(self, during: str) -> None:
        if self.proc is None:
            return
        code = self.proc.poll()
        if code is None and procs.pid_alive(self.proc.pid):  # pid_alive: running, and not a zombie
            return
        if code is None:  # dead, its last threads still exiting: wait for the status the kernel will report
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=ZOMBIE_REAP_S)
        cls = ServerStartError if during == "boot" else ServerDiedError
        how = "died (its exit status not reported yet)" if code is None else f"exited with code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-code).name}"
        after = (f", {time.monotonic() - self._launched_at:.1f} s after launch"
                 if during == "boot" and self._launched_at is not None else "")
        raise cls(f"{self.spec.id} (pid {self.proc.pid}) {how} during {during}{after} "
                  f"(server died; log: {self.log_path})\n--- last lines ---\n{self._tail()}")

    def ensure_alive(self) -> None:
        """Raise :class:`ServerDiedError` (with the log tail) when the server process has exited."""
        self._raise_if_exited(during="the session")

    def is_alive(self) -> bool:
        return self.proc is None or (self.proc.poll() is None and procs.pid_alive(self.proc.pid))

    def death_report(self) -> str | None:
        """None while the server runs; else who died, how, the log path and its last lines."""
        try:
            self.ensure_alive()
        except ServerDiedError as exc:
            return str(exc)
        return None

    def _server_gpu_pids(self) -> frozenset[int]:
        """The server's GPU processes as NVML lists them (another pid namespace's numbers in a container)."""
        return self.gpu_scope.server_pids if self.gpu_scope is not None else frozenset()

    def stop(self) -> procs.TeardownReport | None:
        """Kill the whole process tree (SIGTERM, then SIGKILL) and check nothing is left."""
        report = None
        if self.proc is not None:
            start = time.monotonic()
            # Workers left by an API process that already died have no one to finish for: a short grace.
            grace_s = 10.0 if self.proc.poll() is None else 2.0
            report = procs.kill_tree(self.proc.pid, pgid=self.proc.pid, grace_s=grace_s)
            # Processes that left the tree and the group (re-parented, setsid) still carry the marker.
            strays = [p.pid for p in isolation.marked_processes(self.marker) if p.pid not in report.pids]
            if strays:
                report = procs.TeardownReport(tuple(sorted({*report.pids, *strays})), True,
                                              (*report.survivors, *isolation.kill_pids(strays)), report.seconds)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.boot.stop_s = time.monotonic() - start
            self.boot.teardown = {"pids": list(report.pids), "escalated": report.escalated,
                                  "survivors": list(report.survivors), "seconds": round(report.seconds, 2)}
            if not report.survivors:
                unregister_running(self)  # else the record stays, so the next run finds what is left
            if self.gpu_pre is not None:
                back = gpu.wait_memory_returned(self.gpu_pre.baseline_used_mib, self.gpu_pre.devices, 30,
                                                server_pids={*report.pids, *self._server_gpu_pids()},
                                                baseline_pids=self.gpu_pre.baseline_pids)
                self.boot.teardown["gpu_memory"] = back.to_dict()
                if not back.ok:
                    raise ServerError(f"teardown of {self.spec.id}: {back.message()}")
            self.say(f"{self.spec.id} stopped in {report.seconds:.1f} s ({len(report.pids)} processes"
                     f"{', SIGKILL needed' if report.escalated else ''})")
            if report.survivors:
                raise ServerError(f"teardown of {self.spec.id} left processes running: {', '.join(report.survivors)}")
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None
        return report

    # ------------------------------------------------------------------ evidence
    def log_text(self) -> str:
        if not self.log_path:
            return ""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def client(self) -> LLMClient:
        return LLMClient(self.base_url, self.model_name, api_key=self.spec.api_key,
                         timeout_s=self.spec.request_timeout_s, accounting=self.accounting,
                         request_lock=self.request_lock)

    def page(self, path: str) -> Page:
        """One of the server's pages (metrics, server info): 10 s at most, never longer than a request may take."""
        return read_page(self.base_url, path, self.spec.api_key, min(PAGE_TIMEOUT_S, self.spec.request_timeout_s))

    def metrics_text(self) -> str | None:
        return self.page("/metrics").body

    def server_info(self) -> dict[str, object] | None:
        """The engine's own account of its resolved settings (SGLang ``/server_info``, llama.cpp ``/props``),
        asked of the configured engine's adapter (an attached server is reached as ``external``)."""
        adapter = engine_of(self)
        fetch = getattr(adapter, "fetch_server_info", None)
        if fetch is not None:
            info = fetch(self.base_url, self.spec.api_key)
            return info if isinstance(info, dict) else None
        path = adapter.server_info_path
        if not path:
            return None
        data = self.page(path).json()
        return data if isinstance(data, dict) else None

    def facts(self) -> ServerFacts:
        return self.adapter.parse_facts(self.log_text(), self.metrics_text(), self.server_info())


# ---------------------------------------------------------------------- preflight and the registry

def _live_server_pids() -> list[int]:
    """Processes of servers whose owning pytest is alive (this run's and concurrent runs'): not stale."""
    pids: list[int] = []
    reg = registry_dir()
    if not reg.is_dir():
        return pids
    for path in reg.glob("*.json"):
        try:
            entry: RunningRecord = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        pid = _recorded_pid(entry)
        if pid and procs.pid_alive(pid):
            pids.extend(p.pid for p in procs.tree_of(pid))
    # Processes of live runs' servers that left their tree (engine workers re-parented to init).
    pids.extend(m.pid for m in isolation.marked_processes() if isolation.owner_alive(m.owner))
    return pids


def registry_dir() -> Path:
    return cache_dir() / "running"


class RunningRecord(TypedDict, total=False):
    """A launched server's record in the registry (:func:`register_running`, one JSON file per server), or what a
    dead run left that no record names (its marker and owner only); :func:`stale_servers` adds what is left of it.
    Read back from disk, any key may be missing."""

    pid: int | None  # the API process (None: known by its marker only)
    create_time: float | None  # its start time: a reused pid is not the same process
    port: int
    server: str  # the configuration's id
    owner_pid: int  # the pytest that launched it, and its start time
    owner_create_time: float | None
    run_pid: int  # the run it belongs to (the xdist controller for a worker's boot), and its start time
    run_create_time: float | None
    log: str
    started: float
    marker: str  # the run marker its processes carry (isolation.RUN_MARKER_ENV)
    owner: str | None  # the marker's owner (isolation.RUN_OWNER_ENV)
    api_alive: bool  # added by stale_servers: the API process still runs
    orphans: list[int]  # added by stale_servers: its other processes left
    orphan_descriptions: list[str]


def register_running(handle: ServerHandle) -> None:
    """Record a launched server so a later run can find it if this one dies without teardown.

    Pids are stored with their start times (a reused pid is not the same process), and with the pytest
    process responsible for the server (``run_pid``: the xdist controller for a worker's boot).
    """
    reg = registry_dir()
    reg.mkdir(parents=True, exist_ok=True)
    assert handle.pid is not None
    me = os.getpid()
    entry: RunningRecord = {"pid": handle.pid, "create_time": procs.create_time(handle.pid), "port": handle.port,
             "server": handle.spec.id, "owner_pid": me, "owner_create_time": procs.create_time(me),
             "run_pid": handle.run_pid, "run_create_time": procs.create_time(handle.run_pid),
             "log": str(handle.log_path), "started": time.time(), "marker": handle.marker,
             "owner": handle.marker_env[isolation.RUN_OWNER_ENV]}
    tmp = reg / f".{handle.pid}.json.tmp"
    tmp.write_text(dumps(entry))
    os.replace(tmp, reg / f"{handle.pid}.json")  # a concurrent run's scan never reads half an entry


def unregister_running(handle: ServerHandle) -> None:
    if handle.pid is not None:
        with contextlib.suppress(OSError):
            (registry_dir() / f"{handle.pid}.json").unlink()


def _recorded_pid(entry: RunningRecord) -> int:
    """A record's API pid (0 when it names none); a null pid raises as any malformed record does."""
    pid = entry.get("pid", 0)
    if pid is None:
        raise TypeError("a registry record with a null pid")
    return int(pid)


def _entry_owner_alive(entry: RunningRecord) -> bool:
    """True while the pytest that launched the server, or the run it belongs to, is still running."""
    for given, created in ((entry.get("owner_pid"), entry.get("owner_create_time")),
                           (entry.get("run_pid"), entry.get("run_create_time"))):
        pid = int(given or 0)
        if pid and procs.pid_alive(pid, created):
            return True
    if "owner_pid" not in entry and "run_pid" not in entry:
        return isolation.owner_alive(entry.get("owner"))  # an orphan known by its marker only
    return False


def _leftovers(entry: RunningRecord, marked: list[isolation.MarkedProcess]) -> dict[int, str]:
    """pid -> description of what is left of a recorded server besides its API process: processes with
    its marker, and, once the API process is gone, the members of the process group it led (its engine
    processes keep that group id, whatever titles they give themselves)."""
    pid = int(entry.get("pid") or 0)
    left = isolation.with_their_groups(marked)
    if pid and not procs.pid_alive(pid, entry.get("create_time")) and not psutil.pid_exists(pid):
        # The leader is gone and its pid not reused: members of its group are its server's.
        for proc in isolation.group_of(pid, entry.get("create_time")):
            left.setdefault(proc.pid, procs.describe(proc))
    left.pop(pid, None)
    return left


def stale_servers() -> list[RunningRecord]:
    """Servers launched by an earlier run whose owner is gone but which are still running.

    A server is running while its API process runs or any of its processes does (vLLM's EngineCore and
    workers can outlive the API process): found by its marker or, for the retitled engine processes,
    by the process group the API process led. Its registry record stays until then, with the leftovers
    under ``"orphans"``. Marked processes of a dead run that no record names are stale too (one entry
    per server marker). A server whose owning pytest still runs (a concurrent run) is never stale.
    """
    out: list[RunningRecord] = []
    by_marker: dict[str, list[isolation.MarkedProcess]] = {}
    reg = registry_dir()
    for proc in isolation.marked_processes(registry=reg):
        by_marker.setdefault(proc.marker, []).append(proc)
    for path in sorted(reg.glob("*.json")) if reg.is_dir() else []:
        try:
            entry: RunningRecord = json.loads(path.read_text())
            pid = _recorded_pid(entry)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        marked = by_marker.pop(entry["marker"], []) if isinstance(entry.get("marker"), str) else []
        api_alive = procs.pid_alive(pid, entry.get("create_time"))
        left = _leftovers(entry, marked)
        if not api_alive and not left:
            with contextlib.suppress(OSError):
                path.unlink()  # the server is gone (or its pid now names another process): history
            continue
        entry["api_alive"] = api_alive
        entry["orphans"] = sorted(left)
        entry["orphan_descriptions"] = [left[p] for p in sorted(left)]
        if not _entry_owner_alive(entry):
            out.append(entry)
    for marker, unrecorded in sorted(by_marker.items()):
        owner = unrecorded[0].owner
        if isolation.owner_alive(owner):
            continue  # a live run's server (its record may be in another cache directory)
        left = isolation.with_their_groups(unrecorded)
        out.append({"server": marker.rpartition("/")[2], "marker": marker, "owner": owner, "pid": None,
                    "api_alive": False, "orphans": sorted(left),
                    "orphan_descriptions": [left[p] for p in sorted(left)]})
    return out


def describe_stale(entry: RunningRecord) -> str:
    owner = entry.get("owner_pid") or str(entry.get("owner") or "?").partition(":")[0]
    gone = f"its pytest, pid {owner}, is gone"
    if entry.get("api_alive", True):
        return (f"{entry.get('server')} (pid {entry.get('pid')}, port {entry.get('port')}, "
                f"log {entry.get('log')}; {gone})")
    left = entry.get("orphan_descriptions") or [f"pid {p}" for p in entry.get("orphans", [])]
    api = f"its API process (pid {entry['pid']}) exited" if entry.get("pid") else "no record of it"
    return (f"{entry.get('server')} ({api}, {len(left)} of its processes left: {', '.join(left)}; "
            f"marker {isolation.RUN_MARKER_ENV}={entry.get('marker')}, log {entry.get('log')}; {gone})")


def kill_stale(say: Callable[[str], None] = print) -> int:
    """Kill every stale server found in the registry or by its marker; return how many were killed."""
    killed = 0
    for entry in stale_servers():
        pid = int(entry.get("pid") or 0)
        pids: set[int] = set()
        survivors: list[str] = []
        if pid and procs.pid_alive(pid, entry.get("create_time")):
            report = procs.kill_tree(pid, pgid=pid)
            pids.update(report.pids)
            survivors += report.survivors
        left = sorted(_leftovers(entry, isolation.marked_processes(entry["marker"]) if entry.get("marker") else []))
        pids.update(left)
        survivors += isolation.kill_pids(left)
        say(f"killed stale server {describe_stale(entry)}: {len(pids)} processes"
            + (f"; still running: {', '.join(survivors)}" if survivors else ""))
        if pid and not survivors:
            with contextlib.suppress(OSError):
                (registry_dir() / f"{pid}.json").unlink()
        killed += 1
    return killed


def preflight(spec: ServerSpec, host: str, port: int, *, gpu_check: Callable[[ServerSpec], None] | None = None) -> None:
    """Refuse to boot when something blocks it; each message says what blocks and how to clear it."""
    if not procs.port_is_free(host, port):
        who = procs.who_listens(port)
        raise PreflightError(f"port {port} on {host} is taken{' by ' + who if who else ''}; "
                             f"leave `port` unset in {spec.source} to get a free port, or stop that process")
    stale = stale_servers()
    if stale:
        lines = ", ".join(describe_stale(e) for e in stale)
        raise PreflightError(f"stale server(s) from an earlier run are still running: {lines}. "
                             f"Stop them with `llmserve kill-stale` (or pass --llmserve-kill-stale)")
    if gpu_check is not None:
        gpu_check(spec)
    if spec.python and not Path(spec.python).exists() and not _on_path(spec.python):
        raise PreflightError(f"server {spec.id}: python = {spec.python!r} (from {spec.source}) does not exist"
                             + ("; run `llmserve setup` to create the embedded default" if "pytest-llmserve" in
                                spec.python else ""))


def _on_path(name: str) -> bool:
    return shutil.which(name) is not None
