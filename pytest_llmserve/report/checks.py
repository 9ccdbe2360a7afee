"""The verdict of one check on one server configuration (:class:`CheckOutcome`) and the run's headline.

A *check* is a test that is not a measured benchmark: the built-in suite's correctness tests, any test
that uses ``decode_check`` or carries ``llmserve_correctness``, and a benchmark test that ended before
its gate recorded a measurement (it failed early or was skipped). The plugin builds one CheckOutcome
per such test from its pytest outcome and what ``DecodeCheck`` recorded; the reports list them beside
the benchmarks' :class:`~pytest_llmserve.report.outcome.BenchOutcome` rows, and :func:`headline`
counts both, failures first, so a CI page never shows a harmless-looking summary of a broken server.

*Verified* (:func:`is_verified`): a check or benchmark whose verdict was reached from evidence. That is a
correctness check's pass or failure, and a measured benchmark's ``pass``, ``regressed`` or ``improved`` against
its baseline. Not verified: ``unverifiable``, ``not-applicable``, ``skipped``, ``error`` (it could not run), a
benchmark row without a measurement (whatever its verdict), and the benchmark statuses ``no-baseline``,
``saved``, ``refused``, ``confounded``, ``inconclusive`` and ``error``. A row that strict mode failed is not
verified either: it failed because nothing was verified. The headline starts with "verified N of M checks",
M counting every check and benchmark it counts.

*Strict mode* (``--llmserve-strict``, for CI): a test that verified nothing and would not fail fails
(:func:`strict_failure`): an unverifiable check, a not-applicable one whose untrained model the configuration
did not declare (``random_weights = true``; a checkpoint marker alone is not a declaration), and a benchmark
without a baseline (``no-baseline``, or ``refused`` where the gate skipped it as "no baseline for this
environment"), ``inconclusive`` or ``confounded``. A plain skip (no GPU here, graphs off) stays a skip, a declared
not-applicable stays not applicable, and ``saved`` (a baseline recorded on request) stays as it is. The plugin
records such a test as a :class:`CheckOutcome` with verdict ``fail`` and ``strict_from`` set; for a benchmark that
row stands beside the unchanged :class:`~pytest_llmserve.report.outcome.BenchOutcome` (its figures, and what
``llmserve baselines accept`` reads) and decides how the headline counts it.

*An interrupted run* (:class:`RunCompleteness`): Ctrl-C, SIGTERM, ``-x`` or ``--maxfail`` leave items that never
ran; every report's headline then starts with e.g. "INTERRUPTED: 15 of 16 collected items never ran" (or "STOPPED
EARLY (...)"), so a run that stopped is never taken for a run that passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from pytest_llmserve.report.outcome import BenchOutcome

CheckVerdict = Literal["pass", "fail", "error", "unverifiable", "not-applicable", "skipped"]
CheckKind = Literal["correctness", "benchmark"]
CHECK_VERDICTS: tuple[CheckVerdict, ...] = ("pass", "fail", "error", "unverifiable", "not-applicable", "skipped")
#: How the headline and the tables name each verdict that is not a pass or a failure.
VERDICT_WORDS: dict[str, str] = {"unverifiable": "unverifiable", "not-applicable": "not applicable",
                                 "skipped": "skipped"}
CHECK_KINDS: tuple[CheckKind, ...] = ("correctness", "benchmark")
#: How a not-applicable check's skip reason starts: the reports classify a skip by it.
NOT_APPLICABLE = "not applicable:"
FAILING_VERDICTS = frozenset({"fail", "error"})
FIRST_FINDING_CHARS = 240  # one line in a table cell or a junit property
#: A correctness check's verdicts reached from evidence (module docstring, "Verified").
VERIFIED_CHECK_VERDICTS = frozenset({"pass", "fail"})
#: A benchmark's statuses reached from measurements compared with a baseline.
VERIFIED_BENCH_STATUSES = frozenset({"pass", "regressed", "improved"})


@dataclass
class CheckOutcome:
    """One check on one server configuration.

    ``verdict``: ``pass``; ``fail`` (the check found something); ``error`` (it could not run: its set-up,
    e.g. the server's boot, failed); ``unverifiable`` (the evidence does not exist, which is not a pass);
    ``not-applicable`` (the oracle needs a trained model and this one is untrained: neither a pass nor a
    failure); ``skipped`` (it does not apply here, e.g. no GPU). ``first_finding`` is one line, ``findings`` the
    structured evidence (the oracles' findings, each with what was sent and what came back), ``message``
    the text pytest showed (shortened unless ``-vv``) and ``detail`` the full evidence text.

    ``untrained_declared``, for a not-applicable verdict: True when the configuration declared the model
    untrained (``random_weights = true``), False when only a checkpoint marker showed it (None otherwise).
    ``strict_from``: strict mode failed this test, which would have been this verdict (or, for a benchmark row
    beside its record, this benchmark status); ``verdict`` is then ``fail``.
    """

    test_id: str
    check: str  # the test without its server parameter, e.g. "test_no_nan" or "test_batch_size[bs=3-padded-to-4]"
    server_id: str
    verdict: CheckVerdict
    kind: CheckKind = "correctness"
    first_finding: str | None = None
    findings: list[dict[str, object]] = field(default_factory=list)
    message: str | None = None  # the failure or skip text pytest showed (concise by default)
    detail: str | None = None  # the full evidence text, when longer than ``message``
    oracles: list[dict[str, object]] = field(default_factory=list)  # each oracle run: check, verdict, findings
    duration_s: float | None = None
    untrained_declared: bool | None = None
    strict_from: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING_VERDICTS

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckOutcome:
        verdict = str(data["verdict"])
        if verdict not in CHECK_VERDICTS:
            raise ValueError(f"check verdict {verdict!r} is not one of {', '.join(CHECK_VERDICTS)}")
        kind = str(data.get("kind") or "correctness")
        if kind not in CHECK_KINDS:
            raise ValueError(f"check kind {kind!r} is not 'correctness' or 'benchmark'")
        duration, declared = data.get("duration_s"), data.get("untrained_declared")
        strict_from = data.get("strict_from")
        return cls(test_id=str(data["test_id"]), check=str(data["check"]), server_id=str(data.get("server_id") or ""),
                   verdict=verdict,
                   kind=kind,
                   first_finding=data.get("first_finding"), findings=list(data.get("findings") or []),
                   message=data.get("message"), detail=data.get("detail"), oracles=list(data.get("oracles") or []),
                   duration_s=float(duration) if duration is not None else None,
                   untrained_declared=bool(declared) if declared is not None else None,
                   strict_from=str(strict_from) if strict_from is not None else None)


def one_line(text: str | None, limit: int = FIRST_FINDING_CHARS) -> str | None:
    """The first non-empty line of ``text``, cut to ``limit`` characters (None stays None)."""
    if text is None:
        return None
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def as_checks(items: Iterable[CheckOutcome | Mapping[str, object]]) -> list[CheckOutcome]:
    return [item if isinstance(item, CheckOutcome) else CheckOutcome.from_dict(item) for item in items]


# Benchmark statuses other than pass/failure, as the headline names them.
_BENCH_STATUS_WORDS = {
    "no-baseline": ("benchmark without baseline", "benchmarks without baseline"),
    "saved": ("baseline saved", "baselines saved"),
    "refused": ("benchmark comparison refused", "benchmark comparisons refused"),
    "confounded": ("benchmark confounded by a busy host", "benchmarks confounded by a busy host"),
    "inconclusive": ("benchmark inconclusive", "benchmarks inconclusive"),
    "improved": ("benchmark improved", "benchmarks improved"),
}


# ---------------------------------------------------------------------------- verified

def is_verified(item: CheckOutcome | BenchOutcome) -> bool:
    """Whether ``item``'s verdict was reached from evidence (module docstring, "Verified")."""
    if isinstance(item, BenchOutcome):
        return item.status in VERIFIED_BENCH_STATUSES
    # A benchmark's row means it ended before its gate measured anything: there was nothing to verify from.
    return item.kind == "correctness" and item.verdict in VERIFIED_CHECK_VERDICTS and item.strict_from is None


# ---------------------------------------------------------------------------- strict mode

#: How a strict-mode failure names what it did not accept, by the verdict or benchmark status it replaced.
STRICT_WORDS: dict[str, str] = {
    "unverifiable": "unverifiable",
    "not-applicable": "not applicable without a declaration",
    "no-baseline": "a benchmark without baseline",
    "refused": "a benchmark without a baseline for this environment",
    "inconclusive": "an inconclusive benchmark",
    "confounded": "a benchmark confounded by a busy host",
}
_NOT_DECLARED_HINT = ("(declare random_weights = true for the server in its configuration if the model is meant to be "
                      "untrained: a declared not-applicable is accepted)")


@dataclass(frozen=True, slots=True)
class StrictFailure:
    """Why strict mode fails a test that would otherwise not fail: ``was`` is the verdict or benchmark status it
    had (a key of :data:`STRICT_WORDS`), ``reason`` the text that said why (a skip reason, the gate's note)."""

    was: str
    reason: str

    @property
    def message(self) -> str:
        """``strict mode: unverifiable is not a pass: <the original reason>`` (the test's failure text)."""
        text = f"strict mode: {STRICT_WORDS[self.was]} is not a pass: {self.reason}"
        return f"{text}\n{_NOT_DECLARED_HINT}" if self.was == "not-applicable" else text


def strict_failure(item: CheckOutcome | BenchOutcome) -> StrictFailure | None:
    """What strict mode fails ``item`` for, None where it accepts it as it is (module docstring, "Strict mode").

    Decided on the verdict alone: a ``refused`` benchmark fails the test already unless the gate skipped it as no
    baseline for this environment, and the plugin applies a StrictFailure only to a test that did not fail."""
    if isinstance(item, BenchOutcome):
        status = item.status
        if status not in STRICT_WORDS:  # pass, regressed, improved, error, saved: a verdict, or asked for
            return None
        return StrictFailure(status, item.note or item.error or status)
    reason = item.message or item.first_finding or item.verdict
    if item.verdict == "unverifiable":
        return StrictFailure("unverifiable", reason)
    if item.verdict == "not-applicable" and not item.untrained_declared:
        return StrictFailure("not-applicable", reason)
    return None  # pass, fail, error, a plain skip, a declared not-applicable


def failed_by_strict_mode(row: CheckOutcome, failure: StrictFailure) -> CheckOutcome:
    """``row`` as strict mode records it: failed, with the strict message first and the evidence kept."""
    return replace(row, verdict="fail", strict_from=failure.was, first_finding=one_line(failure.message),
                   message=failure.message, detail=row.detail or row.message)


def strict_failed_benchmarks(checks: Iterable[CheckOutcome]) -> frozenset[str]:
    """The test ids of the benchmarks strict mode failed: their rows decide how they are counted (over the
    status of their records, which stays what was measured)."""
    return frozenset(c.test_id for c in checks if c.kind == "benchmark" and c.strict_from is not None)


# ---------------------------------------------------------------------------- an interrupted run

StopKind = Literal["interrupted", "stopped-early"]


@dataclass(frozen=True, slots=True)
class RunCompleteness:
    """How much of the run's collected items ran to an outcome (passed, failed or skipped), and why it ended
    before the others did: ``stopped`` is ``interrupted`` (Ctrl-C, SIGTERM) or ``stopped-early`` (``-x``,
    ``--maxfail``, a plugin's stop; ``why`` is then pytest's reason, e.g. "stopping after 1 failures"), None for a
    run that ran to its end. An item whose test was under way when the run stopped did not run to an outcome."""

    collected: int
    ran: int
    stopped: StopKind | None = None
    why: str | None = None

    @property
    def never_ran(self) -> int:
        return max(self.collected - self.ran, 0)

    def line(self) -> str | None:
        """``INTERRUPTED: 15 of 16 collected items never ran`` (None for a run that ran to its end)."""
        if self.stopped is None:
            return None
        word = "INTERRUPTED" if self.stopped == "interrupted" else "STOPPED EARLY"
        because = f" ({self.why})" if self.why else ""
        return f"{word}{because}: {self.never_ran} of {self.collected} collected items never ran"

    def to_dict(self) -> dict[str, object]:
        return {"stopped": self.stopped, "why": self.why, "collected": self.collected, "ran": self.ran,
                "never_ran": self.never_ran}


# ---------------------------------------------------------------------------- the headline

def headline_counts(checks: Sequence[CheckOutcome], benchmarks: Sequence[BenchOutcome]) -> dict[str, Any]:
    """Counts behind :func:`headline`: failures by kind (``strict_failed`` of them by strict mode), passes,
    unverifiable, not applicable, skipped, benchmark statuses, and ``verified`` of ``total``. A benchmark that
    strict mode failed is counted once, by its row."""
    by_row = strict_failed_benchmarks(checks)
    counted = [b for b in benchmarks if b.test_id not in by_row]
    failed = {"correctness": 0, "benchmark": 0}
    counts: dict[str, Any] = {"failed": failed, "strict_failed": 0, "passed": 0, "unverifiable": 0,
                              "not-applicable": 0, "skipped": 0, "benchmarks": {},
                              "verified": sum(map(is_verified, checks)) + sum(map(is_verified, counted)),
                              "total": len(checks) + len(counted)}
    for c in checks:
        if c.failed:
            failed[c.kind] += 1
            counts["strict_failed"] += c.strict_from is not None
        elif c.verdict == "pass":
            counts["passed"] += 1
        else:
            counts[c.verdict] += 1
    for b in counted:
        if b.failed:
            failed["benchmark"] += 1
        elif b.status == "pass":
            counts["passed"] += 1
        else:
            counts["benchmarks"][b.status] = counts["benchmarks"].get(b.status, 0) + 1
    return counts


def headline(checks: Sequence[CheckOutcome], benchmarks: Sequence[BenchOutcome], *, strict: bool = False,
             completeness: RunCompleteness | None = None) -> str:
    """E.g. ``verified 12 of 17 checks · 3 FAILED (2 correctness, 1 benchmark) · 9 passed · 1 unverifiable · 2 not
    applicable · 1 benchmark without baseline``: how much was verified, then every verdict of the run counted,
    failures first, nothing that did not occur. ``strict``: the run was in strict mode ("(strict)" after the
    verified count; "n by strict mode" among the failures). ``completeness``: a run that stopped early says so
    first (``INTERRUPTED: 15 of 16 collected items never ran · ...``)."""
    counts = headline_counts(checks, benchmarks)
    stopped = completeness.line() if completeness is not None else None
    parts = [stopped] if stopped else []
    if not counts["total"]:
        return " · ".join([*parts, "no checks or benchmarks ran" + (" (strict)" if strict else "")])
    noun = "check" if counts["total"] == 1 else "checks"
    parts.append(f"verified {counts['verified']} of {counts['total']} {noun}" + (" (strict)" if strict else ""))
    failed = counts["failed"]
    n_failed = failed["correctness"] + failed["benchmark"]
    if n_failed:
        kinds = ", ".join(f"{n} {kind}" for kind, n in failed.items() if n)
        by_strict = f"; {counts['strict_failed']} by strict mode" if counts["strict_failed"] else ""
        parts.append(f"{n_failed} FAILED ({kinds}{by_strict})")
    if counts["passed"]:
        parts.append(f"{counts['passed']} passed")
    for key in ("unverifiable", "not-applicable", "skipped"):
        if counts[key]:
            parts.append(f"{counts[key]} {VERDICT_WORDS[key]}")
    for status, n in counts["benchmarks"].items():
        one, many = _BENCH_STATUS_WORDS.get(status, (f"benchmark {status}", f"benchmarks {status}"))
        parts.append(f"{n} {one if n == 1 else many}")
    return " · ".join(parts)
