"""Every report of a session in one call: results JSON, Markdown and text summaries, pytest-benchmark JSON,
plots, and the GitHub Actions job summary."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_llmserve.report.benchmark_json import write_pytest_benchmark_json
from pytest_llmserve.report.json import write_results_json
from pytest_llmserve.report.outcome import BenchOutcome, as_outcomes
from pytest_llmserve.report.plots import write_plots
from pytest_llmserve.report.text import format_markdown, format_table


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
