"""Every report of a session in one call: results JSON, Markdown and text summaries, pytest-benchmark JSON,
plots, and the GitHub Actions job summary; and where they go.

Each run's reports go to a directory of their own, ``<results_dir>/runs/<UTC time>-<random>/``
(:func:`new_run_dir`), never over an earlier run's; ``<results_dir>/latest`` points at the newest (a
relative symlink, or, where symlinks cannot be made, a ``latest.txt`` holding the directory's path
relative to ``results_dir``: :func:`point_latest`, :func:`latest_run_dir`)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pytest_llmserve.report.benchmark_json import write_pytest_benchmark_json
from pytest_llmserve.report.checks import (
    CheckOutcome,
    RunCompleteness,
    as_checks,
    headline,
    strict_failed_benchmarks,
)
from pytest_llmserve.report.json import write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.plots import matplotlib_missing, write_plots
from pytest_llmserve.report.text import format_check_lines, format_markdown, format_table

GITHUB_STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


def format_text_summary(outcomes: Iterable[BenchOutcome], checks: Iterable[CheckOutcome] = (), *,
                        strict: bool = False, completeness: RunCompleteness | None = None) -> str:
    """summary.txt and the terminal's llmserve section: the headline (``strict`` and ``completeness`` as
    :func:`~pytest_llmserve.report.checks.headline` takes them), each check that did not pass (with its first
    finding), then the benchmark table."""
    benches, rows = list(outcomes), list(checks)
    lines = [f"llmserve: {headline(rows, benches, strict=strict, completeness=completeness)}"]
    lines += format_check_lines(rows)
    if benches:
        lines.append(format_table(benches, strict_failed_benchmarks(rows)))
    return "\n".join(lines)


def write_all(
    outcomes: Iterable[BenchOutcome],
    results_dir: str | os.PathLike[str],
    *,
    checks: Iterable[CheckOutcome | Mapping[str, object]] = (),
    bench_json: str | os.PathLike[str] | None = None,
    plots: bool = True,
    github_summary: bool = False,
    run_id: str | None = None,
    strict: bool = False,
    completeness: RunCompleteness | None = None,
) -> list[Path]:
    """Every report of a session under ``results_dir``; returns the paths written.

    ``results.json`` (the format ``llmserve baselines accept`` reads; one row per check and per
    benchmark), ``summary.md``, ``summary.txt``, PNG plots under ``plots/``, pytest-benchmark JSON at
    ``bench_json`` when given, and the Markdown appended (never overwritten: earlier steps wrote there
    too) to ``$GITHUB_STEP_SUMMARY`` when ``github_summary`` is set and that variable is. ``strict``: the run was
    in strict mode; ``completeness``: how much of it ran (an interrupted run says so first in every report).
    """
    items = list(outcomes)
    rows = as_checks(checks)
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_results_json(out / "results.json", items, rows, run_id=run_id, strict=strict,
                                  completeness=completeness)]
    markdown = format_markdown(items, rows, strict=strict, completeness=completeness)
    (out / "summary.md").write_text(markdown, encoding="utf-8")
    text = format_text_summary(items, rows, strict=strict, completeness=completeness)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    written += [out / "summary.md", out / "summary.txt"]
    if bench_json is not None and items:
        written.append(write_pytest_benchmark_json(bench_json, items))
    if plots and items:
        written += write_plots(items, out / "plots")
    step_summary = os.environ.get(GITHUB_STEP_SUMMARY)
    if github_summary and step_summary:
        with open(step_summary, "a", encoding="utf-8") as fh:
            fh.write(markdown + "\n")
    return written


RUNS_DIR = "runs"
LATEST = "latest"
LATEST_TXT = "latest.txt"


def new_run_dir(results_dir: str | os.PathLike[str]) -> Path:
    """A new, empty directory for this run's reports: ``<results_dir>/runs/<UTC time>-<random>``."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    runs = Path(results_dir) / RUNS_DIR
    runs.mkdir(parents=True, exist_ok=True)
    while True:
        path = runs / f"{stamp}-{uuid.uuid4().hex[:6]}"
        try:
            path.mkdir()  # never an existing one: two runs in the same second get different names
        except FileExistsError:
            continue
        return path


def point_latest(results_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str]) -> Path:
    """Make ``<results_dir>/latest`` point at ``run_dir`` (atomically replaced); where a symlink cannot be
    made, write ``latest.txt`` instead. Returns the pointer written."""
    root = Path(results_dir)
    target = os.path.relpath(run_dir, root)
    link = root / LATEST
    tmp = root / f".{LATEST}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        os.symlink(target, tmp, target_is_directory=True)
        if link.exists() and not link.is_symlink():
            raise OSError(f"{link} exists and is not a symlink")  # a user's own file or directory: keep it
        os.replace(tmp, link)
    except (OSError, NotImplementedError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        text = root / LATEST_TXT
        text.write_text(target + "\n", encoding="utf-8")
        return text
    with contextlib.suppress(OSError):
        (root / LATEST_TXT).unlink()  # a stale fallback would contradict the link
    return link


def latest_run_dir(results_dir: str | os.PathLike[str]) -> Path | None:
    """The newest run's report directory, by the ``latest`` pointer; None when there is none."""
    root = Path(results_dir)
    link = root / LATEST
    if link.is_symlink() or link.is_dir():
        return link.resolve()
    with contextlib.suppress(OSError):
        return (root / (root / LATEST_TXT).read_text(encoding="utf-8").strip()).resolve()
    return None


def render_session(outcomes: Iterable[BenchOutcome],
                   checks: Iterable[CheckOutcome | Mapping[str, object]], results_dir: Path, *,
                   bench_json: Path | None, wall_s: float, boot_s: float, run_id: str | None = None,
                   files: Sequence[tuple[str, Path]] = (), strict: bool = False,
                   completeness: RunCompleteness | None = None) -> str:
    """Write every report of the session (the job summary included) and return the terminal's lines:
    the headline, the checks that did not pass, the benchmark table, the paths written. ``files``: other
    records of the run, copied into its report directory under their relative names (e.g. a matrix
    reference's answers, ``reference-answers/<server>.json``). ``strict`` and ``completeness``: as
    :func:`write_all` takes them."""
    items, rows = list(outcomes), as_checks(checks)
    no_plots = matplotlib_missing() if items else None
    run_dir = new_run_dir(results_dir)  # never over an earlier run's reports
    paths = write_all(items, run_dir, checks=rows, bench_json=bench_json, plots=no_plots is None,
                      github_summary=True, run_id=run_id or run_dir.name, strict=strict, completeness=completeness)
    for relative, source in files:
        target = run_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)  # the run directory is new: nothing there to overwrite
        paths.append(target)
    latest = point_latest(results_dir, run_dir)
    lines = [format_text_summary(items, rows, strict=strict, completeness=completeness)]
    lines += [f"report: {p}" for p in paths]
    lines.append(f"report: {latest} -> {run_dir.name}")
    if no_plots:
        lines.append(f"report: {no_plots}")
    lines.append(f"suite wall time {wall_s:.1f} s, of which server boots {boot_s:.1f} s")
    return "\n".join(lines)
