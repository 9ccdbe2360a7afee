"""The reports carry every verdict, proven on the real vLLM CPU engine serving a broken model.

The model is the ``nan`` checkpoint that the oracles' e2e test derives (one mid-depth layer filled with
NaN: vLLM answers HTTP 400 whenever logprobs are asked for, and empty text without them). One inner
pytest run, attached to the test run's shared server of that checkpoint, runs the whole built-in suite on it with a tiny benchmark workload, ``--junitxml``
and ``$GITHUB_STEP_SUMMARY`` set. What is checked is what a CI page is built from: summary.md's first
line counts the correctness failures, results.json has a row for each, junit carries each verdict as
testcase properties, the job summary is appended to (not overwritten), and the failure messages are
concise while the results keep the full evidence.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import TINY_WORKLOAD
from tests.e2e.shared import SharedServers

pytestmark = pytest.mark.slow

SHARED_SERVERS = ("nan",)  # the shared servers (tests/e2e/shared.py) this module attaches to

EARLIER_STEP = "## an earlier step's summary\n"


def junit_cases(path: Path) -> dict[str, tuple[dict[str, str], str]]:
    """test name -> (its properties, its failure text or '')."""
    cases: dict[str, tuple[dict[str, str], str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        failure = case.find("failure")
        text = "" if failure is None else (failure.text or failure.get("message") or "")
        cases[case.get("name", "")] = (props, text)
    return cases


def test_the_suite_on_the_nan_checkpoint_reports_every_failure(
        pytester: pytest.Pytester, write_config: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
        shared_servers: SharedServers) -> None:
    write_config(shared_servers.get("nan").toml() + TINY_WORKLOAD)
    pytester.makeini("[pytest]\n")  # the rootdir is this directory, whatever lies above it
    step_summary = pytester.path / "step-summary.md"
    step_summary.write_text(EARLIER_STEP, encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess("--llmserve-suite", "--llmserve-workload=tiny", "--llmserve-rounds=1",
                                           "-p", "no:cacheprovider", f"--junitxml={junit}", timeout=900)
    out = result.stdout.str()
    results_dir = pytester.path / "llmserve-results" / "latest"  # this run's own report directory
    doc = json.loads((results_dir / "results.json").read_text(encoding="utf-8"))
    checks = {row["test_id"].rsplit("::", 1)[-1]: row for row in doc["checks"]}
    correctness = [row for row in checks.values() if row["kind"] == "correctness"]
    failed = [row for row in correctness if row["verdict"] in ("fail", "error")]

    # Every oracle that asks for logprobs meets vLLM's 400 and fails, each with its own row and first finding.
    for name in ("test_no_nan[nan]", "test_known_answers[nan]", "test_long_decode_is_coherent[nan]"):
        row = checks[name]
        assert row["verdict"] == "fail" and row["server_id"] == "nan", (name, row, out[-4000:])
        assert row["first_finding"] and len(row["first_finding"]) <= 240, row
        assert row["findings"], row  # the structured evidence, each finding with what was sent
    assert "HTTP 400" in checks["test_no_nan[nan]"]["first_finding"], checks["test_no_nan[nan]"]
    # One row per check x server configuration: every correctness test of the suite, none lost.
    assert len(correctness) == result.parseoutcomes().get("failed", 0) + result.parseoutcomes().get("passed", 0) \
        + result.parseoutcomes().get("skipped", 0) + result.parseoutcomes().get("error", 0) - 1, \
        (sorted(checks), result.parseoutcomes())  # all but the benchmark

    # The first line of summary.md counts the correctness failures, failures first.
    summary = (results_dir / "summary.md").read_text(encoding="utf-8")
    first_line = summary.splitlines()[0]
    assert first_line.startswith("### pytest-llmserve: "), first_line
    headline = first_line.removeprefix("### pytest-llmserve: ")
    assert headline == doc["summary"]["headline"]
    assert re.match(rf"verified \d+ of \d+ checks · \d+ FAILED \({len(failed)} correctness", headline), \
        (headline, [r["check"] for r in failed])
    for row in failed:
        assert f"`{row['check']}` | nan |" in summary, row["check"]
    # The benchmark is reported too: measured (a row among the benchmarks) or ended early (a check row).
    bench_rows = [b for b in doc["benchmarks"] if "test_throughput" in b["test_id"]] + \
                 [c for c in checks.values() if c["kind"] == "benchmark"]
    assert len(bench_rows) == 1, (doc["benchmarks"], checks)

    # The CI job summary: appended after the earlier step's, not overwritten.
    job_summary = step_summary.read_text(encoding="utf-8")
    assert job_summary.startswith(EARLIER_STEP) and summary in job_summary

    # junit: each verdict as testcase properties.
    cases = junit_cases(junit)
    props, message = cases["test_no_nan[nan]"]
    assert props["llmserve_check"] == "test_no_nan" and props["llmserve_server"] == "nan", props
    assert props["llmserve_verdict"] == "fail" and props["llmserve_first_finding"], props
    assert cases["test_throughput[nan]"][0].get("llmserve_verdict"), cases["test_throughput[nan]"]
    for name, (case_props, _) in cases.items():
        assert "llmserve_verdict" in case_props, (name, case_props)

    # Concise by default: at most three findings shown, no line running on, never more than the full
    # evidence kept in results.json. (On this checkpoint the findings fold into few distinct ones, so the
    # two are close; the shortening itself is proven in tests/unit/gates/test_decode_records.py.)
    full = checks["test_no_nan[nan]"]["detail"]
    assert "nan-check FAILED on server nan" in message and "nan-check FAILED on server nan" in full
    assert "Out of range float values are not JSON compliant" in message
    assert len(message) <= len(full) + 200, (message, full)  # junit adds the traceback location
    shown = [line for line in message.splitlines() if line.startswith("[")]
    assert 1 <= len(shown) <= 3, message
    assert max(len(line) for line in message.splitlines()) <= 400, message
    n_findings = len(checks["test_no_nan[nan]"]["findings"])
    assert n_findings >= len(shown)
    assert checks["test_boots_and_generates[nan]"]["first_finding"].startswith(
        "a plain completion failed: HTTP 400"), checks["test_boots_and_generates[nan]"]
    print(f"test_no_nan[nan]: message {len(message.splitlines())} lines, full evidence {len(full.splitlines())} "
          f"lines, {n_findings} findings; headline: {first_line}")
