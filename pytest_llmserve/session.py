"""The run in use, in one pytest process: its settings resolved, its state (run directory, server pool,
benchmark records, time accounting, probes sent ahead), the SIGTERM guard, and the teardown.

The plugin's face (:mod:`pytest_llmserve.face`) keeps the :class:`RunState` in ``config.stash`` once the run
uses llmserve, and calls what is here from its hooks and fixtures.
"""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from pytest_llmserve import xdist_hooks
from pytest_llmserve.builds import install_builds
from pytest_llmserve.config import untrained
from pytest_llmserve.engines import embedded
from pytest_llmserve.errors import LLMServeError
from pytest_llmserve.gates.accounting import Accounting
from pytest_llmserve.gates.probes import ServerProbes
from pytest_llmserve.options import Sources
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.handle import kill_stale
from pytest_llmserve.server.hosts import host_run_dir
from pytest_llmserve.server.pool import ServerPool, stop_shared_servers
from pytest_llmserve.settings import Settings, resolve_settings

Say = Callable[[str], None]


def resolve(rootpath: Path, sources: Sources) -> Settings:
    """The run's settings, with the builds its matrices want installed; a bad one is a usage error."""
    try:
        settings = resolve_settings(rootpath, sources, embedded.default_spec)
        # A checkpoint marker that its weights contradict is a configuration error: said now, before anything
        # boots, not in the first oracle that asks (the weights' hash is cached, so this costs one hash per model).
        for spec in settings.cfg.servers:
            untrained(spec)
        # The builds the matrices want, installed now (cached): a step of its own, never the configuration's.
        return replace(settings, cfg=install_builds(settings.cfg))
    except LLMServeError as exc:
        raise pytest.UsageError(f"pytest-llmserve: {exc}") from None


@dataclass
class RunState:
    """Per-process state: the server pool, benchmark outcomes, timing accounting."""

    run_dir: Path  # created by the first boot (ServerPool), removed by its owner at unconfigure
    owns_run_dir: bool
    accounting: Accounting
    host_local: bool = False  # a worker on another host: its own run directory; it stops what it boots
    pool: ServerPool | None = None
    outcomes: list[BenchOutcome] = field(default_factory=list)
    session_start: float = field(default_factory=time.monotonic)
    probes: dict[str, ServerProbes] = field(default_factory=dict)  # by server id: independent probes sent ahead

    def server_pool(self, settings: Settings, *, shared: bool, say: Say) -> ServerPool:
        """The pool, made by the first server wanted (``shared``: on an xdist worker, whose servers other
        workers use too); with ``--llmserve-kill-stale``, other runs' stale servers are killed first."""
        if self.pool is None:
            if settings.kill_stale:
                kill_stale(say=say)
            self.run_dir.mkdir(mode=0o700, parents=self.host_local, exist_ok=True)
            self.pool = ServerPool(self.run_dir, settings.results_dir / "logs", shared=shared, say=say,
                                   host_local=self.host_local)
            self.pool.accounting = self.accounting
        return self.pool

    def stop_servers(self, *, worker: bool, say: Say) -> None:
        """At the session's end: what this process must stop (an xdist worker's servers are its
        controller's to stop, except on another host, where the controller cannot reach them)."""
        if self.pool is None:
            return
        if self.host_local:
            errors = self.pool.stop_owned()  # a worker on another host stops what it booted itself
        elif worker:
            return
        else:
            errors = self.pool.stop_all()
        for err in errors:
            say(f"teardown problem: {err}")

    def finish(self, *, worker: bool, say: Say) -> None:
        """At unconfigure: every server still up stopped, and the run directory's owner removes it (after
        stopping what any process of the run launched there)."""
        if self.pool is not None and not worker:
            self.pool.stop_all()
        if self.owns_run_dir and self.run_dir.exists():
            leftovers = stop_shared_servers(self.run_dir, say=say)
            if leftovers:
                say(f"processes left after teardown: {', '.join(leftovers)}")
            shutil.rmtree(self.run_dir, ignore_errors=True)


def start(config: pytest.Config, settings: Settings, run_dir_name: Path) -> RunState:
    """This process's run state. The controller (or a run without xdist) owns the run directory
    ``run_dir_name``; an xdist worker uses its controller's, or on another host a host-local one, and
    sends its accounting home at the end (:func:`pytest_llmserve.xdist_hooks.send_home`)."""
    host_local = False
    if xdist_hooks.is_worker(config):
        gateway = xdist_hooks.worker_gateway(config)
        run_dir, host_local = host_run_dir(xdist_hooks.worker_run_dir(config), settings.results_dir,
                                           remote=bool(gateway.get("remote")), label=str(gateway.get("label", "host")))
        owns = False
    else:
        run_dir, owns = run_dir_name, True
    return RunState(run_dir=run_dir, owns_run_dir=owns, accounting=Accounting(), host_local=host_local)


def install_sigterm_handler() -> Any:
    """SIGTERM (a CI cancel, ``timeout``, ``kill``) ends Python without any teardown, which would leave
    the servers running: turn it into KeyboardInterrupt, as pytest does with Ctrl-C, so sessionfinish and
    unconfigure stop them. Only where no one else handles SIGTERM; a repeated SIGTERM during that
    (bounded) shutdown is ignored so the teardown is not cut short. Returns the handler it replaced (None
    where it installed none), for :func:`restore_sigterm_handler`."""
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None
    fired: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if fired:
            return
        fired.append(signum)
        raise KeyboardInterrupt("SIGTERM: stopping servers and ending the run")

    return signal.signal(signal.SIGTERM, on_sigterm)


def restore_sigterm_handler(previous: Any) -> None:
    signal.signal(signal.SIGTERM, previous)
