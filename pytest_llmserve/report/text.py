"""A run's verdicts as text: the terminal tables and the Markdown summary for CI job pages."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from pytest_llmserve.report.checks import CheckOutcome, RunCompleteness, headline, strict_failed_benchmarks
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.verdicts.stats import Summary

STATUS_LABELS: dict[str, str] = {
    "pass": "pass",
    "regressed": "REGRESSED",
    "improved": "improved",
    "inconclusive": "inconclusive",
    "refused": "REFUSED",
    "confounded": "confounded (host busy)",
    "error": "ERROR",
    "no-baseline": "no baseline",
    "saved": "saved as baseline",
}
CHECK_LABELS: dict[str, str] = {
    "pass": "pass",
    "fail": "FAIL",
    "error": "ERROR",
    "unverifiable": "unverifiable",
    "not-applicable": "not applicable",
    "skipped": "skipped",
}
CHECK_ICONS: dict[str, str] = {
    "pass": "✅",
    "fail": "❌",
    "error": "⚠️",
    "unverifiable": "❔",
    "not-applicable": "➖",
    "skipped": "⏭️",
}
STATUS_ICONS: dict[str, str] = {
    "pass": "✅",
    "regressed": "❌",
    "improved": "🚀",
    "inconclusive": "❔",
    "refused": "⛔",
    "confounded": "🚧",
    "error": "⚠️",
    "no-baseline": "🆕",
    "saved": "💾",
}


def format_number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.4g}"


def _summary_cell(s: Summary | None) -> str:
    if s is None:
        return "-"
    return f"{format_number(s.median)} ±{s.cv * 100:.1f}% (n={s.n})"


def _change_cell(o: BenchOutcome) -> str:
    if o.verdict is not None:
        return f"{o.verdict.raw_change * 100:+.1f}%"
    if o.baseline is not None and o.current is not None and o.baseline.median:
        return f"{(o.current.median - o.baseline.median) / abs(o.baseline.median) * 100:+.1f}%"
    return "-"


#: Beside a benchmark's own status when strict mode failed its test (its record keeps what was measured).
STRICT_FAILED_LABEL = " -> FAILED (strict)"


def _verdict_cell(o: BenchOutcome, failed_by_strict: Collection[str] = ()) -> str:
    label = STATUS_LABELS.get(o.status, o.status)
    comp = o.comparability
    if comp is not None and comp.status == "forced":
        label += " (FORCED)"
    elif comp is not None and comp.status == "allowed-variable":
        label += f" ({comp.label})"
    if comp is not None and comp.host_diffs and comp.status != "allowed-variable":  # that label says it already
        label += " (across hosts)"
    if o.status == "inconclusive" and o.resolution is not None and o.resolution.short:
        label += f" ({o.resolution.short})"  # what this noise resolves; the details say which setting to change
    if o.test_id in failed_by_strict:
        label += STRICT_FAILED_LABEL
    return label


def _status_icon(o: BenchOutcome, failed_by_strict: Collection[str]) -> str:
    return STATUS_ICONS["regressed"] if o.test_id in failed_by_strict else STATUS_ICONS.get(o.status, "")


def _rounds_cell(o: BenchOutcome) -> str:
    """Measured rounds, then the warm-up rounds discarded before them and whether they settled."""
    n = str(len(o.samples.get(o.metric, [])))
    warm = o.warmup
    if warm is None:
        return n
    if warm.settled is None:
        return f"{n} (no warm-up)"
    return f"{n} (+{warm.rounds} warm-up{'' if warm.settled else ', NOT settled'})"


def _spread_cell(o: BenchOutcome) -> str:
    """The CV of the gated metric's rounds and, in brackets, the sd of their logs (the t test's scale)."""
    spread = o.spread
    if spread["cv"] is None:
        return "-"
    logs = f" ({spread['log_sd']:.3f})" if spread["log_sd"] is not None else ""
    return f"{spread['cv']:.1%}{logs}" + (" noisy" if spread["noisy"] else "")


def _contention_cell(o: BenchOutcome) -> str:
    """The most other processes took of the host in a measured round, and the rounds discarded as contended."""
    busy = o.host_contention
    cell = f"{busy['max']:.1%}" if busy["max"] is not None else "-"
    return cell + (f" (+{busy['discarded']} discarded)" if busy["discarded"] else "")


def _p_cell(o: BenchOutcome) -> str:
    return f"{o.verdict.p_value:.3g}" if o.verdict is not None else "-"


def _rows(outcomes: Sequence[BenchOutcome], failed_by_strict: Collection[str]) -> list[list[str]]:
    return [
        [
            o.name,
            o.workload,
            o.metric + (" ↑" if o.higher_is_better else " ↓"),
            _summary_cell(o.baseline),
            _summary_cell(o.current),
            _change_cell(o),
            _p_cell(o),
            _verdict_cell(o, failed_by_strict),
            _rounds_cell(o),
            _spread_cell(o),
            _contention_cell(o),
        ]
        for o in outcomes
    ]


_HEADER = [
    "benchmark",
    "workload",
    "metric",
    "baseline (median ±cv)",
    "now (median ±cv)",
    "change",
    "p",
    "verdict",
    "rounds (+warm-up)",
    "CV (sd ln)",
    "host contention",
]


def aligned_columns(rows: Sequence[Sequence[str]], *, rule: bool = False) -> list[str]:
    """Rows of cells as lines of left-aligned columns two spaces apart; ``rule`` puts dashes under the first."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def format_table(outcomes: Sequence[BenchOutcome], failed_by_strict: Collection[str] = ()) -> str:
    """Plain-text table, one line per benchmark, then the reasons behind non-passing verdicts.
    ``failed_by_strict``: the test ids of benchmarks strict mode failed (their verdict cell says so)."""
    if not outcomes:
        return "no benchmarks ran"
    lines = aligned_columns([_HEADER, *_rows(outcomes, failed_by_strict)], rule=True)
    notes = []
    for o in outcomes:
        for line in _explain(o):
            notes.append(f"{o.name} ({o.workload}): {line}")
    return "\n".join(lines + ([""] + notes if notes else []))


def _explain(o: BenchOutcome) -> list[str]:
    out: list[str] = []
    if o.error:
        out.append(f"invalid run: {o.error}")
    comp = o.comparability
    if comp is not None and (comp.status in ("refused", "forced") or comp.host_diffs):
        out.append(comp.message)
    if o.verdict is not None and (o.status != "pass" or (comp is not None and comp.status == "forced")):
        out.append(o.verdict.reason)
    if o.note and o.note not in out:  # the gate's note often repeats the refusal or the verdict's reason
        out.append(o.note)
    out += o.notes
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def _check_order(c: CheckOutcome) -> int:
    """Failures first, then what was not verified, then the rest (stable within each)."""
    return 0 if c.failed else 1 if c.verdict == "unverifiable" else 2


def format_check_lines(checks: Sequence[CheckOutcome]) -> list[str]:
    """One line per check that did not pass (verdict, check, server, first finding), failures first."""
    rows = [[CHECK_LABELS.get(c.verdict, c.verdict), c.check, c.server_id or "-", c.first_finding or ""]
            for c in sorted(checks, key=_check_order) if c.verdict != "pass"]
    return aligned_columns(rows) if rows else []


def format_markdown(outcomes: Sequence[BenchOutcome], checks: Sequence[CheckOutcome] = (), *,
                    title: str = "pytest-llmserve", strict: bool = False,
                    completeness: RunCompleteness | None = None) -> str:
    """Markdown for a CI job summary (e.g. appended to ``$GITHUB_STEP_SUMMARY``): the headline that counts
    every verdict on the first line (an interrupted run's first of all: see :func:`headline`), then one row per
    check and one per benchmark."""
    lines = [f"### {title}: {headline(checks, outcomes, strict=strict, completeness=completeness)}", ""]
    if checks:
        lines += ["#### Checks", "", "| | check | server | verdict | first finding |", "|---|---|---|---|---|"]
        for c in sorted(checks, key=_check_order):
            cells = [CHECK_ICONS.get(c.verdict, ""), f"`{c.check}`", c.server_id or "-",
                     CHECK_LABELS.get(c.verdict, c.verdict) + (" (benchmark)" if c.kind == "benchmark" else ""),
                     c.first_finding or ""]
            lines.append("| " + " | ".join(_md(cell) for cell in cells) + " |")
        explained = [c for c in sorted(checks, key=_check_order) if c.verdict != "pass" and c.message]
        if explained:
            lines += ["", "<details><summary>Check details</summary>", ""]
            for c in explained:
                lines += [f"**{_md(c.check)}** on {_md(c.server_id or '-')}", "", "```", c.message or "", "```", ""]
            lines.append("</details>")
        lines.append("")
    if outcomes:
        lines += ["#### Benchmarks", ""] + _benchmarks_markdown(outcomes, strict_failed_benchmarks(checks))
    elif not checks:
        lines.append("Nothing ran.")
    return "\n".join(lines).rstrip("\n") + "\n"


def _benchmarks_markdown(outcomes: Sequence[BenchOutcome], failed_by_strict: Collection[str]) -> list[str]:
    # The counts are in the headline; the table holds each benchmark's figures.
    lines = [
        "| | benchmark | server | workload | metric | baseline | now | change | 95% CI | p | verdict "
        "| rounds (+warm-up) | CV (sd ln) | host contention |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        ci = f"{o.verdict.ci_low * 100:+.1f}%..{o.verdict.ci_high * 100:+.1f}%" if o.verdict else "-"
        cells = [
            _status_icon(o, failed_by_strict),
            f"`{o.test_id.rsplit('::', 1)[-1]}`",
            o.server_id,
            o.workload,
            o.metric + (" ↑" if o.higher_is_better else " ↓"),
            _summary_cell(o.baseline),
            _summary_cell(o.current),
            _change_cell(o),
            ci,
            _p_cell(o),
            _verdict_cell(o, failed_by_strict),
            _rounds_cell(o),
            _spread_cell(o),
            _contention_cell(o),
        ]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    details = [(o, _explain(o)) for o in outcomes]
    details = [(o, d) for o, d in details if d]
    if details:
        lines += ["", "<details><summary>Details</summary>", ""]
        for o, explanation in details:
            lines.append(f"**{_md(o.name)}** ({_md(o.workload)}, {_md(o.metric)})")
            lines.append("")
            lines += ["```", *explanation, "```", ""]
        lines.append("</details>")
    return lines
