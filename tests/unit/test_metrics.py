"""The metric vocabulary: every figure a round produces has one definition, a unit and a direction."""

from __future__ import annotations

import pytest

from pytest_llmserve.metrics import LATENCIES, LATENCY_STATS, METRICS, definitions, higher_is_better, is_known

THROUGHPUTS = ("output_throughput", "total_token_throughput", "input_throughput", "request_throughput")
# The figures of a round with no "good = up" reading: the gate has always treated them as lower-is-better.
COUNTS_AND_TIMES = ("duration_s", "mean_concurrency", "total_output_tokens", "total_input_tokens", "client_chunks",
                    "empty_chunks", "completed", "failed")


def test_every_known_metric_has_the_direction_the_old_rules_gave() -> None:
    """Before the vocabulary, the gate's HIGHER_IS_BETTER table (then in load.py) and the stats module's
    default_higher_is_better (reports, the baseline CLI: a name with throughput/per_s/tok_s/tokens_per/goodput/
    accuracy is higher-is-better) decided. They agreed on every name a round produces; these are those answers."""
    latency_figures = [f"{stat}_{lat}_ms" for lat in ("ttft", "tpot", "itl", "e2e")
                       for stat in ("mean", "median", "p90", "p99", "std")]
    assert set(METRICS) == set(THROUGHPUTS) | set(COUNTS_AND_TIMES) | set(latency_figures)
    for name in THROUGHPUTS:
        assert higher_is_better(name), name
    for name in (*COUNTS_AND_TIMES, *latency_figures):
        assert not higher_is_better(name), name
    assert {m.name for m in METRICS.values() if m.higher_is_better} == set(THROUGHPUTS)


@pytest.mark.parametrize("name", ["ttft", "percentiles", "goodput", "accuracy", "server_tok_s", "nope"])
def test_unknown_names_are_lower_is_better_and_not_known(name: str) -> None:
    # "goodput", "accuracy", "server_tok_s": the old name heuristic said higher-is-better, the gate's set said
    # lower; the set's answer is kept (a caller that knows better passes the direction explicitly).
    assert not is_known(name)
    assert not higher_is_better(name)


def test_definitions_are_one_line_with_units() -> None:
    defs = definitions()
    assert set(defs) == set(METRICS)
    for name, metric in METRICS.items():
        assert metric.name == name
        assert metric.unit and metric.definition
        assert "\n" not in defs[name] and defs[name].endswith(f"({metric.unit})")
    assert all(METRICS[f"{stat}_{lat}_ms"].unit == "ms" for lat in LATENCIES for stat in LATENCY_STATS)
    assert "n - 1" in METRICS["std_itl_ms"].definition
