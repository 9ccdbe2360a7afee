"""Nothing left behind when pytest is SIGKILLed: the marker every launched server carries, the registry
record that stays until the server's last process is gone, and ``kill-stale`` that finds orphans by
the marker alone while sparing a live run's server.

Stand-ins (sleeping processes carrying a marker) play the orphans here: the real engine's
``VLLM::EngineCore`` orphans after a SIGKILLed pytest are produced in tests/e2e/test_orphans_real.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import PreflightError
from pytest_llmserve.server import handle as server
from pytest_llmserve.server import isolation, procs
from pytest_llmserve.server.handle import ServerHandle
from tests.standins.helpers import MARK_ENV, STANDINS, marked_processes, wait_for

pytestmark = pytest.mark.usefixtures("private_registry")


def dead_owner() -> str:
    proc = psutil.Popen([sys.executable, "-c", "pass"])
    created = proc.create_time()
    proc.wait(10)
    return f"{proc.pid}:{created:.3f}"


def live_owner() -> str:
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


@pytest.fixture
def sleepers(token: str) -> Iterator[list[psutil.Popen]]:
    started: list[psutil.Popen] = []
    yield started
    for proc in started:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            proc.wait(10)


def sleeper(started: list[psutil.Popen], token: str, marker: str, owner: str, registry: Path) -> psutil.Popen:
    """A process in its own session carrying a server marker, as an engine worker left by its server."""
    env = {**os.environ, MARK_ENV: token, isolation.RUN_MARKER_ENV: marker, isolation.RUN_OWNER_ENV: owner,
           isolation.RUN_REGISTRY_ENV: str(registry)}
    proc = psutil.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env, start_new_session=True)
    started.append(proc)
    wait_for(lambda: isolation.marked_processes(marker), 10, "the marked process")
    return proc


def test_orphans_of_a_dead_run_are_found_by_marker_alone_and_a_live_run_s_are_spared(
        private_registry: Path, token: str, sleepers: list[psutil.Popen]) -> None:
    orphan = sleeper(sleepers, token, "llmserve-run-dead/default-abc", dead_owner(), private_registry)
    live = sleeper(sleepers, token, "llmserve-run-live/default-def", live_owner(), private_registry)
    elsewhere = sleeper(sleepers, token, "llmserve-run-other/x", dead_owner(), private_registry.parent / "other")
    stale = server.stale_servers()
    assert [(e["server"], e["orphans"]) for e in stale] == [("default-abc", [orphan.pid])]
    text = server.describe_stale(stale[0])
    assert "no record of it, 1 of its processes left: pid" in text
    assert "marker PYTEST_LLMSERVE_RUN=llmserve-run-dead/default-abc" in text

    with pytest.raises(PreflightError, match="stale server.*default-abc"):
        server.preflight(ServerSpec(name="x", engine="command", argv=("true",)), "127.0.0.1", procs.free_port())
    said: list[str] = []
    assert server.kill_stale(say=said.append) == 1
    assert "killed stale server default-abc" in said[0] and ": 1 processes" in said[0]
    psutil.wait_procs([orphan], timeout=10)
    assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
    assert live.is_running() and elsewhere.is_running()  # a live run's, and another registry's: untouched
    assert server.stale_servers() == []


def test_the_record_stays_while_processes_outlive_the_api_process(
        private_registry: Path, token: str, sleepers: list[psutil.Popen]) -> None:
    """The API process died (as when the OOM killer picks it) but its engine core runs on: the record is
    kept, names the leftovers, and kill-stale stops them and only then drops the record."""
    marker, owner = "llmserve-run-gone/default-123", dead_owner()
    api = psutil.Popen([sys.executable, "-c", "pass"])
    api_created = api.create_time()
    api.wait(10)
    core = sleeper(sleepers, token, marker, owner, private_registry)
    private_registry.mkdir(parents=True, exist_ok=True)
    record = private_registry / f"{api.pid}.json"
    record.write_text(json.dumps({"pid": api.pid, "create_time": api_created, "port": 1, "server": "default",
                                  "owner_pid": int(owner.split(":")[0]), "owner_create_time": None,
                                  "log": "/logs/default.log", "marker": marker, "owner": owner}))
    stale = server.stale_servers()
    assert len(stale) == 1 and record.exists()
    assert stale[0]["orphans"] == [core.pid]
    assert f"default (its API process (pid {api.pid}) exited, 1 of its processes left: pid {core.pid}" in \
        server.describe_stale(stale[0])
    assert server.kill_stale(say=lambda msg: None) == 1
    assert not record.exists()
    assert not isolation.marked_processes(marker)


RETITLED_CORE = (
    "import os, subprocess, sys, time; "
    "core = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], env=dict(), stdout=subprocess.DEVNULL); "
    "print(core.pid, flush=True)")


def test_a_dead_api_process_s_group_is_found_although_its_members_lost_the_marker(
        private_registry: Path, token: str) -> None:
    """Stand-in: the API process starts an engine core whose environment no longer shows the marker (vLLM's
    ``VLLM::EngineCore`` retitles itself over it), then dies. The core keeps the API process's group id."""
    marker, owner = "llmserve-run-gone/default-456", dead_owner()
    env = {**os.environ, isolation.RUN_MARKER_ENV: marker, isolation.RUN_OWNER_ENV: owner,
           isolation.RUN_REGISTRY_ENV: str(private_registry)}
    api = psutil.Popen([sys.executable, "-c", RETITLED_CORE], env=env, start_new_session=True,
                       stdout=subprocess.PIPE)
    api_created = api.create_time()
    core = psutil.Process(int(api.communicate(timeout=30)[0]))
    try:
        assert os.getpgid(core.pid) == api.pid and isolation.RUN_MARKER_ENV not in core.environ()
        private_registry.mkdir(parents=True, exist_ok=True)
        record = private_registry / f"{api.pid}.json"
        record.write_text(json.dumps({"pid": api.pid, "create_time": api_created, "port": 1, "server": "default",
                                      "owner_pid": int(owner.split(":")[0]), "log": "/l.log", "marker": marker,
                                      "owner": owner}))
        stale = server.stale_servers()
        assert [e["orphans"] for e in stale] == [[core.pid]] and record.exists()
        assert server.kill_stale(say=lambda msg: None) == 1
        psutil.wait_procs([core], timeout=10)
        assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE
        assert not record.exists()
    finally:
        with contextlib.suppress(psutil.Error):
            core.kill()


STRAY_SERVER = (
    "import os, subprocess, sys; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
    "os.execv(sys.executable, [sys.executable, sys.argv[1], '--port', sys.argv[2]])")


def test_a_launched_server_carries_the_marker_and_teardown_stops_what_left_its_group(
        tmp_path: Path, token: str, private_registry: Path) -> None:
    """Stand-in: a server that starts a helper in a session of its own (as engines that call setsid do):
    neither its tree walk nor its process group finds the helper once re-parented; the marker does."""
    spec = ServerSpec(name="stray", engine="command", served_model_name="standin", source="t.toml",
                      argv=(sys.executable, "-c", STRAY_SERVER, str(STANDINS / "fail_once.py"), "{port}"),
                      env=((MARK_ENV, token),), startup_timeout_s=30.0)
    handle = ServerHandle(spec, log_dir=tmp_path / "logs", run_id="llmserve-run-t", server_key="stray-k")
    handle.start()
    try:
        assert handle.marker == "llmserve-run-t/stray-k"
        marked = isolation.marked_processes(handle.marker)
        assert len(marked) == 2  # the server and its helper in another session
        env = psutil.Process(handle.pid or 0).environ()
        assert env[isolation.RUN_OWNER_ENV] == f"{os.getpid()}:{procs.create_time(os.getpid()):.3f}"
        assert env[isolation.RUN_REGISTRY_ENV] == str(private_registry)
        record = json.loads((private_registry / f"{handle.pid}.json").read_text())
        assert record["marker"] == handle.marker
        assert server.stale_servers() == []  # this run is alive
    finally:
        report = handle.stop()
    assert report is not None and not report.survivors
    assert not marked_processes(token)
    assert not list(private_registry.glob("*.json"))
