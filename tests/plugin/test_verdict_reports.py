"""Every check's verdict reaches results.json, summary.md, the GitHub job summary and --junitxml, in one
process and across pytest-xdist workers (pytester; the checks here need no server, since what is proven is
the recording and its transport; the real engine's failures are in tests/e2e/test_reports_real.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

INNER = '''
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("the server did not come up")

@pytest.mark.llmserve_correctness
def test_passes():
    pass

@pytest.mark.llmserve_correctness
def test_finds_nan():
    pytest.fail("nan-check FAILED on server s: 1 error(s)\\n[nan] error in probe: HTTP 400 reports NaN\\n" + "x\\n" * 50,
                pytrace=False)

@pytest.mark.llmserve_correctness
def test_cannot_tell():
    pytest.skip("UNVERIFIABLE: the server does not report its attention backend")

@pytest.mark.llmserve_correctness
def test_does_not_apply():
    pytest.skip("CUDA graphs are off in this configuration")

@pytest.mark.llmserve_correctness
def test_never_ran(broken):
    pass

def test_not_an_llmserve_check():
    pass
'''


@pytest.fixture(autouse=True)
def anchored_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "xdist-2"])
def test_every_verdict_is_in_each_report(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                         workers: int) -> None:
    pytester.makepyfile(test_checks=INNER)
    step = pytester.path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    junit = pytester.path / "junit.xml"
    args = ["-p", "no:cacheprovider", f"--junitxml={junit}"] + (["-n", str(workers)] if workers else [])
    result = pytester.runpytest_subprocess(*args, timeout=120)
    result.assert_outcomes(passed=2, failed=1, skipped=2, errors=1)

    doc = json.loads((pytester.path / "llmserve-results" / "latest" / "results.json").read_text())
    verdicts = {row["check"]: row["verdict"] for row in doc["checks"]}
    assert verdicts == {"test_passes": "pass", "test_finds_nan": "fail", "test_cannot_tell": "unverifiable",
                        "test_does_not_apply": "skipped", "test_never_ran": "error"}
    rows = {row["check"]: row for row in doc["checks"]}
    # The first finding is the one under the oracle's header line; the message keeps all of it.
    assert rows["test_finds_nan"]["first_finding"] == "[nan] error in probe: HTTP 400 reports NaN"
    assert rows["test_finds_nan"]["message"].count("\n") >= 50
    assert rows["test_never_ran"]["first_finding"] == "setup: the server did not come up"
    headline = "verified 2 of 5 checks · 2 FAILED (2 correctness) · 1 passed · 1 unverifiable · 1 skipped"
    assert doc["summary"]["headline"] == headline

    summary = (pytester.path / "llmserve-results" / "latest" / "summary.md").read_text()
    assert summary.splitlines()[0] == f"### pytest-llmserve: {headline}"
    assert step.read_text() == "earlier step\n" + summary + "\n"  # appended, once, by the controller only
    result.stdout.fnmatch_lines([f"llmserve: {headline}", "FAIL * test_finds_nan * [[]nan[]] error in probe*"])

    cases = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_finds_nan"] == {"llmserve_check": "test_finds_nan", "llmserve_server": "",
                                       "llmserve_verdict": "fail",
                                       "llmserve_first_finding": "[nan] error in probe: HTTP 400 reports NaN"}
    assert cases["test_cannot_tell"]["llmserve_verdict"] == "unverifiable"
    assert cases["test_never_ran"]["llmserve_verdict"] == "error"
    assert cases["test_not_an_llmserve_check"] == {}  # not a check: nothing added


def test_a_run_without_llmserve_checks_writes_no_reports(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=60)
    result.assert_outcomes(passed=1)
    assert not (pytester.path / "llmserve-results").exists()
    out = result.stdout.str()
    assert "llmserve: " not in out and "llmserve ===" not in out  # no headline, no llmserve section
