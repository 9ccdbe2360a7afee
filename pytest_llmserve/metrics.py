"""The one metric vocabulary: every figure a benchmark round produces, its definition, unit and direction.

The load generator (:mod:`pytest_llmserve.load.metrics`) computes exactly these names; the benchmark
gate, the marker check, the baseline CLI and the reports take a metric's direction from here.

``n`` is a request's ``usage.completion_tokens``. A *content chunk* is an SSE event with a non-empty
``choices`` list: one decode step (its text may be empty for special tokens); a trailing empty-text
chunk that only carries ``finish_reason`` beyond ``n`` is a finish marker, not a content chunk.
Latency figures are over every sample of every timed request (pooled over client processes, never
averaged), in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["LATENCIES", "LATENCY_METRICS", "LATENCY_STATS", "METRICS", "Metric", "definitions", "higher_is_better",
           "is_known", "latency_metric"]


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    definition: str
    unit: str
    higher_is_better: bool


#: The per-request latency samples (seconds on a request's record) that the latency figures summarise.
LATENCIES: Mapping[str, str] = MappingProxyType({
    "ttft": "request sent to arrival of the first content chunk (SSE event with a choice: one decode step)",
    "tpot": "(e2e - ttft) / (n - 1) per request, n = usage.completion_tokens (undefined for n < 2)",
    "itl": "gaps between consecutive content chunks, pooled over requests (c chunks give c - 1 samples)",
    "e2e": "request sent to arrival of the last content chunk",
})

#: How each latency is summarised: ``<stat>_<latency>_ms``.
LATENCY_STATS: Mapping[str, str] = MappingProxyType({
    "mean": "mean",
    "median": "median (linear interpolation, as numpy.percentile)",
    "p90": "90th percentile (linear interpolation, as numpy.percentile)",
    "p99": "99th percentile (linear interpolation, as numpy.percentile)",
    "std": "sample standard deviation (n - 1 in the denominator)",
})


def latency_metric(stat: str, latency: str) -> str:
    """The name of a latency figure, e.g. ``latency_metric("p99", "ttft") == "p99_ttft_ms"``."""
    return f"{stat}_{latency}_ms"


_FLAT: tuple[Metric, ...] = (
    Metric("output_throughput", "sum of usage.completion_tokens over timed requests / duration_s", "tokens/s",
           True),
    Metric("total_token_throughput", "sum of usage.prompt_tokens + usage.completion_tokens / duration_s",
           "tokens/s", True),
    Metric("input_throughput", "sum of usage.prompt_tokens / duration_s", "tokens/s", True),
    Metric("request_throughput", "completed requests / duration_s", "requests/s", True),
    Metric("duration_s", "first timed request start to last timed request end (stream closed); warm-up excluded",
           "s", False),
    Metric("mean_concurrency", "sum over requests of (end - start) / duration_s", "requests", False),
    Metric("total_output_tokens", "sum of usage.completion_tokens over timed requests", "tokens", False),
    Metric("total_input_tokens", "sum of usage.prompt_tokens over timed requests", "tokens", False),
    Metric("client_chunks", "content chunks counted by the client (cross-check of usage.completion_tokens)",
           "chunks", False),
    Metric("empty_chunks", "content chunks whose text was empty (special tokens; all empty = suspect NaN logits)",
           "chunks", False),
    Metric("completed", "timed requests that finished without error", "requests", False),
    Metric("failed", "timed requests that ended with an error (never retried)", "requests", False),
)

#: name -> Metric, for every figure in a valid run's ``metrics``.
METRICS: Mapping[str, Metric] = MappingProxyType({
    **{m.name: m for m in _FLAT},
    **{latency_metric(stat, lat): Metric(latency_metric(stat, lat), f"{how} of {lat}: {what}", "ms", False)
       for lat, what in LATENCIES.items() for stat, how in LATENCY_STATS.items()},
})

#: Every latency figure: what chunk timing measures, withheld from a round whose chunks were merged or buffered
#: (:func:`pytest_llmserve.gates.rounds.judge_round`).
LATENCY_METRICS: frozenset[str] = frozenset(latency_metric(stat, lat) for lat in LATENCIES for stat in LATENCY_STATS)


def is_known(name: str) -> bool:
    return name in METRICS


def higher_is_better(name: str) -> bool:
    """The good direction of ``name``: throughputs up, everything else (latencies, counts) down.

    A name outside the vocabulary counts as lower-is-better, the rule the benchmark gate always applied;
    a caller that knows better (a baseline's stored direction, a marker's ``higher_is_better``) passes it.
    """
    metric = METRICS.get(name)
    return metric.higher_is_better if metric is not None else False


def definitions() -> dict[str, str]:
    """name -> one-line definition (with its unit), for JSON written next to the figures."""
    return {m.name: f"{m.definition} ({m.unit})" for m in METRICS.values()}
