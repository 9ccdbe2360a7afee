"""Reports: terminal table, Markdown, results JSON, pytest-benchmark JSON (checked by its CLI), plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec, Workload
from pytest_llmserve.errors import BaselineError
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.report.benchmark_json import (
    benchmark_stats,
    stats_transform,
    to_pytest_benchmark_json,
    write_pytest_benchmark_json,
)
from pytest_llmserve.report.json import read_results_json, write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.plots import write_plots
from pytest_llmserve.report.session import write_all
from pytest_llmserve.report.text import format_markdown, format_table
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts.comparability import comparability
from pytest_llmserve.verdicts.stats import decide

HW = {"cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}
COMMIT = {
    "id": "abc123",
    "dirty": False,
    "project": "demo",
    "branch": "main",
    "time": "2026-01-01T00:00:00+00:00",
}
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
DROP = [90.0, 90.5, 89.5, 91.0, 89.0]


def context(**kw: object) -> dict[str, object]:
    spec = ServerSpec(name="srv", engine="vllm", model="/m", **kw)  # type: ignore[arg-type]
    return build_context(
        spec,
        Workload("smoke"),
        engine_version="0.32.0",
        hardware=HW,
        plugin_version="0.1.0",
        python="CPython 3.11",
    )


def outcome(
    name: str = "test_throughput",
    server: str = "srv",
    current: list[float] | None = None,
    baseline: list[float] | None = None,
    **kw: object,
) -> BenchOutcome:
    cur = DROP if current is None else current
    base = BASE if baseline is None else baseline
    verdict = (
        decide(base, cur, higher_is_better=True, tolerance=0.05, metric="output_throughput") if base else None
    )
    fields: dict[str, object] = {
        "test_id": f"tests/test_perf.py::{name}",
        "server_id": server,
        "workload": "smoke",
        "metric": "output_throughput",
        "verdict": verdict,
        "comparability": comparability(context(), context(), None, False),
        "samples": {"output_throughput": cur, "median_ttft_ms": [20.0 + i for i in range(len(cur))]},
        "baseline_samples": base,
        "context": context(),
        "request_latencies_s": {"e2e": [0.5, 0.6, 0.55, 0.7], "ttft": [0.05, 0.06, 0.05, 0.07]},
    }
    fields.update(kw)
    return BenchOutcome(**fields)  # type: ignore[arg-type]


def test_outcome_fills_summaries_and_status() -> None:
    o = outcome()
    assert o.current is not None
    assert o.current.median == 90.0
    assert o.baseline is not None
    assert o.baseline.median == 100.0
    assert set(o.metrics) == {"output_throughput", "median_ttft_ms"}
    assert o.status == "regressed"
    assert o.failed
    assert o.name == "test_throughput[srv]"
    assert outcome(error="3 requests failed").status == "error"
    assert outcome(baseline=[], verdict=None).status == "no-baseline"
    refused = comparability(context(), context(mem_fraction=0.5), None, False)
    assert outcome(comparability=refused, verdict=None).status == "refused"


def test_terminal_table() -> None:
    forced = comparability(context(), context(mem_fraction=0.5), None, True)
    text = format_table(
        [
            outcome(),
            outcome("test_ok", current=[100.2, 100.1, 99.9, 100.0, 99.8]),
            outcome("test_forced", comparability=forced),
            outcome("test_bad", error="2 of 16 requests failed"),
        ]
    )
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["benchmark", "workload", "metric"]
    row = next(line for line in lines if line.startswith("test_throughput[srv]"))
    assert "-10.0%" in row
    assert "REGRESSED" in row
    assert "100.0 ±" in row
    assert "90.00 ±" in row
    assert "pass" in next(line for line in lines if line.startswith("test_ok[srv]"))
    assert "(FORCED)" in next(line for line in lines if line.startswith("test_forced[srv]"))
    assert "ERROR" in next(line for line in lines if line.startswith("test_bad[srv]"))
    assert "invalid run: 2 of 16 requests failed" in text
    assert "FORCED comparison" in text
    assert "server_args.mem_fraction" in text
    assert "significant" in text  # the regression's reason sentence
    assert format_table([]) == "no benchmarks ran"


def test_markdown_summary() -> None:
    refused = comparability(context(), context(mem_fraction=0.5), None, False)
    md = format_markdown([outcome(), outcome("test_p[a|b]", comparability=refused, verdict=None)])
    assert md.startswith("### pytest-llmserve: verified 1 of 2 checks · 1 FAILED (1 benchmark) · "
                         "1 benchmark comparison refused\n")
    assert "| ❌ | `test_throughput` | srv | smoke | output_throughput ↑ |" in md
    assert "test_p[a\\|b]" in md  # pipes escaped
    assert "⛔" in md
    assert "REFUSED" in md
    assert "<details>" in md
    assert "comparison refused" in md
    header = next(line for line in md.splitlines() if line.startswith("| |"))
    assert all(
        line.count(" | ") >= header.count(" | ") for line in md.splitlines() if line.startswith("| ❌")
    )


def test_results_json_round_trip(tmp_path: Path) -> None:
    forced = comparability(context(), context(cuda_graph=CudaGraphSpec(enabled=False)), "cuda_graph", False)
    items = [outcome(), outcome("t2", comparability=forced, concurrency=8), outcome("t3", error="invalid")]
    path = write_results_json(tmp_path / "out" / "results.json", items, run_id="r1")
    header, back = read_results_json(path)
    assert header["format"] == "pytest-llmserve-results"
    assert header["run_id"] == "r1"
    assert [o.to_dict() for o in back] == [o.to_dict() for o in items]
    assert back[1].comparability is not None
    assert back[1].comparability.status == "allowed-variable"
    assert json.loads(path.read_text())["benchmarks"][0]["status"] == "regressed"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not a readable JSON"),
        ('{"format": "other"}', "not a pytest-llmserve results file"),
        ('{"format": "pytest-llmserve-results", "schema": 9, "benchmarks": []}', "schema 9"),
        (
            '{"format": "pytest-llmserve-results", "schema": 1, "benchmarks": [{"x": 1}]}',
            r"benchmarks\[0\] is malformed",
        ),
    ],
)
def test_results_json_bad_input(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(BaselineError, match=message):
        read_results_json(path)


def test_benchmark_stats_field_by_field() -> None:
    """pytest-benchmark's Stats give what the hand-written copy they replaced gave, field by field and in order
    (figures from that copy); the outlier checks hd15iqr, which pytest-benchmark got right in 5.3.1."""
    data = [0.02, 0.021, 0.019, 0.0205, 0.0195, 0.05, 0.02]
    stats = benchmark_stats(data)
    expected = {
        "min": 0.019, "max": 0.05, "mean": 0.024285714285714285, "stddev": 0.011357292601588428, "rounds": 7,
        "median": 0.02, "iqr": 0.00125, "q1": 0.019625, "q3": 0.020875, "iqr_outliers": 1,
        "stddev_outliers": 1, "outliers": "1;1", "ld15iqr": 0.019, "hd15iqr": 0.021, "ops": 41.17647058823529,
        "total": 0.17, "iterations": 1, "data": data,
    }
    assert list(stats) == list(expected)
    for name, value in expected.items():
        assert stats[name] == pytest.approx(value), name
    one = benchmark_stats([0.5])
    assert (one["stddev"], one["q1"], one["q3"], one["ld15iqr"], one["hd15iqr"], one["ops"]) == (0, 0.5, 0.5, 0.5, 0.5, 2.0)
    with pytest.raises(ValueError, match="no data"):
        benchmark_stats([])


def test_stats_transform() -> None:
    to_time, how = stats_transform("output_throughput", True)
    assert to_time(40.0) == pytest.approx(0.025)
    assert "1/value" in how
    assert stats_transform("median_ttft_ms", False)[0](250.0) == pytest.approx(0.25)
    assert stats_transform("duration_s", False)[0](3.0) == 3.0
    doc = to_pytest_benchmark_json([outcome(current=[40.0, 40.0, 40.0])], hardware=HW, commit=COMMIT)
    assert doc["benchmarks"][0]["stats"]["ops"] == pytest.approx(40.0)  # ops is the throughput again


def _pytest_benchmark_cli() -> list[str]:
    exe = Path(sys.executable).parent / "pytest-benchmark"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pytest_benchmark"]


def test_pytest_benchmark_compare_loads_our_json(tmp_path: Path) -> None:
    base_doc = outcome("test_throughput", current=BASE, baseline=[])
    first = write_pytest_benchmark_json(
        tmp_path / "0001_baseline.json", [base_doc], hardware=HW, commit=COMMIT
    )
    second = write_pytest_benchmark_json(
        tmp_path / "0002_now.json",
        [outcome(), outcome("test_other", error="bad run")],
        hardware=HW,
        commit=COMMIT,
    )
    doc = json.loads(second.read_text())
    assert len(doc["benchmarks"]) == 1  # the invalid run has no stats
    bench = doc["benchmarks"][0]
    assert set(doc) == {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    assert doc["version"].startswith("5.")
    assert set(bench) >= {"group", "name", "fullname", "params", "param", "extra_info", "options", "stats"}
    assert bench["extra_info"]["output_throughput"] == 90.0
    assert bench["extra_info"]["llmserve"]["samples"]["output_throughput"] == DROP
    env = dict(os.environ, COLUMNS="200", PY_COLORS="0")
    result = subprocess.run(
        [*_pytest_benchmark_cli(), "compare", str(first), str(second)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Failed to load" not in output
    assert "test_throughput[srv]" in output
    assert output.count("test_throughput[srv]") >= 2  # one row per file


def test_plots(tmp_path: Path) -> None:
    items = [
        outcome("test_c1", concurrency=1, current=[20.0, 21.0, 20.5]),
        outcome("test_c8", concurrency=8, current=[38.0, 39.0, 40.0]),
        outcome("test_c8", server="other", concurrency=8, current=[37.0, 38.0, 36.0]),
    ]
    written = write_plots(items, tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert "output_throughput-vs-concurrency.png" in names
    assert "latency-cdf.png" in names
    assert sum(name.startswith("baseline-vs-current-") for name in names) == 3
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 1000


def test_no_plots_without_data(tmp_path: Path) -> None:
    lone = outcome(baseline=[], verdict=None, request_latencies_s={})
    assert write_plots([lone], tmp_path) == []


def gate_dict(verdict: str, **kw: object) -> dict[str, object]:
    """An outcome dict as pytest_llmserve.gates.bench recorded it before it filled a BenchOutcome (a bare list of
    these is still read: "gate-outcomes")."""
    d: dict[str, object] = {
        "test": "tests/test_perf.py::test_throughput[srv]",
        "server": "srv",
        "workload": "smoke",
        "metric": "output_throughput",
        "higher_is_better": True,
        "tolerance": 0.05,
        "baseline_file": "baselines/x.json",
        "context": context(),
        "verdict": verdict,
        "current": {"output_throughput": DROP, "median_ttft_ms": [20.0] * 5},
        "baseline": None,
        "rounds": 5,
        "message": f"{verdict} message",
        "seconds": 1.0,
        "cross_check": None,
    }
    d.update(kw)
    return d


def read_legacy_record(data: dict[str, object]) -> BenchOutcome:
    """The outcome read back from a bare list holding ``data`` (the gate's earlier record shape)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bare = Path(tmp) / "bare.json"
        bare.write_text(json.dumps([data]))
        header, [read] = read_results_json(bare)
    assert header["format"] == "gate-outcomes"
    return read


def test_legacy_bare_records_read_back() -> None:
    v = decide(BASE, DROP, higher_is_better=True, tolerance=0.05)
    comp = comparability(context(), context(), None, False)
    judged = read_legacy_record(
        gate_dict(
            "regressed",
            verdict_detail=v.to_dict(),
            comparability=comp.to_dict(),
            baseline={"output_throughput": BASE, "median_ttft_ms": [19.0] * 5},
        )
    )
    assert judged.status == "regressed"
    assert judged.verdict == v
    assert judged.baseline_samples == BASE
    assert judged.key == BenchKey(
        "tests/test_perf.py::test_throughput", "srv", "smoke"
    )  # as the gate keys it
    assert read_legacy_record(gate_dict("saved")).status == "saved"
    assert read_legacy_record(gate_dict("no-baseline", current=None)).status == "no-baseline"
    refused = comparability(context(), context(mem_fraction=0.5), None, False)
    assert (
        read_legacy_record(gate_dict("refused", current=None, comparability=refused.to_dict())).status
        == "refused"
    )
    explicit = read_legacy_record(gate_dict("saved", key={"test": "t", "server": "s", "workload": "w"}))
    assert explicit.key == BenchKey("t", "s", "w")


def test_write_all_from_gate_dicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    v = decide(BASE, DROP, higher_is_better=True, tolerance=0.05)
    items = [
        read_legacy_record(gate_dict("regressed", verdict_detail=v.to_dict(), baseline={"output_throughput": BASE})),
        outcome(),
    ]
    paths = write_all(items, tmp_path / "results", bench_json=tmp_path / "bench.json", github_summary=True)
    names = {p.name for p in paths}
    assert {"results.json", "summary.md", "summary.txt", "bench.json"} <= names
    assert any(name.startswith("baseline-vs-current-test_throughput-") for name in names)
    _, back = read_results_json(tmp_path / "results" / "results.json")
    assert [o.status for o in back] == ["regressed", "regressed"]
    assert back[0].key.test == "tests/test_perf.py::test_throughput"
    assert "REGRESSED" in summary.read_text()
    # the gate's bare list of dicts is read as well
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([gate_dict("saved")]))
    header, saved = read_results_json(bare)
    assert header["format"] == "gate-outcomes"
    assert saved[0].status == "saved"
    assert saved[0].samples["output_throughput"] == DROP
    # and a bare list of outcomes as they are now (results.json entries, or the records the plugin carries)
    bare.write_text(json.dumps([back[0].to_dict(), json.loads(back[1].to_json())]))
    header, again = read_results_json(bare)
    assert header["format"] == "gate-outcomes"
    assert [o.to_dict() for o in again] == [o.to_dict() for o in back]


def test_without_matplotlib_the_other_reports_are_written_and_the_extra_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_llmserve.report.session import render_session

    for name in ["matplotlib", *(m for m in sys.modules if m.startswith("matplotlib."))]:
        monkeypatch.setitem(sys.modules, name, None)  # imports fail, as when the extra is not installed
    v = decide(BASE, DROP, higher_is_better=True, tolerance=0.05)
    items = [read_legacy_record(gate_dict("regressed", verdict_detail=v.to_dict(), baseline={"output_throughput": BASE}))]
    text = render_session(items, [], tmp_path / "results", bench_json=None, wall_s=3.0, boot_s=1.0)
    assert "install the plots extra: pip install 'pytest-llmserve[plots]'" in text
    latest = tmp_path / "results" / "latest"  # this run's own directory, by the latest pointer
    assert (latest / "results.json").exists() and not (latest / "plots").exists()
    assert text.splitlines()[0] == "llmserve: verified 1 of 1 check · 1 FAILED (1 benchmark)"
    assert text.splitlines()[3].startswith("test_throughput[srv]  smoke") and "REGRESSED" in text
    with pytest.raises(ImportError, match=r"pytest-llmserve\[plots\]"):
        write_plots([outcome()], tmp_path / "plots")
