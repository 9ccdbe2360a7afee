"""Characterization of what llama.cpp's /props and /slots and SGLang's /metrics add to the facts (issue 36): every
fact and evidence line each records, pinned before ``parse_llamacpp_props`` and ``merge_sglang_metrics`` were split
into one reader per part of the page."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.engines.llamacpp.facts import LlamaCppFacts, parse_llamacpp_props
from pytest_llmserve.engines.sglang.facts import merge_sglang_metrics
from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.evidence.prometheus import parse


def changed(facts: ServerFacts, blank: ServerFacts) -> dict[str, Any]:
    """The facts (and evidence) that differ from a blank record's."""
    before = blank.to_dict()
    return {key: value for key, value in facts.to_dict().items() if value != before[key]}


@pytest.mark.parametrize(("props", "expected"), [
    ({"build_info": "b1-abc", "total_slots": 4, "model_path": "/m.gguf",
      "default_generation_settings": {"n_ctx": 2048, "params": {"seed": 7}},
      "slots": [{"speculative": False}, {"speculative": True}]},
     {"version": "b1-abc", "build_info": "b1-abc", "speculative": True, "max_batch_size": 4, "n_parallel": 4,
      "seed": 7, "n_ctx_slot": 2048, "model_path": "/m.gguf", "evidence": {
          "build_info": ["/props build_info = 'b1-abc'"], "version": ["/props build_info = 'b1-abc'"],
          "n_parallel": ["/props total_slots = 4"], "max_batch_size": ["/props total_slots = 4"],
          "model_path": ["/props model_path = '/m.gguf'"],
          "n_ctx_slot": ["/props default_generation_settings.n_ctx = 2048"],
          "seed": ["/props default_generation_settings.params.seed = 7"],
          "speculative": ["/slots speculative = [False, True]"]}}),
    # values of the wrong type are not facts; the slots are still counted
    ({"build_info": "", "total_slots": True, "model_path": 3,
      "default_generation_settings": {"n_ctx": False, "params": {"seed": True}}, "slots": [{"speculative": 1}, "x"]},
     {"n_parallel": 2, "evidence": {"n_parallel": ["/slots: 2 slots"]}}),
    ({"default_generation_settings": [], "slots": []}, {}),
    ({"default_generation_settings": {"params": []}, "slots": [{}, {}]},
     {"n_parallel": 2, "evidence": {"n_parallel": ["/slots: 2 slots"]}}),
    ({"total_slots": 2, "slots": [{"speculative": False}]},
     {"speculative": False, "max_batch_size": 2, "n_parallel": 2, "evidence": {
         "n_parallel": ["/props total_slots = 2"], "max_batch_size": ["/props total_slots = 2"],
         "speculative": ["/slots speculative = [False]"]}}),
])
def test_llamacpp_props_and_slots(props: dict[str, Any], expected: dict[str, Any]) -> None:
    assert changed(parse_llamacpp_props(props), LlamaCppFacts(engine="llamacpp")) == expected


PASSES = ('sglang:cuda_graph_passes_total{mode="decode_cuda_graph",tp_rank="0",dp_rank="0"} 10\n'
          'sglang:cuda_graph_passes_total{mode="decode_cuda_graph",tp_rank="1",dp_rank="0"} 12\n'
          'sglang:cuda_graph_passes_total{mode="decode_cuda_graph",tp_rank="0",dp_rank="1"} 5\n'
          'sglang:cuda_graph_passes_total{mode="decode_none",dp_rank="0"} 3\n'
          'sglang:cuda_graph_passes_total{mode="prefill_cuda_graph"} 4\n'
          'sglang:cuda_graph_passes_total 1\n'
          'sglang:max_total_num_tokens{a="1"} 1000\nsglang:max_total_num_tokens{a="2"} 2000\n'
          'sglang:engine_startup_time 30.5\n'
          'sglang:startup_time_seconds{phase="total"} 99\n')
PASSES_FOUND = {"graph_passes": {"decode_cuda_graph": 17.0, "decode_none": 3.0, "prefill_cuda_graph": 4.0, "": 1.0},
                "graph_passes_on": 17.0, "graph_passes_off": 3.0}
PASSES_EVIDENCE = [
    'sglang:cuda_graph_passes_total{dp_rank="0",mode="decode_cuda_graph",tp_rank="1"} 12',
    'sglang:cuda_graph_passes_total{dp_rank="1",mode="decode_cuda_graph",tp_rank="0"} 5',
    'sglang:cuda_graph_passes_total{dp_rank="0",mode="decode_none"} 3',
    'sglang:cuda_graph_passes_total{mode="prefill_cuda_graph"} 4',
    "sglang:cuda_graph_passes_total 1"]


@pytest.mark.parametrize(("metrics", "expected"), [
    # TP ranks of one DP rank: the largest; DP ranks: added up; prefill modes are not decode passes
    (PASSES, {**PASSES_FOUND, "kv_cache_tokens": 1000, "startup_s": 30.5, "evidence": {
        "graph_passes": PASSES_EVIDENCE, "kv_cache_tokens": ['sglang:max_total_num_tokens{a="1"} 1000'],
        "startup_s": ["sglang:engine_startup_time 30.5"]}}),
    ('sglang:startup_time_seconds{phase="load"} 10\nsglang:startup_time_seconds{phase="total"} 40\n'
     'sglang:startup_time_seconds{phase="x"} 1\n',
     {"startup_s": 40.0, "evidence": {"startup_s": ['sglang:startup_time_seconds{phase="total"} 40']}}),
    ('sglang:startup_time_seconds{phase="load"} 10\nsglang:startup_time_seconds{phase="capture"} 2.5\n',
     {"startup_s": 12.5, "evidence": {"startup_s": ['sglang:startup_time_seconds{phase="load"} 10',
                                                    'sglang:startup_time_seconds{phase="capture"} 2.5']}}),
    ("", {}),
])
def test_sglang_metrics(metrics: str, expected: dict[str, Any]) -> None:
    facts = ServerFacts(engine="sglang")
    merge_sglang_metrics(facts, parse(metrics))
    assert changed(facts, ServerFacts(engine="sglang")) == expected


def test_sglang_metrics_leave_facts_the_log_reported() -> None:
    facts = ServerFacts(engine="sglang", kv_cache_tokens=5, startup_s=1.0)
    merge_sglang_metrics(facts, parse(PASSES))
    assert changed(facts, ServerFacts(engine="sglang")) == {
        **PASSES_FOUND, "kv_cache_tokens": 5, "startup_s": 1.0, "evidence": {"graph_passes": PASSES_EVIDENCE}}
