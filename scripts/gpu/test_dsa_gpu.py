"""The seeds' central A/B on the H200, run by scripts/gpu/dsa_suite.sh (call d3) with scripts/gpu/dsa_gpu.toml.in.

SGLang 0.5.15 serving SmolLM2-135M's architecture (random weights: the A/B measures speed, and the workloads are
fixed-length) with triton attention: CUDA graphs captured up to batch 64 against no graphs, at concurrency 1
(decode-bound: launch overhead is what graphs remove) and saturated (64 x 256 in / 256 out, all at once). A is graphs
off (the reference), B graphs on (the candidate): "improved" = B (graphs) better than A beyond the tolerance with
significance. Each test states the verdict it expects and why (scripts/gpu/ab_expectations.py judges it); an
inconclusive verdict or an invalid round fails every one of them.
"""

from __future__ import annotations

import pytest

from pytest_llmserve.bench_face import ABFace
from scripts.gpu.ab_expectations import RecordProperty, run_expected_ab

GRAPHS_OFF = "smollm2[cuda_graph=off]"
GRAPHS_ON = "smollm2[cuda_graph=on(max=64)]"


@pytest.mark.gpu
def test_sglang_cuda_graphs_ab_decode_c1(llm_ab: ABFace, record_property: RecordProperty) -> None:
    """Graphs on (B) must come out "improved" against graphs off (A) at concurrency 1.

    Measured on this H200 with the same SGLang 0.5.15, triton attention and SmolLM2-135M's architecture (trained
    weights there, which do not change the work per token), 2026-12-01 (docs/gpu.md, "A/B verdicts";
    scripts/gpu/test_gpu_engines.py): no graphs 53.6 tok/s, graphs bs 1,2,4,8 478.0 tok/s at concurrency 1, +792 %
    (95 % CI +626 %..+1245 %), "improved". Here the graphs cover every size up to 64, batch 1 included, so the same
    launch-bound decode runs on a graph."""
    check = run_expected_ab(llm_ab, record_property, a=GRAPHS_OFF, b=GRAPHS_ON, workload="decode-c1",
                            expected="improved")
    assert check.met, check.failure_message()


@pytest.mark.gpu
def test_sglang_cuda_graphs_ab_saturated(llm_ab: ABFace, record_property: RecordProperty) -> None:
    """At saturation (64 x 256/256 at once) the direction is not known in advance: the seeds reported graphs hurting
    saturated throughput, this pair has never been measured on the GPU (docs/gpu.md, "Not run": no device time
    left), and with graphs captured up to 64 every decode step of this workload may run on one. So the test asks for a
    decided verdict (pass, improved or regressed; inconclusive fails), from valid rounds, and records the direction
    (printed, and the junit properties ``ab_verdict`` / ``ab_direction``)."""
    check = run_expected_ab(llm_ab, record_property, a=GRAPHS_OFF, b=GRAPHS_ON, workload="saturated",
                            expected="decided")
    assert check.met, check.failure_message()
