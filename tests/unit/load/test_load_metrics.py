"""A run's figures and validity from synthetic request records: the metric definitions, percentiles over
all samples, every invalidity reason, merged client processes, the server-counter cross-check."""

from __future__ import annotations

import pickle
import random
import statistics

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.load.metrics import (
    Blame,
    RequestRecord,
    compute_metrics,
    cross_check,
    evaluate,
    invalid_reasons,
    only_artefacts,
    server_counter_throughput,
    server_fault,
    timing_only,
)
from pytest_llmserve.load.runner import merge_records, split_evenly
from pytest_llmserve.metrics import LATENCIES, METRICS
from pytest_llmserve.verdicts.two_sample import percentile


def rec(index: int, start: float, ttft: float, gaps: list[float], *, n: int | None = None,
        process: int = 0, error: str | None = None) -> RequestRecord:
    """A synthetic record: content chunks at start+ttft, then after each gap."""
    e2e = ttft + sum(gaps)
    return RequestRecord(index=index, start=start, end=start + e2e + 0.001, ttft=ttft, e2e=e2e,
                         itl=list(gaps), output_tokens=len(gaps) + 1 if n is None else n, prompt_tokens=10,
                         chunks=len(gaps) + 1, error=error, process=process)


def test_tpot_and_itl_definitions() -> None:
    r = rec(0, 100.0, 0.5, [0.1, 0.2, 0.3])
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / (4 - 1))  # type: ignore[operator]
    assert r.tpot == pytest.approx(0.2)
    assert len(r.itl) == r.output_tokens - 1  # type: ignore[operator]
    assert rec(1, 0.0, 0.5, []).tpot is None  # n = 1: undefined
    assert rec(2, 0.0, 0.5, [0.1], error="boom").tpot is None
    assert set(LATENCIES) == {"ttft", "tpot", "itl", "e2e"}
    for key in ("output_throughput", "duration_s", "total_token_throughput", "request_throughput"):
        assert key in METRICS


def test_a_valid_run_gives_exactly_the_vocabulary_and_sample_stds() -> None:
    records = [rec(0, 10.0, 0.1, [0.01] * 9), rec(1, 10.5, 0.2, [0.02] * 9), rec(2, 10.7, 0.4, [0.03] * 9)]
    res = evaluate(records, Workload("w", num_prompts=3, output_len=10), transport="lean")
    assert res.valid, res.invalid_reasons
    assert set(res.metrics) == set(METRICS)  # every figure has its one definition, and nothing else is defined
    assert set(res.to_dict(per_request=False)["metric_definitions"]) == set(METRICS)
    ttft_ms = [100.0, 200.0, 400.0]
    assert res.metrics["std_ttft_ms"] == pytest.approx(statistics.stdev(ttft_ms))  # n - 1, as stats.Summary
    assert res.summaries["ttft"].stdev == res.metrics["std_ttft_ms"]
    assert res.summaries["ttft"].cv == pytest.approx(statistics.stdev(ttft_ms) / statistics.mean(ttft_ms))


def test_compute_metrics_on_synthetic_records() -> None:
    records = [rec(0, 10.0, 0.1, [0.01] * 9), rec(1, 10.5, 0.2, [0.02] * 9)]
    metrics, summaries = compute_metrics(records)
    duration = records[1].end - records[0].start
    assert metrics["duration_s"] == pytest.approx(duration)
    assert metrics["output_throughput"] == pytest.approx(20 / duration)
    assert metrics["total_token_throughput"] == pytest.approx(40 / duration)
    assert metrics["request_throughput"] == pytest.approx(2 / duration)
    assert summaries["itl"].n == 18
    assert metrics["median_ttft_ms"] == pytest.approx(150.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(15.0)
    assert metrics["p99_e2e_ms"] == pytest.approx(statistics.quantiles([190.0, 380.0], n=100,
                                                                        method="inclusive")[98])
    wl = Workload("w", num_prompts=2, output_len=10)
    assert invalid_reasons(records, wl) == []
    assert evaluate(records, wl, transport="lean").valid


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    vals = sorted(rng.random() for _ in range(101))
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))


def test_invalid_reasons_cover_each_fault() -> None:
    wl = Workload("w", num_prompts=1, output_len=4)
    assert any("TPOT = 0" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.0, 0.0, 0.0])], wl))
    neg = rec(0, 0.0, 0.5, [0.1, 0.1, 0.1])
    neg.e2e = 0.4  # last chunk stamped before the first: what parsing-before-timestamping produces
    assert any("negative TPOT" in r for r in invalid_reasons([neg], wl))
    # One coalesced request of four (a starved machine) is a note, not an invalid run; half or more is.
    healthy = [rec(i, 0.0, 0.5, [0.1, 0.1, 0.1]) for i in range(1, 4)]
    wl4 = Workload("w", num_prompts=4, output_len=4)
    assert invalid_reasons([rec(0, 0.0, 0.5, [0.0, 0.0, 0.0]), *healthy], wl4) == []
    assert any("TPOT = 0" in r for r in invalid_reasons(
        [rec(0, 0.0, 0.5, [0.0, 0.0, 0.0]), rec(9, 0.0, 0.5, [0.0, 0.0, 0.0]), *healthy[:2]], wl4))
    assert any("output_len=4" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.1, 0.1])], wl))
    mismatch = rec(0, 0.0, 0.5, [0.1], n=4)
    assert any("content chunks" in r for r in invalid_reasons([mismatch], wl))
    relaxed = invalid_reasons([mismatch], wl, allow_multi_token_chunks=True)
    assert not any("content chunks" in r for r in relaxed)
    assert invalid_reasons([], wl) == ["no timed requests were sent"]
    warm_fail = rec(-1, 0.0, 0.5, [0.1] * 3, error="HTTP 500: x")
    assert any("warm-up" in r for r in invalid_reasons([rec(0, 0.0, 0.5, [0.1] * 3)], wl, warmup=[warm_fail]))


def test_each_reason_is_classified_where_its_check_is_made() -> None:
    # The reasons carry their blame (a bisect counts the server's kind as a bad build, retries the other) and whether
    # only chunk timing is touched; nothing downstream reads their words.
    wl = Workload("w", num_prompts=1, output_len=4)
    textless = rec(0, 0.0, 0.5, [0.1] * 3)
    textless.empty_chunks = textless.chunks
    wrong_output = {
        "failed": invalid_reasons([rec(0, 0.0, 0.5, [0.1] * 3, error="HTTP 500: x")], wl),
        "wrong length": invalid_reasons([rec(0, 0.0, 0.5, [0.1, 0.1])], wl),
        "no text": invalid_reasons([textless], wl),
    }
    artefacts = {
        "chunks merged": invalid_reasons([rec(0, 0.0, 0.5, [0.1], n=4)], wl),
        "TPOT = 0": invalid_reasons([rec(0, 0.0, 0.5, [0.0, 0.0, 0.0])], wl),
    }
    for kind, reasons in wrong_output.items():
        assert reasons and server_fault(reasons) and not only_artefacts(reasons), (kind, reasons)
        assert not timing_only(reasons), (kind, reasons)
    for kind, reasons in artefacts.items():
        assert reasons and not server_fault(reasons) and only_artefacts(reasons), (kind, reasons)
        assert timing_only(reasons) and all(r.blame is Blame.MACHINE for r in reasons), (kind, reasons)
    # Not only timing: without usage the tokens cannot be counted, so the throughput is no number either.
    no_usage = rec(0, 0.0, 0.5, [0.1] * 3)
    no_usage.output_tokens = None
    reasons = invalid_reasons([no_usage], wl)
    assert only_artefacts(reasons) and not timing_only(reasons), reasons
    # The classification travels with a reason pickled across client processes.
    again = pickle.loads(pickle.dumps(artefacts["TPOT = 0"]))
    assert again == artefacts["TPOT = 0"] and timing_only(again)


def test_merge_gives_percentiles_over_all_samples() -> None:
    rng = random.Random(7)
    a = [rec(i, 1000.0 + i * 0.01, rng.uniform(0.05, 0.1), [rng.uniform(0.001, 0.002)] * 15, process=0)
         for i in range(0, 40, 2)]
    # the second process is slower and started 3 ms later: averaging per-process percentiles would hide it
    b = [rec(i, 1000.003 + i * 0.01, rng.uniform(0.4, 0.9), [rng.uniform(0.010, 0.030)] * 15, process=1)
         for i in range(1, 40, 2)]
    merged = merge_records([a, b])
    assert [r.start for r in merged] == sorted(r.start for r in a + b)
    metrics, summaries = compute_metrics(merged)
    union_ttft = sorted(r.ttft * 1000 for r in a + b)  # type: ignore[operator]
    assert metrics["p90_ttft_ms"] == pytest.approx(percentile(union_ttft, 90))
    assert metrics["median_ttft_ms"] == pytest.approx(percentile(union_ttft, 50))
    avg_of_p90 = (compute_metrics(a)[0]["p90_ttft_ms"] + compute_metrics(b)[0]["p90_ttft_ms"]) / 2
    assert metrics["p90_ttft_ms"] != pytest.approx(avg_of_p90)
    assert summaries["itl"].n == 40 * 15
    assert metrics["duration_s"] == pytest.approx(max(r.end for r in a + b) - min(r.start for r in a + b))
    assert split_evenly(10, 3) == [4, 3, 3]


METRICS_BEFORE = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m a}b"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:prompt_tokens_total 7
"""


METRICS_AFTER = METRICS_BEFORE.replace("} 100.0", "} 1100.0").replace("} 50.0", "} 1050.0")


def test_server_counter_throughput_parses_prometheus_text() -> None:
    assert counter_total(METRICS_BEFORE, "vllm:generation_tokens") == 150.0
    assert counter_total(METRICS_BEFORE, "vllm:generation_tokens_total") == 150.0
    assert counter_total(METRICS_BEFORE, "vllm:prompt_tokens") == 7.0
    assert counter_total(METRICS_BEFORE, "sglang:generation_tokens") is None
    assert server_counter_throughput(METRICS_BEFORE, METRICS_AFTER, "vllm:generation_tokens", 4.0) == 500.0
    assert server_counter_throughput(METRICS_AFTER, METRICS_BEFORE, "vllm:generation_tokens", 4.0) is None
    assert server_counter_throughput(METRICS_BEFORE, "", "vllm:generation_tokens", 4.0) is None
    ok, msg = cross_check(505.0, 500.0)
    assert ok
    assert "+1.0%" in msg
    ok, msg = cross_check(450.0, 500.0, bound=0.03)
    assert not ok
    assert "DISAGREE" in msg
    assert cross_check(1.0, None)[0]


def test_client_cpu_per_request_is_recorded() -> None:
    records = [rec(0, 10.0, 0.1, [0.01] * 9), rec(1, 10.5, 0.2, [0.02] * 9)]
    wl = Workload("w", num_prompts=2, output_len=10)
    res = evaluate(records, wl, transport="lean", client_cpu_s=0.004)
    assert res.client_cpu_s == pytest.approx(0.004)
    assert res.client_cpu_ms_per_request == pytest.approx(2.0)
    assert res.to_dict(per_request=False)["client_cpu_ms_per_request"] == pytest.approx(2.0)
    assert evaluate(records, wl, transport="lean").client_cpu_ms_per_request is None


def test_one_chunk_short_of_the_tokens_is_accepted_with_a_note_more_is_not() -> None:
    """vLLM 0.26 on the H200 streamed 127 content chunks for 128 tokens (two tokens in one delta) in every request."""
    wl = Workload("w", num_prompts=2, output_len=5)
    one_short = [rec(i, float(i), 0.1, [0.01, 0.01, 0.01], n=5) for i in range(2)]  # 4 chunks, 5 tokens
    res = evaluate(one_short, wl, transport="lean")
    assert res.valid, res.invalid_reasons
    assert any("one content chunk fewer" in note for note in res.notes)
    two_short = [rec(i, float(i), 0.1, [0.01, 0.01], n=5) for i in range(2)]  # 3 chunks, 5 tokens
    assert any("different number of content chunks" in r for r in invalid_reasons(two_short, wl))
