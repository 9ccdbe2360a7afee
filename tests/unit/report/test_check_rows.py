"""Check rows beside benchmark rows: the headline that counts every verdict, summary.md, results.json and the
GitHub job summary (appended, never overwritten)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmserve.errors import BaselineError
from pytest_llmserve.report.checks import CheckOutcome, headline, headline_counts, one_line
from pytest_llmserve.report.json import read_check_outcomes, read_results_json
from pytest_llmserve.report.session import format_text_summary, write_all
from pytest_llmserve.report.text import format_markdown
from tests.unit.report.test_report import outcome


def check(name: str, verdict: str, server: str = "nan", kind: str = "correctness",
          first: str | None = None) -> CheckOutcome:
    return CheckOutcome.from_dict({"test_id": f"suite.py::{name}[{server}]", "check": name, "server_id": server,
                                   "verdict": verdict, "kind": kind, "first_finding": first,
                                   "message": first, "detail": first})


RUN = [
    check("test_boots_and_generates", "pass"),
    check("test_no_nan", "fail", first="[nan] nan-check[capital]: HTTP 400 whose body reports NaN/inf"),
    check("test_coherent", "fail", first="[nan] long-decode[story]: HTTP 400"),
    check("test_config_is_execution", "unverifiable", first="UNVERIFIABLE: attention backend"),
    check("test_captured_batch_sizes_covered", "skipped", first="CUDA graphs are off"),
    check("test_throughput", "error", kind="benchmark", first="setup: server nan failed to boot"),
]


def test_headline_counts_every_verdict_failures_first() -> None:
    benches = [outcome(), outcome("test_new", baseline=[]), outcome("test_same", current=[100.0, 100.2, 99.8])]
    text = headline(RUN, benches)
    # Verified: the pass and the two failures of the checks, the regressed and the passed benchmark.
    assert text == ("verified 5 of 9 checks · 4 FAILED (2 correctness, 2 benchmark) · 2 passed · 1 unverifiable · "
                    "1 skipped · 1 benchmark without baseline")
    counts = headline_counts(RUN, benches)
    assert counts["failed"] == {"correctness": 2, "benchmark": 2} and counts["total"] == 9
    assert counts["verified"] == 5
    assert headline([check("a", "pass")], []) == "verified 1 of 1 check · 1 passed"
    assert headline([], []) == "no checks or benchmarks ran"


def test_markdown_first_line_is_the_headline_and_each_check_has_a_row() -> None:
    md = format_markdown([outcome()], RUN)
    lines = md.splitlines()
    assert lines[0] == "### pytest-llmserve: verified 4 of 7 checks · 4 FAILED (2 correctness, 2 benchmark) · " \
                       "1 passed · 1 unverifiable · 1 skipped"
    rows = [line for line in lines if line.startswith("| ") and "`test_" in line]
    assert len(rows) == len(RUN) + 1  # every check, and the benchmark
    # Failures first, then what could not be verified; a passing check is listed too.
    assert rows[0].startswith("| ❌ | `test_no_nan` | nan | FAIL | [nan] nan-check[capital]: HTTP 400")
    assert rows[3].startswith("| ❔ | `test_config_is_execution`")
    assert any("`test_boots_and_generates` | nan | pass" in row for row in rows)
    assert "ERROR (benchmark)" in md and "#### Benchmarks" in md and "<summary>Check details</summary>" in md


def test_results_json_rows_round_trip_and_old_files_have_no_checks(tmp_path: Path) -> None:
    paths = write_all([outcome()], tmp_path, checks=RUN, plots=False)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["summary"]["headline"].startswith("verified 4 of 7 checks · 4 FAILED (2 correctness, 2 benchmark)")
    assert (doc["summary"]["counts"]["verified"], doc["summary"]["counts"]["total"]) == (4, 7)
    assert doc["summary"]["strict"] is False and doc["summary"]["interrupted"] is None
    assert [row["verdict"] for row in doc["checks"]] == [c.verdict for c in RUN]
    assert read_check_outcomes(tmp_path / "results.json") == RUN
    _, benches = read_results_json(tmp_path / "results.json")  # what `llmserve baselines accept` reads
    assert len(benches) == 1
    assert (tmp_path / "summary.txt").read_text().startswith("llmserve: verified 4 of 7 checks · 4 FAILED")
    assert {p.name for p in paths} == {"results.json", "summary.md", "summary.txt"}
    old = tmp_path / "old.json"
    del doc["checks"]
    old.write_text(json.dumps(doc))
    assert read_check_outcomes(old) == []
    doc["checks"] = [{"test_id": "t", "check": "c", "verdict": "maybe"}]
    old.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"checks\[0\] is malformed.*'maybe'"):
        read_check_outcomes(old)


def test_a_run_without_benchmarks_still_gets_its_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    write_all([], tmp_path / "r", checks=RUN[:2], github_summary=True, bench_json=tmp_path / "bench.json")
    write_all([], tmp_path / "r", checks=RUN[:1], github_summary=True)
    text = step.read_text()
    assert text.startswith("earlier step\n")  # appended, never overwritten
    assert text.count("### pytest-llmserve:") == 2
    assert "verified 2 of 2 checks · 1 FAILED (1 correctness) · 1 passed" in text
    assert not (tmp_path / "bench.json").exists()  # no benchmarks: no empty pytest-benchmark file


def test_text_summary_lists_what_did_not_pass() -> None:
    text = format_text_summary([], RUN)
    lines = text.splitlines()
    assert lines[0] == ("llmserve: verified 3 of 6 checks · 3 FAILED (2 correctness, 1 benchmark) · 1 passed · "
                        "1 unverifiable · 1 skipped")
    assert lines[1].split() [:3] == ["FAIL", "test_no_nan", "nan"]
    assert "test_boots_and_generates" not in text


def test_one_line() -> None:
    assert one_line("\n  first\nsecond") == "first"
    assert one_line("x" * 300, 20) == "x" * 17 + "..."
    assert one_line(None) is None


def test_not_applicable_is_counted_on_its_own_in_every_report() -> None:
    untrained = [check("test_boots_and_generates", "pass", server="tiny"),
                 check("test_known_answers", "not-applicable", server="tiny",
                       first="not applicable: known-answers on tiny: random weights"),
                 check("test_long_decode_is_coherent", "not-applicable", server="tiny",
                       first="not applicable: long-decode on tiny: random weights"),
                 check("test_captured_batch_sizes_covered", "skipped", server="tiny", first="CUDA graphs are off")]
    assert headline(untrained, []) == "verified 1 of 4 checks · 1 passed · 2 not applicable · 1 skipped"
    counts = headline_counts(untrained, [])
    assert (counts["passed"], counts["not-applicable"], counts["skipped"], counts["unverifiable"]) == (1, 2, 1, 0)
    markdown = format_markdown([], untrained)
    assert markdown.splitlines()[0] == ("### pytest-llmserve: verified 1 of 4 checks · 1 passed · 2 not applicable · "
                                        "1 skipped")
    assert "| ➖ | `test_known_answers` | tiny | not applicable | not applicable: known-answers" in markdown
    assert CheckOutcome.from_dict(untrained[1].to_dict()).verdict == "not-applicable"


def test_the_session_s_verdicts_are_this_process_s_records_and_the_reports_rows_once_each() -> None:
    from types import SimpleNamespace

    from pytest_llmserve.report_hooks import BENCH_PROPERTY, ROW_ATTR, session_verdicts

    mine, workers = outcome(), outcome("test_new", baseline=[])

    def report(when: str, bench: object = None, row: CheckOutcome | None = None) -> SimpleNamespace:
        props = [(BENCH_PROPERTY, bench.to_json())] if bench is not None else []  # type: ignore[attr-defined]
        return SimpleNamespace(when=when, user_properties=props, **({ROW_ATTR: row.to_dict()} if row else {}))

    reports = [report("call", mine), report("call", workers), report("teardown", workers),  # a property stays
               report("call", row=RUN[0]), report("call", row=RUN[1]), report("call", row=RUN[0])]  # a rerun
    benches, checks = session_verdicts(reports, [mine])
    # This process's record came back in its report too: one row each, its own first.
    assert [b.to_json() for b in benches] == [mine.to_json(), workers.to_json()]
    assert [c.test_id for c in checks] == [RUN[0].test_id, RUN[1].test_id]
