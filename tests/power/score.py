"""The fault catalogue's mutation score over one inner run's check rows (no pytest import).

Given the rows of results.json's ``checks`` (:func:`read_checks`), the catalogue's faults (tests/power/catalogue.py)
and the healthy servers' ids, :func:`score` returns a typed :class:`Scorecard`: per fault, the verdict and first
finding of every check that must catch it (``caught``: each of them failed) and the other checks that failed on
it too; per healthy server, every check's verdict (``false_alarms``: any that failed or errored); and the score,
faults caught over faults. :func:`markdown` renders it for a CI page. Generic: the stand-in run
(tests/power/test_standin_faults.py) and the real-engine runner of the checkpoint faults both score with it; a
fault's server is the one named after it unless ``servers`` says otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_llmserve.report.checks import FAILING_VERDICTS, CheckOutcome, CheckVerdict
from pytest_llmserve.report.json import read_check_outcomes
from tests.power.catalogue import Fault

#: A first finding in the Markdown table is cut to this many characters (the full one is in results.json).
FINDING_CHARS = 160


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One inner check on one server: its verdict (None: the run has no row for it) and first finding."""

    check: str
    verdict: CheckVerdict | None
    first_finding: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING_VERDICTS

    def render(self) -> str:
        return f"{self.check}: {self.verdict or 'missing'}"


@dataclass(frozen=True, slots=True)
class FaultScore:
    """A fault's server in the run: ``expected`` are its ``caught_by`` checks, ``also_failed`` the other checks that
    failed (or errored) on it."""

    fault: Fault
    server_id: str
    expected: tuple[CheckResult, ...]
    also_failed: tuple[CheckResult, ...]

    @property
    def caught(self) -> bool:
        """Every check that must catch the fault failed (an error is not a catch: the check did not judge)."""
        return bool(self.expected) and all(r.verdict == "fail" for r in self.expected)

    @property
    def first_finding(self) -> str | None:
        """The first finding of the first expected check that has one."""
        return next((r.first_finding for r in self.expected if r.first_finding), None)


@dataclass(frozen=True, slots=True)
class HealthyScore:
    """A healthy server in the run: every check's result; any failure or error is a false alarm."""

    server_id: str
    results: tuple[CheckResult, ...]

    @property
    def false_alarms(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.failed)


@dataclass(frozen=True, slots=True)
class Scorecard:
    faults: tuple[FaultScore, ...]
    healthy: tuple[HealthyScore, ...]

    @property
    def caught(self) -> int:
        return sum(f.caught for f in self.faults)

    @property
    def score(self) -> float:
        """Faults caught over faults (0 without faults)."""
        return self.caught / len(self.faults) if self.faults else 0.0

    @property
    def false_alarms(self) -> tuple[tuple[str, CheckResult], ...]:
        return tuple((h.server_id, r) for h in self.healthy for r in h.false_alarms)


def read_checks(results_json: str | os.PathLike[str]) -> list[CheckOutcome]:
    """The check rows of an inner run's results.json."""
    return read_check_outcomes(results_json)


def score(checks: Sequence[CheckOutcome], faults: Sequence[Fault], healthy: Sequence[str],
          servers: Mapping[str, str] | None = None) -> Scorecard:
    """The scorecard of ``faults`` and the ``healthy`` server ids over the run's ``checks``. ``servers``: fault name
    -> the server id it ran on, where that is not the fault's own name."""
    rows: dict[str, dict[str, CheckOutcome]] = {}
    for row in checks:
        rows.setdefault(row.server_id, {})[row.check] = row

    def result(server: str, check: str) -> CheckResult:
        row = rows.get(server, {}).get(check)
        return CheckResult(check, row.verdict, row.first_finding) if row else CheckResult(check, None)

    scored = []
    for fault in faults:
        server = (servers or {}).get(fault.name, fault.name)
        others = sorted(set(rows.get(server, {})) - set(fault.caught_by))
        scored.append(FaultScore(fault, server, tuple(result(server, c) for c in fault.caught_by),
                                 tuple(r for r in (result(server, c) for c in others) if r.failed)))
    return Scorecard(tuple(scored),
                     tuple(HealthyScore(h, tuple(result(h, c) for c in sorted(rows.get(h, {})))) for h in healthy))


def _cell(text: str | None, limit: int = FINDING_CHARS) -> str:
    """``text`` fit for a Markdown table cell: one line, pipes escaped, cut to ``limit``."""
    if not text:
        return "-"
    line = " ".join(text.split())
    line = line if len(line) <= limit else line[: limit - 1] + "…"
    return line.replace("|", "\\|")


def markdown(card: Scorecard) -> str:
    """The scorecard as Markdown: one row per fault, then the healthy servers, then the score line."""
    lines = ["| fault | injected as | stands for | caught by | first finding |", "|---|---|---|---|---|"]
    for f in card.faults:
        verdicts = ", ".join(r.render() for r in f.expected)
        if f.also_failed:
            verdicts += "; also failed: " + ", ".join(r.check for r in f.also_failed)
        mark = "caught" if f.caught else "MISSED"
        lines.append(f"| {f.fault.name} | {f.fault.injected} | {_cell(f.fault.stands_for)} | {mark}: "
                     f"{_cell(verdicts, 400)} | {_cell(f.first_finding)} |")
    lines += ["", "| healthy server | verdicts | false alarms |", "|---|---|---|"]
    for h in card.healthy:
        alarms = ", ".join(r.render() for r in h.false_alarms) or "none"
        lines.append(f"| {h.server_id} | {_cell(', '.join(r.render() for r in h.results), 1000)} | {alarms} |")
    n_alarms = len(card.false_alarms)
    lines += ["", f"**score: {card.caught} of {len(card.faults)} faults caught ({card.score:.0%}); "
                  f"{n_alarms} false alarm{'' if n_alarms == 1 else 's'} on {len(card.healthy)} healthy "
                  f"server{'' if len(card.healthy) == 1 else 's'}**"]
    return "\n".join(lines) + "\n"
