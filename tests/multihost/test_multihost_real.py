"""Two hosts over real ssh, the real vLLM CPU server on each: the embedded default's two configurations
(``max_batch_size`` 4 and 8, eager) spread by pytest-xdist's own ``--tx ssh=...`` gateways.

The hosts are OpenSSH servers on 127.0.0.2 and 127.0.0.3 (tests/multihost/sshhosts.py), each with its own
key, working directory, HOME, TMPDIR and registry of running servers; the workers run this checkout's
venv python (``//python=``) and get the inner project by ``--rsyncdir``. Scenario one: each configuration
boots exactly once, on its own host, and the controller's summary merges both. Scenario two: while host2
runs its configuration, its sshd and pytest worker are SIGKILLed (its server is spared, as a stand-in for
the processes a dead machine would take with it): its tests fail naming the host and why, host1 completes,
and ``llmserve kill-stale`` on host2 finds the orphaned server. Selected with ``-m multihost`` (tox -e
multihost); deselected from the default run (each scenario is minutes of real boots).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from pytest_llmserve.engines import embedded
from tests.e2e.conftest import default_server_toml
from tests.multihost import sshhosts
from tests.standins.helpers import MARK_ENV, describe, kill_marked, marked_processes, wait_or_kill

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

PYTHON = sys.executable  # this checkout's venv: the package is installed there (editable), on both "hosts"
INNER_TIMEOUT_S = 1800

TESTS = """
    import pathlib
    import time

    SIGNALS = pathlib.Path({signals!r})


    def test_a_generates(llm_server, llm_client):
        assert llm_client.complete("The capital of France is", max_tokens=4).text.strip()


    def test_b_second(request, llm_server, llm_client):
        if {hold!r} and "max_batch_size=8" in request.node.name:
            # The host running this configuration is killed here; the test waits to be cut off.
            (SIGNALS / "host-of-8-is-busy").write_text(str(llm_server.base_url))
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                time.sleep(0.5)
        assert llm_client.complete("One, two, three,", max_tokens=4).text.strip()


    def test_c_third(llm_server):
        assert llm_server.base_url
"""


@dataclass
class MultiRun:
    hosts: sshhosts.Hosts
    project: Path
    token: str
    code: int
    out: str
    seconds: float
    killed: list[int]
    left_before_sweep: list[str]
    sweep: str
    left: list[str]


def _project(root: Path, token: str, *, hold: bool) -> Path:
    project = root / "proj"
    (project / "signals").mkdir(parents=True)
    spec = embedded.default_spec()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "llmserve.toml").write_text(
        default_server_toml("default", env={**dict(spec.env), MARK_ENV: token})
        + "[matrix.default]\nmax_batch_size = [4, 8]\n")
    (project / "test_hosts.py").write_text(textwrap.dedent(TESTS.format(signals=str(project / "signals"),
                                                                         hold=hold)))
    return project


def _run(root: Path, *, kill_host2: bool) -> Iterator[MultiRun]:
    reason = sshhosts.available()
    if reason:
        pytest.skip(reason)
    if not embedded.is_ready():
        pytest.skip("embedded default not set up: run `llmserve setup`")
    hosts = sshhosts.Hosts(root / "hosts")
    token = f"multihost-{uuid.uuid4().hex[:12]}"
    try:
        project = _project(root, token, hold=kill_host2)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        env.update({"COLUMNS": "400", "PYTHONDONTWRITEBYTECODE": "1",
                    "PYTEST_LLMSERVE_CACHE": str(root / "controller-cache")})
        args = [PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--dist", "loadgroup",
                *[arg for host in hosts.hosts for arg in ("--tx", hosts.tx(host, PYTHON))],
                "--rsyncdir", str(project), str(project)]
        out_path = root / "out.txt"
        started = time.monotonic()
        killed: list[int] = []
        with open(out_path, "wb") as fh:
            proc = subprocess.Popen(args, cwd=project, env=env, stdout=fh, stderr=subprocess.STDOUT)
            busy = project / "signals" / "host-of-8-is-busy"
            while kill_host2 and proc.poll() is None and time.monotonic() - started < INNER_TIMEOUT_S:
                if busy.exists():
                    servers = {p.pid for p in marked_processes(token)}
                    host2 = next(h for h in hosts.hosts if h.alias == _host_of_config8(hosts))
                    killed = hosts.kill(host2, spare=servers)
                    break
                time.sleep(0.5)
            code = wait_or_kill(proc, out_path, INNER_TIMEOUT_S, "the multihost inner run")
        seconds = time.monotonic() - started
        out = out_path.read_text(errors="replace")
        print(out)
        print(f"MEASURE multihost run ({'host2 killed' if kill_host2 else 'healthy'}): {seconds:.1f} s wall")
        left_before = [describe([p]) for p in marked_processes(token)]
        print(f"MEASURE left when the run ended: {left_before}")
        sweeps = []
        for host in hosts.hosts:
            # What a next run's preflight does on that host: its registry, its orphans.
            sweep = subprocess.run([str(Path(PYTHON).parent / "llmserve"), "kill-stale"], capture_output=True,
                                   text=True, env={**env, **host.env}, timeout=300)
            sweeps.append(f"{host.alias}: {sweep.stdout.strip()} {sweep.stderr.strip()}".strip())
        psutil.wait_procs([p for p in marked_processes(token)], timeout=30)
        left = [describe([p]) for p in marked_processes(token)]
        yield MultiRun(hosts, project, token, code, out, seconds, killed, left_before, "\n".join(sweeps), left)
    finally:
        kill_marked(token)
        hosts.stop()


def _host_of_config8(hosts: sshhosts.Hosts) -> str:
    """The host whose workdir holds the max_batch_size=8 server's log (found on disk: the test does not
    assume which gateway the scheduler gave it)."""
    for host in hosts.hosts:
        if list(host.workdir.glob("proj/llmserve-results/logs/default_max_batch_size_8_*.log")):
            return host.alias
    return hosts.hosts[1].alias


def _rows(out: str) -> dict[str, str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("configurations by host:"))
    rows = {}
    for line in lines[start + 1:]:
        found = re.match(r"^  (default\[max_batch_size=\d\]): (.*)$", line)
        if not found:
            break
        rows[found.group(1)] = found.group(2)
    return rows


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    yield from _run(tmp_path_factory.mktemp("healthy"), kill_host2=False)


@pytest.fixture(scope="module")
def host2_dies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiRun]:
    yield from _run(tmp_path_factory.mktemp("dies"), kill_host2=True)


def test_each_configuration_boots_once_on_its_own_host_and_the_summary_merges_them(healthy: MultiRun) -> None:
    assert healthy.code == 0, healthy.out
    rows = _rows(healthy.out)
    assert set(rows) == {"default[max_batch_size=4]", "default[max_batch_size=8]"}, healthy.out
    hosts_used = {re.match(r"host ([^\s;(]+)", row).group(1) for row in rows.values()}  # type: ignore[union-attr]
    assert hosts_used == {"host1", "host2"}, rows
    for row in rows.values():
        assert "boots 1;" in row and "3 passed" in row and "failed" not in row, row
    # Each host booted only its own configuration: its logs are in its own working directory.
    for host in healthy.hosts.hosts:
        logs = sorted(p.name for p in host.workdir.glob("proj/llmserve-results/logs/*.log"))
        assert len(logs) == 1, (host.alias, logs)
    merged = json.loads((healthy.project / "llmserve-results" / "hosts.json").read_text())
    assert sorted((r["server"], r["boots"], r["verdicts"]["passed"]) for r in merged) == [
        ("default[max_batch_size=4]", 1, 3), ("default[max_batch_size=8]", 1, 3)]


def test_each_host_stopped_its_own_servers(healthy: MultiRun) -> None:
    assert healthy.left_before_sweep == [], healthy.left_before_sweep
    assert healthy.left == []


def test_a_dead_host_fails_its_tests_naming_it_and_the_other_host_completes(host2_dies: MultiRun) -> None:
    run = host2_dies
    assert run.killed, "host2 was never busy with its configuration"
    assert run.code == 1, run.out
    rows = _rows(run.out)
    row8, row4 = rows["default[max_batch_size=8]"], rows["default[max_batch_size=4]"]
    assert "3 passed" in row4 and "failed" not in row4, row4
    assert "host went down" in row8 and "2 failed" in row8, row8
    failures = [line for line in run.out.splitlines() if line.startswith("FAILED")]
    assert len(failures) == 2, failures
    host8 = re.match(r"host ([^\s;(]+)", row8).group(1)  # type: ignore[union-attr]
    assert all(f"host {host8} (gw" in line for line in failures), failures
    assert any("went down while running" in line and "test_b_second" in line for line in failures), failures
    assert any("went down before" in line and "test_c_third" in line for line in failures), failures


def test_no_server_is_left_on_either_host_after_the_next_runs_sweep(host2_dies: MultiRun) -> None:
    # The dead host's server lost its owner (its worker was SIGKILLed; its processes were spared by the
    # kill). Whatever of it was still running when the run ended, the sweep on that host (what the next
    # run's preflight does there) must account for: afterwards nothing carries the run's token.
    print(f"MEASURE dead host: left before the sweep: {host2_dies.left_before_sweep}; sweep: {host2_dies.sweep}")
    if host2_dies.left_before_sweep:
        assert "stopped 0 " not in host2_dies.sweep.split("host2:")[1], host2_dies.sweep
    assert host2_dies.left == [], host2_dies.left
