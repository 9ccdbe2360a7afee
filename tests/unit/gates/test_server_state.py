"""The server's state before a benchmark (issue 35, item 2): read from each engine's own counters on a real recorded
metrics page, and classed fresh / after traffic / unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_llmserve.engines.base import EngineAdapter
from pytest_llmserve.engines.sglang.launch import SGLangAdapter
from pytest_llmserve.engines.vllm.launch import VLLMAdapter
from pytest_llmserve.evidence.prometheus import counter_total
from pytest_llmserve.gates.context import FRESH_TOKEN_ALLOWANCE, server_state

LOGS = Path(__file__).parents[2] / "data" / "logs"


@pytest.mark.parametrize(("adapter", "page", "expected"), [
    # vLLM 0.26.0 on the H200 after 10 requests (finished by length, summed over the finish reasons), 320 tokens.
    (VLLMAdapter(), "real_vllm_gpu_0.26.0_h200_full_and_piecewise.metrics.txt",
     {"state": "after traffic", "generated_tokens_before": 320, "requests_before": 10,
      "prefix_cache_hit_tokens_before": 0}),
    # SGLang 0.5.15 on the H200 after 12 requests, 344 generated tokens, 16 prompt tokens from the radix cache.
    (SGLangAdapter(), "real_sglang_0.5.15_h200_cuda_graph.metrics.txt",
     {"state": "after traffic", "generated_tokens_before": 344, "requests_before": 12,
      "prefix_cache_hit_tokens_before": 16}),
])
def test_each_engines_counters_on_a_real_page_give_the_state(adapter: EngineAdapter, page: str,
                                                            expected: dict[str, object]) -> None:
    text = (LOGS / page).read_text(encoding="utf-8")
    figures = [counter_total(text, name) for name in (adapter.generation_counter, adapter.request_counter,
                                                      adapter.prefix_cache_hit_counter) if name]
    assert len(figures) == 3 and all(f is not None for f in figures), figures  # every counter is on the page
    state = server_state(figures[0], 12.5, requests_before=figures[1], prefix_cache_hits_before=figures[2])
    assert {k: state[k] for k in expected} == expected
    assert state["seconds_since_ready"] == 12.5


def test_the_class_boundaries() -> None:
    assert server_state(None, None)["state"] == "unknown"  # no counter to read (a stand-in, an unreadable page)
    assert server_state(0, 3.0)["state"] == "fresh"
    assert server_state(FRESH_TOKEN_ALLOWANCE, 3.0)["state"] == "fresh"  # the plugin's own readiness probes
    assert server_state(FRESH_TOKEN_ALLOWANCE + 1, 3.0)["state"] == "after traffic"
