"""Nothing left behind when pytest is SIGKILLed, on the real vLLM CPU server (one boot).

O boots the server and is SIGKILLed (a CI runner's hard kill): its ``VLLM::EngineCore`` and
``VLLM::Worker`` live on, retitled (a lower-case ``pgrep vllm`` misses them). Their registry record is
then removed, as the issue found it ("the registry no longer listed them"), so only the marker the
plugin put in the server's environment (and the process group the engine processes share with the API
process) can find them. While L, a concurrently live run, holds its own server, R (the next run) is
refused by its preflight naming the orphans, and ``llmserve kill-stale`` stops every one of them and
spares L's server. L's server is a stand-in: two real vLLM servers at once would halve a 2-core
machine for nothing, and sparing a live run is decided by the run's marker whatever the engine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from pytest_llmserve.server import isolation, procs
from tests.e2e.test_faults import STARTUP_TIMEOUT_S, Inner, Workdir
from tests.standins.helpers import marked_processes, standin_toml, wait_for

pytestmark = pytest.mark.slow

HOLD = """
    import json
    import pathlib
    import time

    import psutil


    def test_hold(llm_server):
        env = psutil.Process(llm_server.pid).environ()
        pathlib.Path("up.json").write_text(json.dumps({"pid": llm_server.pid,
                                                       "marker": env["PYTEST_LLMSERVE_RUN"]}))
        # Held until the outer test releases it: the bound only keeps a lost release from running forever
        # (a slow host's boot of O must never end L's hold before kill-stale has looked at it).
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and not pathlib.Path("release").exists():
            time.sleep(0.1)
"""


def alive(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out


@dataclass
class Story:
    up: dict[str, Any]
    orphans: dict[int, str]  # pid -> name, right after O was SIGKILLed
    marker_in_engine_env: bool
    refused: Inner
    kill_stale: subprocess.CompletedProcess[str]
    left: list[psutil.Process]
    live_spared: bool
    live: Inner


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    wd = Workdir(tmp_path_factory.mktemp("orphans"))
    table, _token = wd.server("default")
    wd.write("llmserve.toml", table)
    wd.write("test_hold.py", HOLD)
    live_dir = wd.path / "live"
    live_token = "fault-live-" + _token
    wd.tokens.append(live_token)
    wd.write("live/llmserve.toml", standin_toml("default", "fail_once.py", token=live_token))
    wd.write("live/pytest.ini", "[pytest]\n")
    wd.write("live/test_hold.py", HOLD)
    running: list[subprocess.Popen[bytes]] = []
    orphans: dict[int, str] = {}
    try:
        # L first: a live run (and its server) is up all along, and O's and R's preflights spare it.
        live, live_out, live_started = wd.spawn("L", cwd=live_dir)
        running.append(live)
        wait_for(lambda: (live_dir / "up.json").exists() or live.poll() is not None, 60, "L's server")
        assert live.poll() is None, live_out.read_text()
        live_up = json.loads((live_dir / "up.json").read_text())

        o, o_out, o_started = wd.spawn("O", "test_hold.py")
        running.append(o)
        wait_for(lambda: (wd.path / "up.json").exists() or o.poll() is not None, STARTUP_TIMEOUT_S, "O's server")
        assert o.poll() is None, o_out.read_text()
        up = json.loads((wd.path / "up.json").read_text())
        o.send_signal(signal.SIGKILL)
        wd.finish("O", o, o_out, o_started, 30)
        group = isolation.group_of(up["pid"])
        orphans = {p.pid: p.name() for p in group}
        engine = [p for p in group if p.name().startswith("VLLM::")]
        marker_in_engine_env = any(isolation.RUN_MARKER_ENV in p.environ() for p in engine)
        # The state the issue found: no record of the server in the registry.
        for record in (wd.cache / "running").glob("*.json"):
            record.unlink()

        refused = wd.run("R", "test_hold.py", "-rA", timeout_s=300)
        killer = subprocess.run([str(Path(sys.executable).parent / "llmserve"), "kill-stale"], env=wd.env,
                                capture_output=True, text=True, timeout=120, check=False)
        left = alive(list(orphans)) + [m for m in alive([p.pid for p in marked_processes(up["marker"])])]
        live_spared = procs.pid_alive(live_up["pid"])
        (live_dir / "release").write_text("")
        live_run = wd.finish("L", live, live_out, live_started, 120)
        yield Story(up, orphans, marker_in_engine_env, refused, killer, left, live_spared, live_run)
    finally:
        for proc in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        for proc in alive(list(orphans)):
            proc.kill()
        wd.cleanup()


def test_sigkilled_pytest_leaves_retitled_engine_orphans(story: Story) -> None:
    names = sorted(story.orphans.values())
    assert story.up["pid"] in story.orphans, names  # the API process
    assert "VLLM::EngineCore" in names, names
    print(f"MEASURE orphans after SIGKILL: {names}; marker readable in the engine processes' environ: "
          f"{story.marker_in_engine_env}")


def test_the_next_run_s_preflight_names_the_unrecorded_orphans_by_marker(story: Story) -> None:
    out = story.refused.out
    assert story.refused.code != 0
    assert "stale server(s) from an earlier run are still running" in out, out
    assert "no record of it" in out and f"marker PYTEST_LLMSERVE_RUN={story.up['marker']}" in out, out
    assert "VLLM::EngineCore" in out, out
    assert "Stop them with `llmserve kill-stale`" in out


def test_kill_stale_stops_every_orphan_and_spares_the_live_run(story: Story) -> None:
    out = story.kill_stale.stdout + story.kill_stale.stderr
    assert story.kill_stale.returncode == 0, out
    assert f"killed stale server {story.up['marker'].rpartition('/')[2]}" in out, out
    assert "stopped 1 stale server(s)" in out, out
    assert not story.left, [procs.describe(p) for p in story.left]
    assert story.live_spared
    assert story.live.code == 0 and story.live.outcome_count("passed") == 1, story.live.out
