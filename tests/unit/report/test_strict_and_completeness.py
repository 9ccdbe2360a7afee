"""Strict mode's decisions (which verdicts it fails, which it leaves), the headline's "verified N of M", and an
interrupted run said first in every report: pure functions on constructed rows and benchmark records. The same
through whole pytest runs is in tests/plugin/test_strict_runs.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_llmserve.report.checks import (
    CheckOutcome,
    RunCompleteness,
    failed_by_strict_mode,
    headline,
    headline_counts,
    is_verified,
    strict_failure,
)
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.session import format_text_summary, write_all
from pytest_llmserve.report.text import STRICT_FAILED_LABEL, format_markdown
from pytest_llmserve.report_hooks import run_completeness, untrained_declared
from pytest_llmserve.verdicts.comparability import comparability
from tests.unit.report.test_report import context, outcome


def row(verdict: str, *, kind: str = "correctness", name: str = "test_x", message: str | None = None,
        declared: bool | None = None) -> CheckOutcome:
    return CheckOutcome(test_id=f"suite.py::{name}[s]", check=name, server_id="s", verdict=verdict,  # type: ignore[arg-type]
                        kind=kind, message=message, first_finding=message, untrained_declared=declared)  # type: ignore[arg-type]


def bench(status: str, name: str = "test_throughput") -> BenchOutcome:
    """A benchmark record whose ``status`` is the one asked for, with a note as its gate leaves one."""
    measured = outcome(name)  # regressed: the current rounds are 10 % below the baseline
    assert measured.verdict is not None
    made = {
        "regressed": measured,
        "pass": replace(measured, verdict=replace(measured.verdict, outcome="pass")),
        "improved": replace(measured, verdict=replace(measured.verdict, outcome="improved")),
        "inconclusive": replace(measured, verdict=replace(measured.verdict, outcome="inconclusive")),
        "no-baseline": outcome(name, baseline=[], comparability=None),
        "saved": outcome(name, baseline=[], comparability=None, saved=True),
        "confounded": outcome(name, baseline=[], comparability=None, confounded=True),
        "refused": outcome(name, verdict=None,
                           comparability=comparability(context(), context(mem_fraction=0.5), None, False)),
        "error": outcome(name, error="invalid run: 1 of 4 requests failed"),
    }[status]
    record = replace(made, note=f"the gate's note ({status})")
    assert record.status == status
    return record


# ---------------------------------------------------------------------------- verified

def test_verified_means_a_verdict_reached_from_evidence() -> None:
    verified: list[CheckOutcome | BenchOutcome] = [row("pass"), row("fail"), bench("pass"), bench("regressed"),
                                                   bench("improved")]
    not_verified: list[CheckOutcome | BenchOutcome] = [row("error"), row("unverifiable"), row("not-applicable"), row("skipped"),
                    row("fail", kind="benchmark"), row("pass", kind="benchmark"),  # a benchmark that measured nothing
                    failed_by_strict_mode(row("unverifiable", message="no log line"),
                                          strict_failure(row("unverifiable", message="no log line"))),  # type: ignore[arg-type]
                    *(bench(s) for s in ("no-baseline", "saved", "refused", "confounded", "inconclusive", "error"))]
    assert all(is_verified(item) for item in verified)
    assert not any(is_verified(item) for item in not_verified), [item for item in not_verified if is_verified(item)]


def test_the_headline_says_how_many_of_the_checks_were_verified() -> None:
    checks = [row("pass", name="a"), row("fail", name="b"), row("unverifiable", name="c"),
              row("not-applicable", name="d"), row("skipped", name="e")]
    benches = [bench("pass", "t1"), bench("no-baseline", "t2"), bench("confounded", "t3")]
    counts = headline_counts(checks, benches)
    assert (counts["verified"], counts["total"]) == (3, 8)
    assert headline(checks, benches) == ("verified 3 of 8 checks · 1 FAILED (1 correctness) · 2 passed · "
                                         "1 unverifiable · 1 not applicable · 1 skipped · "
                                         "1 benchmark without baseline · 1 benchmark confounded by a busy host")
    # The case this exists for: a run that verified nothing no longer reads like a green one.
    nothing = headline([row("unverifiable"), row("not-applicable", name="d")], [bench("no-baseline")])
    assert nothing.startswith("verified 0 of 3 checks · "), nothing
    assert headline([], []) == "no checks or benchmarks ran"


# ---------------------------------------------------------------------------- strict mode

@pytest.mark.parametrize(("item", "was"), [
    (row("unverifiable", message="UNVERIFIABLE: no attention backend line"), "unverifiable"),
    (row("not-applicable", message="not applicable: known-answers on s: marker file", declared=False),
     "not-applicable"),
    (row("not-applicable", message="not applicable: known-answers on s: marker file"), "not-applicable"),  # no key
    (bench("no-baseline"), "no-baseline"),
    (bench("refused"), "refused"),  # reaches a passing test only as "no baseline for this environment", skipped
    (bench("inconclusive"), "inconclusive"),
    (bench("confounded"), "confounded"),
], ids=["unverifiable", "not-applicable-by-marker", "not-applicable-without-key", "no-baseline",
        "no-baseline-for-this-environment", "inconclusive", "confounded"])
def test_strict_mode_fails_what_verified_nothing_naming_the_original_reason(item: CheckOutcome | BenchOutcome,
                                                                            was: str) -> None:
    failure = strict_failure(item)
    assert failure is not None and failure.was == was
    reason = item.note if isinstance(item, BenchOutcome) else item.message
    assert failure.message.startswith("strict mode: ") and f"is not a pass: {reason}" in failure.message
    if was == "not-applicable":
        assert "declare random_weights = true" in failure.message  # how to make it acceptable


@pytest.mark.parametrize("item", [
    row("not-applicable", message="not applicable: known-answers on s: random_weights = true declared",
        declared=True),
    row("skipped", message="CUDA graphs are off in this configuration"),
    row("pass"), row("fail", message="[nan] HTTP 400"), row("error", message="setup: no server"),
    row("skipped", kind="benchmark", message="no GPU visible"),
    bench("saved"), bench("pass"), bench("improved"), bench("regressed"), bench("error"),
], ids=["declared-not-applicable", "plain-skip", "pass", "fail", "error", "benchmark-skipped-before-measuring",
        "saved", "benchmark-pass", "improved", "regressed", "benchmark-error"])
def test_strict_mode_leaves_a_verdict_a_declaration_a_plain_skip_and_a_saved_baseline_as_they_are(
        item: CheckOutcome | BenchOutcome) -> None:
    assert strict_failure(item) is None


def test_a_check_failed_by_strict_mode_is_a_failure_in_every_report_and_not_verified(tmp_path: Path) -> None:
    original = row("unverifiable", name="test_config_is_execution", message="UNVERIFIABLE: no backend line")
    failure = strict_failure(original)
    assert failure is not None
    failed = failed_by_strict_mode(original, failure)
    assert (failed.verdict, failed.strict_from, failed.failed) == ("fail", "unverifiable", True)
    assert failed.first_finding == "strict mode: unverifiable is not a pass: UNVERIFIABLE: no backend line"
    assert failed.detail == "UNVERIFIABLE: no backend line"  # the evidence is kept
    assert CheckOutcome.from_dict(failed.to_dict()) == failed  # travels as the report's row (xdist, results.json)
    checks = [row("pass", name="test_no_nan"), failed]
    text = headline(checks, [], strict=True)
    assert text == "verified 1 of 2 checks (strict) · 1 FAILED (1 correctness; 1 by strict mode) · 1 passed"
    write_all([], tmp_path, checks=checks, plots=False, strict=True)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["summary"]["headline"] == text and doc["summary"]["strict"] is True
    assert doc["summary"]["counts"]["strict_failed"] == 1
    assert {c["check"]: c["strict_from"] for c in doc["checks"]} == {"test_no_nan": None,
                                                                    "test_config_is_execution": "unverifiable"}
    assert (tmp_path / "summary.md").read_text().splitlines()[0] == f"### pytest-llmserve: {text}"
    assert (tmp_path / "summary.txt").read_text().splitlines()[0] == f"llmserve: {text}"


def test_a_benchmark_failed_by_strict_mode_is_counted_once_by_its_row_and_its_record_keeps_its_figures() -> None:
    record = bench("no-baseline")
    failure = strict_failure(record)
    assert failure is not None
    strict_row = CheckOutcome(test_id=record.test_id, check="test_throughput", server_id=record.server_id,
                              verdict="fail", kind="benchmark", first_finding=failure.message,
                              message=failure.message, strict_from=failure.was)
    other = bench("pass", "test_latency")
    counts = headline_counts([strict_row], [record, other])
    assert (counts["total"], counts["verified"], counts["failed"]["benchmark"], counts["benchmarks"]) == (2, 1, 1, {})
    assert headline([strict_row], [record, other], strict=True) == (
        "verified 1 of 2 checks (strict) · 1 FAILED (1 benchmark; 1 by strict mode) · 1 passed")
    assert record.status == "no-baseline"  # what `llmserve baselines accept` reads is unchanged
    text = format_text_summary([record, other], [strict_row], strict=True)
    assert f"no baseline{STRICT_FAILED_LABEL}" in text
    markdown = format_markdown([record, other], [strict_row], strict=True)
    assert f"no baseline{STRICT_FAILED_LABEL}" in markdown and "| ❌ | `test_throughput` |" in markdown
    # Without strict mode's row the same record is a benchmark without baseline, not a failure.
    assert headline([], [record, other]) == "verified 1 of 2 checks · 1 passed · 1 benchmark without baseline"


def test_untrained_is_declared_only_when_every_not_applicable_record_says_so() -> None:
    declared = {"check": "known-answers", "verdict": "not-applicable", "declared": True}
    by_marker = {"check": "long-decode", "verdict": "not-applicable", "declared": False}
    without_key = {"check": "long-decode", "verdict": "not-applicable"}
    passed = {"check": "nan-check", "verdict": "pass"}
    assert untrained_declared([passed, declared]) is True
    assert untrained_declared([declared, by_marker]) is False
    assert untrained_declared([without_key]) is False
    assert untrained_declared([passed]) is False  # not applicable by its skip reason alone: not declared


# ---------------------------------------------------------------------------- an interrupted run

def test_an_interrupted_run_says_so_first_in_every_report(tmp_path: Path) -> None:
    stopped = RunCompleteness(collected=16, ran=1, stopped="interrupted")
    checks = [row("pass")]
    text = headline(checks, [], completeness=stopped)
    assert text == "INTERRUPTED: 15 of 16 collected items never ran · verified 1 of 1 check · 1 passed"
    write_all([], tmp_path, checks=checks, plots=False, completeness=stopped)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["summary"]["headline"] == text
    assert doc["summary"]["interrupted"] == {"stopped": "interrupted", "why": None, "collected": 16, "ran": 1,
                                             "never_ran": 15}
    assert (tmp_path / "summary.md").read_text().splitlines()[0] == f"### pytest-llmserve: {text}"
    assert (tmp_path / "summary.txt").read_text().splitlines()[0] == f"llmserve: {text}"
    early = RunCompleteness(collected=4, ran=1, stopped="stopped-early", why="stopping after 1 failures")
    assert headline([row("fail")], [], completeness=early).startswith(
        "STOPPED EARLY (stopping after 1 failures): 3 of 4 collected items never ran · ")
    assert headline([], [], completeness=stopped) == ("INTERRUPTED: 15 of 16 collected items never ran · "
                                                      "no checks or benchmarks ran")


def test_a_run_that_ran_to_its_end_says_nothing_of_it(tmp_path: Path) -> None:
    complete = RunCompleteness(collected=1, ran=1)
    assert complete.line() is None
    assert headline([row("pass")], [], completeness=complete) == "verified 1 of 1 check · 1 passed"
    write_all([], tmp_path, checks=[row("pass")], plots=False, completeness=complete)
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["interrupted"] is None


def report(nodeid: str, when: str, outcome: str = "passed") -> Any:
    return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed")


# Three items: a passed one; one skipped in set-up; one whose set-up passed and whose call never ended.
REPORTS = [report("t::a", "setup"), report("t::a", "call"), report("t::a", "teardown"),
           report("t::b", "setup", "skipped"), report("t::c", "setup"),
           SimpleNamespace(nodeid="t::a", message="a warning, not a test's report")]


def test_completeness_counts_the_items_that_ran_to_an_outcome_and_tells_why_the_run_stopped() -> None:
    interrupted = run_completeness(REPORTS, collected=16, exitstatus=pytest.ExitCode.INTERRUPTED, shouldfail=False,
                                   shouldstop=False, maxfail=0)
    assert interrupted == RunCompleteness(collected=16, ran=2, stopped="interrupted")
    failing = [*REPORTS[:4], report("t::c", "call", "failed")]
    minus_x = run_completeness(failing, collected=5, exitstatus=pytest.ExitCode.TESTS_FAILED,
                               shouldfail="stopping after 1 failures", shouldstop=False, maxfail=1)
    assert minus_x == RunCompleteness(collected=5, ran=3, stopped="stopped-early", why="stopping after 1 failures")
    # pytest-xdist's controller ends a -x run with the interrupted exit status: the failures tell it apart.
    xdist_x = run_completeness(failing, collected=5, exitstatus=pytest.ExitCode.INTERRUPTED, shouldfail=False,
                               shouldstop=False, maxfail=1)
    assert (xdist_x.stopped, xdist_x.why) == ("stopped-early", "stopping after 1 failures")


def test_completeness_of_a_run_that_ended_by_itself_has_no_stop_even_with_failures() -> None:
    failing = [*REPORTS[:4], report("t::c", "call", "failed")]
    done = run_completeness(failing, collected=3, exitstatus=pytest.ExitCode.TESTS_FAILED, shouldfail=False,
                            shouldstop=False, maxfail=0)
    assert done == RunCompleteness(collected=3, ran=3)
    assert done.line() is None
