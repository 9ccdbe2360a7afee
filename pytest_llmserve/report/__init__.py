"""Benchmark reports: terminal table, Markdown summary, results JSON, pytest-benchmark JSON, plots.

Everything here takes :class:`BenchOutcome` objects, plain data that the plugin (or a script) fills in
after a benchmark ran and was judged.

Results JSON (:func:`write_results_json`, read back by :func:`read_results_json` and
``llmserve baselines accept``; :func:`write_all` writes it with every other report)::

    {"format": "pytest-llmserve-results", "schema": 1, "created_at": ISO-8601, "run_id": "...",
     "plugin_version": "...",
     "benchmarks": [{"test_id", "server_id", "workload", "metric", "higher_is_better", "tolerance",
                     "samples": {metric: [...]}, "metrics": {metric: summary}, "current": summary | null,
                     "baseline": summary | null, "baseline_samples": [...], "verdict": {...} | null,
                     "comparability": {...} | null, "error": str | null, "context": {...},
                     "concurrency": int | null, "request_latencies_s": {name: [...]}, "note": ...,
                     "baseline_path": ..., "run_id": ..., "saved": bool,
                     "key": {"test", "server", "workload"}}, ...]}

pytest-benchmark JSON (:func:`to_pytest_benchmark_json`): pytest-benchmark's tables assume "lower is
better, in seconds", so ``stats`` hold a transform of the gated metric's samples that keeps that
meaning: a higher-is-better metric v is stored as 1/v (seconds per token for a throughput, so that
``ops`` is the throughput again), ``*_ms`` as v/1000, ``*_s`` as is. The untransformed samples, every
metric's summary, the verdict and the transform used are in ``extra_info``.

Plots use matplotlib's Agg canvas directly (no pyplot state), imported when a plot is drawn.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmserve.errors import BaselineError
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.store.baselines import BenchKey, Comparability, atomic_write_text
from pytest_llmserve.verdicts.stats import Summary, Verdict, summarize

RESULTS_FORMAT = "pytest-llmserve-results"
RESULTS_SCHEMA = 1
PYTEST_BENCHMARK_FORMAT_VERSION = "5.1.0"  # the JSON layout written here is that of pytest-benchmark 5.x

STATUS_LABELS: dict[str, str] = {
    "pass": "pass",
    "regressed": "REGRESSED",
    "improved": "improved",
    "inconclusive": "inconclusive",
    "refused": "REFUSED",
    "error": "ERROR",
    "no-baseline": "no baseline",
    "saved": "saved as baseline",
}
STATUS_ICONS: dict[str, str] = {
    "pass": "✅",
    "regressed": "❌",
    "improved": "🚀",
    "inconclusive": "❔",
    "refused": "⛔",
    "error": "⚠️",
    "no-baseline": "🆕",
    "saved": "💾",
}


@dataclass
class BenchOutcome:
    """One benchmark's result: what was measured, against what, and the verdict.

    ``samples`` holds the current run's samples of every metric (one value per round), ``metrics``
    their summaries (filled from ``samples`` when left empty), ``baseline_samples`` the baseline's
    samples of the gated ``metric``. ``error`` is set when the run was invalid or failed; then no
    verdict is given. ``request_latencies_s`` holds per-request latencies (seconds) for CDF plots.
    """

    test_id: str
    server_id: str
    workload: str
    metric: str
    higher_is_better: bool = True
    tolerance: float = 0.05
    current: Summary | None = None
    baseline: Summary | None = None
    verdict: Verdict | None = None
    comparability: Comparability | None = None
    metrics: dict[str, Summary] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    baseline_samples: list[float] = field(default_factory=list)
    error: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    request_latencies_s: dict[str, list[float]] = field(default_factory=dict)
    note: str | None = None
    baseline_path: str | None = None
    run_id: str | None = None
    saved: bool = False  # this run's samples were recorded as the baseline (nothing compared)
    baseline_key: BenchKey | None = None  # the store key, when it is not (test_id, server_id, workload)

    def __post_init__(self) -> None:
        for name, values in self.samples.items():
            if name not in self.metrics and values and all(math.isfinite(v) for v in values):
                self.metrics[name] = summarize(values)
        if self.current is None:
            self.current = self.metrics.get(self.metric)
        if self.baseline is None and self.baseline_samples:
            self.baseline = summarize(self.baseline_samples)

    @property
    def key(self) -> BenchKey:
        """The baseline store key: ``baseline_key`` if given, else (test id, server id, workload)."""
        return self.baseline_key or BenchKey(test=self.test_id, server=self.server_id, workload=self.workload)

    @property
    def status(self) -> str:
        """``error``, ``refused``, the verdict's outcome, ``saved`` or ``no-baseline``."""
        if self.error:
            return "error"
        if self.comparability is not None and self.comparability.status == "refused":
            return "refused"
        if self.verdict is not None:
            return self.verdict.outcome
        return "saved" if self.saved else "no-baseline"

    @property
    def failed(self) -> bool:
        """A regression or an invalid run (refusals and inconclusive results are reported, not failed)."""
        return self.status in ("regressed", "error")

    @property
    def name(self) -> str:
        """Short display name: the test function (with parameters) and, if not already in it, the server."""
        short = self.test_id.rsplit("::", 1)[-1]
        return short if self.server_id in short else f"{short}[{self.server_id}]"

    def to_dict(self) -> dict[str, Any]:
        return {
            "test_id": self.test_id,
            "server_id": self.server_id,
            "workload": self.workload,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "tolerance": self.tolerance,
            "status": self.status,
            "current": self.current.to_dict() if self.current else None,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "comparability": self.comparability.to_dict() if self.comparability else None,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "samples": self.samples,
            "baseline_samples": self.baseline_samples,
            "error": self.error,
            "context": self.context,
            "concurrency": self.concurrency,
            "request_latencies_s": self.request_latencies_s,
            "note": self.note,
            "baseline_path": self.baseline_path,
            "run_id": self.run_id,
            "saved": self.saved,
            "key": self.key.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchOutcome:
        def summary(value: Any) -> Summary | None:
            return Summary.from_dict(value) if isinstance(value, Mapping) else None

        return cls(
            test_id=str(data["test_id"]),
            server_id=str(data["server_id"]),
            workload=str(data["workload"]),
            metric=str(data["metric"]),
            higher_is_better=bool(data.get("higher_is_better", True)),
            tolerance=float(data.get("tolerance", 0.05)),
            current=summary(data.get("current")),
            baseline=summary(data.get("baseline")),
            verdict=Verdict.from_dict(data["verdict"]) if data.get("verdict") else None,
            comparability=Comparability.from_dict(data["comparability"])
            if data.get("comparability")
            else None,
            metrics={k: Summary.from_dict(v) for k, v in (data.get("metrics") or {}).items()},
            samples={k: [float(x) for x in v] for k, v in (data.get("samples") or {}).items()},
            baseline_samples=[float(x) for x in data.get("baseline_samples") or []],
            error=data.get("error"),
            context=dict(data.get("context") or {}),
            concurrency=data.get("concurrency"),
            request_latencies_s={
                k: [float(x) for x in v] for k, v in (data.get("request_latencies_s") or {}).items()
            },
            note=data.get("note"),
            baseline_path=data.get("baseline_path"),
            run_id=data.get("run_id"),
            saved=bool(data.get("saved", False)),
            baseline_key=BenchKey.from_dict(data["key"]) if data.get("key") else None,
        )


# --------------------------------------------------------------------------- formatting helpers


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


def _verdict_cell(o: BenchOutcome) -> str:
    label = STATUS_LABELS.get(o.status, o.status)
    comp = o.comparability
    if comp is not None and comp.status == "forced":
        label += " (FORCED)"
    elif comp is not None and comp.status == "allowed-variable":
        label += f" ({comp.label})"
    return label


def _p_cell(o: BenchOutcome) -> str:
    return f"{o.verdict.p_value:.3g}" if o.verdict is not None else "-"


def _rows(outcomes: Sequence[BenchOutcome]) -> list[list[str]]:
    return [
        [
            o.name,
            o.workload,
            o.metric + (" ↑" if o.higher_is_better else " ↓"),
            _summary_cell(o.baseline),
            _summary_cell(o.current),
            _change_cell(o),
            _p_cell(o),
            _verdict_cell(o),
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
]


def format_table(outcomes: Sequence[BenchOutcome]) -> str:
    """Plain-text table, one line per benchmark, then the reasons behind non-passing verdicts."""
    if not outcomes:
        return "no benchmarks ran"
    rows = [_HEADER, *_rows(outcomes)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
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
    if comp is not None and comp.status in ("refused", "forced"):
        out.append(comp.message)
    if o.verdict is not None and (o.status != "pass" or (comp is not None and comp.status == "forced")):
        out.append(o.verdict.reason)
    if o.note:
        out.append(o.note)
    return out


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def format_markdown(outcomes: Sequence[BenchOutcome], *, title: str = "pytest-llmserve benchmarks") -> str:
    """Markdown for a CI job summary (e.g. appended to ``$GITHUB_STEP_SUMMARY``)."""
    lines = [f"### {title}", ""]
    if not outcomes:
        return "\n".join(lines + ["No benchmarks ran.", ""])
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    lines.append(
        ", ".join(
            f"{STATUS_ICONS.get(s, '')} {n} {STATUS_LABELS.get(s, s)}" for s, n in sorted(counts.items())
        )
    )
    lines += [
        "",
        "| | benchmark | server | workload | metric | baseline | now | change | 95% CI | p | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        ci = f"{o.verdict.ci_low * 100:+.1f}%..{o.verdict.ci_high * 100:+.1f}%" if o.verdict else "-"
        cells = [
            STATUS_ICONS.get(o.status, ""),
            f"`{o.test_id.rsplit('::', 1)[-1]}`",
            o.server_id,
            o.workload,
            o.metric + (" ↑" if o.higher_is_better else " ↓"),
            _summary_cell(o.baseline),
            _summary_cell(o.current),
            _change_cell(o),
            ci,
            _p_cell(o),
            _verdict_cell(o),
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
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the plugin's gate outcomes


def outcome_from_gate(data: Mapping[str, Any]) -> BenchOutcome:
    """A :class:`BenchOutcome` from the dict the benchmark gate (``pytest_llmserve.gates.bench``) records.

    Keys read: ``test``, ``server``, ``workload``, ``metric``, ``higher_is_better``, ``tolerance``,
    ``verdict`` (an outcome, ``saved``, ``no-baseline`` or ``refused``), ``verdict_detail`` (a
    :class:`Verdict` dict), ``current`` and ``baseline`` (metric → samples), ``comparability``,
    ``context``, ``message``, ``baseline_file``, ``key`` (the store key; without it the key is the test
    id without its parameters, the server and the workload, as the gate computes it), ``concurrency``,
    ``request_latencies_s``, ``error``, ``run_id``.
    """
    metric = str(data["metric"])
    test = str(data["test"])
    server = str(data["server"])
    workload = str(data["workload"])
    current = {k: [float(x) for x in v] for k, v in (data.get("current") or {}).items()}
    baseline = data.get("baseline") or {}
    detail = data.get("verdict_detail")
    comp = data.get("comparability")
    key_data = data.get("key")
    key = (
        BenchKey.from_dict(key_data)
        if isinstance(key_data, Mapping)
        else BenchKey(test=test.split("[", 1)[0], server=server, workload=workload)
    )
    higher = data.get("higher_is_better")
    return BenchOutcome(
        test_id=test,
        server_id=server,
        workload=workload,
        metric=metric,
        higher_is_better=bool(higher) if higher is not None else higher_is_better(metric),
        tolerance=float(data.get("tolerance", 0.05)),
        verdict=Verdict.from_dict(detail) if isinstance(detail, Mapping) else None,
        comparability=Comparability.from_dict(comp) if isinstance(comp, Mapping) else None,
        samples=current,
        baseline_samples=[float(x) for x in baseline.get(metric) or []],
        error=data.get("error"),
        context=dict(data.get("context") or {}),
        concurrency=data.get("concurrency"),
        request_latencies_s={
            k: [float(x) for x in v] for k, v in (data.get("request_latencies_s") or {}).items()
        },
        note=data.get("message"),
        baseline_path=data.get("baseline_file"),
        run_id=data.get("run_id"),
        saved=data.get("verdict") == "saved",
        baseline_key=key,
    )


def as_outcomes(items: Iterable[BenchOutcome | Mapping[str, Any]]) -> list[BenchOutcome]:
    """BenchOutcomes as they are; gate dicts converted by :func:`outcome_from_gate`."""
    return [item if isinstance(item, BenchOutcome) else outcome_from_gate(item) for item in items]


def write_all(
    outcomes: Iterable[BenchOutcome | Mapping[str, Any]],
    results_dir: str | os.PathLike[str],
    *,
    bench_json: str | os.PathLike[str] | None = None,
    plots: bool = True,
    github_summary: bool = False,
    run_id: str | None = None,
) -> list[Path]:
    """Every report of a session under ``results_dir``; returns the paths written.

    ``results.json`` (the format ``llmserve baselines accept`` reads), ``summary.md``, ``summary.txt``,
    PNG plots under ``plots/``, pytest-benchmark JSON at ``bench_json`` when given, and the Markdown
    appended to ``$GITHUB_STEP_SUMMARY`` when ``github_summary`` is set and that variable is.
    """
    items = as_outcomes(outcomes)
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_results_json(out / "results.json", items, run_id=run_id)]
    markdown = format_markdown(items)
    (out / "summary.md").write_text(markdown, encoding="utf-8")
    (out / "summary.txt").write_text(format_table(items) + "\n", encoding="utf-8")
    written += [out / "summary.md", out / "summary.txt"]
    if bench_json is not None:
        written.append(write_pytest_benchmark_json(bench_json, items))
    if plots:
        written += write_plots(items, out / "plots")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if github_summary and step_summary:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(markdown)
    return written


# --------------------------------------------------------------------------- results JSON


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def results_document(outcomes: Sequence[BenchOutcome], *, run_id: str | None = None) -> dict[str, Any]:
    from pytest_llmserve import __version__

    return {
        "format": RESULTS_FORMAT,
        "schema": RESULTS_SCHEMA,
        "created_at": _now(),
        "run_id": run_id or uuid.uuid4().hex[:12],
        "plugin_version": __version__,
        "benchmarks": [o.to_dict() for o in outcomes],
    }


def write_results_json(
    path: str | os.PathLike[str], outcomes: Sequence[BenchOutcome], *, run_id: str | None = None
) -> Path:
    """Write the results of a session (atomically); ``llmserve baselines accept`` reads this file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = _finite_json(results_document(outcomes, run_id=run_id))
    atomic_write_text(p, json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return p


def _finite_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_results_json(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[BenchOutcome]]:
    """The header (everything but ``benchmarks``) and the outcomes of a results file."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"{p}: no such results file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BaselineError(f"{p}: not a readable JSON results file ({exc})") from None
    if isinstance(data, list):  # the gate's own list of outcome dicts
        try:
            return {"format": "gate-outcomes"}, [outcome_from_gate(item) for item in data]
        except (KeyError, TypeError, ValueError, AttributeError, BaselineError) as exc:
            raise BaselineError(f"{p}: a list, but not of benchmark outcomes ({exc!r})") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        raise BaselineError(
            f'{p}: not a pytest-llmserve results file (expected "format": "{RESULTS_FORMAT}")'
        )
    if data.get("schema") != RESULTS_SCHEMA:
        raise BaselineError(
            f"{p}: results schema {data.get('schema')!r} is not supported (reads {RESULTS_SCHEMA})"
        )
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list):
        raise BaselineError(f"{p}: 'benchmarks' must be a list")
    outcomes = []
    for i, item in enumerate(benchmarks):
        try:
            outcomes.append(BenchOutcome.from_dict(item))
        except (KeyError, TypeError, ValueError, BaselineError) as exc:
            raise BaselineError(f"{p}: benchmarks[{i}] is malformed ({exc!r})") from None
    header = {k: v for k, v in data.items() if k != "benchmarks"}
    return header, outcomes


# --------------------------------------------------------------------------- pytest-benchmark JSON


def pb_transform(metric: str, higher_is_better: bool) -> tuple[Callable[[float], float], str]:
    """How a metric's samples become pytest-benchmark "time" data (lower is better, seconds)."""
    if higher_is_better:
        return (lambda v: 1.0 / v), "1/value (seconds per unit: ops = the metric)"
    if metric.endswith("_ms"):
        return (lambda v: v / 1000.0), "value/1000 (ms to s)"
    if metric.endswith("_us"):
        return (lambda v: v / 1e6), "value/1e6 (us to s)"
    return (lambda v: v), "value as is"


def _quartiles(data: Sequence[float]) -> tuple[float, float]:
    """Q1 and Q3 as pytest-benchmark computes them (Wikipedia methods 2 and 3)."""
    rounds = len(data)
    d = sorted(data)
    if rounds == 1:
        return d[0], d[0]
    if rounds % 2:
        n, q = rounds // 4, rounds % 4
        if q == 1:
            return 0.25 * d[n - 1] + 0.75 * d[n], 0.75 * d[3 * n] + 0.25 * d[3 * n + 1]
        return 0.75 * d[n] + 0.25 * d[n + 1], 0.25 * d[3 * n + 1] + 0.75 * d[3 * n + 2]
    return statistics.median(d[: rounds // 2]), statistics.median(d[rounds // 2 :])


def pb_stats(data: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's ``stats`` block (``Stats.as_dict`` fields + ``iterations`` + raw ``data``)."""
    values = [float(v) for v in data]
    if not values:
        raise ValueError("pytest-benchmark stats of no data")
    n = len(values)
    ordered = sorted(values)
    mean = statistics.mean(values)
    stddev = statistics.stdev(values) if n > 1 else 0.0
    q1, q3 = _quartiles(values)
    iqr = q3 - q1
    low_fence, high_fence = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    iqr_outliers = sum(1 for v in values if v < low_fence or v > high_fence)
    stddev_outliers = sum(1 for v in values if v < mean - stddev or v > mean + stddev)
    total = math.fsum(values)
    within = [v for v in ordered if low_fence <= v <= high_fence] or ordered
    return {
        "min": ordered[0],
        "max": ordered[-1],
        "mean": mean,
        "stddev": stddev,
        "rounds": n,
        "median": statistics.median(values),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": iqr_outliers,
        "stddev_outliers": stddev_outliers,
        "outliers": f"{stddev_outliers};{iqr_outliers}",
        "ld15iqr": within[0],
        "hd15iqr": within[-1],
        "ops": n / total if total else 0,
        "total": total,
        "iterations": 1,
        "data": values,
    }


def machine_info(hardware: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """pytest-benchmark's ``machine_info`` keys, plus this plugin's hardware context under ``llmserve``."""
    uname = platform.uname()
    info: dict[str, Any] = {
        "node": uname.node,
        "processor": uname.processor,
        "machine": uname.machine,
        "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(),
        "python_build": list(platform.python_build()),
        "release": uname.release,
        "system": uname.system,
        "cpu": {},
    }
    if hardware:
        info["cpu"] = {"brand_raw": hardware.get("cpu_model"), "count": hardware.get("cpu_count")}
        info["llmserve"] = dict(hardware)
    return info


def commit_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Git commit of ``cwd`` in pytest-benchmark's ``commit_info`` shape (``error`` when not a repository)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    project = Path(cwd or ".").resolve().name
    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        branch = git("rev-parse", "--abbrev-ref", "HEAD")
        when = git("show", "-s", "--format=%cI", "HEAD")
        author_time = git("show", "-s", "--format=%aI", "HEAD")
    except (OSError, subprocess.SubprocessError) as exc:
        return {
            "id": "unknown",
            "dirty": False,
            "project": project,
            "branch": "(unknown)",
            "error": f"{type(exc).__name__}: {exc}",
        }
    return {
        "id": commit,
        "time": when,
        "author_time": author_time,
        "dirty": dirty,
        "project": project,
        "branch": branch,
    }


def to_pytest_benchmark_json(
    outcomes: Sequence[BenchOutcome],
    *,
    hardware: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A document ``pytest-benchmark compare`` loads; outcomes without samples of the metric are left out."""
    benchmarks = []
    for o in outcomes:
        raw = o.samples.get(o.metric) or []
        if not raw or o.error:
            continue
        transform, how = pb_transform(o.metric, o.higher_is_better)
        if o.higher_is_better and any(v <= 0 for v in raw):
            transform, how = (lambda v: v), "value as is (non-positive samples)"
        fullname = o.test_id if o.server_id in o.test_id else f"{o.test_id}[{o.server_id}]"
        extra: dict[str, Any] = {name: s.median for name, s in o.metrics.items()}
        extra["llmserve"] = {
            "metric": o.metric,
            "higher_is_better": o.higher_is_better,
            "stats_transform": how,
            "server": o.server_id,
            "workload": o.workload,
            "status": o.status,
            "samples": o.samples,
            "summaries": {k: v.to_dict() for k, v in o.metrics.items()},
            "baseline": o.baseline.to_dict() if o.baseline else None,
            "verdict": o.verdict.to_dict() if o.verdict else None,
            "comparability": o.comparability.status if o.comparability else None,
        }
        benchmarks.append(
            {
                "group": f"{o.workload} {o.metric}",
                "name": o.name,
                "fullname": fullname,
                "params": {"server": o.server_id, "workload": o.workload},
                "param": o.server_id,
                "extra_info": extra,
                "options": {
                    "disable_gc": False,
                    "timer": "llmserve",
                    "min_rounds": len(raw),
                    "max_time": 0.0,
                    "min_time": 0.0,
                    "warmup": False,
                },
                "stats": pb_stats([transform(v) for v in raw]),
            }
        )
    from pytest_llmserve.store.baselines import hardware_context

    doc: dict[str, Any] = _finite_json(
        {
            "machine_info": machine_info(hardware if hardware is not None else hardware_context()),
            "commit_info": dict(commit) if commit is not None else commit_info(),
            "benchmarks": benchmarks,
            "datetime": _now(),
            "version": PYTEST_BENCHMARK_FORMAT_VERSION,
        }
    )
    return doc


def write_pytest_benchmark_json(
    path: str | os.PathLike[str],
    outcomes: Sequence[BenchOutcome],
    *,
    hardware: Mapping[str, Any] | None = None,
    commit: Mapping[str, Any] | None = None,
) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = to_pytest_benchmark_json(outcomes, hardware=hardware, commit=commit)
    atomic_write_text(p, json.dumps(doc, indent=4, allow_nan=False) + "\n")
    return p


# --------------------------------------------------------------------------- plots


def _figure(width: float = 7.0, height: float = 4.5) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format="png")
    return p


def plot_throughput_vs_concurrency(
    outcomes: Iterable[BenchOutcome], path: str | os.PathLike[str], *, metric: str | None = None
) -> Path | None:
    """Median (with min..max bars) of a metric against concurrency, one line per server.

    Drawn only when some server was measured at two or more concurrencies; returns None otherwise.
    """
    series: dict[str, dict[int, list[float]]] = {}
    chosen = metric
    for o in outcomes:
        name = chosen or o.metric
        values = o.samples.get(name)
        if o.concurrency is None or not values or o.error:
            continue
        chosen = name
        series.setdefault(o.server_id, {}).setdefault(o.concurrency, []).extend(values)
    series = {server: points for server, points in series.items() if len(points) >= 2}
    if not series or chosen is None:
        return None
    fig = _figure()
    ax = fig.add_subplot()
    for server, points in sorted(series.items()):
        xs = sorted(points)
        med = [statistics.median(points[x]) for x in xs]
        lo = [m - min(points[x]) for x, m in zip(xs, med, strict=True)]
        hi = [max(points[x]) - m for x, m in zip(xs, med, strict=True)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=server)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(chosen)
    ax.set_title(f"{chosen} vs concurrency (median, min..max over rounds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


LATENCY_PREFERENCE = ("e2e", "ttft", "tpot", "itl")


def plot_latency_cdf(
    outcomes: Iterable[BenchOutcome], path: str | os.PathLike[str], *, latency: str | None = None
) -> Path | None:
    """Empirical CDF of per-request latencies (ms), one curve per benchmark; None when there are none."""
    items = [o for o in outcomes if o.request_latencies_s and not o.error]
    if not items:
        return None
    if latency is None:
        present = {name for o in items for name in o.request_latencies_s}
        latency = next((n for n in LATENCY_PREFERENCE if n in present), sorted(present)[0])
    fig = _figure()
    ax = fig.add_subplot()
    drawn = 0
    for o in items:
        values = sorted(v * 1000.0 for v in o.request_latencies_s.get(latency, []))
        if not values:
            continue
        ys = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(values, ys, where="post", label=f"{o.server_id} {o.workload}")
        drawn += 1
    if not drawn:
        return None
    ax.set_xlabel(f"{latency} (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{latency} latency CDF")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_samples(
    groups: Mapping[str, Sequence[float]], path: str | os.PathLike[str], *, title: str, ylabel: str
) -> Path:
    """Box plot with every sample drawn on top (A vs B, baseline vs now)."""
    names = [name for name, values in groups.items() if values]
    if not names:
        raise ValueError("plot_samples: no samples to draw")
    fig = _figure(max(4.0, 1.8 * len(names) + 2), 4.5)
    ax = fig.add_subplot()
    data = [list(groups[name]) for name in names]
    ax.boxplot(data, tick_labels=names, widths=0.5, showfliers=False)
    for i, values in enumerate(data, start=1):
        offsets = [((j % 7) - 3) * 0.03 for j in range(len(values))]
        ax.scatter([i + off for off in offsets], values, s=18, alpha=0.8, zorder=3)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def plot_ab(outcome: BenchOutcome, path: str | os.PathLike[str]) -> Path | None:
    """Baseline vs current samples of the gated metric; None when either side has none."""
    current = outcome.samples.get(outcome.metric) or []
    if not outcome.baseline_samples or not current:
        return None
    title = f"{outcome.name} {outcome.workload}"
    if outcome.verdict is not None:
        title += f": {outcome.verdict.outcome} ({outcome.verdict.raw_change * 100:+.1f}%)"
    return plot_samples(
        {"baseline": outcome.baseline_samples, "now": current}, path, title=title, ylabel=outcome.metric
    )


def _file_stem(o: BenchOutcome) -> str:
    return o.key.filename[: -len(".json")]


def write_plots(outcomes: Sequence[BenchOutcome], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Every plot that the outcomes support, as PNG files under ``out_dir``."""
    out = Path(out_dir)
    written: list[Path] = []
    metrics = sorted({o.metric for o in outcomes})
    for metric in metrics:
        chosen = [o for o in outcomes if o.metric == metric]
        path = plot_throughput_vs_concurrency(chosen, out / f"{metric}-vs-concurrency.png", metric=metric)
        if path:
            written.append(path)
    cdf = plot_latency_cdf(outcomes, out / "latency-cdf.png")
    if cdf:
        written.append(cdf)
    for o in outcomes:
        ab = plot_ab(o, out / f"ab-{_file_stem(o)}.png")
        if ab:
            written.append(ab)
    return written
