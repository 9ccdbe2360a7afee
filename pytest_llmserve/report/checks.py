"""The verdict of one check on one server configuration (:class:`CheckOutcome`) and the run's headline.

A *check* is a test that is not a measured benchmark: the built-in suite's correctness tests, any test
that uses ``decode_check`` or carries ``llmserve_correctness``, and a benchmark test that ended before
its gate recorded a measurement (it failed early or was skipped). The plugin builds one CheckOutcome
per such test from its pytest outcome and what ``DecodeCheck`` recorded; the reports list them beside
the benchmarks' :class:`~pytest_llmserve.report.outcome.BenchOutcome` rows, and :func:`headline`
counts both, failures first, so a CI page never shows a harmless-looking summary of a broken server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
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


@dataclass
class CheckOutcome:
    """One check on one server configuration.

    ``verdict``: ``pass``; ``fail`` (the check found something); ``error`` (it could not run: its set-up,
    e.g. the server's boot, failed); ``unverifiable`` (the evidence does not exist, which is not a pass);
    ``not-applicable`` (the oracle needs a trained model and this one is untrained: neither a pass nor a
    failure); ``skipped`` (it does not apply here, e.g. no GPU). ``first_finding`` is one line, ``findings`` the
    structured evidence (the oracles' findings, each with what was sent and what came back), ``message``
    the text pytest showed (shortened unless ``-vv``) and ``detail`` the full evidence text.
    """

    test_id: str
    check: str  # the test without its server parameter, e.g. "test_no_nan" or "test_batch_size[bs=3-padded-to-4]"
    server_id: str
    verdict: CheckVerdict
    kind: CheckKind = "correctness"
    first_finding: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    message: str | None = None  # the failure or skip text pytest showed (concise by default)
    detail: str | None = None  # the full evidence text, when longer than ``message``
    oracles: list[dict[str, Any]] = field(default_factory=list)  # each oracle run: check, verdict, findings
    duration_s: float | None = None

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckOutcome:
        verdict = str(data["verdict"])
        if verdict not in CHECK_VERDICTS:
            raise ValueError(f"check verdict {verdict!r} is not one of {', '.join(CHECK_VERDICTS)}")
        kind = str(data.get("kind") or "correctness")
        if kind not in CHECK_KINDS:
            raise ValueError(f"check kind {kind!r} is not 'correctness' or 'benchmark'")
        duration = data.get("duration_s")
        return cls(test_id=str(data["test_id"]), check=str(data["check"]), server_id=str(data.get("server_id") or ""),
                   verdict=verdict,
                   kind=kind,
                   first_finding=data.get("first_finding"), findings=list(data.get("findings") or []),
                   message=data.get("message"), detail=data.get("detail"), oracles=list(data.get("oracles") or []),
                   duration_s=float(duration) if duration is not None else None)


def one_line(text: str | None, limit: int = FIRST_FINDING_CHARS) -> str | None:
    """The first non-empty line of ``text``, cut to ``limit`` characters (None stays None)."""
    if text is None:
        return None
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def as_checks(items: Iterable[CheckOutcome | Mapping[str, Any]]) -> list[CheckOutcome]:
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


def headline_counts(checks: Sequence[CheckOutcome], benchmarks: Sequence[BenchOutcome]) -> dict[str, Any]:
    """Counts behind :func:`headline`: failures by kind, passes, unverifiable, not applicable, skipped, and
    benchmark statuses."""
    failed = {"correctness": 0, "benchmark": 0}
    counts: dict[str, Any] = {"failed": failed, "passed": 0, "unverifiable": 0, "not-applicable": 0, "skipped": 0,
                              "benchmarks": {}, "total": len(checks) + len(benchmarks)}
    for c in checks:
        if c.failed:
            failed[c.kind] += 1
        elif c.verdict == "pass":
            counts["passed"] += 1
        else:
            counts[c.verdict] += 1
    for b in benchmarks:
        if b.failed:
            failed["benchmark"] += 1
        elif b.status == "pass":
            counts["passed"] += 1
        else:
            counts["benchmarks"][b.status] = counts["benchmarks"].get(b.status, 0) + 1
    return counts


def headline(checks: Sequence[CheckOutcome], benchmarks: Sequence[BenchOutcome]) -> str:
    """E.g. ``3 FAILED (2 correctness, 1 benchmark) · 12 passed · 1 unverifiable · 2 not applicable · 1
    benchmark without baseline``: every verdict of the run counted, failures first, nothing that did not occur."""
    counts = headline_counts(checks, benchmarks)
    if not counts["total"]:
        return "no checks or benchmarks ran"
    parts = []
    failed = counts["failed"]
    n_failed = failed["correctness"] + failed["benchmark"]
    if n_failed:
        kinds = ", ".join(f"{n} {kind}" for kind, n in failed.items() if n)
        parts.append(f"{n_failed} FAILED ({kinds})")
    if counts["passed"]:
        parts.append(f"{counts['passed']} passed")
    for key in ("unverifiable", "not-applicable", "skipped"):
        if counts[key]:
            parts.append(f"{counts[key]} {VERDICT_WORDS[key]}")
    for status, n in counts["benchmarks"].items():
        one, many = _BENCH_STATUS_WORDS.get(status, (f"benchmark {status}", f"benchmarks {status}"))
        parts.append(f"{n} {one if n == 1 else many}")
    return " · ".join(parts)
