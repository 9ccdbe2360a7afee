"""A/B verdicts and confounders on the real SGLang 0.5.15 and vLLM 0.26.0, run by scripts/gpu/engines_suite.sh next
to the built-in suite (`pytest -m gpu --llmserve-suite`) with scripts/gpu/engines_gpu.toml.in.

A is the reference, B the candidate: "improved" = B better than A beyond the tolerance with significance,
"regressed" = B worse. In every pair here A is without CUDA graphs and B with them (captured for 1, 2, 4, 8), each
measured at concurrency 1 (launch-bound decode, where graphs pay) and at 64 at once (most decode steps above the
largest captured graph, 8, where graphs cannot help and may cost). Each test states the verdict it expects and why
(scripts/gpu/ab_expectations.py judges it); an inconclusive verdict or an invalid round fails every one of them.
"""

from __future__ import annotations

import pytest

from pytest_llmserve.bench_face import ABFace
from pytest_llmserve.gates.decode import DecodeCheck
from scripts.gpu.ab_expectations import RecordProperty, run_expected_ab

SGL_GRAPHS_OFF = "sglang[attention_backend=triton,cuda_graph=off]"
SGL_GRAPHS_ON = "sglang[attention_backend=triton,cuda_graph=on(1,2,4,8)]"
VLLM_EAGER = "vllm-eager"
VLLM_FULL_AND_PIECEWISE = "vllm[cuda_graph=on(FULL_AND_PIECEWISE:1,2,4,8)]"


@pytest.mark.gpu
def test_sglang_cuda_graphs_ab_decode_c1(llm_ab: ABFace, record_property: RecordProperty) -> None:
    """Graphs on (B) must come out "improved" against graphs off (A) at concurrency 1: measured on the lent H200,
    2026-12-01 (docs/gpu.md, "A/B verdicts"), 53.6 tok/s without graphs and 478.0 tok/s with them, +792 % (95 % CI
    +626 %..+1245 %), "improved"."""
    check = run_expected_ab(llm_ab, record_property, a=SGL_GRAPHS_OFF, b=SGL_GRAPHS_ON, workload="decode-c1",
                            expected="improved")
    assert check.met, check.failure_message()


@pytest.mark.gpu
def test_sglang_cuda_graphs_ab_saturated_64(llm_ab: ABFace, record_property: RecordProperty) -> None:
    """At 64 at once the direction is not known in advance: never measured (docs/gpu.md, "Not run": the device
    budget ended), most decode steps run above the largest captured size (8) on both sides, and the seeds reported
    graphs hurting saturated throughput. So: a decided verdict (pass, improved or regressed; inconclusive fails),
    from valid rounds, its direction recorded (printed, and the junit properties ``ab_verdict`` / ``ab_direction``)."""
    check = run_expected_ab(llm_ab, record_property, a=SGL_GRAPHS_OFF, b=SGL_GRAPHS_ON, workload="saturated-64",
                            expected="decided")
    assert check.met, check.failure_message()


@pytest.mark.gpu
def test_vllm_full_and_piecewise_vs_eager_ab_decode_c1(llm_ab: ABFace, record_property: RecordProperty) -> None:
    """FULL_AND_PIECEWISE graphs (B) must come out "improved" against eager (A) at concurrency 1. The A/B itself has
    no valid measurement yet (its first rounds on 2026-12-01 were refused by a validity rule since fixed), but the
    same two servers on the same H200 did: the suite's smoke throughput (16 prompts, 8 at once, 64/64, inside the
    captured sizes) was 3,130 tok/s with these graphs and 385 tok/s eager (docs/gpu.md, "Per combination"), and at
    concurrency 1 decode is the most launch-bound of all (SGLang's graphs: +792 % there, the same day)."""
    check = run_expected_ab(llm_ab, record_property, a=VLLM_EAGER, b=VLLM_FULL_AND_PIECEWISE, workload="decode-c1",
                            expected="improved")
    assert check.met, check.failure_message()


@pytest.mark.gpu
def test_vllm_full_and_piecewise_vs_eager_ab_saturated_64(llm_ab: ABFace,
                                                          record_property: RecordProperty) -> None:
    """At 64 at once the direction is not known in advance: never measured on the GPU, and most decode steps run
    above the largest captured size (8), where B has no graph to run either. So: a decided verdict (inconclusive
    fails), from valid rounds, its direction recorded."""
    check = run_expected_ab(llm_ab, record_property, a=VLLM_EAGER, b=VLLM_FULL_AND_PIECEWISE,
                            workload="saturated-64", expected="decided")
    assert check.met, check.failure_message()


@pytest.mark.gpu
@pytest.mark.llmserve_server("vllm-ngram-unconfigured")
def test_speculative_decoding_that_was_not_configured_is_caught(decode_check: DecodeCheck) -> None:
    """The server runs ngram speculation (passed in args); the configuration says nothing about speculation, which
    means "off": config-is-execution must fail and name it."""
    with pytest.raises(pytest.fail.Exception) as failure:
        decode_check.config_is_execution()
    message = str(failure.value)
    assert "speculative" in message and "FAIL" in message, message
    print(message)
