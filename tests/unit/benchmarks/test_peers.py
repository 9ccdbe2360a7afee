"""benchmarks/peers.py: reading each peer's own output file, the round order, the server-counter judge and the
peer / plugin ratios. The files under tests/data/peers/ are recorded runs (tests/data/peers/README.md)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_llmserve.config import Workload
from pytest_llmserve.verdicts.two_sample import ratio_ci

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "peers"


def _load_peers() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("peers", ROOT / "benchmarks" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


peers = _load_peers()
WL = Workload("peers", num_prompts=16, input_len=64, output_len=64, max_concurrency=8, warmup=0, seed=0)


def test_aiperf_export_is_read_by_the_plugins_names_on_the_plugins_definitions() -> None:
    path = DATA / "aiperf-profile_export_aiperf.json"
    raw: dict[str, Any] = json.loads(path.read_text())
    got = peers.parse_aiperf(path)
    assert got["completed"] == WL.num_prompts and got["failed"] == 0
    assert got["total_output_tokens"] == WL.num_prompts * WL.output_len
    # Throughput over AIPerf's benchmark_duration (seconds in this schema).
    assert raw["benchmark_duration"]["unit"] == "sec"
    assert got["output_throughput"] == pytest.approx(got["total_output_tokens"] / got["duration_s"], rel=1e-6)
    assert got["request_throughput"] == pytest.approx(got["completed"] / got["duration_s"], rel=1e-6)
    # TPOT is AIPerf's per-request inter_token_latency; ITL its pooled per-chunk gap.
    assert got["median_tpot_ms"] == raw["inter_token_latency"]["p50"]
    assert got["median_itl_ms"] == raw["inter_chunk_latency"]["p50"]
    # Pooled chunk gaps: at most one per token after the first (1006 of 1008 in this recording: AIPerf takes
    # two SSE events that arrive in one read as one response).
    assert 0.95 * WL.num_prompts * (WL.output_len - 1) <= raw["inter_chunk_latency"]["count"] \
        <= WL.num_prompts * (WL.output_len - 1)
    assert got["median_ttft_ms"] == raw["time_to_first_token"]["p50"]
    # AIPerf's own throughput divides by the profiling phase's window, longer than benchmark_duration.
    window = got["wall_end"] - got["wall_start"]
    assert window > got["duration_s"]
    assert got["aiperf_output_token_throughput"] == pytest.approx(got["total_output_tokens"] / window, rel=1e-3)
    assert got["aiperf_output_token_throughput"] < got["output_throughput"]


def test_guidellm_benchmarks_file_is_read_by_the_plugins_names_on_the_plugins_definitions() -> None:
    path = DATA / "guidellm-benchmarks.json"
    metrics = json.loads(path.read_text())["benchmarks"][0]["metrics"]
    got = peers.parse_guidellm(path)
    assert got["completed"] == WL.num_prompts and got["failed"] == 0
    assert got["total_output_tokens"] == WL.num_prompts * WL.output_len
    assert got["duration_s"] == pytest.approx(got["wall_end"] - got["wall_start"])
    assert got["output_throughput"] == pytest.approx(got["total_output_tokens"] / got["duration_s"])
    # guidellm's own mean output tokens/s is the same total over the same window.
    assert got["guidellm_output_tokens_per_second_mean"] == pytest.approx(got["output_throughput"], rel=1e-6)
    # TPOT = guidellm's inter_token_latency_ms ((e2e - TTFT) / (n - 1)); its time_per_output_token_ms is
    # e2e / n, the first token included, so larger whenever TTFT exceeds the per-token gap.
    assert got["median_tpot_ms"] == metrics["inter_token_latency_ms"]["successful"]["median"]
    assert got["guidellm_median_time_per_output_token_ms"] > got["median_tpot_ms"]
    assert got["median_itl_ms"] is None  # no per-chunk gaps in its files
    assert got["median_ttft_ms"] == metrics["time_to_first_token_ms"]["successful"]["median"]


def test_a_guidellm_run_that_lost_a_request_says_so_in_its_own_file() -> None:
    # Recorded: guidellm created 16 requests and the server generated 16 x 64 tokens, but its file counts 15.
    got = peers.parse_guidellm(DATA / "guidellm-benchmarks-15-of-16.json")
    assert got["completed"] == 15 and got["failed"] == 0
    assert got["total_output_tokens"] == 15 * WL.output_len


def test_the_guidellm_run_configuration_asks_for_the_workload() -> None:
    spec = peers.guidellm_scenario("http://h:1", "m", "/tok", WL, Path("/out"))["spec"]
    assert spec["data"] == [{"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 64}]
    assert spec["profile"] == {"kind": "concurrent", "streams": [8]}
    assert spec["constraints"] == [{"kind": "max_requests", "count": 16}]
    assert spec["backend"]["request_format"] == "/v1/completions" and spec["backend"]["stream"] is True


def test_the_aiperf_command_asks_for_exact_lengths_and_server_token_counts() -> None:
    cmd = peers.aiperf_command(Path("/v"), "http://h:1", "m", "/tok", WL, Path("/out"))
    pairs = dict(zip(cmd[2::1], cmd[3::1], strict=False))
    assert pairs["--synthetic-input-tokens-stddev"] == "0" and pairs["--output-tokens-stddev"] == "0"
    assert pairs["--synthetic-input-tokens-mean"] == "64" and pairs["--output-tokens-mean"] == "64"
    assert "ignore_eos:true" in cmd and "--use-server-token-count" in cmd and "--streaming" in cmd
    assert "--warmup-request-count" not in cmd  # AIPerf rejects 0: no warm-up is no flag


def test_round_order_rotates_so_no_tool_always_follows_the_same_one() -> None:
    tools = ["plugin", "vllm", "aiperf", "guidellm"]
    orders = [peers.rotation(tools, k) for k in range(4)]
    assert orders[0] == tools and orders[1] == ["vllm", "aiperf", "guidellm", "plugin"]
    assert {o[0] for o in orders} == set(tools)


def _row(tool: str, rnd: int, out_tps: float, out_delta: float = 1024, in_delta: float = 1024) -> dict[str, Any]:
    return {"tool": tool, "round": rnd, "output_throughput": out_tps, "request_throughput": out_tps / 64,
            "median_ttft_ms": 100.0, "median_tpot_ms": 10.0, "median_itl_ms": None,
            "counter_throughput": out_tps, "warmup_tokens": 0,
            "server_deltas": {"counter": out_delta, "prompt_tokens": in_delta}}


def test_the_server_counter_judges_whether_a_tool_sent_the_workload() -> None:
    assert peers.judge(_row("aiperf", 1, 100.0), WL)["exact_output"] is True
    short = peers.judge(_row("aiperf", 1, 100.0, out_delta=1000), WL)
    assert short["exact_output"] is False and short["expected_output_tokens"] == 1024
    assert peers.judge(_row("aiperf", 1, 100.0, in_delta=900), WL)["exact_input"] is False


def test_compare_gives_each_peer_over_the_plugin_with_its_interval() -> None:
    plugin, aiperf = [100.0, 104.0, 98.0], [95.0, 99.0, 94.0]
    rows = [_row("plugin", k + 1, v) for k, v in enumerate(plugin)] + \
        [_row("aiperf", k + 1, v) for k, v in enumerate(aiperf)]
    cmp = peers.compare(rows, ["plugin", "aiperf"])
    cell = cmp["output_throughput"]["aiperf"]
    assert (cell["ratio"], cell["low"], cell["high"]) == pytest.approx(ratio_ci(plugin, aiperf))
    assert cell["low"] < cell["ratio"] < cell["high"] < 1.0 + 1e-9 or cell["high"] > 1.0
    assert cmp["output_throughput"]["plugin"]["median"] == 100.0 and "ratio" not in cmp["output_throughput"]["plugin"]
    assert cmp["median_itl_ms"]["aiperf"]["median"] is None  # no figure: no ratio, no failure
    assert math.isclose(cmp["median_ttft_ms"]["aiperf"]["ratio"], 1.0)
