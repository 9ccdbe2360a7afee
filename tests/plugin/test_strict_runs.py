"""Strict mode and stopped runs through whole pytest runs (pytester).

A run whose checks verified nothing exits 0 normally and 1 with ``--llmserve-strict`` (or the ini key, or the
environment variable), each failure naming its reason, in one process and across pytest-xdist workers; a benchmark
without a baseline (measured on ``tools/zero_cost_server.py`` under the ``command`` engine: the figure does not
matter here, only that there is no baseline) is failed the same way. A run that is interrupted (an inner test's
KeyboardInterrupt; SIGTERM to an inner run with a stand-in server up) or stopped by ``-x`` says so first in
summary.md, summary.txt, results.json and the terminal. The pure decisions are in
tests/unit/report/test_strict_and_completeness.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from tests.standins.helpers import MARK_ENV, ZERO_COST, marked_processes, server_toml, standin_toml, wait_for

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

# Checks that need no server: what is proven is the verdict each one is given, and its transport.
CHECKS = '''
import pytest

from pytest_llmserve.gates.decode import oracle_record
from pytest_llmserve.report_hooks import oracle_records


def _not_applicable(request, declared):
    # What DecodeCheck leaves for an oracle that needs a trained model, on an untrained one.
    reason = "not applicable: known-answers on s: " + ("random_weights = true declared in llmserve.toml"
                                                       if declared else "marker file m/llmserve-checkpoint.json")
    oracle_records(request.node).append(oracle_record("known-answers", "not-applicable", first_finding=reason,
                                                      detail=reason, declared=declared))
    pytest.skip(reason)


@pytest.mark.llmserve_correctness
def test_passes():
    pass


@pytest.mark.llmserve_correctness
def test_cannot_tell():
    pytest.skip("UNVERIFIABLE: the server does not report its attention backend")


@pytest.mark.llmserve_correctness
def test_graphs_off():
    pytest.skip("CUDA graphs are off in this configuration")


@pytest.mark.llmserve_correctness
def test_untrained_by_marker(request):
    _not_applicable(request, declared=False)


@pytest.mark.llmserve_correctness
def test_untrained_declared(request):
    _not_applicable(request, declared=True)
'''

STRICT_HEADLINE = ("verified 1 of 5 checks (strict) · 2 FAILED (2 correctness; 2 by strict mode) · 1 passed · "
                   "1 not applicable · 1 skipped")


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    """Inner runs get a pytest.ini, so their rootdir (and config file) is theirs, whatever lies above."""
    pytester.makeini("[pytest]\n")


def _results(pytester: pytest.Pytester) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((pytester.path / "llmserve-results" / "latest" / "results.json").read_text())
    return doc


def _first_line(pytester: pytest.Pytester, name: str) -> str:
    return (pytester.path / "llmserve-results" / "latest" / name).read_text().splitlines()[0]


def test_without_strict_mode_a_run_that_verified_little_exits_0(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=4)
    headline = _results(pytester)["summary"]["headline"]
    assert headline == "verified 1 of 5 checks · 1 passed · 1 unverifiable · 2 not applicable · 1 skipped"
    result.stdout.fnmatch_lines([f"llmserve: {headline}"])


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist-2"])
def test_strict_mode_fails_an_unverifiable_and_an_undeclared_not_applicable_check_naming_the_reason(
        pytester: pytest.Pytester, workers: int) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    junit = pytester.path / "junit.xml"
    args = ["-p", "no:cacheprovider", "-rf", "--llmserve-strict", f"--junitxml={junit}"]
    result = pytester.runpytest_subprocess(*args, *(["-n", str(workers)] if workers else []), timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=2, skipped=2)  # the plain skip and the declared one stay skips
    result.stdout.fnmatch_lines(["llmserve: strict mode: unverifiable, undeclared not applicable, no baseline, "
                                 "inconclusive and confounded fail"])
    # Each failure's text: strict mode, what it did not accept, the original reason (and pytest's short summary).
    result.stdout.fnmatch_lines([
        "strict mode: unverifiable is not a pass: UNVERIFIABLE: the server does not report its attention backend",
        "strict mode: not applicable without a declaration is not a pass: not applicable: known-answers on s: "
        "marker file m/llmserve-checkpoint.json",
        "(declare random_weights = true for the server *",
        "FAILED *test_cannot_tell - Failed: strict mode: *", "FAILED *test_untrained_by_marker - Failed: strict mode: *"])
    result.stdout.fnmatch_lines([f"llmserve: {STRICT_HEADLINE}"])

    doc = _results(pytester)
    assert doc["summary"]["headline"] == STRICT_HEADLINE and doc["summary"]["strict"] is True
    rows = {row["check"]: row for row in doc["checks"]}
    assert {name: (row["verdict"], row["strict_from"]) for name, row in rows.items()} == {
        "test_passes": ("pass", None), "test_cannot_tell": ("fail", "unverifiable"),
        "test_graphs_off": ("skipped", None), "test_untrained_by_marker": ("fail", "not-applicable"),
        "test_untrained_declared": ("not-applicable", None)}
    assert rows["test_untrained_declared"]["untrained_declared"] is True
    assert rows["test_cannot_tell"]["first_finding"].startswith("strict mode: unverifiable is not a pass: ")
    assert _first_line(pytester, "summary.md") == f"### pytest-llmserve: {STRICT_HEADLINE}"
    assert _first_line(pytester, "summary.txt") == f"llmserve: {STRICT_HEADLINE}"

    cases = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_cannot_tell"]["llmserve_verdict"] == "fail"
    assert cases["test_cannot_tell"]["llmserve_strict_from"] == "unverifiable"
    assert cases["test_untrained_declared"]["llmserve_verdict"] == "not-applicable"
    assert "llmserve_strict_from" not in cases["test_untrained_declared"]


@pytest.mark.parametrize(("ini", "env", "strict"), [
    ("llmserve_strict = true", None, True),
    (None, "1", True),
    ("llmserve_strict = true", "0", False),  # the environment outranks the ini
], ids=["ini", "env", "env-over-ini"])
def test_strict_mode_from_the_ini_key_and_the_environment(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ini: str | None, env: str | None,
        strict: bool) -> None:
    pytester.makeini("[pytest]\n" + (f"{ini}\n" if ini else ""))
    pytester.makepyfile(test_checks=CHECKS)
    if env is not None:
        monkeypatch.setenv("PYTEST_LLMSERVE_STRICT", env)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if strict else pytest.ExitCode.OK)
    assert ("strict mode: unverifiable is not a pass: UNVERIFIABLE" in result.stdout.str()) is strict


@pytest.mark.parametrize(("where", "expected"), [
    ("env", "$PYTEST_LLMSERVE_STRICT = 'maybe': must be true or false"),
    ("ini", "ini llmserve_strict: invalid truth value 'maybe'"),
])
def test_a_bad_strict_value_is_a_usage_error_naming_value_and_source(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, expected: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    if where == "env":
        monkeypatch.setenv("PYTEST_LLMSERVE_STRICT", "maybe")
    else:
        pytester.makeini("[pytest]\nllmserve_strict = maybe\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert expected in result.stderr.str(), result.stderr.str()


def _zero_cost_table(token: str) -> str:
    argv = [sys.executable, str(ZERO_COST), "--port", "{port}", "--token-delay-ms", "0.5"]
    return (server_toml("zero", engine="command", argv=argv, served_model_name="zero-cost", env={MARK_ENV: token},
                        startup_timeout_s=30)
            + "[workloads.tiny]\nnum_prompts = 2\ninput_len = 4\noutput_len = 8\nwarmup = 0\n")


BENCHMARK = '''
import pytest


# Other processes on a shared test machine must not make this a "confounded" benchmark: not what is tested here.
@pytest.mark.llmserve_benchmark(workload="tiny", rounds=1, warmup_rounds=0, contention_bound=0.99)
def test_gate(llm_bench):
    llm_bench.run()


@pytest.mark.llmserve_correctness
def test_cannot_tell():
    pytest.skip("UNVERIFIABLE: the server does not report its attention backend")
'''


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist-2"])
def test_a_benchmark_without_baseline_passes_normally_and_fails_in_strict_mode(
        pytester: pytest.Pytester, token: str, workers: int) -> None:
    pytester.makefile(".toml", llmserve=_zero_cost_table(token))
    pytester.makepyfile(test_gate=BENCHMARK)
    xdist = ["-n", str(workers)] if workers else []
    normal = pytester.runpytest_subprocess("-p", "no:cacheprovider", *xdist, timeout=180)
    assert normal.ret == pytest.ExitCode.OK, normal.stdout.str()
    normal.assert_outcomes(passed=1, skipped=1)
    assert _results(pytester)["summary"]["headline"] == ("verified 0 of 2 checks · 1 unverifiable · "
                                                         "1 benchmark without baseline")

    junit = pytester.path / "junit.xml"
    strict = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf", "--llmserve-strict",
                                           f"--junitxml={junit}", *xdist, timeout=180)
    assert strict.ret == pytest.ExitCode.TESTS_FAILED, strict.stdout.str()
    strict.assert_outcomes(failed=2)
    strict.stdout.fnmatch_lines([  # benchmarks run last
        "strict mode: unverifiable is not a pass: UNVERIFIABLE: the server does not report its attention backend",
        "strict mode: a benchmark without baseline is not a pass: output_throughput: median *; no baseline at *; record one "
        "with: *--llmserve-save-baseline*"])
    assert "llmserve server log" not in strict.stdout.str()  # the server did nothing wrong: its log says nothing
    doc = _results(pytester)
    headline = "verified 0 of 2 checks (strict) · 2 FAILED (1 correctness, 1 benchmark; 2 by strict mode)"
    assert doc["summary"]["headline"] == headline
    strict.stdout.fnmatch_lines([f"llmserve: {headline}", "*no baseline -> FAILED (strict)*"])
    # The benchmark's record is unchanged (what `llmserve baselines accept` reads); its row says strict mode failed it.
    assert [b["status"] for b in doc["benchmarks"]] == ["no-baseline"]
    gate_row = next(row for row in doc["checks"] if row["kind"] == "benchmark")
    assert (gate_row["verdict"], gate_row["strict_from"]) == ("fail", "no-baseline")
    cases = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(junit).getroot().iter("testcase")}
    gate = next(props for name, props in cases.items() if name and name.startswith("test_gate"))
    assert (gate["llmserve_verdict"], gate["llmserve_strict_from"]) == ("fail", "no-baseline")
    assert str(gate["llmserve_first_finding"]).startswith("strict mode: a benchmark without baseline is not a pass")


INTERRUPTED = '''
import pytest


@pytest.mark.llmserve_correctness
def test_first():
    pass


@pytest.mark.llmserve_correctness
def test_interrupted():
    raise KeyboardInterrupt


@pytest.mark.llmserve_correctness
def test_never_reached():
    pass
'''


def test_an_interrupted_run_says_so_in_every_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stop=INTERRUPTED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    headline = "INTERRUPTED: 2 of 3 collected items never ran · verified 1 of 1 check · 1 passed"
    doc = _results(pytester)
    assert doc["summary"]["headline"] == headline
    assert doc["summary"]["interrupted"] == {"stopped": "interrupted", "why": None, "collected": 3, "ran": 1,
                                             "never_ran": 2}
    assert _first_line(pytester, "summary.md") == f"### pytest-llmserve: {headline}"
    assert _first_line(pytester, "summary.txt") == f"llmserve: {headline}"
    result.stdout.fnmatch_lines([f"llmserve: {headline}"])


def test_a_run_stopped_by_maxfail_says_it_stopped_early(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stop=INTERRUPTED.replace("raise KeyboardInterrupt", "assert False, 'found NaN'"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-x", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    doc = _results(pytester)
    assert doc["summary"]["headline"].startswith(
        "STOPPED EARLY (stopping after 1 failures): 1 of 3 collected items never ran · verified 2 of 2 checks · ")
    assert doc["summary"]["interrupted"]["stopped"] == "stopped-early"


def test_a_run_that_ran_to_its_end_is_not_said_to_be_interrupted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stop=INTERRUPTED.replace("raise KeyboardInterrupt", "pass"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.OK
    doc = _results(pytester)
    assert doc["summary"]["interrupted"] is None
    assert doc["summary"]["headline"] == "verified 3 of 3 checks · 3 passed"


def test_sigterm_with_a_server_up_leaves_reports_that_say_interrupted(pytester: pytest.Pytester, token: str) -> None:
    """Stand-in: fail_once.py, up and answering (the real engine's SIGTERM is in tests/e2e/test_faults.py)."""
    pytester.makefile(".toml", llmserve=standin_toml("up", "fail_once.py", token=token))
    pytester.makepyfile(test_term='''
        import time
        import pytest

        @pytest.mark.llmserve_correctness
        def test_first(llm_server):
            pass

        @pytest.mark.llmserve_correctness
        def test_waits(llm_server):
            print("WAITING FOR SIGTERM", flush=True)
            time.sleep(120)

        @pytest.mark.llmserve_correctness
        def test_never_reached(llm_server):
            pass
    ''')
    out = pytester.path / f"inner-{uuid.uuid4().hex[:6]}.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s"],
                                cwd=pytester.path, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "WAITING FOR SIGTERM" in out.read_text(), 90, "the second test to start")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        text = out.read_text()
        assert code == pytest.ExitCode.INTERRUPTED, text
        headline = "INTERRUPTED: 2 of 3 collected items never ran · verified 1 of 1 check · 1 passed"
        assert f"llmserve: {headline}" in text, text
        doc = _results(pytester)
        assert doc["summary"]["headline"] == headline
        assert (doc["summary"]["interrupted"]["collected"], doc["summary"]["interrupted"]["never_ran"]) == (3, 2)
        assert _first_line(pytester, "summary.md") == f"### pytest-llmserve: {headline}"
        assert not marked_processes(token), text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

