"""A/B verdicts and confounders on the real SGLang 0.5.15 and vLLM 0.26.0, run by scripts/gpu/engines_suite.sh next
to the built-in suite (`pytest -m gpu --llmserve-suite`) with scripts/gpu/engines_gpu.toml.in.

A is the reference, B the candidate: "regressed" (B worse than A beyond the tolerance, with significance) fails the
test, which is how the gate shows an "optimization" that made things slower. The seeds saw CUDA graphs help decode at
concurrency 1 and hurt saturated throughput: each A/B runs at both, and whichever direction is real is the verdict.
"""

from __future__ import annotations

from typing import Any

import pytest

SGL_GRAPHS_OFF = "sglang[attention_backend=triton,cuda_graph=off]"
SGL_GRAPHS_ON = "sglang[attention_backend=triton,cuda_graph=on(1,2,4,8)]"
VLLM_EAGER = "vllm-eager"
VLLM_FULL_AND_PIECEWISE = "vllm[cuda_graph=on(FULL_AND_PIECEWISE:1,2,4,8)]"
VERDICTS = ("pass", "improved", "regressed", "inconclusive")

# decode-c1: one request at a time (launch-bound decode, where graphs pay); saturated-64: 64 at once, most decode
# steps above the largest captured graph (8), where graphs cannot help and may cost.
WORKLOADS = ("decode-c1", "saturated-64")


def _verdict(outcome: Any) -> str:
    verdict = outcome["verdict"] if isinstance(outcome, dict) else outcome.verdict
    return str(verdict)


@pytest.mark.gpu
@pytest.mark.parametrize("workload", WORKLOADS)
def test_sglang_cuda_graphs_ab(llm_ab: Any, workload: str) -> None:
    outcome = llm_ab.run(a=SGL_GRAPHS_OFF, b=SGL_GRAPHS_ON, workload=workload, rounds=5, tolerance=0.05)
    assert _verdict(outcome) in VERDICTS


@pytest.mark.gpu
@pytest.mark.parametrize("workload", WORKLOADS)
def test_vllm_full_and_piecewise_vs_eager_ab(llm_ab: Any, workload: str) -> None:
    outcome = llm_ab.run(a=VLLM_EAGER, b=VLLM_FULL_AND_PIECEWISE, workload=workload, rounds=5, tolerance=0.05)
    assert _verdict(outcome) in VERDICTS


@pytest.mark.gpu
@pytest.mark.llmserve_server("vllm-ngram-unconfigured")
def test_speculative_decoding_that_was_not_configured_is_caught(decode_check: Any) -> None:
    """The server runs ngram speculation (passed in args); the configuration says nothing about speculation, which
    means "off": config-is-execution must fail and name it."""
    with pytest.raises(pytest.fail.Exception) as failure:
        decode_check.config_is_execution()
    message = str(failure.value)
    assert "speculative" in message and "FAIL" in message, message
    print(message)
