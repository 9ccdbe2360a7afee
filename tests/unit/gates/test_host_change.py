"""A baseline of another host: skipped with the differing host fields and the command that records one here,
compared on purpose with ``allow_host_change``; a baseline recorded before host identity was: an unknown host.
The gate runs with the stand-in round runner of test_warmup (no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.gates.context import build_context
from pytest_llmserve.gates.preflight import preflight_refusal
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.hardware import hardware_context
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from tests.unit.gates.standins import CFG, SPEC, TEST_ID, stand_in_gate
from tests.unit.gates.test_warmup import GATE, Rounds

KEY_TEST = "tests/test_perf.py::test_throughput"


def store_baseline(tmp_path: Path, hardware: dict[str, Any]) -> Path:
    """A baseline of this gate's server and workload whose hardware is ``hardware``, else this host's context."""
    wl = CFG.workload(GATE.workload, where="test")
    context = build_context(SPEC, wl, engine_version=None)
    context["hardware"] = hardware
    store = BaselineStore(tmp_path / "baselines")
    key = BenchKey(KEY_TEST, SPEC.id, wl.name)
    store.save(key, context, {"output_throughput": [100.0, 101.0, 99.0, 100.5, 100.2]},
               metric="output_throughput", higher_is_better=True)
    return store.path_for(key)


def run_gate(tmp_path: Path, *, allow_host_change: bool = False) -> tuple[BenchOutcome, list[str]]:
    rounds = Rounds([100.0, 100.5, 99.8, 100.2, 100.1, 99.9, 100.3, 100.0, 100.4])
    bench, recorded, said = stand_in_gate(tmp_path, rounds, options=GATE, clock=rounds.clock,
                                          allow_host_change=allow_host_change, key_test=KEY_TEST)
    bench.run()
    return recorded[-1], said


def test_a_baseline_of_a_host_without_avx2_is_skipped_with_a_figure_the_fields_and_the_command(tmp_path: Path) -> None:
    here = hardware_context()
    store_baseline(tmp_path, {**here, "cpu_flags": sorted(set(here["cpu_flags"]) ^ {"avx2"})})
    with pytest.raises(pytest.skip.Exception) as skipped:
        run_gate(tmp_path)
    message = str(skipped.value)
    assert message.startswith("output_throughput: median ")  # a figure
    assert "no baseline for this environment" in message and "recorded on another host: hardware.cpu_flags: [" in message
    assert "llmserve baselines accept --replace" in message and "--llmserve-allow-host-change" in message


def test_a_baseline_recorded_before_host_identity_is_an_unknown_host_skipped_with_the_command(tmp_path: Path) -> None:
    here = hardware_context()
    store_baseline(tmp_path, {k: here[k] for k in ("cpu_model", "cpu_count", "gpu_name", "gpu_count", "driver",
                                                  "cuda")})  # the six keys of the committed baseline
    with pytest.raises(pytest.skip.Exception) as skipped:
        run_gate(tmp_path)
    message = str(skipped.value)
    assert "from an unknown host, re-record it on this one" in message
    assert "hardware.cpu_flags: (absent) -> " in message and "llmserve baselines accept --replace" in message


def test_allow_host_change_compares_and_prints_the_host_fields_beside_the_verdict(tmp_path: Path) -> None:
    here = hardware_context()
    store_baseline(tmp_path, {**here, "memory_gib": (here["memory_gib"] or 0) + 64})
    outcome, said = run_gate(tmp_path, allow_host_change=True)
    assert outcome.status in ("pass", "inconclusive"), outcome.note  # compared, not refused
    across = f"hardware.memory_gib: {(here['memory_gib'] or 0) + 64} -> {here['memory_gib']}"
    assert outcome.note is not None and f"across hosts (allowed): {across}" in outcome.note
    assert any(line.endswith(f"against a baseline of another host (allowed): {across}") for line in said), said
    assert outcome.comparability is not None and outcome.comparability.host_diffs[0].key == "hardware.memory_gib"


def test_allow_host_change_does_not_allow_another_server_environment(tmp_path: Path) -> None:
    wl = CFG.workload(GATE.workload, where="test")
    context = build_context(SPEC, wl, engine_version=None)
    context["hardware"]["cpu_flags"] = ["avx"]
    context["server_args"]["args"] = ["--max-model-len", "4096"]
    BaselineStore(tmp_path / "baselines").save(BenchKey(KEY_TEST, SPEC.id, wl.name), context,
                                               {"output_throughput": [100.0, 101.0, 99.0]},
                                               metric="output_throughput", higher_is_better=True)
    refusal = preflight_refusal(spec=SPEC, cfg=CFG, options=GATE, store_dir=tmp_path / "baselines",
                                key_test=KEY_TEST, test_id=TEST_ID, save=False, allow_confounded=False,
                                results_dir=tmp_path / "results", allow_host_change=True)
    assert refusal is not None and refusal.status == "refused"  # before any boot
    message = str(refusal.note)
    assert "server_args.args" in message and "  ~ hardware.cpu_flags" in message
    with pytest.raises(pytest.fail.Exception):  # and the gate, had it booted, fails it: not environment-only
        run_gate(tmp_path, allow_host_change=True)
