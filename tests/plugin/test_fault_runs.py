"""The fault matrix through whole pytest runs (pytester): what a user sees when a stand-in server
(``tests/standins/``, under the ``command`` engine) misbehaves, when the run is signalled, when an xdist
worker crashes, and when a setting or marker argument is wrong. The server-level faults are in
``tests/unit/server/test_faults_unit.py``; what the real vLLM CPU server does is in ``tests/e2e/test_faults.py``.

Every test is bounded and checks that no process it caused is left (the ``token`` fixture).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.standins.helpers import (
    MARK_ENV,
    ZERO_COST,
    marked_processes,
    server_toml,
    standin_toml,
    wait_for,
)

# The registry is private to each test, so other runs on this machine neither see nor disturb ours.
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    """Inner runs get a pytest.ini, so their rootdir (and config file) is theirs, whatever lies above."""
    pytester.makeini("[pytest]\n")


def _holder(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A foreign process listening on a port (a distinctive command line, so the refusal can name it)."""
    code = ("import socket,sys,time\ns=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(120)  # llmserve-port-holder\n")
    script = tmp_path / "llmserve_port_holder.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, port


def test_taken_port_is_refused_naming_the_holder_and_free_port_picking_avoids_it(
        pytester: pytest.Pytester, tmp_path: Path, token: str) -> None:
    holder, port = _holder(tmp_path)
    try:
        pytester.makefile(".toml", llmserve=standin_toml("fixed", "fail_once.py", token=token, port=port)
                          + standin_toml("free", "fail_once.py", token=token))
        pytester.makepyfile(test_port="""
            import pytest

            @pytest.mark.llmserve_server("fixed")
            def test_fixed(llm_server):
                pass

            @pytest.mark.llmserve_server("free")
            def test_free(llm_server):
                print("FREE PORT", llm_server.port)
        """)
        start = time.monotonic()
        result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", timeout=120)
        elapsed = time.monotonic() - start
        result.assert_outcomes(passed=1, errors=1)  # the refused server's test errors in setup
        out = result.stdout.str()
        assert f"port {port} on 127.0.0.1 is taken by pid {holder.pid} (" in out
        assert "llmserve_port_holder.py" in out  # who holds it
        assert "leave `port` unset in " in out and "llmserve.toml" in out  # where it came from, how to clear
        free = int(out.split("FREE PORT ")[1].split()[0])
        assert free != port
        print(f"MEASURE port-taken: inner run (refusal + a stand-in boot) {elapsed:.1f} s")
    finally:
        holder.kill()
        holder.wait(10)
        assert holder.stdout is not None
        holder.stdout.close()


def _spawn_pytest(pytester: pytest.Pytester, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    out = pytester.path / f"inner-{uuid.uuid4().hex[:6]}.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", *args],
                                cwd=pytester.path, stdout=fh, stderr=subprocess.STDOUT)
    return proc, out


def test_sigterm_during_boot_stops_the_booting_server(pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: never_ready.py (a boot that lasts as long as the test needs; the real engine's SIGINT and
    SIGTERM with the server up are in tests/e2e/test_faults.py)."""
    pytester.makefile(".toml", llmserve=standin_toml("slow", "never_ready.py", token=token,
                                                     startup_timeout_s=300))
    pytester.makepyfile(test_boot="def test_boot(llm_server):\n    pass\n")
    proc, out = _spawn_pytest(pytester)
    try:
        wait_for(lambda: marked_processes(token), 60, "the stand-in server to be launched")
        time.sleep(1.0)  # inside readiness polling
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        elapsed = time.monotonic() - sent
        text = out.read_text()
        assert code == pytest.ExitCode.INTERRUPTED, text
        assert "KeyboardInterrupt" in text and "SIGTERM" in text
        assert not marked_processes(token), text
        assert elapsed / 300 < 0.1
        print(f"MEASURE sigterm-during-boot: pytest ended {elapsed:.2f} s after SIGTERM, server gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_xdist_worker_crash_under_the_default_loadgroup_still_leaves_no_server(
        pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: fail_once.py as the shared server (the real engine's worker crash is in
    tests/e2e/test_faults.py). With ``-n 2`` the plugin runs ``--dist loadgroup``; pytest-xdist 3.8.0's
    loadgroup scheduler hangs once a crashed worker is replaced (pytest-dev/pytest-xdist#1323, #1327).
    Whether or not it hangs, the shared server must not outlive the run: a CI timeout's SIGTERM ends it."""
    pytester.makefile(".toml", llmserve=standin_toml("default", "fail_once.py", token=token))
    pytester.makepyfile(test_crash="""
        import os
        import pytest

        @pytest.mark.xdist_group("crash")
        def test_crash(llm_server):
            os._exit(3)

        @pytest.mark.xdist_group("live")
        @pytest.mark.parametrize("i", range(2))
        def test_live(llm_server, llm_client, i):
            assert llm_client.complete("Hello", 2).ok
    """)
    proc, out = _spawn_pytest(pytester, "-n", "2", "-v")
    try:
        wait_for(lambda: "node down" in out.read_text() or proc.poll() is not None, 120, "the worker crash")
        wait_for(lambda: "PASSED test_crash.py::test_live" in out.read_text() or proc.poll() is not None, 60,
                 "a live test after the crash")
        try:
            # A fixed pytest-xdist ends here by itself, within a second or two of the live test; a hang is not told
            # apart any better by waiting longer (the assertions below hold either way).
            proc.wait(5)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        text = out.read_text()
        assert not marked_processes(token), text
        assert "stopped shared server default" in text
        assert proc.returncode == (pytest.ExitCode.INTERRUPTED if hung else pytest.ExitCode.TESTS_FAILED), text
        print(f"MEASURE xdist loadgroup after a worker crash: {'hung (upstream bug), ended by SIGTERM' if hung else 'ended by itself'}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _failing_gate_run(pytester: pytest.Pytester, table: str) -> str:
    """Run one benchmark gate (workload ``tiny``, one round) on the server of ``table``, which must fail it;
    return the run's output."""
    pytester.makefile(".toml", llmserve=table)
    pytester.makepyfile(test_gate="""
        import pytest

        @pytest.mark.llmserve_benchmark(workload="tiny", rounds=1)
        def test_gate(llm_bench):
            llm_bench.run()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=1)
    return result.stdout.str()


def test_the_gate_bounds_each_measured_request_by_the_servers_request_timeout(
        pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: silent.py (passes readiness, then never answers: a wedged engine cannot be made on demand).
    The gate hands the server's ``request_timeout_s`` to the load generator instead of its 300 s default."""
    out = _failing_gate_run(pytester, standin_toml("wedged", "silent.py", token=token, request_timeout_s=1.0)
                            + "[workloads.tiny]\nnum_prompts = 2\ninput_len = 4\noutput_len = 4\nwarmup = 0\n")
    assert "warm-up round 1 on wedged is INVALID (not a number)" in out  # the first round warms up
    assert "timed out after 1 s" in out  # the server's 1 s, not the generator's default
    # The auxiliary requests before the round (/metrics, /version, /tokenize) are bounded by it too: with their
    # own 10 + 10 + 30 s timeouts the run could not take less than 50 s against this wedged server.
    wall = float(re.search(r"time: wall ([\d.]+) s", out).group(1))  # type: ignore[union-attr]
    assert wall < 50, out


def test_measured_request_is_never_retried_through_the_gate(pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: fail_once.py (exactly one measured request fails; readiness answers 503 three times first)."""
    pytester.makefile(".toml", llmserve=standin_toml("flaky", "fail_once.py", "--health-503", "3", token=token)
                      + "[workloads.four]\nnum_prompts = 4\ninput_len = 4\noutput_len = 8\nwarmup = 0\n")
    pytester.makepyfile(test_gate="""
        import httpx
        import pytest

        @pytest.mark.llmserve_benchmark(workload="four", rounds=1)
        def test_gate(llm_server, llm_bench):
            try:
                llm_bench.run()
            finally:
                print("STATS", httpx.get(llm_server.base_url + "/stats").text)
    """)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "warm-up round 1 on flaky is INVALID (not a number)" in out
    assert "1 of 4 requests failed (requests are never retried)" in out
    assert "HTTP 500" in out and "injected transient failure" in out
    stats = json.loads(out.split("STATS ", 1)[1].splitlines()[0])
    assert stats["streamed"] == 4 and stats["failed"] == 1  # four sent, none resent
    assert stats["health"] >= 4  # readiness was retried through the three 503s


def test_stream_cut_mid_way_fails_the_gate_with_what_was_received(pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: tools/zero_cost_server.py --drop-after (a connection cut mid-stream at a chosen chunk)."""
    argv = [sys.executable, str(ZERO_COST), "--port", "{port}", "--drop-after", "5", "--fault-every", "2",
            "--token-delay-ms", "0.5"]
    out = _failing_gate_run(pytester, server_toml("cut", engine="command", argv=argv, served_model_name="zero-cost",
                                                  env={MARK_ENV: token}, startup_timeout_s=30)
                            + "[workloads.tiny]\nnum_prompts = 4\ninput_len = 4\noutput_len = 16\nwarmup = 0\n")
    assert "is INVALID (not a number)" in out
    assert "2 of 4 requests failed" in out
    assert "stream ended after 5 chunks without [DONE]: last bytes" in out  # what was received


@pytest.mark.parametrize(("marker", "expected"), [
    ("tolerance=2", "marker llmserve_benchmark tolerance = 2: must be a fraction below 1"),
    ("rounds=0", "marker llmserve_benchmark rounds = 0: must be a positive integer"),
    ("max_rounds='many'", "marker llmserve_benchmark max_rounds = 'many': must be a positive integer"),
    ("rounds_=3", "marker llmserve_benchmark: unknown argument rounds_=3 (known: "),
    ("higher_is_better='yes'", "higher_is_better = 'yes': must be True or False"),
    ("metric='tokens'", "metric = 'tokens': unknown metric"),
    ("'tiny', 'small'", "takes at most one positional argument (the workload), got ('tiny', 'small')"),
])
def test_bad_benchmark_marker_argument_is_a_usage_error_naming_test_and_value(
        pytester: pytest.Pytester, token: str, marker: str, expected: str) -> None:
    pytester.makefile(".toml", llmserve=standin_toml("s", "fail_once.py", token=token))
    pytester.makepyfile(test_marker=f"""
        import pytest

        @pytest.mark.llmserve_benchmark({marker})
        def test_bench(llm_bench):
            llm_bench.run()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    out = result.stdout.str() + result.stderr.str()
    assert "test_marker.py::test_bench" in out and expected in out, out
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "booting" not in out  # refused at collection, before any server boots


@pytest.mark.parametrize(("where", "expected"), [
    ("env", "$PYTEST_LLMSERVE_ROUNDS = '0': must be a positive integer"),
    ("ini", "ini llmserve_max_rounds: invalid literal for int() with base 10: 'lots'"),
    ("ini-zero", "ini llmserve_max_rounds = 0: must be a positive integer"),
    ("file-port", "[tool.llmserve.servers.a] port = 70000: must be a port number below 65536"),
    ("file-workload", "[tool.llmserve.workloads.w] num_prompts = 0: must be a positive integer"),
    ("file-matrix", "[tool.llmserve.matrix.a] unknown or non-varying key 'engine'"),
])
def test_bad_setting_is_a_usage_error_naming_value_and_source(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, expected: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    args: list[str] = []
    if where == "env":
        monkeypatch.setenv("PYTEST_LLMSERVE_ROUNDS", "0")
    elif where == "ini":
        pytester.makeini("[pytest]\nllmserve_max_rounds = lots\n")
    elif where == "ini-zero":
        pytester.makeini("[pytest]\nllmserve_max_rounds = 0\n")
    else:
        body = {"file-port": '[servers.a]\nmodel = "/m"\nport = 70000\n',
                "file-workload": '[workloads.w]\nnum_prompts = 0\n',
                "file-matrix": '[servers.a]\nmodel = "/m"\n[matrix.a]\nengine = ["sglang"]\n'}[where]
        pytester.makefile(".toml", llmserve=body)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert expected in err, err
    if where.startswith("file"):
        assert str(pytester.path / "llmserve.toml") in err
