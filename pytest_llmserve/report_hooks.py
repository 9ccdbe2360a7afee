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

In strict mode (``--llmserve-strict``) a test that verified nothing and did not fail is failed here, in its
report (:func:`~pytest_llmserve.report.checks.strict_failure` decides; the report's outcome becomes ``failed``
with "strict mode: ..." and the original reason as its failure, so the exit status, xdist's controller, junit and
``-x`` all see a failure); its row records ``fail`` with ``strict_from`` (a benchmark gets such a row beside its
record) and junit's ``llmserve_verdict`` says ``fail``, with ``llmserve_strict_from``.

A test whose server died under it fails with the death's report (:func:`blame_server_death`); a failed
test whose server is up gets the server log's last lines (:func:`server_log_section`). At the end,
:func:`write_summary` writes the run's llmserve section of the terminal summary: configurations by host,
boots and attached servers, where the time went, and the session's report, whose headline says first when the
run stopped before its items ran (:func:`run_completeness`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.gates.accounting import Accounting, format_report
from pytest_llmserve.gates.accounting import report as time_report
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.redaction import redact_text
from pytest_llmserve.report.checks import (
    NOT_APPLICABLE,
    CheckOutcome,
    CheckVerdict,
    RunCompleteness,
    StopKind,
    failed_by_strict_mode,
    one_line,
    strict_failure,
)
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.session import render_session
from pytest_llmserve.server.handle import LOG_TAIL_LINES, ServerHandle, read_tail, secret_values
from pytest_llmserve.server.hosts import (
    BootEntry,
    ConfigRow,
    HostReport,
    config_groups,
    merge_by_config,
    server_of_nodeid,
)
from pytest_llmserve.server.pool import read_boots
from pytest_llmserve.settings import Settings
from pytest_llmserve.store.reference_answers import DIR_NAME

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


def oracle_records(item: pytest.Item) -> list[dict[str, Any]]:
    """Where ``DecodeCheck`` leaves each oracle's verdict and full evidence for this test's row."""
    return item.stash.setdefault(ORACLE_RECORDS_KEY, [])


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
    # Skipped: unverifiable when a check said its evidence does not exist; not applicable when an oracle
    # needs a trained model and this one is not; else it did not apply here. Any record counts, the most telling
    # first, as DecodeCheck orders its skip reasons: the chain goes on past a check that reached no verdict.
    said = {record["verdict"] for record in records}
    if "unverifiable" in said:
        return "unverifiable"
    if "not-applicable" in said:
        return "not-applicable"
    if message.lstrip().lower().startswith(NOT_APPLICABLE):
        return "not-applicable"
    return "unverifiable" if "unverifiable" in message.lower() else "skipped"


def check_row(item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport,
              server_id: str | None) -> CheckOutcome:
    records = item.stash.get(ORACLE_RECORDS_KEY, [])
    message = "" if report.passed else _exception_text(call, report)
    verdict = _verdict(item, report, message, records)
    failing = next((r for r in reversed(records) if r["verdict"] == verdict), None) if verdict != "pass" else None
    return CheckOutcome(
        test_id=item.nodeid, check=check_name(item, server_id), server_id=server_id or "", verdict=verdict,
        kind="benchmark" if is_benchmark(item) else "correctness",
        first_finding=_first_finding(failing, message, verdict, report.when),
        findings=[f for r in records for f in r.get("findings") or []],
        message=message or None, detail=(failing or {}).get("detail") or message or _passed_detail(verdict, records),
        oracles=[{"check": r["check"], "verdict": r["verdict"], "findings": len(r.get("findings") or [])}
                 for r in records],
        duration_s=round(report.duration, 3),
        untrained_declared=untrained_declared(records) if verdict == "not-applicable" else None)


def _first_finding(failing: dict[str, Any] | None, message: str, verdict: str, when: str) -> str | None:
    """The row's first finding: the deciding oracle record's, else the first line of the test's message (an error
    says in which phase)."""
    first = (failing or {}).get("first_finding") or (_first_line(message) if message else None)
    return one_line(f"{when}: {first}") if verdict == "error" and first else first


def untrained_declared(records: list[dict[str, Any]]) -> bool:
    """Whether every not-applicable oracle record says the configuration declared the model untrained
    (``"declared": true``, :func:`pytest_llmserve.gates.decode.oracle_record`); a record without the key, or a
    test that was not applicable by its skip reason alone, is not declared."""
    said = [record for record in records if record["verdict"] == "not-applicable"]
    return bool(said) and all(record.get("declared") is True for record in said)


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
                   server_id: str | None, suite_dir: Path, *, strict: bool = False) -> bool:
    """Give the report of the phase that decided ``item``'s outcome its row and its junit properties; in
    ``strict`` mode, fail a report that verified nothing (module docstring). True when strict mode failed it."""
    decided = report.when == "call" or (report.when == "setup" and not report.passed)
    if not decided:
        return False
    # A test that failed already, or one the user expects to fail (xfail), is left as it is.
    promotable = strict and not report.failed and not hasattr(report, "wasxfail")
    bench_records = [str(value) for name, value in item.user_properties if name == BENCH_PROPERTY]
    if bench_records:
        return _record_benchmark(item, report, server_id, [BenchOutcome.from_json(text) for text in bench_records],
                                 promotable)
    if not (is_check(item, suite_dir) or is_benchmark(item)):
        return False
    return _record_check(item, check_row(item, call, report, server_id), report, promotable)


def _record_benchmark(item: pytest.Item, report: pytest.TestReport, server_id: str | None,
                      records: list[BenchOutcome], promotable: bool) -> bool:
    """A benchmark's row is the gate's own record, junit gets its figures; in strict mode a record that verified
    nothing fails the report."""
    properties = _bench_properties(records[-1])
    failures = [f for f in map(strict_failure, records) if f is not None] if promotable else []
    if failures:
        message = "\n".join(failure.message for failure in failures)
        _fail_report(item, report, message)
        row = CheckOutcome(test_id=item.nodeid, check=check_name(item, server_id),
                           server_id=server_id or records[-1].server_id, verdict="fail", kind="benchmark",
                           first_finding=one_line(message), message=message, detail=records[-1].note,
                           duration_s=round(report.duration, 3), strict_from=failures[0].was)
        setattr(report, ROW_ATTR, row.to_dict())
        properties = [(name, "fail" if name == "llmserve_verdict" else value) for name, value in properties
                      if name != "llmserve_first_finding"]
        properties += [("llmserve_strict_from", failures[0].was), ("llmserve_first_finding", row.first_finding)]
    item.user_properties.extend(properties)
    return bool(failures)


def _record_check(item: pytest.Item, row: CheckOutcome, report: pytest.TestReport, promotable: bool) -> bool:
    """A check's row on its report and its junit properties; in strict mode a row that verified nothing fails it."""
    failure = strict_failure(row) if promotable else None
    if failure is not None:
        row = failed_by_strict_mode(row, failure)
        _fail_report(item, report, failure.message)
    setattr(report, ROW_ATTR, row.to_dict())
    # The teardown report copies item.user_properties, and junitxml writes that report's properties.
    item.user_properties += [("llmserve_check", row.check), ("llmserve_server", row.server_id),
                             ("llmserve_verdict", row.verdict)]
    if row.strict_from is not None:
        item.user_properties.append(("llmserve_strict_from", row.strict_from))
    if row.first_finding:
        item.user_properties.append(("llmserve_first_finding", row.first_finding))
    return failure is not None


def _fail_report(item: pytest.Item, report: pytest.TestReport, message: str) -> None:
    """``report`` failed with ``message``, as ``pytest.fail(message, pytrace=False)`` in the test would have
    left it (the same failure text, and the one-line reason in pytest's short summary)."""
    try:
        pytest.fail(message, pytrace=False)
    except pytest.fail.Exception:
        excinfo = pytest.ExceptionInfo.from_current()
    report.outcome = "failed"
    report.longrepr = item.repr_failure(excinfo)


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


def session_verdicts(reports: Iterable[Any],
                     own: Iterable[BenchOutcome]) -> tuple[list[BenchOutcome], list[CheckOutcome]]:
    """Every benchmark record and check row of the session: from ``reports`` (which, under xdist, come
    from the workers) and ``own``, the benchmark records made in this process. Those came back in this
    process's reports too: one row each (the JSON is the record's identity)."""
    benches, checks = collected(reports)
    outcomes = list(own)
    kept = {outcome.identity for outcome in outcomes}  # the same outcome, seen here and in a report's properties
    outcomes += [record for record in benches if record.identity not in kept]
    return outcomes, checks


# ---------------------------------------------------------------------------- a server that died

def server_death_failure(death: str, error: str) -> str:
    """A test's failure when its server died under it, in the style of the tests after it (whose
    ``llm_server`` setup fails with ``death``): who died and how, the test's own error in one line, then
    the log's last lines once; the traceback into the client would only show where the socket closed."""
    head, _, tail = death.partition("\n")
    first = error.strip().splitlines()[0] if error.strip() else "?"
    return f"{head}\nthe test failed with: {first}" + (f"\n{tail}" if tail else "")


def blame_server_death(call: pytest.CallInfo[None], server: ServerHandle | None) -> str | None:
    """``server``'s death report, if it died under the test's failed (not skipped) call; the call's
    exception is then replaced by the failure that names the death (:func:`server_death_failure`)."""
    death = server.death_report() if server is not None else None
    if death is not None and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        try:
            pytest.fail(server_death_failure(death, f"{call.excinfo.typename}: {call.excinfo.value}"),
                        pytrace=False)
        except pytest.fail.Exception:
            call.excinfo = pytest.ExceptionInfo.from_current()
    return death


def server_log_section(server: ServerHandle) -> tuple[str, str]:
    """A failed test's report section: the last lines of its server's log, which often say why a request
    failed; masked as in a death report (some engines print their arguments, an API key included)."""
    assert server.log_path is not None
    secrets = secret_values(server.spec, server.plan.argv if server.plan else None)
    tail = redact_text(read_tail(server.log_path), secrets)
    return ("llmserve server log", f"{server.describe()}\n--- last {LOG_TAIL_LINES} lines ---\n{tail}")


# ---------------------------------------------------------------------------- the terminal summary

def write_summary(terminalreporter: pytest.TerminalReporter, settings: Settings, *, run_dir: Path,
                  host_reports: dict[str, HostReport], outcomes: list[BenchOutcome], checks: list[CheckOutcome],
                  accounting: Accounting | None, workers: list[dict[str, Any]], session_start: float,
                  completeness: RunCompleteness | None = None) -> None:
    """The llmserve section of the controller's terminal summary (none when the run booted, attached,
    measured and checked nothing, and was not stopped while it used a server). ``accounting``: this process's
    time, None where no server was used here or in a worker (``workers``: the workers' snapshots).
    ``completeness``: how much of the run ran (:func:`run_completeness`)."""
    # Across hosts the boots were recorded in each host's own run directory and came home with its report.
    boots = read_boots(run_dir) + [boot for r in host_reports.values() for boot in r.boots
                                   if boot not in read_boots(run_dir)]
    by_host = _rows_by_host(terminalreporter, settings, host_reports) if host_reports else []
    # A run stopped during its first boot has no row yet: its reports still say it stopped, so that `latest`
    # does not go on pointing at an earlier run's.
    stopped_in_use = completeness is not None and completeness.stopped is not None and accounting is not None
    if not boots and not outcomes and not checks and not by_host and not stopped_in_use:
        return
    terminalreporter.section("llmserve")
    if by_host:
        _write_hosts(terminalreporter, settings, by_host)
    wall = time.monotonic() - session_start
    boot_s = _write_boots(terminalreporter, boots)
    if accounting is not None:
        snapshot = Accounting.merge([accounting.snapshot(), *workers])
        terminalreporter.write_line("time: " + format_report(time_report(snapshot)))
    # A matrix reference's answers, recorded in the run's shared directory (removed at the end), kept with
    # the run's reports, where --llmserve-reference-answers can name them in a later run.
    recorded = sorted((run_dir / DIR_NAME).glob("*.json")) if (run_dir / DIR_NAME).is_dir() else []
    for line in render_session(outcomes, checks, settings.results_dir, bench_json=settings.bench_json,
                               wall_s=wall, boot_s=boot_s,
                               files=[(f"{DIR_NAME}/{path.name}", path) for path in recorded],
                               strict=settings.strict, completeness=completeness).splitlines():
        terminalreporter.write_line(line)


def _write_hosts(terminalreporter: pytest.TerminalReporter, settings: Settings, by_host: list[ConfigRow]) -> None:
    """Each configuration's row by host, on the terminal and in hosts.json."""
    terminalreporter.write_line("configurations by host:")
    for row in by_host:
        terminalreporter.write_line("  " + row.line())
    settings.results_dir.mkdir(parents=True, exist_ok=True)
    (settings.results_dir / "hosts.json").write_text(dumps([row.to_dict() for row in by_host], indent=2))


def _write_boots(terminalreporter: pytest.TerminalReporter, boots: list[BootEntry]) -> float:
    """The servers booted (each with its boot time and log) and attached; returns the seconds spent booting."""
    # Attached servers (launched elsewhere) are not boots: each xdist worker records its own attachment.
    attached = list({b["server"]: b for b in boots if b.get("launched") is False}.values())
    boots = [b for b in boots if b.get("launched") is not False]
    ok = [b for b in boots if b.get("ok")]
    if boots or attached:
        terminalreporter.write_line(
            f"server boots: {len(ok)}" + (f" ({', '.join(b['server'] for b in ok)})" if ok else "")
            + (f"; failed boots: {len(boots) - len(ok)}" if len(ok) != len(boots) else ""))
    for b in boots:
        terminalreporter.write_line(f"  {b['server']}: boot {b.get('boot_s')} s, log {b.get('log')}")
    for b in attached:
        terminalreporter.write_line(
            f"attached: {b['server']} at {b.get('url')}, not launched by this run (nor stopped by it)"
            + (f"; log {b['log']}" if b.get("log") else "")
            + ("" if b.get("ok") else f"; not ready: {b.get('error')}"))
    return sum(float(b.get("boot_s") or 0) for b in boots)


def _ran_to_an_outcome(report: Any) -> bool:
    """A report that decides its test: the call, a set-up that failed or skipped, or pytest-xdist's "???" for
    the test a worker was running when it went down."""
    when = getattr(report, "when", None)
    return when in ("call", "???") or (when == "setup" and not getattr(report, "passed", True))


def run_completeness(reports: Iterable[Any], *, collected: int, exitstatus: int, shouldfail: bool | str,
                     shouldstop: bool | str, maxfail: int) -> RunCompleteness:
    """How much of the session ran: ``reports`` are the terminal reporter's (every worker's under xdist), the rest
    what the session knew at its end (its ``testscollected``, exit status, ``shouldfail``/``shouldstop``) and
    ``--maxfail`` (``-x`` is 1). Ctrl-C and SIGTERM (which the plugin turns into KeyboardInterrupt) end it
    ``interrupted``; ``-x``/``--maxfail`` (pytest's ``shouldfail``; pytest-xdist's controller stops the same way
    but ends with the interrupted exit status, so there the failures are counted against ``maxfail``) and a
    plugin's ``shouldstop`` end it ``stopped-early``."""
    ran: set[str] = set()
    failures = 0
    for report in reports:
        if _ran_to_an_outcome(report):
            ran.add(str(getattr(report, "nodeid", "")))
        if getattr(report, "when", None) is not None and getattr(report, "outcome", None) == "failed":
            failures += 1
    stopped: StopKind | None = None
    why: str | None = None
    if shouldfail:
        stopped, why = "stopped-early", shouldfail if isinstance(shouldfail, str) else None
    elif exitstatus == pytest.ExitCode.INTERRUPTED and maxfail and failures >= maxfail:
        stopped, why = "stopped-early", f"stopping after {failures} failures"
    elif exitstatus == pytest.ExitCode.INTERRUPTED:
        stopped = "interrupted"
    elif shouldstop:
        stopped, why = "stopped-early", shouldstop if isinstance(shouldstop, str) else None
    return RunCompleteness(collected=collected, ran=len(ran), stopped=stopped, why=why)


def _rows_by_host(terminalreporter: pytest.TerminalReporter, settings: Settings,
                  host_reports: dict[str, HostReport]) -> list[ConfigRow]:
    """Per configuration run on a remote host: that host, its boots and the verdicts of its tests."""
    if not any(report.label != "localhost" for report in host_reports.values()):
        return []
    groups = config_groups(settings.cfg.all_specs())
    outcomes = []
    for category in terminalreporter.stats.values():
        for report in category:
            node = getattr(report, "node", None)
            when = getattr(report, "when", None)
            # "???": pytest-xdist's report of the test a worker was running when it went down.
            decided = when in ("call", "???") or (when == "setup" and not getattr(report, "passed", True))
            server = server_of_nodeid(str(getattr(report, "nodeid", "")), groups) if decided else None
            if server is not None and node is not None:
                outcomes.append((server, str(node.gateway.id), str(report.outcome)))
    return merge_by_config(groups, outcomes, host_reports)
