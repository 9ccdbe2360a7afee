"""The pytest side of the reports: each check's verdict taken from its test report, carried to the
controller (xdist workers included) and into ``--junitxml``, and collected for the session's reports.

Every test that is a *check* (:func:`is_check`) or a benchmark (:func:`is_benchmark`) gets, when its
outcome is known (the call phase, or a set-up that failed or skipped), a row: a
:class:`~pytest_llmserve.report.checks.CheckOutcome` dict on the report as ``llmserve_check`` (a report
attribute survives pytest-xdist's report serialization; the junit file is not burdened with it), and
its verdict as flat ``user_properties`` (``llmserve_check``, ``llmserve_server``, ``llmserve_verdict``,
``llmserve_first_finding``; for a measured benchmark also ``llmserve_median``, ``llmserve_baseline_median``,
``llmserve_change``, ``llmserve_p``), which pytest's junitxml writes as the testcase's properties. A
benchmark whose gate recorded a measurement is reported by that record (a
:class:`~pytest_llmserve.report.outcome.BenchOutcome`, carried as its JSON in the ``llmserve_benchmark`` user
property); the row is for a benchmark test that ended without one (it failed before measuring, or was skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.report.checks import NOT_APPLICABLE, CheckOutcome, CheckVerdict, one_line
from pytest_llmserve.report.outcome import BenchOutcome

ROW_ATTR = "llmserve_check"  # the report attribute that carries a check's row
BENCH_PROPERTY = "llmserve_benchmark"  # the user property a benchmark's BenchOutcome travels in (its JSON)
ORACLE_RECORDS_KEY = pytest.StashKey[list[dict[str, Any]]]()
BENCH_FIXTURES = frozenset({"llm_bench", "llm_ab"})


def is_benchmark(item: pytest.Item) -> bool:
    return (item.get_closest_marker("llmserve_benchmark") is not None
            or not BENCH_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())))


def is_check(item: pytest.Item, suite_dir: Path) -> bool:
    """A correctness check: a test of the built-in suite, or one that uses ``decode_check`` or carries
    ``llmserve_correctness`` (benchmarks are reported as benchmarks)."""
    if is_benchmark(item):
        return False
    return (suite_dir in Path(item.path).parents or "decode_check" in getattr(item, "fixturenames", ())
            or item.get_closest_marker("llmserve_correctness") is not None)


def oracle_recorder(item: pytest.Item) -> Callable[[dict[str, Any]], None]:
    """Where ``DecodeCheck`` leaves each oracle's verdict and full evidence for this test's row."""
    records = item.stash.setdefault(ORACLE_RECORDS_KEY, [])
    return records.append


def check_name(item: pytest.Item, server_id: str | None) -> str:
    """The test without its server parameter: ``test_no_nan``, ``test_batch_size[bs=3-padded-to-4]``."""
    base = getattr(item, "originalname", None) or item.name.split("[", 1)[0]
    callspec = getattr(item, "callspec", None)
    params = str(callspec.id) if callspec is not None else ""
    if server_id and params == server_id:
        params = ""
    elif server_id and params.startswith(server_id + "-"):
        params = params[len(server_id) + 1:]
    return f"{base}[{params}]" if params else base


def _exception_text(call: pytest.CallInfo[None], report: pytest.TestReport) -> str:
    if call.excinfo is not None:
        text = str(call.excinfo.value)
        if text:
            return text
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[2])
    return report.longreprtext or ""


def _first_line(message: str) -> str | None:
    """The message's first finding: its first line, or, under an oracle report's header line ("X FAILED
    on server Y: n error(s)..."), the first finding below it."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and " FAILED on server " in lines[0]:
        return one_line(lines[1])
    return one_line(message)


def _verdict(item: pytest.Item, report: pytest.TestReport, message: str,
             records: list[dict[str, Any]]) -> CheckVerdict:
    if report.passed:
        return "pass"
    if report.failed:
        return "fail" if report.when == "call" else "error"
    # Skipped: unverifiable when the check said its evidence does not exist; not applicable when the oracle
    # needs a trained model and this one is not; else it did not apply here.
    said: CheckVerdict | None = records[-1]["verdict"] if records else None
    if said in ("unverifiable", "not-applicable"):
        return said
    if message.lstrip().lower().startswith(NOT_APPLICABLE):
        return "not-applicable"
    return "unverifiable" if "unverifiable" in message.lower() else "skipped"


def check_row(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport,
              server_id: str | None) -> CheckOutcome:
    records = item.stash.get(ORACLE_RECORDS_KEY, [])
    message = "" if report.passed else _exception_text(call, report)
    verdict = _verdict(item, report, message, records)
    failing = next((r for r in reversed(records) if r["verdict"] == verdict), None) if verdict != "pass" else None
    first = (failing or {}).get("first_finding") or (_first_line(message) if message else None)
    if verdict == "error" and first:
        first = one_line(f"{report.when}: {first}")
    findings = [f for r in records for f in r.get("findings") or []]
    return CheckOutcome(
        test_id=item.nodeid, check=check_name(item, server_id), server_id=server_id or "", verdict=verdict,
        kind="benchmark" if is_benchmark(item) else "correctness", first_finding=first, findings=findings,
        message=message or None, detail=(failing or {}).get("detail") or message or _passed_detail(verdict, records),
        oracles=[{"check": r["check"], "verdict": r["verdict"], "findings": len(r.get("findings") or [])}
                 for r in records],
        duration_s=round(report.duration, 3))


def _passed_detail(verdict: str, records: list[dict[str, Any]]) -> str | None:
    """A passed check's evidence, where its oracle left one (a differential's per-request table)."""
    if verdict != "pass":
        return None
    return next((r["detail"] for r in reversed(records) if r["verdict"] == "pass" and r.get("detail")), None)


def _bench_properties(o: BenchOutcome) -> list[tuple[str, object]]:
    props: list[tuple[str, object]] = [("llmserve_check", o.test_id.rsplit("::", 1)[-1].split("[", 1)[0]),
                                       ("llmserve_server", o.server_id), ("llmserve_verdict", o.status),
                                       ("llmserve_metric", o.metric)]
    if o.current is not None:
        props.append(("llmserve_median", o.current.median))
    if o.baseline is not None:
        props.append(("llmserve_baseline_median", o.baseline.median))
    if o.verdict is not None:
        props += [("llmserve_change", round(o.verdict.raw_change, 6)), ("llmserve_p", o.verdict.p_value)]
    finding = one_line(o.error or o.note)
    if finding:
        props.append(("llmserve_first_finding", finding))
    return props


def record_verdict(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport,
                   server_id: str | None, suite_dir: Path) -> None:
    """Give the report of the phase that decided ``item``'s outcome its row and its junit properties."""
    decided = report.when == "call" or (report.when == "setup" and not report.passed)
    if not decided:
        return
    bench_records = [str(value) for name, value in item.user_properties if name == BENCH_PROPERTY]
    if bench_records:
        # The gate's own record is this benchmark's row; junit gets its figures.
        item.user_properties.extend(_bench_properties(BenchOutcome.from_json(bench_records[-1])))
        return
    if not (is_check(item, suite_dir) or is_benchmark(item)):
        return
    row = check_row(item, call, report, server_id)
    setattr(report, ROW_ATTR, row.to_dict())
    # The teardown report copies item.user_properties, and junitxml writes that report's properties.
    item.user_properties += [("llmserve_check", row.check), ("llmserve_server", row.server_id),
                             ("llmserve_verdict", row.verdict)]
    if row.first_finding:
        item.user_properties.append(("llmserve_first_finding", row.first_finding))


def collected(reports: Iterable[Any]) -> tuple[list[BenchOutcome], list[CheckOutcome]]:
    """The benchmark records and the check rows in ``reports`` (the terminal reporter's, which under
    xdist come from every worker); a test reported more than once (a rerun) keeps its last row."""
    benches: list[str] = []  # each record's JSON, once
    rows: dict[str, CheckOutcome] = {}
    for report in reports:
        row = getattr(report, ROW_ATTR, None)
        if isinstance(row, dict):
            rows[str(row["test_id"])] = CheckOutcome.from_dict(row)
        if getattr(report, "when", None) == "call":
            for name, value in getattr(report, "user_properties", []):
                if name == BENCH_PROPERTY and str(value) not in benches:
                    benches.append(str(value))
    return [BenchOutcome.from_json(text) for text in benches], list(rows.values())
