"""Helpers for the fault tests (not a stand-in): stand-in argv, config tables, and process accounting.

Processes are found by a unique token that a test puts in the server's command line or environment
(``env`` of the spec is inherited by every process the server spawns, engine workers included), so an
orphan is found even after it was re-parented, re-titled or left its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

STANDINS = Path(__file__).resolve().parent
ZERO_COST = STANDINS.parents[1] / "tools" / "zero_cost_server.py"
MARK_ENV = "LLMSERVE_FAULT_TOKEN"

T = TypeVar("T")


def standin_argv(script: str, *args: str) -> list[str]:
    """argv of a stand-in under the ``command`` engine (``{port}`` is filled in by the plugin)."""
    return [sys.executable, str(STANDINS / script), "--port", "{port}", *args]


def server_toml(name: str, **fields: Any) -> str:
    """A ``[servers.NAME]`` table (values as JSON, which is valid TOML for strings, numbers and lists)."""
    lines = [f"[servers.{name}]"]
    for key, value in fields.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def standin_toml(name: str, script: str, *args: str, token: str, **fields: Any) -> str:
    fields.setdefault("startup_timeout_s", 30)
    return server_toml(name, engine="command", argv=standin_argv(script, *args), served_model_name="standin",
                       env={MARK_ENV: token}, **fields)


def marked_processes(token: str) -> list[psutil.Process]:
    """Running processes (zombies excluded) whose command line or environment holds ``token``."""
    out = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if token in " ".join(proc.info["cmdline"] or ()):
                out.append(proc)
                continue
            if any(token in v for v in proc.environ().values()):
                out.append(proc)
    return out


def describe(procs: list[psutil.Process]) -> str:
    parts = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            parts.append(f"{p.pid} {' '.join(p.cmdline())[:150]}")
    return "; ".join(parts)


def kill_marked(token: str) -> int:
    """Cleanup after a failed test: SIGKILL what carries ``token`` (only our own processes do)."""
    procs = marked_processes(token)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def wait_for(check: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """Poll ``check`` until it returns something truthy; bounded, with a message naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def wait_or_kill(proc: subprocess.Popen[bytes], out: Path, timeout_s: float, what: str) -> int:
    """The exit code of an inner run writing to ``out``; one still running after ``timeout_s`` is killed and
    the test fails with its output."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise AssertionError(f"{what} did not end within {timeout_s} s:\n{out.read_text()}") from None
