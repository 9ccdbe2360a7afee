"""``llmserve baselines list|show|diff|accept`` and ``llmserve compare``: output and exit codes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.cli import baselines as cli_baselines
from pytest_llmserve.config import CudaGraphSpec, ServerSpec, Workload
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.report.json import write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.store.baselines import BaselineStore, BenchKey

HW = {"cpu_model": "Test CPU", "cpu_count": 2, "gpu_name": None, "gpu_count": 0, "driver": None, "cuda": None}
BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
SAME = [100.2, 100.8, 99.4, 100.1, 99.7]
DROP = [90.0, 90.5, 89.5, 91.0, 89.0]
TEST = "tests/test_perf.py::test_throughput"


def context(**kw: Any) -> dict[str, Any]:
    engine_version = kw.pop("engine_version", "0.32.0")
    spec = ServerSpec(name="srv", engine="vllm", model="/m", **{"mem_fraction": 0.9, **kw})
    return build_context(
        spec,
        Workload("smoke"),
        engine_version=engine_version,
        hardware=HW,
        plugin_version="0.1.0",
        python="CPython 3.11",
    )


def results(
    path: Path,
    values: list[float],
    *,
    server: str = "srv",
    ctx: dict[str, Any] | None = None,
    error: str | None = None,
    test: str = TEST,
) -> Path:
    o = BenchOutcome(
        test_id=f"{test}[{server}]",
        server_id=server,
        workload="smoke",
        metric="output_throughput",
        samples={"output_throughput": values, "median_ttft_ms": [20.0] * len(values)},
        context=ctx if ctx is not None else context(),
        error=error,
    )
    return write_results_json(path, [o], run_id=path.stem)


def cli(*argv: str) -> int:
    return cli_baselines.main(list(argv))


def test_parser_wiring_for_the_main_command() -> None:
    parser = argparse.ArgumentParser(prog="llmserve")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_baselines.add_parser(sub)
    for argv in (
        ["baselines", "list"],
        ["baselines", "show", "x"],
        ["baselines", "diff", "a", "b"],
        ["baselines", "accept", "r.json", "--replace"],
        ["compare", "a", "b", "--tolerance", "5%"],
    ):
        args = parser.parse_args(argv)
        assert args.func is cli_baselines.run
    assert parser.parse_args(["compare", "a", "b", "--tolerance", "5%"]).tolerance == pytest.approx(0.05)
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "a", "b", "--tolerance", "lots"])
    assert cli_baselines.run(argparse.Namespace()) == 2


def test_accept_then_list_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store_dir = tmp_path / "baselines"
    r1 = results(tmp_path / "r1.json", BASE)
    assert cli("baselines", "list", "--dir", str(store_dir)) == 0
    assert "no baselines" in capsys.readouterr().out
    assert cli("baselines", "accept", str(r1), "--dir", str(store_dir)) == 0
    assert "record 1 appended to" in capsys.readouterr().out
    assert cli("baselines", "accept", str(results(tmp_path / "r2.json", SAME)), "--dir", str(store_dir)) == 0
    assert "record 2 appended to" in capsys.readouterr().out
    doc = BaselineStore(store_dir).load(BenchKey(f"{TEST}[srv]", "srv", "smoke"))
    assert doc is not None
    assert [r.samples["output_throughput"] for r in doc.records] == [BASE, SAME]
    assert doc.records[0].run_id == "r1"
    assert doc.records[0].info["accepted_from"] == str(r1)

    assert cli("baselines", "list", "--dir", str(store_dir)) == 0
    out = capsys.readouterr().out
    assert "test_throughput[srv]" in out
    assert "output_throughput" in out
    assert "  2  " in out

    key = BenchKey(f"{TEST}[srv]", "srv", "smoke")
    assert cli("baselines", "show", key.digest, "--dir", str(store_dir)) == 0
    out = capsys.readouterr().out
    assert "metric:   output_throughput (higher is better)" in out
    assert "records (2):" in out
    assert '"engine_version": "0.32.0"' in out
    assert "median_ttft_ms: 20" in out
    assert cli("baselines", "show", str(store_dir / key.filename), "--json") == 0
    assert json.loads(capsys.readouterr().out)["schema"] == 1


def test_accept_never_overwrites_without_replace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "b")
    assert cli("baselines", "accept", str(results(tmp_path / "r1.json", BASE)), "--dir", d) == 0
    newer = results(tmp_path / "r2.json", DROP, ctx=context(engine_version="0.33.0"))
    assert cli("baselines", "accept", str(newer), "--dir", d) == 2
    err = capsys.readouterr().err
    assert "another context" in err
    assert "engine_version" in err
    assert "--replace" in err
    assert cli("baselines", "accept", str(newer), "--dir", d, "--replace") == 0
    assert "replaced" in capsys.readouterr().out
    doc = BaselineStore(d).load(BenchKey(f"{TEST}[srv]", "srv", "smoke"))
    assert doc is not None
    assert len(doc.records) == 1
    assert doc.context["engine_version"] == "0.33.0"


def test_accept_skips_invalid_runs_and_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "b")
    bad = results(tmp_path / "bad.json", BASE, error="3 requests failed")
    assert cli("baselines", "accept", str(bad), "--dir", d) == 2
    assert "invalid (3 requests failed)" in capsys.readouterr().err
    assert BaselineStore(d).list() == []
    good = results(tmp_path / "good.json", BASE)
    assert cli("baselines", "accept", str(good), "--dir", d, "-k", "no-such-thing") == 2
    assert "nothing to accept" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("[1, 2")
    assert cli("baselines", "accept", str(tmp_path / "junk.json"), "--dir", d) == 2
    assert "junk.json" in capsys.readouterr().err


def test_list_reports_corrupt_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "b"
    assert cli("baselines", "accept", str(results(tmp_path / "r.json", BASE)), "--dir", str(d)) == 0
    (d / "broken-0123456789.json").write_text("{nope")
    capsys.readouterr()
    assert cli("baselines", "list", "--dir", str(d)) == 2
    captured = capsys.readouterr()
    assert "broken-0123456789.json" in captured.err
    assert "not valid JSON" in captured.err
    assert "test_throughput[srv]" in captured.out


def _baseline_file(
    tmp_path: Path, name: str, values: list[float], ctx: dict[str, Any], server: str = "srv"
) -> Path:
    store = BaselineStore(tmp_path / name)
    key = BenchKey(f"{TEST}[{server}]", server, "smoke")
    store.save(key, ctx, {"output_throughput": values}, metric="output_throughput", higher_is_better=True)
    return store.path_for(key)


def test_diff_shows_context_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _baseline_file(tmp_path, "a", BASE, context())
    b = _baseline_file(tmp_path, "b", DROP, context(mem_fraction=0.5, startup_timeout_s=5.0))
    assert cli("baselines", "diff", str(a), str(b)) == 0
    out = capsys.readouterr().out
    assert "context: refused (refused: 1 confounder(s))" in out
    assert "server_args.mem_fraction: 0.9 -> 0.5" in out
    assert "(ignored) server_args.startup_timeout_s: 900.0 -> 5.0" in out
    assert "verdict: regressed (contexts differ: for information only)" in out


def test_compare_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = results(tmp_path / "base.json", BASE)
    assert cli("compare", str(base), str(results(tmp_path / "same.json", SAME))) == 0
    assert "pass" in capsys.readouterr().out
    drop = results(tmp_path / "drop.json", DROP)
    assert cli("compare", str(base), str(drop)) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out
    assert "-10.0%" in out
    # tolerance from the command line
    assert cli("compare", str(base), str(drop), "--tolerance", "30%") == 0  # a 10 % drop is within half of it
    capsys.readouterr()
    # inconclusive: too few samples
    few = results(tmp_path / "few.json", DROP[:2])
    assert cli("compare", str(base), str(few)) == 0
    assert cli("compare", str(base), str(few), "--fail-on-inconclusive") == 1
    capsys.readouterr()
    # a baseline file against a results file
    bfile = _baseline_file(tmp_path, "store", BASE, context())
    assert cli("compare", str(bfile), str(drop)) == 1
    capsys.readouterr()


def test_compare_refuses_confounded_and_allows_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = results(
        tmp_path / "a.json",
        BASE,
        server="srv[cuda_graph=on]",
        ctx=context(cuda_graph=CudaGraphSpec(enabled=True)),
    )
    both = results(
        tmp_path / "both.json",
        DROP,
        server="srv[cuda_graph=off]",
        ctx=context(cuda_graph=CudaGraphSpec(enabled=False), mem_fraction=0.5),
    )
    assert cli("compare", str(a), str(both), "--variable", "cuda_graph") == 2
    out = capsys.readouterr().out
    assert "REFUSED" in out
    assert "server_args.mem_fraction: 0.9 -> 0.5" in out
    assert "server_args.cuda_graph.enabled: true -> false" in out
    assert cli("compare", str(a), str(both), "--variable", "cuda_graph", "--allow-confounded") == 1
    assert "FORCED" in capsys.readouterr().out
    only = results(
        tmp_path / "only.json",
        SAME,
        server="srv[cuda_graph=off]",
        ctx=context(cuda_graph=CudaGraphSpec(enabled=False)),
    )
    md = tmp_path / "summary.md"
    assert cli("compare", str(a), str(only), "--variable", "cuda_graph", "--markdown", str(md)) == 0
    out = capsys.readouterr().out
    assert "A/B of cuda_graph" in out
    assert "test_throughput[srv[cuda_graph=on] -> srv[cuda_graph=off]]" in out
    assert "### llmserve compare" in md.read_text()
    engine = results(
        tmp_path / "engine.json",
        SAME,
        server="srv[cuda_graph=on]",
        ctx=context(cuda_graph=CudaGraphSpec(enabled=True), engine_version="0.33.0"),
    )
    assert cli("compare", str(a), str(engine), "--variable", "engine_version") == 0
    assert "engine build comparison" in capsys.readouterr().out


def test_compare_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = results(tmp_path / "good.json", BASE)
    assert cli("compare", str(good), str(tmp_path / "missing.json")) == 2
    assert "missing.json: no such file" in capsys.readouterr().err
    (tmp_path / "garbage.json").write_text("{")
    assert cli("compare", str(tmp_path / "garbage.json"), str(good)) == 2
    (tmp_path / "schema.json").write_text('{"schema": 7}')
    assert cli("compare", str(tmp_path / "schema.json"), str(good)) == 2
    assert "schema 7 is not supported" in capsys.readouterr().err
    assert cli("compare", str(good), str(good), "--metric", "nope") == 2
    assert "no samples of 'nope'" in capsys.readouterr().err
    other = results(tmp_path / "other.json", BASE, test="tests/x.py::test_else")
    two = tmp_path / "two.json"
    data = json.loads(good.read_text())
    data["benchmarks"] += json.loads(other.read_text())["benchmarks"]
    two.write_text(json.dumps(data))
    lone = results(tmp_path / "lone.json", BASE, test="tests/y.py::test_unrelated", server="zzz")
    assert cli("compare", str(two), str(lone)) == 2
    assert "no benchmark of" in capsys.readouterr().err


def test_compare_as_a_process(tmp_path: Path) -> None:
    base = results(tmp_path / "base.json", BASE)
    drop = results(tmp_path / "drop.json", DROP)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest_llmserve.cli.baselines", "compare", str(base), str(drop)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REGRESSED" in proc.stdout


def test_accept_gate_outcomes_uses_the_gates_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gate = [
        {
            "test": f"{TEST}[srv]",
            "server": "srv",
            "workload": "smoke",
            "metric": "output_throughput",
            "higher_is_better": True,
            "tolerance": 0.05,
            "context": context(),
            "verdict": "no-baseline",
            "current": {"output_throughput": BASE},
            "baseline": None,
            "message": "no baseline",
        }
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(gate))
    d = tmp_path / "b"
    assert cli("baselines", "accept", str(path), "--dir", str(d)) == 0
    assert BaselineStore(d).load(BenchKey(TEST, "srv", "smoke")) is not None
    capsys.readouterr()
    assert cli("compare", str(path), str(results(tmp_path / "drop.json", DROP))) == 1
    assert "REGRESSED" in capsys.readouterr().out
