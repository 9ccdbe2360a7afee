"""The fault matrix on the real vLLM CPU server: faults the real engine produces for real.

A real boot costs ~35 s on 2 cores, so the faults are grouped into four scenarios (module-scoped
fixtures, each a few inner pytest runs on one real server at a time); the tests below only read what
a scenario recorded. Faults the engine cannot produce on demand (a hang, a crash at a chosen moment)
are in ``tests/unit/server/test_faults_unit.py`` with purpose-built stand-ins.

Isolation: every scenario runs in its own directory with its own HOME (engine caches), TMPDIR and
registry of running servers (``PYTEST_LLMSERVE_CACHE``), so neither other runs on this machine nor the
stale server we make on purpose disturb anyone. The model is a uniquely named symlink to the real one
and every server carries a unique token in its environment (inherited by its engine workers), so
processes left behind are counted exactly (psutil), whatever their command line says.

Times are measured and printed (``MEASURE``); assertions use ratios to the configured deadline or
timeout, never absolute times.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from pytest_llmserve.config import CACHE_ENV
from pytest_llmserve.engines import embedded
from pytest_llmserve.store.baselines import BaselineStore, BenchKey, read_baseline_file
from tests.e2e.conftest import REAL_CACHE, default_server_toml
from tests.standins.helpers import (
    MARK_ENV,
    describe,
    kill_marked,
    marked_processes,
    standin_toml,
    wait_for,
    wait_or_kill,
)

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 600.0
# No warm-up request in each round, as in tests/e2e/conftest.py's TINY_WORKLOAD (it was a third of a round there).
TINY = "[workloads.tiny]\nnum_prompts = 4\ninput_len = 16\noutput_len = 16\nmax_concurrency = 4\nwarmup = 0\n"
# The two concurrent baseline writers' workload: 64 tokens a request. With 16, on a 2-core AVX-512 host (rounds of
# 0.4 s, the two writers' clients and the server sharing the cores), two rounds in a row had 3 of 4 requests' chunks
# in one read (a fresh-clone rehearsal, 2026-12-05): a measurement artefact, rightly not a number, which failed
# the writer after its two allowed retries. A longer stream is not read in one go by a client descheduled for a
# moment.
WRITERS_TINY = TINY.replace("output_len = 16", "output_len = 64")
DURATION = re.compile(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)$")


@dataclass
class Inner:
    """One inner pytest run: its exit code, its output and how long it took."""

    name: str
    code: int
    out: str
    seconds: float
    durations: dict[tuple[str, str], float] = field(default_factory=dict)

    def outcome_count(self, word: str) -> int:
        finals = [ln for ln in self.out.splitlines() if re.match(r"^=+ .* in [\d.]+s.* =+$", ln)]
        found = re.search(rf"(\d+) {word}", finals[-1]) if finals else None
        return int(found.group(1)) if found else 0


class Workdir:
    """A directory to run inner pytest sessions in, with the real engine and a private registry."""

    def __init__(self, root: Path) -> None:
        self.path = root
        (root / "home").mkdir()
        (root / "tmp").mkdir()
        (root / "pytest.ini").write_text("[pytest]\n")
        with mock.patch.dict(os.environ, {CACHE_ENV: REAL_CACHE}):
            self.real = embedded.default_spec()
        self.model = root / f"model-{uuid.uuid4().hex[:10]}"
        self.model.symlink_to(self.real.model or "")
        self.cache = root / "llmserve-cache"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
        self.env.update({"HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), CACHE_ENV: str(self.cache),
                         "PYTHONDONTWRITEBYTECODE": "1"})
        self.env["COLUMNS"] = "400"  # summary lines are not cut at 80 columns
        self.tokens: list[str] = []
        self.notes: dict[str, Any] = {}

    def server(self, name: str, **overrides: Any) -> tuple[str, str]:
        """A real-engine server table and its unique process token."""
        token = f"fault-{uuid.uuid4().hex[:12]}"
        self.tokens.append(token)
        env = {**dict(self.real.env), MARK_ENV: token, **overrides.pop("env", {})}
        fields: dict[str, Any] = {"model": str(self.model), "python": self.real.python, "env": env,
                                  "startup_timeout_s": STARTUP_TIMEOUT_S}
        fields.update(overrides)
        return default_server_toml(name, **fields), token

    def write(self, name: str, text: str) -> Path:
        path = self.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        return path

    def spawn(self, name: str, *args: str, cwd: Path | None = None,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path, float]:
        out = self.path / f"out-{name}.txt"
        pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "--durations=0",
                       "--durations-min=0", *args]
        # The inner run starts as a user's foreground pytest would, with SIGINT at its default: an outer run
        # launched in the background by a shell (`cmd &`, nohup) inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt handler, so the Ctrl-C scenario would wait forever (seen in a
        # rehearsal started that way). Reset, then exec: the pid stays the one signalled.
        reset_sigint = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                        "os.execv(sys.executable, sys.argv[1:])")
        with open(out, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-c", reset_sigint, *pytest_argv], cwd=cwd or self.path, stdout=fh,
                stderr=subprocess.STDOUT, env={**self.env, **(env or {})})
        return proc, out, time.monotonic()

    def finish(self, name: str, proc: subprocess.Popen[bytes], out: Path, started: float,
               timeout_s: float = 600) -> Inner:
        code = wait_or_kill(proc, out, timeout_s, f"inner run {name}")
        text = out.read_text(errors="replace")
        durations = {}
        for line in text.splitlines():
            found = DURATION.match(line.strip())
            if found:
                durations[(found.group(3).split("::", 1)[-1], found.group(2))] = float(found.group(1))
        return Inner(name, code, text, time.monotonic() - started, durations)

    def run(self, name: str, *args: str, timeout_s: float = 600, **kw: Any) -> Inner:
        proc, out, started = self.spawn(name, *args, **kw)
        return self.finish(name, proc, out, started, timeout_s)

    def leftovers(self) -> list[str]:
        """Processes still carrying a server's token (environment) or this run's unique model path (argv)."""
        marks = [*self.tokens, str(self.model)]
        return [describe(marked_processes(t)) for t in marks if marked_processes(t)]

    def cleanup(self) -> None:
        for token in self.tokens:
            kill_marked(token)


def _files(root: Path, skip: tuple[str, ...] = ()) -> dict[str, float]:
    out = {}
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        if path.is_file() and not path.is_symlink() and not rel.startswith(skip):
            out[rel] = path.stat().st_mtime
    return out


def measure(what: str, seconds: float, limit_s: float, limit_name: str) -> float:
    ratio = seconds / limit_s
    print(f"MEASURE {what}: {seconds:.2f} s ({ratio:.3f} of {limit_name} {limit_s:g} s)")
    return ratio


# =========================================================================== scenario 1: exits and deaths

DEATH_TESTS = """
    import os
    import signal
    import threading
    import time

    import httpx
    import pytest
    from pytest_llmserve.config import Workload
    from pytest_llmserve.load.runner import run_workload

    KILL = {"live[max_batch_size=4]": "between", "live[max_batch_size=8]": "during"}


    @pytest.mark.llmserve_server("badflag", "nomodel")
    def test_a_boot(llm_server):
        pass


    @pytest.mark.llmserve_server("live")
    def test_b0_fails_with_server_up(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok
        assert False, "the test's own assertion"


    @pytest.mark.llmserve_server("live")
    def test_b_generate(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok
        if KILL[llm_server.spec.id] == "between":
            os.kill(llm_server.pid, signal.SIGKILL)  # killed between tests
            deadline = time.monotonic() + 30
            while llm_server.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)


    def open_files(pid):
        # How many files the threads of pid still hold: 0 once all have exited, or the process is gone.
        count = 0
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return 0
        for tid in threads:
            try:
                count += len(os.listdir(f"/proc/{pid}/task/{tid}/fd"))
            except OSError:
                pass  # this thread has exited (its fd table is gone)
        return count


    @pytest.mark.llmserve_server("live")
    def test_c_streaming(llm_server, llm_client):
        # A long streaming request (1500 tokens, about a minute here); the server is killed under it.
        wl = Workload("long", num_prompts=2, input_len=16, output_len=1500, warmup=0, max_concurrency=2)
        killed = []
        died = []
        polls = []  # what the killer read that was not "generating": errors, and a first reply without the gauge

        def killer(stop):
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not stop.is_set():
                try:
                    reply = httpx.get(llm_server.base_url + "/metrics", timeout=30)
                except httpx.HTTPError as exc:
                    # Seen in CI (2 cores): a /metrics read timed out while the engine was busy, which
                    # ended this thread before it killed anything. A slow read is a reason to ask again.
                    polls.append(repr(exc))
                    time.sleep(0.2)
                    continue
                running = [ln for ln in reply.text.splitlines() if ln.startswith("vllm:num_requests_running")]
                if not running and not polls:
                    polls.append(f"HTTP {reply.status_code} without the gauge: {reply.text[:120]!r}")
                if running and float(running[0].split()[-1]) >= 1:
                    time.sleep(1.0)  # tokens are flowing
                    killed.append(time.monotonic())
                    os.kill(llm_server.pid, signal.SIGKILL)
                    # Its death, for the client, is when the last of its threads has closed its files: its
                    # sockets close then. Not the main thread's zombie state: seen in CI (2 cores, 2026-12-05),
                    # the main thread was a zombie at once while the other threads, tearing down the address
                    # space, held the sockets 22.6 s more. Seen in CI too: a SIGKILLed process took over a
                    # minute to die.
                    while time.monotonic() < killed[0] + 280:
                        if not open_files(llm_server.pid):
                            died.append(time.monotonic())
                            break
                        time.sleep(0.01)
                    return
                time.sleep(0.2)

        # Seen once in CI (2 cores, 2026-12-03): the workload ended without the killer ever seeing the server
        # generate, and the cause was not in the output. A workload that ends before the kill is the
        # scenario not set up, not the plugin's failure: it runs once more, and each such attempt is named.
        attempts = []
        for _ in range(2):
            stop = threading.Event()
            thread = threading.Thread(target=killer, args=(stop,), daemon=True)
            thread.start()
            began = time.monotonic()
            res = run_workload(llm_server.base_url, llm_server.model_name, wl, progress=False, timeout_s=300)
            ended = time.monotonic()
            if not killed:
                stop.set()
            thread.join(10)
            if killed:
                break
            attempts.append(f"workload ended after {ended - began:.1f} s, valid={res.valid}, "
                            f"tokens={[r.output_tokens for r in res.per_request]}, "
                            f"errors={[r.error for r in res.per_request]}, reasons={res.invalid_reasons}, "
                            f"killer's reads: {polls[:3]}")
        print(f"ATTEMPTS without a kill: {len(attempts)}" + "".join(f"\\n  {a}" for a in attempts))
        assert killed, f"the server was never seen generating: {attempts}"
        assert died, "the SIGKILLed server did not die within 280 s"
        print(f"INFLIGHT surfaced {ended - killed[0]:.3f} s after the kill, {ended - died[0]:.3f} s after the server "
              f"died ({died[0] - killed[0]:.3f} s after the kill); errors: "
              + " | ".join(str(r.error) for r in res.per_request))
        assert not res.valid, "the workload ended valid although its server was killed under it"
        # The server is gone: this request fails with the client's own connection error, which the plugin
        # reports as the server's death, in the style of the tests after this one.
        llm_client.complete("Hello", 2)


    @pytest.mark.llmserve_server("live")
    def test_d_after(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok
"""


@pytest.fixture(scope="module")
def death_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Workdir, Inner]]:
    """One inner run: a server with a bad flag and one with a missing model exit at boot; a two-combination
    matrix whose first combination is SIGKILLed between tests and whose second is SIGKILLed under a
    streaming request; tests after each death need the dead server. Before the deaths, a test fails its own
    assertion with its server up (the report then carries the server log's last lines)."""
    wd = Workdir(tmp_path_factory.mktemp("death"))
    secret = "sk-args-" + uuid.uuid4().hex
    bad, _ = wd.server("badflag", args=[*wd.real.args, "--api-key", secret, "--no-such-flag"])
    missing, _ = wd.server("nomodel", model=str(wd.path / "no-such-model-dir"))
    live, _ = wd.server("live")
    wd.write("llmserve.toml", bad + missing + live + "[matrix.live]\nmax_batch_size = [4, 8]\n")
    wd.write("test_death.py", DEATH_TESTS)
    wd.notes["secret"] = secret
    try:
        inner = wd.run("death", "-rA")
        wd.notes["left"] = wd.leftovers()
        yield wd, inner
    finally:
        wd.cleanup()


def test_server_exiting_at_boot_fails_within_seconds_with_log_tail_and_path(
        death_run: tuple[Workdir, Inner]) -> None:
    wd, inner = death_run
    out = inner.out
    for server, code, last_words in (("badflag", 2, "unrecognized arguments: --no-such-flag"),
                                     ("nomodel", 1, "no-such-model-dir")):
        found = re.search(rf"{server} \(pid \d+\) exited with code {code} during boot, ([\d.]+) s after launch "
                          rf"\(server died; log: (\S+)\)", out)
        assert found, out
        log = Path(found.group(2))
        assert log.is_file() and log.parent == wd.path / "llmserve-results" / "logs"
        start = out.index(f"ERROR at setup of test_a_boot[{server}]")
        block = out[start:out.index("ERROR at setup of", start + 30)]
        assert "--- last lines ---" in block and last_words in block  # the log tail is in the error
        setup = inner.durations[(f"test_a_boot[{server}]", "setup")]
        ratio = measure(f"exit at boot ({server}): error after", setup, STARTUP_TIMEOUT_S, "startup_timeout_s")
        assert ratio < 0.1
        # Within a poll of the exit: the error comes right after the process ended, not later.
        assert setup - float(found.group(1)) < 0.25 * setup + 2
    assert wd.notes["secret"] not in out  # --api-key in args: masked everywhere


def test_server_killed_between_tests_fails_the_rest_fast_with_server_died(death_run: tuple[Workdir, Inner]) -> None:
    _wd, inner = death_run
    out = inner.out
    assert "PASSED test_death.py::test_b_generate[live[max_batch_size=4]]" in out
    for test in ("test_c_streaming[live[max_batch_size=4]]", "test_d_after[live[max_batch_size=4]]"):
        assert f"ERROR test_death.py::{test} - Failed: live[max_batch_size=4] (pid" in out
        setup = inner.durations[(test, "setup")]
        # The first user also waits for the dead server's leftover engine processes to be killed.
        bound = 0.05 if test.startswith("test_c") else 0.01
        assert measure(f"after a kill between tests, {test} failed in", setup, 300, "request_timeout_s") < bound
    assert "was killed by SIGKILL during the session (server died; log:" in out
    assert out.count("--- last lines ---") >= 4


def test_server_killed_during_a_streaming_request_fails_it_at_once(death_run: tuple[Workdir, Inner]) -> None:
    _wd, inner = death_run
    out = inner.out
    found = re.search(r"INFLIGHT surfaced ([\d.]+) s after the kill, ([-\d.]+) s after the server died "
                      r"\(([\d.]+) s after the kill\); errors: (.*)", out)
    assert found, out
    attempts = re.search(r"ATTEMPTS without a kill: (\d+)", out)
    print(f"MEASURE workloads that ended before the server was seen generating: {attempts and attempts.group(1)}")
    # Measured from the server's death (its last thread's files closed), not from the signal: how fast the
    # kernel ends a SIGKILLed process is not the plugin's to decide (seen in CI: 80 s), noticing it is.
    print(f"MEASURE SIGKILL to the server's death (its sockets closed): {float(found.group(3)):.2f} s")
    assert measure("in-flight streaming request failed after the server died", float(found.group(2)), 300,
                   "the load generator's request timeout") < 0.05, found.group(0)
    assert "without [DONE]" in found.group(4) or "Error" in found.group(4)  # what was received / why
    # The test whose server died under it fails in the style of the tests after it: who died, how, the log.
    assert "FAILED test_death.py::test_c_streaming[live[max_batch_size=8]] - Failed: live[max_batch_size=8] (pid" in out
    assert "ERROR test_death.py::test_d_after[live[max_batch_size=8]] - Failed: live[max_batch_size=8]" in out


def test_next_matrix_combination_boots_after_a_death(death_run: tuple[Workdir, Inner]) -> None:
    _wd, inner = death_run
    assert "PASSED test_death.py::test_b_generate[live[max_batch_size=8]]" in inner.out
    assert "server boots: 2 (live[max_batch_size=4], live[max_batch_size=8]); failed boots: 2" in inner.out
    # failed: test_b0 on both combinations (its own assertion) and test_c on the second (its server killed)
    assert (inner.outcome_count("passed"), inner.outcome_count("failed"), inner.outcome_count("error")) == (2, 3, 5)


def test_no_process_left_after_boot_failures_and_deaths(death_run: tuple[Workdir, Inner]) -> None:
    wd, inner = death_run
    assert wd.notes["left"] == [], wd.notes["left"]
    assert measure("whole death scenario run", inner.seconds, 6 * STARTUP_TIMEOUT_S, "6 x startup_timeout_s") < 1
    assert not list((wd.cache / "running").glob("*.json"))


def _failure_block(out: str, test: str) -> str:
    """The FAILURES section's block of ``test`` (its header line up to the next block or section)."""
    start = out.index(f"_ {test} _")
    ends = [i for i in (out.find("\n____", start + len(test)), out.find("\n====", start + len(test))) if i > 0]
    return out[start:min(ends)]


def test_failures_carry_the_log_tail_and_a_death_reads_the_same_everywhere(death_run: tuple[Workdir, Inner]) -> None:
    """A test that fails while its server is up carries the server's log path and last lines; a test whose
    server dies under it fails in the same clean style as the tests after it (who died and how, the test's own
    error in one line, the log's last lines once), not with a traceback into the HTTP client."""
    _wd, inner = death_run
    out = inner.out
    up = _failure_block(out, "test_b0_fails_with_server_up[live[max_batch_size=4]]")
    assert "the test's own assertion" in up
    assert "llmserve server log" in up and "--- last 40 lines ---" in up, up
    log_lines = up.split("--- last 40 lines ---", 1)[1].strip().splitlines()
    assert 10 <= len(log_lines) <= 41, log_lines  # the tail itself, not only the path
    assert re.search(r"\(log: \S+\.log\)", up)

    died = _failure_block(out, "test_c_streaming[live[max_batch_size=8]]")
    assert re.search(r"live\[max_batch_size=8\] \(pid \d+\) was killed by SIGKILL during the session "
                     r"\(server died; log: ", died), died
    # The test's own error, in one line. Which connection error it is depends on timing: vLLM binds its port
    # before it forks the engine core, so the engine core holds the listening socket until it notices its
    # parent is gone. A connect in that window is accepted and then reset (seen on a 2-core host without
    # AVX-512: "Connection reset by peer"); after it, the connect is refused.
    assert re.search(r"the test failed with: RequestError: POST \S+ failed: \w+\('\[Errno \d+\] "
                     r"Connection (refused|reset by peer)'\)", died), died
    assert died.count("--- last lines ---") == 1, died      # the tail once
    assert "Traceback" not in died and "site-packages" not in died and "pytest_llmserve/" not in died, died
    # The summary lines of the dying test and of the one after it read the same.
    head = re.compile(r" - Failed: live\[max_batch_size=8\] \(pid \d+\) was killed by SIGKILL during the session")
    for summary in ("FAILED test_death.py::test_c_streaming[live[max_batch_size=8]]",
                    "ERROR test_death.py::test_d_after[live[max_batch_size=8]]"):
        assert head.search(next(ln for ln in out.splitlines() if ln.startswith(summary))), summary


# =========================================================================== scenario 2: interrupts

HOLD_TEST = """
    import json
    import pathlib
    import time


    def test_hold(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok
        pathlib.Path("up.json").write_text(json.dumps({"pid": llm_server.pid, "port": llm_server.port,
                                                       "url": llm_server.base_url}))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not pathlib.Path("resume").exists():
            time.sleep(0.1)
"""


@dataclass
class Interrupted:
    wd: Workdir
    inner: Inner
    during: int  # marked processes while the server was up
    after: list[str]
    teardown_s: float


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Interrupted]:
    """pytest gets SIGINT (Ctrl-C) while its server is up. (SIGTERM, a CI cancel, goes to an xdist
    controller in scenario 3, and to a boot in progress in tests/unit/server/test_faults_unit.py.)"""
    wd = Workdir(tmp_path_factory.mktemp("sigint"))
    table, token = wd.server("default")
    wd.write("llmserve.toml", table)
    wd.write("test_hold.py", HOLD_TEST)
    proc, out, started = wd.spawn("hold")
    try:
        wait_for(lambda: (wd.path / "up.json").exists() or proc.poll() is not None, STARTUP_TIMEOUT_S,
                 "the server to be up")
        assert proc.poll() is None, out.read_text()
        during = len(marked_processes(token))
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        inner = wd.finish("hold", proc, out, started, timeout_s=120)
        teardown_s = time.monotonic() - sent
        yield Interrupted(wd, inner, during, wd.leftovers(), teardown_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        wd.cleanup()


def test_ctrl_c_with_the_server_up_leaves_no_server(interrupted: Interrupted) -> None:
    it = interrupted
    assert it.during >= 2, "the API server and its engine process were up"  # so the count below means something
    assert it.after == []
    assert it.inner.code == pytest.ExitCode.INTERRUPTED, it.inner.out
    assert "KeyboardInterrupt" in it.inner.out
    assert re.search(r"default stopped in [\d.]+ s \(\d+ processes", it.inner.out), it.inner.out
    assert not list((it.wd.cache / "running").glob("*.json"))
    assert measure("interrupt to a clean exit", it.teardown_s, 15, "kill_tree's grace + kill wait") < 1


# =========================================================================== scenario 3: xdist worker crash

CRASH_TESTS = """
    import json
    import os
    import pathlib
    import time

    import pytest


    # The order matters: worksteal gives each worker a contiguous half ([test_live_a, test_crash] and
    # [test_live_b, test_hold]), so nothing is queued behind the crash. A test pending on the crashed worker
    # would be handed to the other one, behind test_hold, which never ends (seen in CI: SIGTERM never came).
    def test_live_a(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok  # before the crash, on the worker that will crash


    def test_crash(llm_server):
        pathlib.Path("crash.json").write_text(json.dumps({"worker": os.getpid()}))
        os._exit(3)  # the worker dies (segfault, OOM kill...) with the shared server up


    def test_live_b(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok  # on the other worker, before or after the crash


    def test_hold(llm_server, llm_client):
        # A bound against a lost SIGTERM only: a slow host's worker restart must not end the hold first.
        deadline = time.monotonic() + 1200
        while not pathlib.Path("crash.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert llm_client.complete("Hello", 2).ok  # the server outlived the crashed worker
        pathlib.Path("up.json").write_text(json.dumps({"pid": llm_server.pid, "url": llm_server.base_url}))
        while time.monotonic() < deadline:  # until the controller gets SIGTERM
            time.sleep(0.1)
"""


@dataclass
class XdistCrash:
    wd: Workdir
    inner: Inner
    during: int
    after: list[str]
    teardown_s: float


@pytest.fixture(scope="module")
def xdist_crash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[XdistCrash]:
    """``-n 2``: a test os._exit()s its worker while the shared server is up; the other tests go on using the
    server; then the controller gets SIGTERM (a CI job cancelled) while a test still holds the server.

    ``--dist worksteal``: with ``-n`` alone the plugin picks ``loadgroup`` (benchmarks on one worker), and
    pytest-xdist 3.8.0's loadgroup/loadscope scheduler hangs once a crashed worker is replaced (upstream
    pytest-dev/pytest-xdist#1323 and #1327); that path, and the SIGTERM that ends such a hung run without
    leaving the server, is tested with a stand-in in tests/unit/server/test_faults_unit.py."""
    wd = Workdir(tmp_path_factory.mktemp("xdist"))
    table, token = wd.server("default")
    wd.write("llmserve.toml", table)
    wd.write("test_crash.py", CRASH_TESTS)
    proc, out, started = wd.spawn("crash", "-n", "2", "--dist", "worksteal", "-v", "-rA")
    try:
        wait_for(lambda: (wd.path / "up.json").exists() or proc.poll() is not None, STARTUP_TIMEOUT_S,
                 "the hold test after the crash")
        wait_for(lambda: "node down" in out.read_text() or proc.poll() is not None, 60, "the crash report")
        # test_live_b may still be running on the other worker (seen: SIGTERM came before it passed)
        wait_for(lambda: len(re.findall(r"PASSED test_crash.py::test_live", out.read_text())) >= 2
                 or proc.poll() is not None, 120, "both test_live runs")
        assert proc.poll() is None, out.read_text()
        during = len(marked_processes(token))
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        inner = wd.finish("crash", proc, out, started, timeout_s=120)
        yield XdistCrash(wd, inner, during, wd.leftovers(), time.monotonic() - sent)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        wd.cleanup()


def test_xdist_worker_crash_then_sigterm_leaves_no_server(xdist_crash: XdistCrash) -> None:
    it = xdist_crash
    assert it.during >= 2, "the server and its engine were up"
    assert it.after == []
    out = it.inner.out
    assert "crashed while running 'test_crash.py::test_crash[default]'" in out
    assert len(re.findall(r"^PASSED test_crash.py::test_live", out, re.M)) == 2  # the short summary
    assert it.inner.code == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "SIGTERM" in out
    assert "stopped shared server default" in out
    assert not list((it.wd.cache / "running").glob("*.json"))
    assert measure("SIGTERM to the xdist controller to a clean exit", it.teardown_s, 15,
                   "kill_tree's grace + kill wait") < 2


# =========================================================================== scenario 4: stale, concurrent,
#                                                                              security and baselines

SECURE_TESTS = """
    import json
    import pathlib
    import time

    import httpx
    import psutil
    import pytest


    @pytest.mark.llmserve_server("secure")
    def test_1_pause(llm_server, llm_client):
        out = llm_client.complete("Hello", 2)
        assert out.ok, out.describe()
        tree = [psutil.Process(llm_server.pid), *psutil.Process(llm_server.pid).children(recursive=True)]
        listening = sorted({(c.laddr.ip, c.laddr.port) for p in tree for c in p.net_connections("inet")
                            if c.status == psutil.CONN_LISTEN})
        pathlib.Path("up.json").write_text(json.dumps({
            "pid": llm_server.pid, "port": llm_server.port, "url": llm_server.base_url,
            "listening": listening, "cmdline": psutil.Process(llm_server.pid).cmdline(),
            "without_key": httpx.get(llm_server.base_url + "/v1/models", timeout=30).status_code}))
        # Held until the outer test resumes it (C, W1-W3 run meanwhile): the bound only keeps a lost "resume"
        # from running forever, and must not end the hold before a slow host has run them.
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline and not pathlib.Path("resume").exists():
            time.sleep(0.1)
        assert llm_server.is_alive(), "a concurrent run killed this server"


    @pytest.mark.llmserve_server("secure")
    @pytest.mark.llmserve_benchmark(workload="tiny")
    def test_2_save(llm_bench):
        llm_bench.run()
"""

STALE_HOLD = """
    import json
    import pathlib
    import time

    import pytest


    @pytest.mark.llmserve_server("stale")
    def test_hold(llm_server):
        pathlib.Path("stale-up.json").write_text(json.dumps({"pid": llm_server.pid, "port": llm_server.port}))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.1)
"""

CONCURRENT_TEST = """
    import os
    import psutil


    def test_concurrent(llm_server, llm_client):
        assert llm_client.complete("Hello", 2).ok
        print("CONCURRENT PORT", llm_server.port)
        assert psutil.pid_exists(int(os.environ["OTHER_SERVER_PID"]))
"""

WRITER_TEST = """
    import pytest


    @pytest.mark.llmserve_benchmark(workload="tiny")
    def test_save(llm_bench):
        llm_bench.run()
"""

BROKEN_BASELINE_TESTS = """
    import pytest


    @pytest.mark.llmserve_benchmark(workload="tiny", baseline_test="corrupt.py::test_x")
    def test_corrupt(llm_bench):
        llm_bench.run()


    @pytest.mark.llmserve_benchmark(workload="tiny", baseline_test="future.py::test_x")
    def test_schema(llm_bench):
        llm_bench.run()
"""


@dataclass
class Story:
    wd: Workdir
    runs: dict[str, Inner]
    up: dict[str, Any]
    stale_up: dict[str, Any]
    stale_alive_after_kill: int
    stale_left_after_refusal: int
    stale_left_after_kill_stale: int
    server_alive_after_concurrent: bool
    secrets: dict[str, str]
    marker: Path
    broken: dict[str, tuple[Path, bytes]]
    created_during_secure: dict[str, float]
    left: list[str]


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """K boots a server and is SIGKILLed (a stale server); R is refused; S (--llmserve-kill-stale) kills the
    stale server and boots its own with secrets in its configuration and environment, then pauses while
    C (a concurrent run with --llmserve-kill-stale), W1+W2 (two concurrent baseline writers attached to S's
    server) and W3 (benchmarks over a corrupt and a future-schema baseline) run against it."""
    wd = Workdir(tmp_path_factory.mktemp("story"))
    secrets = {"api_key": "sk-cfg-" + uuid.uuid4().hex, "env": "hf_env_" + uuid.uuid4().hex,
               "spec_env": "hf_spec_" + uuid.uuid4().hex}
    marker = wd.path / "pwned"
    stale_table, stale_token = wd.server("stale")
    secure_table, _secure_token = wd.server("secure", api_key=secrets["api_key"],
                                            served_model_name=f"smollm2; touch {marker}",
                                            env={"HF_TOKEN": secrets["spec_env"]})
    wd.write("llmserve.toml", stale_table + secure_table + TINY)
    wd.write("test_stale.py", STALE_HOLD)
    wd.write("test_secure.py", SECURE_TESTS)
    wd.env["HF_TOKEN"] = secrets["env"]
    runs: dict[str, Inner] = {}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # K: a run SIGKILLed with its server up leaves a stale server behind (its own session survives).
        k, k_out, k_started = wd.spawn("K", "test_stale.py")
        procs.append(k)
        wait_for(lambda: (wd.path / "stale-up.json").exists() or k.poll() is not None, STARTUP_TIMEOUT_S,
                 "K's server")
        stale_up = json.loads((wd.path / "stale-up.json").read_text())
        k.send_signal(signal.SIGKILL)
        runs["K"] = wd.finish("K", k, k_out, k_started, 30)
        stale_alive = len(marked_processes(stale_token))

        # R: the next run refuses to boot next to it.
        runs["R"] = wd.run("R", "test_stale.py", "-rA", timeout_s=120)
        stale_after_refusal = len(marked_processes(stale_token))

        # S: --llmserve-kill-stale kills it, boots its own server, saves a baseline; pauses after test_1.
        before = _files(wd.path)
        s, s_out, s_started = wd.spawn("S", "test_secure.py", "--llmserve-kill-stale", "--llmserve-save-baseline",
                                       "-rA")
        procs.append(s)
        wait_for(lambda: (wd.path / "up.json").exists() or s.poll() is not None, STARTUP_TIMEOUT_S, "S's server")
        assert s.poll() is None, s_out.read_text()
        up = json.loads((wd.path / "up.json").read_text())
        stale_after_kill = len(marked_processes(stale_token))

        # C: a concurrent run on this machine, same registry, with --llmserve-kill-stale: it must neither
        # refuse nor kill S's live server. (Its server is a stand-in: one real server at a time on 2 cores.)
        conc = wd.path / "concurrent"
        c_token = f"fault-c-{uuid.uuid4().hex[:8]}"
        wd.tokens.append(c_token)
        c_table = standin_toml("default", "fail_once.py", token=c_token)
        wd.write("concurrent/llmserve.toml", c_table)
        wd.write("concurrent/pytest.ini", "[pytest]\n")
        wd.write("concurrent/test_concurrent.py", CONCURRENT_TEST)
        runs["C"] = wd.run("C", "--llmserve-kill-stale", "-rA", cwd=conc, env={"OTHER_SERVER_PID": str(up["pid"])},
                           timeout_s=120)
        alive_after_c = bool(marked_processes(_secure_token))

        # W1 + W2: two runs attached to S's server save to the same baseline file at once.
        wd.write("writers/test_w.py", WRITER_TEST)
        # The two writers run at once by design, so each one's client is the other's host contention: without
        # a wide bound the second writer's rounds were confounded and skipped (seen in a fresh-clone run,
        # 2026-12-03: W1's pytest took 11-15 % of the 2 cores), and the story lost its second record.
        wd.write("writers/pytest.ini", "[pytest]\nllmserve_contention_bound = 0.99\n")
        wd.write("writers/llmserve.toml", WRITERS_TINY)
        attach = {"OPENAI_API_KEY": secrets["api_key"]}
        writers = [wd.spawn(name, f"--llmserve-url={up['url']}", "--llmserve-save-baseline",
                            f"--llmserve-results-dir=results-{name}", "--llmserve-baseline-dir=../baselines",
                            "-rA", cwd=wd.path / "writers", env=attach) for name in ("W1", "W2")]
        procs.extend(proc for proc, _out, _started in writers)
        for name, (proc, out, started) in zip(("W1", "W2"), writers, strict=True):
            runs[name] = wd.finish(name, proc, out, started, 300)

        # W3: benchmarks whose baseline files are corrupt / of a future schema.
        store = BaselineStore(wd.path / "baselines")
        broken = {}
        for name, content in (("corrupt", b'{"schema": 1, "records": [{"samples": '),
                              ("future", json.dumps({"schema": 99, "records": []}).encode())):
            path = store.path_for(BenchKey(test=f"{name}.py::test_x", server="external", workload="tiny"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            broken[name] = (path, content)
        wd.write("writers/test_broken.py", BROKEN_BASELINE_TESTS)
        runs["W3"] = wd.run("W3", "test_broken.py", f"--llmserve-url={up['url']}", "--llmserve-results-dir=results-W3",
                            "--llmserve-baseline-dir=../baselines", "-rA", cwd=wd.path / "writers", env=attach,
                            timeout_s=120)

        (wd.path / "resume").write_text("")
        runs["S"] = wd.finish("S", s, s_out, s_started, 300)
        after = _files(wd.path)
        created = {p: t for p, t in after.items() if p not in before or before[p] != t}
        yield Story(wd, runs, up, stale_up, stale_alive, stale_after_refusal, stale_after_kill, alive_after_c,
                    secrets, marker, broken, created, wd.leftovers())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        wd.cleanup()


def test_stale_server_is_refused_naming_pid_port_log_and_how_to_clear(story: Story) -> None:
    assert story.stale_alive_after_kill >= 2  # API server + engine outlived their SIGKILLed pytest
    r = story.runs["R"]
    pid, port = story.stale_up["pid"], story.stale_up["port"]
    assert re.search(rf"stale server\(s\) from an earlier run are still running: stale \(pid {pid}, port {port}, "
                     rf"log \S+stale-\S+\.log; its pytest, pid \d+, is gone\)", r.out), r.out
    assert "Stop them with `llmserve kill-stale` (or pass --llmserve-kill-stale)" in r.out
    assert story.stale_left_after_refusal == story.stale_alive_after_kill  # refusing kills nothing
    measure("stale-server refusal (whole inner run)", r.seconds, STARTUP_TIMEOUT_S, "startup_timeout_s")


def test_kill_stale_kills_it_and_boots(story: Story) -> None:
    s = story.runs["S"]
    pid = story.stale_up["pid"]
    assert re.search(rf"killed stale server stale \(pid {pid}, port \d+, log \S+; its pytest, pid \d+, is gone\): "
                     rf"\d+ processes", s.out), s.out
    assert story.stale_left_after_kill_stale == 0
    assert (s.outcome_count("passed"), s.outcome_count("failed")) == (2, 0), s.out


def test_concurrent_run_succeeds_on_its_own_port_and_spares_the_live_server(story: Story) -> None:
    c = story.runs["C"]
    assert c.outcome_count("passed") == 1 and c.outcome_count("failed") == 0, c.out
    assert "killed stale server" not in c.out and "stale server(s)" not in c.out
    port = int(c.out.split("CONCURRENT PORT ")[1].split()[0])
    assert port != story.up["port"]
    assert story.server_alive_after_concurrent
    assert "PASSED test_secure.py::test_1_pause[secure]" in story.runs["S"].out


def test_concurrent_baseline_writers_lose_no_record(story: Story) -> None:
    saved = []
    for name in ("W1", "W2"):
        w = story.runs[name]
        assert w.outcome_count("passed") == 1, w.out
        # 5 rounds, or more when the record's spread is wider than the tolerance: the two writers share the
        # server (seen in a rehearsal: 6 rounds, the median known to +-6.4 % after 5)
        found = re.search(r"saved (\d+) rounds as a new baseline record", w.out)
        assert found and int(found.group(1)) >= 5, w.out
        saved.append(int(found.group(1)))
    path = BaselineStore(story.wd.path / "baselines").path_for(
        BenchKey(test="test_w.py::test_save", server="external", workload="tiny"))
    doc = read_baseline_file(path)
    assert len(doc.records) == 2
    assert len({r.run_id for r in doc.records}) == 2
    assert sorted(len(r.samples["output_throughput"]) for r in doc.records) == sorted(saved)  # every sample kept


def test_corrupt_and_future_schema_baselines_are_named_and_left_untouched(story: Story) -> None:
    w3 = story.runs["W3"]
    # An unreadable baseline is known before any boot: refused in set-up (an error), or at the gate (a failure).
    assert w3.outcome_count("failed") + w3.outcome_count("error") == 2, w3.out
    for path, content in story.broken.values():
        assert path.read_bytes() == content  # byte for byte
        assert re.search(rf"\S*/baselines/{re.escape(path.name)}: ", w3.out), w3.out  # named, with its path
    assert "not valid JSON" in w3.out
    assert "schema 99 is not supported (this version of pytest-llmserve reads schema 1)" in w3.out
    assert "the file was left untouched" in w3.out


def test_server_binds_loopback_only(story: Story) -> None:
    listening = story.up["listening"]
    assert [story.up["port"]] == [port for _ip, port in listening if port == story.up["port"]]
    assert {ip for ip, _port in listening} == {"127.0.0.1"}, listening


def test_shell_metacharacters_in_configuration_do_not_run(story: Story) -> None:
    assert f"smollm2; touch {story.marker}" in story.up["cmdline"]  # one argv element, verbatim
    assert not story.marker.exists()


def test_the_api_key_guards_the_server_without_showing_on_its_command_line(story: Story) -> None:
    assert story.up["without_key"] == 401  # vLLM got the key (through VLLM_API_KEY) and enforces it
    assert not any(story.secrets["api_key"] in arg for arg in story.up["cmdline"])  # ps shows no key


def test_secrets_never_reach_files_the_run_wrote_or_its_output(story: Story) -> None:
    # up.json holds the server's argv, read by the test from /proc.
    written = [p for p in story.created_during_secure if not p.startswith(("home/", "up.json"))]
    assert any(p.startswith("llmserve-results/") for p in written) and any("baselines/" in p for p in written)
    for rel in [*written, *(f"out-{n}.txt" for n in story.runs)]:
        text = (story.wd.path / rel).read_text(errors="replace")
        for what, value in story.secrets.items():
            assert value not in text, f"the {what} secret is in {rel}"
    header = next((story.wd.path / "llmserve-results" / "logs").glob("secure-*.log")).read_text().splitlines()[0]
    assert header.startswith("# llmserve launch ") and "HF_TOKEN" in header  # named, never its value


def test_logs_are_written_only_under_the_results_dir(story: Story) -> None:
    ours = ("llmserve-results/", "baselines/", "writers/results-W", "home/", "tmp/", "out-", "up.json",
            "stale-up.json", "resume", "concurrent/", "writers/test_", "writers/pytest.ini", "writers/llmserve.toml")
    outside = sorted(p for p in story.created_during_secure if not p.startswith(ours))
    assert outside == [], outside
    logs = sorted(p for p in story.created_during_secure if p.endswith(".log"))
    assert logs and all(p.startswith(("llmserve-results/logs/", "concurrent/llmserve-results/logs/")) for p in logs)
    assert not [p for p in story.created_during_secure if p.startswith("tmp/llmserve-run-")]  # run dirs removed
    engine = sorted({"/".join(p.split("/")[:3]) for p in story.created_during_secure if p.startswith(("home/", "tmp/"))})
    print(f"MEASURE files the engine itself wrote under its HOME and TMPDIR (not the plugin's): {engine[:12]}")
    assert sorted(p.name for p in story.wd.cache.iterdir()) == ["running"]
    assert not list((story.wd.cache / "running").iterdir())


def test_no_process_left_after_the_story(story: Story) -> None:
    assert story.left == []
    for name, run in story.runs.items():
        print(f"MEASURE story run {name}: {run.seconds:.1f} s")
