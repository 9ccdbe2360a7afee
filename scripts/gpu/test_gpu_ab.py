"""A/B verdicts on the GPU, run by ``scripts/gpu/run_gpu_suite.sh`` next to the built-in suite.

A is the reference, B the candidate ("regressed" = B worse than A beyond the tolerance, with
significance). Each pair differs in one variable; both servers stay up and rounds interleave A B A B.
Seen on a lent H200 with this llama.cpp: decode at concurrency 1 ~710 tok/s with CUDA graphs and
~265 tok/s without, so B = graphs on must come out "improved".
"""

from __future__ import annotations

from typing import Any

import pytest

GRAPHS_OFF = "smollm2[cuda_graph=off,flash_attention=on]"
GRAPHS_ON = "smollm2[cuda_graph=on,flash_attention=on]"
FA_OFF = "smollm2[cuda_graph=on,flash_attention=off]"


@pytest.mark.gpu
def test_cuda_graphs_speed_up_decode(llm_ab: Any) -> None:
    outcome = llm_ab.run(
        a=GRAPHS_OFF, b=GRAPHS_ON, workload="decode-c1", rounds=5, metric="output_throughput", tolerance=0.05
    )
    assert outcome["verdict"] == "improved", (
        f"CUDA graphs on vs off at concurrency 1: expected a significant gain, "
        f"got {outcome['verdict']}: "
        f"{outcome['message']}"
    )


@pytest.mark.gpu
def test_flash_attention_ab(llm_ab: Any) -> None:
    """Flash attention on (B) must not make decode slower than off (A) beyond 10%: at 64+256 tokens
    on a 135M model it may well not matter, so "pass" and "inconclusive" are fine; the verdict and
    both series land in the results either way."""
    outcome = llm_ab.run(
        a=FA_OFF, b=GRAPHS_ON, workload="decode-c1", rounds=5, metric="output_throughput", tolerance=0.10
    )
    assert outcome["verdict"] in ("pass", "improved", "inconclusive")
