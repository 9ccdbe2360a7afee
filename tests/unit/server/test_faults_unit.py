"""The fault matrix, where the real engine cannot produce the fault on demand: purpose-built stand-ins
(``tests/standins/``; each script's docstring says which fault and why the real engine cannot) under the
``command`` engine. What the real vLLM CPU server can do for real is in ``tests/e2e/test_faults.py``.

Every test is bounded (short deadlines, bounded waits) and checks that no process it caused is left.
Times are asserted as ratios to the configured deadline or timeout, never as absolute figures.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.errors import PreflightError, RequestError, ServerDiedError, ServerStartError
from pytest_llmserve.load.runner import run_workload
from pytest_llmserve.server import handle as server
from pytest_llmserve.server import isolation, procs
from pytest_llmserve.server.handle import ServerHandle
from pytest_llmserve.server.pool import ServerPool, stop_shared_servers
from tests.standins.helpers import MARK_ENV, marked_processes, standin_argv, wait_for

# The registry is private to each test, so other runs on this machine neither see nor disturb ours.
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

PACKAGE = Path(__file__).resolve().parents[3] / "pytest_llmserve"


def spec(name: str, script: str, *args: str, token: str, **kw: object) -> ServerSpec:
    argv = tuple(standin_argv(script, *args))
    fields: dict[str, object] = {"engine": "command", "argv": argv, "served_model_name": "standin",
                                 "env": ((MARK_ENV, token),), "source": "faults.toml", "startup_timeout_s": 30.0}
    fields.update(kw)
    return ServerSpec(name=name, **fields)  # type: ignore[arg-type]


def timed_start(handle: ServerHandle) -> tuple[BaseException, float]:
    start = time.monotonic()
    with pytest.raises(Exception) as info:  # noqa: PT011 - the type is asserted by the caller
        handle.start()
    return info.value, time.monotonic() - start


# --------------------------------------------------------------------------- 1/2: boot faults

def test_crash_during_readiness_surfaces_within_a_poll_not_at_the_deadline(tmp_path: Path, token: str) -> None:
    """Stand-in: never_ready.py --exit-after (a crash at a chosen moment of the boot, as an OOM while loading
    weights; the real engine's own exit at boot is in tests/e2e/test_faults.py)."""
    s = spec("crashy", "never_ready.py", "--exit-after", "1.0", token=token, startup_timeout_s=120.0)
    handle = ServerHandle(s, log_dir=tmp_path / "logs")
    err, elapsed = timed_start(handle)
    assert isinstance(err, ServerStartError), err
    text = str(err)
    assert "exited with code 3 during boot" in text and "s after launch" in text
    assert "server died" in text
    assert f"log: {handle.log_path}" in text and handle.log_path is not None and handle.log_path.is_file()
    assert "--- last lines ---" in text and "out of memory while loading weights" in text  # the log tail
    after_launch = float(text.split("during boot, ")[1].split(" s after launch")[0])
    assert elapsed / s.startup_timeout_s < 0.05, (elapsed, text)  # seconds, not the 120 s deadline
    assert elapsed - after_launch < 0.25 * elapsed + 1.0  # noticed within a poll of the exit
    print(f"MEASURE crash-during-boot: error {elapsed:.2f} s after start() (exit {after_launch:.1f} s after "
          f"launch), deadline {s.startup_timeout_s:g} s, ratio {elapsed / s.startup_timeout_s:.3f}")


@pytest.mark.parametrize(("script", "args", "answer"), [
    ("never_ready.py", (), "GET /health: HTTP 503"),
    ("never_binds.py", (), "GET /health: ConnectError"),
    ("silent.py", ("--silent-from-start",), "GET /health: ReadTimeout"),
], ids=["health-503-forever", "never-binds", "accepts-never-answers"])
def test_never_ready_hits_a_hard_deadline_naming_it_the_last_answer_and_the_log(
        tmp_path: Path, token: str, script: str, args: tuple[str, ...], answer: str) -> None:
    """Stand-ins: never_ready.py, never_binds.py, silent.py (a real engine cannot be made to hang at boot)."""
    s = spec("stuck", script, *args, token=token, startup_timeout_s=2.0)
    handle = ServerHandle(s, log_dir=tmp_path / "logs")
    err, elapsed = timed_start(handle)
    assert isinstance(err, ServerStartError), err
    text = str(err)
    assert "not ready within its startup deadline of 2 s (startup_timeout_s from faults.toml)" in text
    assert f"last readiness answer: {answer}" in text, text
    assert f"log: {handle.log_path}" in text
    assert "--- last lines ---" in text and f"standin {script}" in text
    # A hard deadline: not cut short, and not stretched by a probe's own timeout (5 s /health, 120 s generation).
    assert 1.0 <= elapsed / s.startup_timeout_s < 1.5, elapsed
    assert not handle.is_alive()  # the stuck process was torn down
    assert not list(server.registry_dir().glob("*.json"))
    print(f"MEASURE never-ready[{script}]: error after {elapsed:.2f} s, deadline 2 s, ratio {elapsed / 2:.2f}")


# --------------------------------------------------------------------------- 3: death mid-session (pool)

def test_dead_server_fails_later_tests_fast_and_the_next_configuration_boots(tmp_path: Path, token: str) -> None:
    """Stand-in: fail_once.py as a plain ready server, SIGKILLed between two ``get``s (the real engine's
    version of this, between tests and during a request, is in tests/e2e/test_faults.py)."""
    pool = ServerPool(tmp_path / "run", tmp_path / "logs")
    a = spec("a", "fail_once.py", token=token)
    b = spec("b", "fail_once.py", token=token)
    handle = pool.get(a)
    os.kill(handle.pid or 0, signal.SIGKILL)
    wait_for(lambda: not handle.is_alive(), 10, "the SIGKILLed stand-in to exit")
    for _ in range(2):  # every later user fails at once, with the same account
        start = time.monotonic()
        with pytest.raises(ServerDiedError) as info:
            pool.get(a)
        assert time.monotonic() - start < 0.1 * a.request_timeout_s
        text = str(info.value)
        assert "was killed by SIGKILL during the session (server died" in text
        assert f"log: {handle.log_path}" in text and "--- last lines ---" in text and "standin fail_once.py" in text
    other = pool.get(b)  # the next configuration still boots
    assert other.is_alive()
    assert pool.stop_all() == []


# The main thread leaves (pthread_exit) while another thread lives on: the kernel shows the process as a zombie
# and reports no exit status, as for a SIGKILLed multi-threaded engine whose threads are still exiting.
ZOMBIE_LEADER = ("import ctypes, threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
                 "ctypes.CDLL(None).pthread_exit(None)")


def test_a_server_seen_as_a_zombie_is_dead_before_the_kernel_reports_its_status(
        tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in (the state cannot be produced on demand by a real engine: seen once on vLLM, /proc said Z 4 ms
    after a SIGKILL while ``waitpid`` still said running, and the test whose server died under it was not told
    so). The handle reports the death at once, after a bounded wait for the status."""
    handle = ServerHandle(spec("zombie", "fail_once.py", token=token), log_dir=tmp_path)
    handle.proc = subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER], env={**os.environ, MARK_ENV: token})
    try:
        wait_for(lambda: not procs.pid_alive(handle.proc.pid), 10, "the stand-in's main thread to leave")  # type: ignore[union-attr]
        assert handle.proc.poll() is None  # what made the plugin think it alive
        monkeypatch.setattr(server, "ZOMBIE_REAP_S", 0.2)
        assert not handle.is_alive()
        report = handle.death_report()
        assert report is not None and f"zombie (pid {handle.proc.pid}) died (its exit status not reported yet) " \
            "during the session (server died" in report, report
    finally:
        handle.proc.kill()
        handle.proc.wait(10)
    # Once the status is reported, the account says how it ended.
    assert handle.death_report() is not None and "was killed by SIGKILL" in (handle.death_report() or "")



# A single-threaded process with 2 GiB written: SIGKILLed, its one thread tears the address space down before it
# closes its files and becomes a zombie (tens of milliseconds), the state a SIGKILLed server whose main thread
# exits last is in while its sockets close.
BIG = "import mmap, sys; m = mmap.mmap(-1, 2 << 30); m.write(b'x' * (2 << 30)); print('ready', flush=True); " \
      "sys.stdin.read()"


def test_a_killed_process_still_tearing_down_is_not_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BIG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert procs.pid_alive(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        seen = []  # (state, exiting, pid_alive) until the kernel reports its status
        while proc.poll() is None:
            with contextlib.suppress(OSError, IndexError):
                stat = Path(f"/proc/{proc.pid}/stat").read_text()
                seen.append((stat.rsplit(")", 1)[1].split()[0], procs.exiting(stat), procs.pid_alive(proc.pid)))
    finally:
        proc.kill()
        proc.wait(10)
    tearing_down = [s for s in seen if s[1] and s[0] != "Z"]
    assert tearing_down, seen[:20]  # the state was observed: exiting, not yet a zombie
    assert not any(alive for _, _, alive in tearing_down), tearing_down[:20]
    print(f"MEASURE samples of the killed process exiting, not yet a zombie: {len(tearing_down)} of {len(seen)}")


def test_the_exiting_flag_is_read_after_a_command_name_with_spaces_and_parentheses() -> None:
    rest = " R 1 2 3 0 -1 {} 100 0 0 0 0"
    assert procs.exiting("42 (a ) b (c)" + rest.format(0x400104)) is True  # PF_EXITING among other flags
    assert procs.exiting("42 (a ) b (c)" + rest.format(0x400100)) is False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="a start counted from boot is read from /proc")
def test_a_process_is_known_by_its_start_when_the_wall_clock_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's ``create_time()`` adds /proc/stat's ``btime``, which the kernel recomputes at every read as the
    wall clock less the uptime: an NTP step moves every start it reports (psutil issue #2526). CI, 2026-12-07:
    an xdist worker took the server another worker had booted for dead, and ``kill-stale`` took a live run's
    pytest for gone. Here the wall clock is stepped by 2 s (psutil's ``boot_time``, the one place it reads
    ``btime``): a start recorded on psutil's clock no longer names the live process, the start counted from
    boot does."""
    import psutil._pslinux as pslinux  # the platform module psutil's create_time() reads btime through

    me = os.getpid()
    recorded = procs.create_time(me)
    on_wall_clock = psutil.Process(me).create_time()
    assert recorded is not None and 0 < recorded < time.clock_gettime(time.CLOCK_BOOTTIME)
    assert procs.pid_alive(me, recorded) and procs.pid_alive(me, on_wall_clock)
    assert not procs.pid_alive(me, recorded + 1 / procs.CLOCK_TICKS)  # one tick later: another process
    assert isolation.owner_alive(f"{me}:{recorded:.3f}")

    booted = pslinux.boot_time()
    monkeypatch.setattr(pslinux, "boot_time", lambda: booted + 2.0)
    assert psutil.Process(me).create_time() == pytest.approx(on_wall_clock + 2.0)  # the step is seen
    assert not procs.pid_alive(me, on_wall_clock)  # the fault: psutil's clock takes the live process for gone
    assert procs.pid_alive(me, recorded)  # counted from boot, the start holds
    assert isolation.owner_alive(f"{me}:{recorded:.3f}")
    assert procs.create_time(me) == recorded


# --------------------------------------------------------------------------- 5: ports and the registry



def test_a_process_is_described_by_its_program_base_name_so_a_long_path_keeps_the_script_visible(
        tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # a CI checkout's temp paths run to ~150 characters
    deep.mkdir(parents=True)
    script = deep / "llmserve_port_holder.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, str(script), "--flag", "x" * 600], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # exec'd: /proc shows its argv
        text = procs.describe(psutil.Process(proc.pid))
        assert text.startswith(f"pid {proc.pid} ({os.path.basename(sys.executable)} {script} --flag x")
        assert "llmserve_port_holder.py" in text
        assert text.endswith("…)") and len(text) < 270  # the 600-character argument was cut, not the script
    finally:
        proc.kill()
        proc.wait(10)




def _sleeper(token: str) -> psutil.Popen:
    """A process in its own session standing for a server (marked, so the test can account for it)."""
    return psutil.Popen([sys.executable, "-c", f"import time; time.sleep(120)  # {token}"],
                        start_new_session=True)


def _dead_pid() -> tuple[int, float]:
    proc = psutil.Popen([sys.executable, "-c", "pass"])
    created = proc.create_time()
    proc.wait(10)
    return proc.pid, created


def _register(reg: Path, name: str, pid: int, created: float | None, owner: int, owner_created: float | None,
              run_pid: int = 0, run_created: float | None = None) -> None:
    reg.mkdir(parents=True, exist_ok=True)
    (reg / f"{pid}.json").write_text(json.dumps({
        "pid": pid, "create_time": created, "port": 1, "server": name, "owner_pid": owner,
        "owner_create_time": owner_created, "run_pid": run_pid, "run_create_time": run_created,
        "log": f"/logs/{name}.log"}))


def test_stale_check_spares_live_runs_and_never_trusts_a_reused_pid(private_registry: Path, token: str) -> None:
    me, my_created = os.getpid(), psutil.Process().create_time()
    dead, dead_created = _dead_pid()
    orphan, live, xdist, reused_owner = (_sleeper(token) for _ in range(4))
    unrelated = _sleeper(token)
    try:
        _register(private_registry, "orphan", orphan.pid, orphan.create_time(), dead, dead_created)
        _register(private_registry, "live-run", live.pid, live.create_time(), me, my_created)
        # A worker that launched it crashed, but its xdist controller (the run) still runs: not stale.
        _register(private_registry, "xdist", xdist.pid, xdist.create_time(), dead, dead_created, me, my_created)
        # The owner's pid now names another process (this one, started at another time): the owner is gone.
        _register(private_registry, "reused-owner", reused_owner.pid, reused_owner.create_time(), me,
                  my_created - 1000)
        # The server's pid now names an unrelated process: the entry is history, that process is not touched.
        _register(private_registry, "reused-server", unrelated.pid, unrelated.create_time() - 1000, dead,
                  dead_created)
        stale = {e["server"] for e in server.stale_servers()}
        assert stale == {"orphan", "reused-owner"}
        assert not (private_registry / f"{unrelated.pid}.json").exists()

        s = spec("x", "fail_once.py", token=token)
        with pytest.raises(PreflightError) as info:
            server.preflight(s, "127.0.0.1", procs.free_port())
        text = str(info.value)
        assert f"orphan (pid {orphan.pid}, port 1, log /logs/orphan.log; its pytest, pid {dead}, is gone)" in text
        assert "`llmserve kill-stale` (or pass --llmserve-kill-stale)" in text
        assert "live-run" not in text and "xdist" not in text

        assert server.kill_stale(say=lambda msg: None) == 2
        psutil.wait_procs([orphan, reused_owner], timeout=10)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in (live, xdist, unrelated))
        assert server.stale_servers() == []
    finally:
        for proc in (orphan, live, xdist, reused_owner, unrelated):
            with contextlib.suppress(psutil.Error):
                proc.kill()
                proc.wait(10)


def test_controller_stops_a_server_whose_worker_died_mid_boot(tmp_path: Path, token: str) -> None:
    """Stand-in: never_ready.py (a boot still in progress when its xdist worker is killed). The launch
    record is written before readiness, so the controller finds the server although no boot finished."""
    run_dir = tmp_path / "run"
    # The "worker": boots through a shared pool. The token reaches it reversed, so only the server carries it.
    child = subprocess.Popen([sys.executable, "-c", (
        "import json, os, pathlib\n"
        "from pytest_llmserve.server.pool import ServerPool\n"
        "from pytest_llmserve.config import ServerSpec\n"
        "env = ((os.environ['MARK_NAME'], os.environ['MARK_REV'][::-1]),)\n"
        "spec = ServerSpec(name='boot', engine='command', argv=tuple(json.loads(os.environ['ARGV'])), env=env,"
        " startup_timeout_s=120.0)\n"
        "ServerPool(pathlib.Path(os.environ['RUN_DIR']), pathlib.Path(os.environ['RUN_DIR']) / 'logs',"
        " shared=True).get(spec)\n")],
        env={**os.environ, "MARK_NAME": MARK_ENV, "MARK_REV": token[::-1], "RUN_DIR": str(run_dir),
             "ARGV": json.dumps(standin_argv("never_ready.py"))})
    try:
        standin = wait_for(lambda: marked_processes(token), 60, "the stand-in to be launched")[0]
        assert standin.ppid() == child.pid
        wait_for(lambda: (run_dir / "launches.jsonl").is_file(), 10, "the launch record")
        child.kill()  # the "worker" dies mid-boot; its server lives on in its own session
        child.wait(10)
        assert standin.is_running()
        stop_shared_servers(run_dir, say=lambda msg: None)
        assert not marked_processes(token)
    finally:
        child.kill()
        child.wait(10)


# --------------------------------------------------------------------------- 4: signals (stand-in)







# --------------------------------------------------------------------------- 8: requests

def test_request_timeout_raises_naming_it(tmp_path: Path, token: str) -> None:
    """Stand-in: silent.py (ready, then never answers: a wedged engine cannot be made on demand)."""
    s = spec("wedged", "silent.py", token=token, request_timeout_s=1.0)
    with ServerHandle(s, log_dir=tmp_path / "logs") as handle:
        client = handle.client()
        start = time.monotonic()
        with pytest.raises(RequestError) as info:
            client.complete("Hello", 8)
        elapsed = time.monotonic() - start
        client.close()
        assert f"POST {handle.base_url}/v1/completions timed out after 1 s" in str(info.value)
        assert "sent {" in str(info.value)  # what was sent
        assert 1.0 <= elapsed / s.request_timeout_s < 3.0
        # The load generator's per-request timeout: a record with the error, never a hang.
        wl = Workload("w", num_prompts=2, input_len=4, output_len=4, warmup=0)
        start = time.monotonic()
        res = run_workload(handle.base_url, handle.model_name, wl, progress=False, timeout_s=1.0)
        assert time.monotonic() - start < 5
        assert not res.valid
        assert all(r.error and r.error.startswith("timed out after 1 s") for r in res.per_request)
        print(f"MEASURE request-timeout: RequestError after {elapsed:.2f} s (request_timeout_s 1 s)")










# --------------------------------------------------------------------------- 7: marker arguments





# --------------------------------------------------------------------------- 9: security

def _shell_uses(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = ast.unparse(func)
            if name in ("os.system", "os.popen", "os.execl", "os.execlp", "os.spawnl", "commands.getoutput",
                        "subprocess.getoutput", "subprocess.getstatusoutput", "pty.spawn"):
                found.append(f"{node.lineno}: {name}(...)")
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{node.lineno}: {name}(..., shell={ast.unparse(kw.value)})")
            if name.startswith(("subprocess.", "asyncio.create_subprocess_shell")) and node.args and \
                    isinstance(node.args[0], ast.Constant | ast.JoinedStr | ast.BinOp):
                found.append(f"{node.lineno}: {name}({ast.unparse(node.args[0])[:60]}) takes a string command")
            if name.endswith("create_subprocess_shell"):
                found.append(f"{node.lineno}: {name}(...)")
    return found


def test_no_shell_anywhere_in_the_package() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for hit in _shell_uses(ast.parse(path.read_text(), str(path))):
            problems.append(f"{path.relative_to(PACKAGE.parent)}:{hit}")
    assert problems == []
    # The checker itself finds what it must.
    assert _shell_uses(ast.parse("import os, subprocess\nos.system('x')\nsubprocess.run('ls', shell=True)\n"))


def test_shell_metacharacters_in_configuration_are_passed_literally(tmp_path: Path, token: str) -> None:
    marker = tmp_path / "pwned"
    values = (f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}` && touch {marker}|")
    s = spec("literal", "fail_once.py", "--note", *values, token=token)
    with ServerHandle(s, log_dir=tmp_path / "logs") as handle:
        assert handle.client().complete("Hello", 2).ok
        argv = psutil.Process(handle.pid or 0).cmdline()
        for value in values:
            assert value in argv  # one argument each, exactly as configured
    assert not marker.exists()
    header = (handle.log_path or Path()).read_text().splitlines()[0]
    assert header.startswith("# llmserve launch ") and json.loads(header.split(" ", 3)[3])["argv"][-3:] == list(values)


def test_launch_header_and_failure_messages_never_show_secrets(tmp_path: Path, token: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in: never_ready.py with secrets in api_key, args and env (a boot that fails: every place a
    failure prints from, the header, the error and the log tail, is checked)."""
    secrets = {"api_key": "sk-cfg-" + uuid.uuid4().hex, "arg": "sk-arg-" + uuid.uuid4().hex,
               "env": "hf_env_" + uuid.uuid4().hex}
    monkeypatch.setenv("HF_TOKEN", "hf_outer_" + uuid.uuid4().hex)
    s = spec("secret", "never_ready.py", "--api-key", secrets["arg"], token=token, startup_timeout_s=1.0,
             api_key=secrets["api_key"], env=((MARK_ENV, token), ("HF_TOKEN", secrets["env"])))
    handle = ServerHandle(s, log_dir=tmp_path / "logs")
    err, _ = timed_start(handle)
    log = (handle.log_path or Path()).read_text()
    header = log.splitlines()[0]
    assert secrets["arg"] in log  # the stand-in echoes its argv into its own output, as some engines do...
    assert "--- last lines ---" in str(err) and "--api-key', '***'" in str(err)  # ...the error masks it
    for value in [*secrets.values(), os.environ["HF_TOKEN"]]:
        assert value not in header and value not in str(err)
    assert '"--api-key", "***"' in header and '"HF_TOKEN"' in header


def test_registry_entry_is_written_atomically_and_only_under_the_cache(tmp_path: Path, token: str,
                                                                       private_registry: Path) -> None:
    s = spec("reg", "fail_once.py", token=token)
    with ServerHandle(s, log_dir=tmp_path / "logs") as handle:
        entries = list(private_registry.iterdir())
        assert [p.name for p in entries] == [f"{handle.pid}.json"]  # no temporary file left
        entry = json.loads(entries[0].read_text())
        assert handle.pid is not None and entry["create_time"] == procs.create_time(handle.pid)
        assert entry["run_pid"] == os.getpid()
    assert not list(private_registry.iterdir())


def test_free_port_is_bindable(tmp_path: Path) -> None:
    port = procs.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_kernel_that_cannot_run_on_this_gpu_is_refused_before_anything_launches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU reading stands in (no GPU here): one H200 (compute capability 9.0) and SGLang's trtllm DSA decode
    backend, whose kernels are SM100/SM103 only. The boot is refused in preflight with the reason, no process
    starts, and the error is a PreflightError naming the option, its file and the GPU."""
    from pytest_llmserve.errors import PreflightError
    from pytest_llmserve.server import gpu

    h200 = gpu.GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-0", memory_total_mib=143771, memory_used_mib=1,
                       memory_free_mib=143770, compute_capability="9.0")
    monkeypatch.setattr(gpu, "gpu_check", lambda spec, ignore_pids=(): gpu.PreflightResult([h200], [0], [], {0: 1}))
    s = ServerSpec(name="dsa", engine="sglang", model=str(tmp_path), gpu=True, python=sys.executable,
                   nsa_decode_backend="trtllm", source="llmserve.toml")
    handle = ServerHandle(s, log_dir=tmp_path / "logs")
    with pytest.raises(PreflightError) as refused:
        handle.start()
    text = str(refused.value)
    assert "nsa_decode_backend = 'trtllm' (from llmserve.toml) runs only on SM100/SM103" in text
    assert "GPU 0 (NVIDIA H200) has compute capability 9.0" in text
    assert handle.proc is None and handle.plan is None  # nothing launched
