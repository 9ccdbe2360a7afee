"""Characterization of the CUDA-graph checks of config-is-execution (verdicts/execution.py), pinned before
_check_cuda_graph and _check_graph_used were split into one check per question (issue 36): for graphs requested on
and off, every way the server's facts answer them (capture and sizes, the mode, graph use in decode by batch size, by
batch lines, by counters), each check's name, status, requested, observed, note and evidence count."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_llmserve.config import CudaGraphSpec, ServerSpec
from pytest_llmserve.evidence.facts import ServerFacts
from pytest_llmserve.verdicts.execution import check_config_is_execution

# name: (CudaGraphSpec fields, ServerFacts fields)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "on-capture-not-reported": ({"enabled": True}, {}),
    "on-engine-says-no-graphs": ({"enabled": True}, {"cuda_graph_enabled": False}),
    "on-captured-sizes-unreported": ({"enabled": True}, {"cuda_graph_enabled": True}),
    "on-sizes-asked-unreported": ({"enabled": True, "batch_sizes": (1, 2, 4)}, {"cuda_graph_enabled": True}),
    "on-none-captured": ({"enabled": True, "max_batch_size": 8},
                         {"captured_batch_sizes": (), "cudagraph_mode": "NONE"}),
    "on-missing-sizes": ({"enabled": True, "batch_sizes": (1, 2, 4, 8), "mode": "FULL"},
                         {"captured_batch_sizes": (1, 2, 4), "cudagraph_mode": "PIECEWISE"}),
    "on-max-cut": ({"enabled": True, "max_batch_size": 8, "mode": "full"},
                   {"captured_batch_sizes": (1, 2, 4), "cudagraph_mode": "FULL"}),
    "on-mode-unreported": ({"enabled": True, "mode": "FULL"}, {"captured_batch_sizes": (1, 2, 4)}),
    "on-hint": ({"enabled": True}, {"captured_batch_sizes": (1, 2, 4), "graph_use_hint": "llama.cpp says nothing"}),
    "on-eager-in-range": ({"enabled": True}, {"captured_batch_sizes": (1, 2, 4),
                                             "graph_use_by_size": {1: {"on": 3, "off": 0}, 2: {"on": 1, "off": 2},
                                                                   8: {"on": 0, "off": 5}}}),
    "on-used-with-above": ({"enabled": True}, {"captured_batch_sizes": (1, 2, 4),
                                              "graph_use_by_size": {1: {"on": 3, "off": 0},
                                                                    16: {"on": 0, "off": 2}},
                                              "graph_passes": {"FULL": 7.0}, "graph_passes_on": 7.0}),
    "on-only-above-counter": ({"enabled": True}, {"captured_batch_sizes": (1, 2, 4),
                                                 "graph_use_by_size": {8: {"on": 0, "off": 4}},
                                                 "graph_passes_on": 5.0}),
    "on-only-above": ({"enabled": True}, {"captured_batch_sizes": (1, 2, 4),
                                         "graph_use_by_size": {8: {"on": 1, "off": 4}}}),
    "on-batch-lines": ({"enabled": True}, {"captured_batch_sizes": (1, 2), "decode_batches_on_graph": 3,
                                          "decode_batches_off_graph": 1}),
    "on-counter-none-on": ({"enabled": True}, {"captured_batch_sizes": (1, 2), "graph_passes": {"NONE": 9.0}}),
    "on-sizes-asked-by-size": ({"enabled": True, "batch_sizes": (1, 2)},
                               {"cuda_graph_enabled": True, "graph_use_by_size": {1: {"on": 2, "off": 0}}}),
    "off-engine-says-captured": ({"enabled": False}, {"cuda_graph_enabled": True}),
    "off-unreported": ({"enabled": False}, {}),
    "off-captured": ({"enabled": False}, {"captured_batch_sizes": (1, 2)}),
    "off-none-captured-eager-steps": ({"enabled": False}, {"captured_batch_sizes": (),
                                                          "decode_batches_off_graph": 4}),
    "off-but-ran-on-graph": ({"enabled": False}, {"captured_batch_sizes": (),
                                                 "graph_use_by_size": {2: {"on": 1, "off": 3}}}),
}

# name: [(check, status, requested, observed, note, evidence lines)], as e369d3a checked them
EXPECTED: dict[str, list[tuple[str, str, str, str, str, int]]] = {
    "on-capture-not-reported": [
        ("cuda_graph.captured", "unverifiable", "cuda graphs on", "capture not reported", "", 1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-engine-says-no-graphs": [
        ("cuda_graph.captured", "fail", "cuda graphs on", "no graphs", "", 1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-captured-sizes-unreported": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "graphs captured (sizes not reported)", "", 1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-sizes-asked-unreported": [
        ("cuda_graph.captured",
         "unverifiable",
         "cuda graphs on, batch sizes [1, 2, 4]",
         "graphs captured (sizes not reported)",
         "",
         1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on, batch sizes [1, 2, 4]",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-none-captured": [
        ("cuda_graph.captured",
         "fail",
         "cuda graphs on, max batch size 8",
         "no graphs captured",
         "cudagraph_mode=NONE",
         1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on, max batch size 8",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-missing-sizes": [
        ("cuda_graph.captured",
         "fail",
         "cuda graphs on, batch sizes [1, 2, 4, 8]",
         "captured [1, 2, 4]",
         "missing sizes [8]",
         1),
        ("cuda_graph.mode", "fail", "FULL", "PIECEWISE", "", 0),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on, batch sizes [1, 2, 4, 8]",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-max-cut": [
        ("cuda_graph.captured",
         "fail",
         "cuda graphs on, max batch size 8",
         "captured [1, 2, 4]",
         "largest captured size 4 != requested max 8 (capture lists are cut to the max running requests)",
         1),
        ("cuda_graph.mode", "pass", "full", "FULL", "", 0),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on, max batch size 8",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-mode-unreported": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.mode", "unverifiable", "FULL", "not reported", "", 0),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on",
         "not reported",
         "the engine reported no per-step graph use",
         1),
    ],
    "on-hint": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.used_in_decode", "unverifiable", "cuda graphs on", "not reported", "llama.cpp says nothing", 1),
    ],
    "on-eager-in-range": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.used_in_decode",
         "fail",
         "cuda graphs on",
         "ran WITHOUT a graph within the captured sizes (bs 2: 2 step(s)); steps by batch size: 1: 3 on graph/0 off, "
         "2: 1 on graph/2 off, 8: 0 on graph/5 off",
         "5 step(s) above the largest captured size 4 not counted",
         1),
    ],
    "on-used-with-above": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.used_in_decode",
         "pass",
         "cuda graphs on",
         "steps by batch size: 1: 3 on graph/0 off, 16: 0 on graph/2 off; graph passes FULL=7",
         "2 step(s) above the largest captured size 4 not counted",
         1),
    ],
    "on-only-above-counter": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.used_in_decode",
         "pass",
         "cuda graphs on",
         "steps by batch size: 8: 0 on graph/4 off",
         "4 step(s) above the largest captured size 4 not counted; no logged step within the captured sizes (<= 4); "
         "5 decode passes on a graph by the engine's counter",
         1),
    ],
    "on-only-above": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2, 4]", "", 1),
        ("cuda_graph.used_in_decode",
         "unverifiable",
         "cuda graphs on",
         "steps by batch size: 8: 1 on graph/4 off",
         "no step within the captured sizes (<= 4) was observed",
         1),
    ],
    "on-batch-lines": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2]", "", 1),
        ("cuda_graph.used_in_decode",
         "pass",
         "cuda graphs on",
         "3 decode batch lines on graph, 1 off graph",
         "per-step batch sizes not reported: counted graph passes only",
         1),
    ],
    "on-counter-none-on": [
        ("cuda_graph.captured", "pass", "cuda graphs on", "captured [1, 2]", "", 1),
        ("cuda_graph.used_in_decode",
         "fail",
         "cuda graphs on",
         "graph passes NONE=9",
         "per-step batch sizes not reported: counted graph passes only",
         1),
    ],
    "on-sizes-asked-by-size": [
        ("cuda_graph.captured",
         "unverifiable",
         "cuda graphs on, batch sizes [1, 2]",
         "graphs captured (sizes not reported)",
         "",
         1),
        ("cuda_graph.used_in_decode",
         "pass",
         "cuda graphs on, batch sizes [1, 2]",
         "steps by batch size: 1: 2 on graph/0 off",
         "",
         1),
    ],
    "off-engine-says-captured": [
        ("cuda_graph.captured", "fail", "cuda graphs off", "graphs captured", "", 1),
    ],
    "off-unreported": [
        ("cuda_graph.captured", "unverifiable", "cuda graphs off", "capture not reported", "", 1),
    ],
    "off-captured": [
        ("cuda_graph.captured", "fail", "cuda graphs off", "captured [1, 2]", "", 1),
    ],
    "off-none-captured-eager-steps": [
        ("cuda_graph.captured", "pass", "cuda graphs off", "no graphs captured", "", 1),
        ("cuda_graph.used_in_decode", "pass", "cuda graphs off", "0 decode batch lines on graph, 4 off graph", "", 1),
    ],
    "off-but-ran-on-graph": [
        ("cuda_graph.captured", "pass", "cuda graphs off", "no graphs captured", "", 1),
        ("cuda_graph.used_in_decode", "fail", "cuda graphs off", "steps by batch size: 2: 1 on graph/3 off", "", 1),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_graph_checks(name: str) -> None:
    graph, fields = CASES[name]
    facts = ServerFacts(engine="vllm", **fields)
    facts.evidence = {"captured_batch_sizes": ["Capturing CUDA graphs (decode, FULL): sizes [1, 2, 4]"],
                      "graph_use_by_size": ["bs 1 | FULL | 3"]}
    spec = ServerSpec(name="s", model="/m", cuda_graph=CudaGraphSpec(**graph))
    checks = [r for r in check_config_is_execution(spec, facts) if r.name.startswith("cuda_graph")]
    assert [(r.name, r.status, r.requested, r.observed, r.note, len(r.evidence)) for r in checks] == EXPECTED[name]
