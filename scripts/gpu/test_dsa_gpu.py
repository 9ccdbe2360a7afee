"""The seeds' central A/B on the H200, run by scripts/gpu/dsa_suite.sh (call d3) with scripts/gpu/dsa_gpu.toml.in.

SGLang 0.5.15 serving SmolLM2-135M's architecture: CUDA graphs captured up to batch 64 (B) against no graphs (A), at
concurrency 1 (decode-bound: launch overhead is what graphs remove) and saturated (64 x 256 in / 256 out, all at
once). "regressed" = B worse than A beyond the tolerance with significance; whichever direction is real is the
verdict, and both are recorded: the test asserts only that a verdict was reached from valid rounds.
"""

from __future__ import annotations

from typing import Any

import pytest

GRAPHS_OFF = "smollm2[cuda_graph=off]"
GRAPHS_ON = "smollm2[cuda_graph=on(max=64)]"
VERDICTS = ("pass", "improved", "regressed", "inconclusive")


def _field(outcome: Any, name: str) -> Any:
    return outcome[name] if isinstance(outcome, dict) else getattr(outcome, name)


@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["decode-c1", "saturated"])
def test_sglang_cuda_graphs_ab(llm_ab: Any, workload: str) -> None:
    outcome = llm_ab.run(a=GRAPHS_OFF, b=GRAPHS_ON, workload=workload, rounds=5, tolerance=0.05)
    print(f"A/B {workload}: {_field(outcome, 'verdict')}: {_field(outcome, 'message')}")
    assert _field(outcome, "verdict") in VERDICTS
