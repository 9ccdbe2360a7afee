"""The benchmark gate on the real vLLM CPU server: a figure always, throughput only from sane output,
baselines worth gating against.

One story over four inner pytest runs, attached to the test run's shared servers of the healthy model and
of the NaN checkpoint (tests/e2e/shared.py: what is proven here is the gate, not the boot):

1. ``--llmserve-save-baseline`` on the healthy model and on the NaN checkpoint (derived from SmolLM2 as the
   oracles' e2e tests do). The healthy baseline is asked for a spread it cannot reach (tolerance 0.1 %), so
   it takes rounds up to max_rounds and is saved with a visible warning. The NaN server answers 200 with
   tokens but no text: its round is invalid, the report says its correctness checks failed in this run, and
   nothing is saved for it.
2. The healthy baseline edited to have been recorded on another CPU model (what a fresh machine meets):
   the benchmark still measures, prints its figure and the command that records a baseline here, and
   results.json holds the figure. A second benchmark whose baseline has too few samples stays
   inconclusive: with ``--llmserve-inconclusive=fail`` it fails. Each run keeps its own report directory.
3. A truncated baseline file under ``--llmserve-save-baseline``: refused in set-up, nothing boots, the
   file is byte-identical.
4. A changed server setting (``max_batch_size`` now declared): refused in set-up from the configuration
   alone, before any request. (A changed environment, which only a launched server has, is refused the same
   way in tests/e2e/test_engine_env.py.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import TINY_WORKLOAD, boots_line, expect_outcomes
from tests.e2e.shared import SharedServers
from tests.e2e.test_oracles_real import outcomes_from_junit

pytestmark = [pytest.mark.slow, pytest.mark.bench]

SHARED_SERVERS = ("healthy", "nan")  # the shared servers (tests/e2e/shared.py) this module attaches to

INNER_TESTS = """
import pytest


@pytest.mark.llmserve_server("healthy", "nan")
def test_no_nan(decode_check):
    decode_check.no_nan()


@pytest.mark.llmserve_server("healthy", "nan")
@pytest.mark.llmserve_benchmark
def test_throughput(llm_bench):
    llm_bench.run()


@pytest.mark.llmserve_server("healthy")
@pytest.mark.llmserve_benchmark
def test_inconclusive(llm_bench):
    llm_bench.run()
"""


def baseline_files(root: Path) -> dict[str, Path]:
    """test function -> its baseline file, for the healthy server."""
    found = {}
    for path in sorted(root.glob("*.json")):
        doc = json.loads(path.read_text())
        found[f"{doc['key']['test'].rsplit('::', 1)[-1]}[{doc['key']['server']}]"] = path
    return found


def test_figures_always_sane_output_only_and_baselines_worth_gating_against(
        pytester: pytest.Pytester, write_config: Callable[[str], Path], shared_servers: SharedServers) -> None:
    healthy_server, nan_server = shared_servers.get("healthy"), shared_servers.get("nan")
    write_config('default_server = "healthy"\n' + healthy_server.toml("healthy") + nan_server.toml("nan")
                 + TINY_WORKLOAD)
    pytester.makeini("[pytest]\nllmserve_workload = tiny\n")
    pytester.makepyfile(test_gate=INNER_TESTS)
    baselines = pytester.path / "baselines"
    results = pytester.path / "llmserve-results"

    # 1. Save: the healthy record takes rounds up to max_rounds for a spread within 0.1 %, then saves with a
    # warning; the NaN server's round is invalid and says its correctness checks failed.
    junit = pytester.path / "save.xml"
    saved = pytester.runpytest_subprocess("test_gate.py", "-k", "not test_inconclusive", "-p", "no:cacheprovider",
                                          "-rA", "--llmserve-save-baseline", "--llmserve-tolerance=0.001",
                                          "--llmserve-max-rounds=6", f"--junitxml={junit}", timeout=1200)
    out = saved.stdout.str()
    got = outcomes_from_junit(junit)
    status = {name: s for name, (s, _) in got.items()}
    assert status == {"test_no_nan[healthy]": "passed", "test_throughput[healthy]": "passed",
                      "test_no_nan[nan]": "failed", "test_throughput[nan]": "failed"}, out[-6000:]
    assert "baseline saved with a wide spread" in out and "BaselineSpreadWarning" in out, out[-6000:]
    files = baseline_files(baselines)
    assert sorted(files) == ["test_throughput[healthy]"], files  # nothing saved for the NaN server
    record = json.loads(files["test_throughput[healthy]"].read_text())["records"][0]
    assert len(record["samples"]["output_throughput"]) == 6  # 5 rounds, then more up to max_rounds
    assert record["info"]["ci_half_width"] > 0.001 and "wide spread" in record["info"]["warning"]
    nan_failure = got["test_throughput[nan]"][1]
    assert "generated tokens but no text" in nan_failure, nan_failure
    assert "the correctness checks of server nan failed earlier in this run (" in nan_failure, nan_failure
    assert "test_no_nan[nan]" in nan_failure, nan_failure
    assert boots_line(out) == "server boots: 0", out[-3000:]  # both attached
    first_run = (results / "latest").resolve()
    first = json.loads((first_run / "results.json").read_text())["benchmarks"]
    nan_row = next(b for b in first if b["server_id"] == "nan")
    assert nan_row["status"] == "error" and "no text" in nan_row["error"], nan_row

    # 2. The baseline as a fresh machine meets it: recorded on a host of the same CPU name whose CPU lacks (or
    # has) AVX2, the case of issue 25 (vLLM-CPU ran 10x slower there). And a baseline too small to
    # ever decide (2 samples < min_samples 3) for test_inconclusive, in this very context.
    healthy = files["test_throughput[healthy]"]
    original = healthy.read_bytes()
    doc = json.loads(original)
    small = dict(doc, key=dict(doc["key"], test="test_gate.py::test_inconclusive"))
    small["records"] = [dict(record, samples={"output_throughput": record["samples"]["output_throughput"][:2]})]
    from pytest_llmserve.store.baselines import BenchKey

    (baselines / BenchKey.from_dict(small["key"]).filename).write_text(json.dumps(small))
    hardware = doc["context"]["hardware"]
    here_flags = hardware["cpu_flags"]  # the real run recorded its host's identity
    assert hardware["cpu_vendor"] and hardware["cpu_cores"] and hardware["memory_gib"], hardware
    other_flags = sorted(set(here_flags) ^ {"avx2"})
    hardware["cpu_flags"] = other_flags
    healthy.write_text(json.dumps(doc))
    compared = pytester.runpytest_subprocess("test_gate.py", "-k", "test_throughput or test_inconclusive",
                                             "--llmserve-server=healthy", "-p", "no:cacheprovider", "-rA",
                                             "--llmserve-inconclusive=fail", "--llmserve-max-rounds=4", timeout=900)
    out = compared.stdout.str()
    expect_outcomes(compared, skipped=1, failed=1)
    flags_line = f"hardware.cpu_flags: {json.dumps(other_flags)} -> {json.dumps(here_flags)}"
    assert "no baseline for this environment" in out and "recorded on another host" in out, out[-6000:]
    assert flags_line in out and "--llmserve-allow-host-change" in out, out[-6000:]
    assert "output_throughput: median " in out and " tok/s over 2 rounds" in out, out[-6000:]
    assert "llmserve baselines accept --replace" in out, out[-6000:]
    assert "INCONCLUSIVE after 4 rounds" in out and "policy inconclusive = fail" in out, out[-6000:]
    second_run = (results / "latest").resolve()
    assert second_run != first_run and first_run.is_dir()  # the first run's reports are kept
    assert sorted(p.name for p in (results / "runs").iterdir()) == sorted([first_run.name, second_run.name])
    rows = {b["test_id"].rsplit("::", 1)[-1]: b for b in json.loads((second_run / "results.json").read_text())[
        "benchmarks"]}
    refused = rows["test_throughput[healthy]"]
    assert refused["status"] == "refused" and refused["current"]["median"] > 0, refused  # a figure, not null
    assert rows["test_inconclusive[healthy]"]["status"] == "inconclusive"
    assert "inconclusive" in (second_run / "summary.md").read_text()

    # 3. A truncated baseline under --llmserve-save-baseline: refused before any boot, the file untouched.
    truncated = original[: len(original) // 2]
    healthy.write_bytes(truncated)
    corrupt = pytester.runpytest_subprocess("test_gate.py", "-k", "test_throughput", "--llmserve-server=healthy",
                                            "-p", "no:cacheprovider", "--llmserve-save-baseline", timeout=300)
    out = corrupt.stdout.str()
    expect_outcomes(corrupt, errors=1)
    assert "refused before any boot" in out and "not valid JSON" in out, out[-4000:]
    assert "server boots:" not in out and "round 1" not in out, out[-4000:]
    assert healthy.read_bytes() == truncated

    # 4. A setting of the server changed in the configuration: refused from the configuration alone.
    healthy.write_bytes(original)
    write_config('default_server = "healthy"\n' + healthy_server.toml("healthy", max_batch_size=4)
                 + nan_server.toml("nan") + TINY_WORKLOAD)
    changed = pytester.runpytest_subprocess("test_gate.py", "-k", "test_throughput", "--llmserve-server=healthy",
                                            "-p", "no:cacheprovider", timeout=300)
    out = changed.stdout.str()
    expect_outcomes(changed, errors=1)
    assert "comparison refused" in out and "server_args.max_batch_size" in out, out[-4000:]
    assert "before any boot" in out and "server boots:" not in out, out[-4000:]
    assert healthy.read_bytes() == original
