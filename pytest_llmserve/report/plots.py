"""Plots for CI pages: throughput against concurrency, latency CDFs, baseline against now (PNG).

matplotlib is an optional extra (``pytest-llmserve[plots]``), imported when a plot is drawn; its Agg canvas
is used directly (no pyplot state). :func:`matplotlib_missing` says, before anything is drawn, whether plots
can be made and what to install when not.
"""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmserve.metrics import METRICS
from pytest_llmserve.report.outcome import BenchOutcome

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOTS_EXTRA = "pytest-llmserve[plots]"


def axis_label(metric: str) -> str:
    """``output_throughput (tok/s)``, ``median_ttft_ms (ms)``: a metric with its unit."""
    known = METRICS.get(metric)
    return f"{metric} ({known.unit.replace('tokens/s', 'tok/s')})" if known is not None else metric


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else why there are no plots and which extra to install."""
    if importlib.util.find_spec("matplotlib") is not None:
        return None
    return f"no plots: matplotlib is not installed (install the plots extra: pip install '{PLOTS_EXTRA}')"


def _figure(width: float = 7.0, height: float = 4.5) -> Figure:
    try:
        # lazy: matplotlib takes ~0.5 s to import (-X importtime); only a plot needs it
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            f"plots need matplotlib, which is not installed: pip install '{PLOTS_EXTRA}' ({exc})"
        ) from exc

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str]) -> Path:
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
    ax.set_ylabel(axis_label(chosen))
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


def ab_sides(outcome: BenchOutcome) -> tuple[str, str] | None:
    """The A and B configuration ids of an A/B outcome (its key's server is ``"A|B"``), else None."""
    a, sep, b = outcome.key.server.partition("|")
    return (a, b) if sep else None


def plot_ab(outcome: BenchOutcome, path: str | os.PathLike[str]) -> Path | None:
    """Baseline (or A) vs current (or B) samples of the gated metric; None when either side has none."""
    current = outcome.samples.get(outcome.metric) or []
    if not outcome.baseline_samples or not current:
        return None
    title = f"{outcome.name} {outcome.workload}"
    if outcome.verdict is not None:
        title += f": {outcome.verdict.outcome} ({outcome.verdict.raw_change * 100:+.1f}%)"
    sides = ab_sides(outcome)
    names = (f"A: {sides[0]}", f"B: {sides[1]}") if sides else ("baseline", "now")
    return plot_samples(
        {names[0]: outcome.baseline_samples, names[1]: current}, path, title=title,
        ylabel=axis_label(outcome.metric),
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("._-")[:60] or "x"


def comparison_plot_name(o: BenchOutcome) -> str:
    """What a comparison plot compares, as its file name: ``baseline-vs-current-<test>-<server>-<hash>.png``
    or ``<A>-vs-<B>-<test>-<hash>.png`` (the key's hash keeps names unique)."""
    test = _slug(o.key.test.rsplit("::", 1)[-1].split("[", 1)[0])
    sides = ab_sides(o)
    if sides:
        return f"{_slug(sides[0])}-vs-{_slug(sides[1])}-{test}-{o.key.digest}.png"
    return f"baseline-vs-current-{test}-{_slug(o.server_id)}-{o.key.digest}.png"


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
        ab = plot_ab(o, out / comparison_plot_name(o))
        if ab:
            written.append(ab)
    return written


def plot_builds(labels: list[str], samples: list[list[float]], path: str | os.PathLike[str], *,
                metric: str = "output_throughput", verdicts: list[str] | None = None) -> Path:
    """Each build's rounds of ``metric`` (dots) and their median (bar), builds in the order given."""
    fig = _figure(width=max(6.0, 1.6 * len(labels)), height=4.5)
    ax = fig.add_subplot(1, 1, 1)
    for i, values in enumerate(samples):
        if values:
            ax.bar(i, statistics.median(values), color="#9ecae1", width=0.6)
            ax.plot([i] * len(values), values, "o", color="#08519c", markersize=4)
    ax.set_xticks(range(len(labels)))
    shown = [f"{label}\n{verdicts[i]}" if verdicts and verdicts[i] else label for i, label in enumerate(labels)]
    ax.set_xticklabels(shown, fontsize=8)
    ax.set_ylabel(axis_label(metric))
    ax.set_title(f"{metric} per build (bar: median; dots: rounds)")
    return _save(fig, path)
