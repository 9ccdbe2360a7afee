"""Results as pytest-benchmark JSON, so ``pytest-benchmark compare`` and its tooling read them.

pytest-benchmark's tables assume "lower is better, in seconds", so ``stats`` hold a transform of the gated
metric's samples that keeps that meaning (:func:`stats_transform`): a higher-is-better metric v is stored as
1/v (seconds per token for a throughput, so that ``ops`` is the throughput again), ``*_ms`` as v/1000,
``*_s`` as is. The statistics themselves are pytest-benchmark's own (``pytest_benchmark.stats.Stats``). The
untransformed samples, every metric's summary, the verdict and the transform used are in ``extra_info``. The file
is strict JSON, a figure that is not finite written null (:mod:`pytest_llmserve.json_encoding`).
"""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_llmserve.json_encoding import dumps, to_plain
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.hardware import hardware_context
from pytest_llmserve.store.baselines import atomic_write_text, utc_timestamp

PYTEST_BENCHMARK_FORMAT_VERSION = "5.1.0"  # the JSON layout written here is that of pytest-benchmark 5.x


def stats_transform(metric: str, higher_is_better: bool) -> tuple[Callable[[float], float], str]:
    """How a metric's samples become pytest-benchmark "time" data (lower is better, seconds)."""
    if higher_is_better:
        return (lambda v: 1.0 / v), "1/value (seconds per unit: ops = the metric)"
    if metric.endswith("_ms"):
        return (lambda v: v / 1000.0), "value/1000 (ms to s)"
    if metric.endswith("_us"):
        return (lambda v: v / 1e6), "value/1e6 (us to s)"
    return (lambda v: v), "value as is"


def benchmark_stats(data: Sequence[float]) -> dict[str, object]:
    """pytest-benchmark's ``stats`` block: ``Stats.as_dict()`` of ``data``, ``iterations`` (1) and ``data``."""
    # lazy: pytest_benchmark.stats takes ~30 ms to import (-X importtime), and is optional
    from pytest_benchmark.stats import Stats

    values = [float(v) for v in data]
    if not values:
        raise ValueError("pytest-benchmark stats of no data")
    stats: Any = Stats()  # type: ignore[no-untyped-call]  # pytest-benchmark ships no annotations
    for value in values:
        stats.update(value)
    out: dict[str, object] = stats.as_dict()
    out["iterations"] = 1
    out["data"] = values
    return out


def machine_info(hardware: Mapping[str, object] | None = None) -> dict[str, object]:
    """pytest-benchmark's ``machine_info`` keys, plus this plugin's hardware context under ``llmserve``."""
    uname = platform.uname()
    info: dict[str, object] = {
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


def commit_info(cwd: str | os.PathLike[str] | None = None) -> dict[str, object]:
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
    hardware: Mapping[str, object] | None = None,
    commit: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """A document ``pytest-benchmark compare`` loads; outcomes without samples of the metric are left out."""
    benchmarks = []
    for o in outcomes:
        raw = o.samples.get(o.metric) or []
        if not raw or o.error:
            continue
        transform, how = stats_transform(o.metric, o.higher_is_better)
        if o.higher_is_better and any(v <= 0 for v in raw):
            transform, how = (lambda v: v), "value as is (non-positive samples)"
        fullname = o.test_id if o.server_id in o.test_id else f"{o.test_id}[{o.server_id}]"
        extra: dict[str, object] = {name: s.median for name, s in o.metrics.items()}
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
                "stats": benchmark_stats([transform(v) for v in raw]),
            }
        )
    doc: dict[str, Any] = to_plain(
        {
            "machine_info": machine_info(hardware if hardware is not None else hardware_context()),
            "commit_info": dict(commit) if commit is not None else commit_info(),
            "benchmarks": benchmarks,
            "datetime": utc_timestamp(),
            "version": PYTEST_BENCHMARK_FORMAT_VERSION,
        }
    )
    return doc


def write_pytest_benchmark_json(
    path: str | os.PathLike[str],
    outcomes: Sequence[BenchOutcome],
    *,
    hardware: Mapping[str, object] | None = None,
    commit: Mapping[str, object] | None = None,
) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = to_pytest_benchmark_json(outcomes, hardware=hardware, commit=commit)
    atomic_write_text(p, dumps(doc, indent=4) + "\n")
    return p
