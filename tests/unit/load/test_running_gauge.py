"""Measured alone: the rule that makes a round whose server ran more requests than the round sent invalid,
and reading the engines' running-requests gauges from their /metrics pages."""

from __future__ import annotations

import pytest

from pytest_llmserve.config import ServerSpec, Workload
from pytest_llmserve.engines import adapter_for
from pytest_llmserve.load.metrics import RequestRecord, evaluate
from pytest_llmserve.load.runner import (
    GaugeReading,
    RunningGaugeSampler,
    contamination,
    judge_isolation,
    round_concurrency,
)

# Lines as the engines print them (vLLM 0.26 and SGLang 0.5 on an H200, llama.cpp b6); a longer metric
# that starts with the same name must not be counted.
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/tmp/model"} 3.0
vllm:num_requests_running{engine="1",model_name="/tmp/model"} 6.0
vllm:num_requests_running_total_bogus{engine="0"} 100.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="/tmp/model"} 4.0
"""
SGLANG_PAGE = 'sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0"} 8.0\n'
LLAMACPP_PAGE = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"


def during(*values: float) -> list[GaugeReading]:
    """Readings sent and answered while the timed requests of :func:`valid_round` ran (100.0 .. 101.07)."""
    return [GaugeReading(100.2 + 0.1 * i, 100.25 + 0.1 * i, v) for i, v in enumerate(values)]


def valid_round(num_prompts: int = 8, max_concurrency: int | None = 8) -> object:
    workload = Workload("w", num_prompts=num_prompts, output_len=4, max_concurrency=max_concurrency)
    records = [RequestRecord(index=i, start=100.0 + i * 0.01, end=101.0 + i * 0.01, ttft=0.1, e2e=1.0,
                             itl=[0.3, 0.3, 0.3], output_tokens=4, prompt_tokens=10, chunks=4)
               for i in range(num_prompts)]
    result = evaluate(records, workload, transport="lean")
    assert result.valid, result.invalid_reasons
    return result


def test_a_round_whose_gauge_exceeded_its_concurrency_is_invalid_with_the_figures() -> None:
    assert contamination([0, 8, 8, 9, 8], 8) == "contaminated: 9 running requests during a round of concurrency 8"
    result = judge_isolation(valid_round(), "vllm:num_requests_running", during(0, 8, 9, 8))  # type: ignore[arg-type]
    assert not result.valid
    assert result.invalid_reasons == ["contaminated: 9 running requests during a round of concurrency 8"]
    assert result.metrics == {} and result.summaries == {}
    assert result.diagnostics["output_throughput"] > 0  # the figures it did produce, for the report only
    assert result.diagnostics["server_running_requests_max"] == 9
    with pytest.raises(Exception, match="contaminated: 9 running requests"):
        result.metric("output_throughput")


def test_a_round_at_or_below_its_concurrency_stays_valid_and_says_what_was_seen() -> None:
    assert contamination([0, 3, 8, 8, 1], 8) is None
    result = judge_isolation(valid_round(), "vllm:num_requests_running", during(0, 8, 8))  # type: ignore[arg-type]
    assert result.valid and result.metrics["output_throughput"] > 0
    assert result.diagnostics["server_running_requests_max"] == 8
    assert "vllm:num_requests_running sampled 3 times during the round: at most 8 running" in result.notes[-1]


def test_without_a_concurrency_limit_the_round_s_own_size_is_the_bound() -> None:
    assert round_concurrency(Workload("w", num_prompts=5, max_concurrency=None)) == 5
    assert round_concurrency(Workload("w", num_prompts=64, max_concurrency=8)) == 8
    result = judge_isolation(valid_round(4, None), "g", during(4, 5))  # type: ignore[arg-type]
    assert result.invalid_reasons == ["contaminated: 5 running requests during a round of concurrency 4"]


def test_an_unreadable_gauge_is_said_not_verified_and_does_not_invalidate() -> None:
    result = judge_isolation(valid_round(), "vllm:num_requests_running", [], failed_reads=3)  # type: ignore[arg-type]
    assert result.valid
    assert "could not be read during the round (3 attempts)" in result.notes[-1]


def test_readings_outside_the_round_s_requests_verify_nothing() -> None:
    # Seen in CI, with the reads on a thread of their own: a reading taken before the timed requests reached the
    # server (0), and a read answered only after the round had ended. Neither proves the round ran alone.
    before = GaugeReading(99.0, 99.1, 0.0)
    late = GaugeReading(100.5, 102.0, 1.0)
    result = judge_isolation(valid_round(), "vllm:num_requests_running", [before, late])  # type: ignore[arg-type]
    assert result.valid
    assert "server_running_requests_max" not in result.diagnostics
    assert "never while the round's requests ran" in result.notes[-1] and "not verified" in result.notes[-1]
    assert "the slowest answer took 1.5 s, the timed requests ran 1.1 s" in result.notes[-1]


def test_a_foreign_request_seen_before_the_round_s_own_still_contaminates_it() -> None:
    # The sampler starts once the round holds the server: more than the round's concurrency at any reading
    # answered before the round ended means another client is on the server.
    early = GaugeReading(99.0, 99.1, 11.0)
    result = judge_isolation(valid_round(), "vllm:num_requests_running",  # type: ignore[arg-type]
                             [early, *during(8, 8)])
    assert not result.valid
    assert result.invalid_reasons == ["contaminated: 11 running requests during a round of concurrency 8"]
    assert result.diagnostics["server_running_requests_max"] == 11


@pytest.mark.parametrize(("engine", "page", "expected"), [
    ("vllm", VLLM_PAGE, 9.0), ("sglang", SGLANG_PAGE, 8.0), ("llamacpp", LLAMACPP_PAGE, 2.0)])
def test_each_engine_declares_its_gauge_and_the_sampler_reads_it(engine: str, page: str, expected: float) -> None:
    spec = ServerSpec(name="s", engine=engine, model="/m")
    gauge = adapter_for(spec).running_requests_gauge
    assert gauge is not None
    assert RunningGaugeSampler("http://x", None, gauge).read(page) == expected  # summed over label sets


def test_a_page_without_the_gauge_reads_as_nothing() -> None:
    assert RunningGaugeSampler("http://x", None, "vllm:num_requests_running").read("# nothing\nfoo 1\n") is None
