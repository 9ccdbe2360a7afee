"""Servers in depth on the real vLLM CPU server: a two-combination matrix (eager vs compiled) boots twice
with the right facts and passing config-is-execution checks; the same run A/B-tests the two and runs the
matrix reference differential (``reference = "eager=on"``: the eager server records its answers, the compiled
one replays the prompts and is compared with them, first divergence, top-k both ways, |Δlogprob| before it;
the recording is kept with the run's reports); a baseline is refused when more than the variable under test
changed; attach mode boots none. (That `-n 2` shares one boot between two workers is proven by
tests/e2e/test_isolation_real.py, whose two workers each use it.)

The facts, the A/B and the reference differential share one run on purpose: each needs the same two boots,
and the compiled boot is the suite's slowest (100-180 s on 2 cores).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import TINY_WORKLOAD, boots_line, default_server_toml, expect_outcomes
from tests.e2e.shared import SharedServers

pytestmark = pytest.mark.slow

SHARED_SERVERS = ("healthy",)  # the shared servers (tests/e2e/shared.py) this module attaches to

FACTS_TEST = """
import json
import pytest

@pytest.mark.llmserve_server("cpu")
def test_facts(llm_server, decode_check):
    decode_check.config_is_execution()
    facts = llm_server.facts()
    eager = llm_server.spec.eager
    print("FACTS", json.dumps({"id": llm_server.spec.id, "compilation_mode": facts.compilation_mode,
                                "cudagraph_mode": facts.cudagraph_mode, "kv": facts.kv_cache_tokens,
                                "eager": facts.enforce_eager, "captured": facts.captured_batch_sizes}))
    assert facts.compilation_mode == ("NONE" if eager else "DYNAMO_TRACE_ONCE")
    assert facts.enforce_eager is eager
    assert facts.cudagraph_mode == "NONE"          # no CUDA graphs on CPU
    # VLLM_CPU_KVCACHE_SPACE=2 with SmolLM2's KV layout, in the dtype the embedded default chose for this CPU
    args = llm_server.spec.args
    assert facts.kv_cache_tokens == {"bfloat16": 93184, "float32": 46592}[args[args.index("--dtype") + 1]]

@pytest.mark.llmserve_server("cpu")
@pytest.mark.llmserve_benchmark(rounds=5)
def test_throughput(llm_bench):
    llm_bench.run()

def test_ab_eager_vs_compiled(llm_ab):
    llm_ab.run(a="cpu[eager=on]", b="cpu[eager=off]", workload="tiny", rounds=3, tolerance=0.5)
"""


@pytest.mark.bench  # the A/B of eager against compiled and the baseline refused for a changed setting
def test_matrix_boots_each_combination_once_with_facts_ab_reference_and_refusal(
        pytester: pytest.Pytester, write_config: Callable[[str], Path]) -> None:
    write_config(default_server_toml("cpu") + '[matrix.cpu]\neager = [true, false]\nreference = "eager=on"\n'
                 + TINY_WORKLOAD)
    pytester.makeini("[pytest]\nllmserve_workload = tiny\n")
    pytester.makepyfile(test_matrix=FACTS_TEST)
    # This file's tests and, of the built-in suite, the reference differential on both combinations.
    result = pytester.runpytest_subprocess("test_matrix.py", "--llmserve-suite", "-k",
                                           "test_matrix.py or matches_reference", "-s", "-rA", "-p", "no:cacheprovider",
                                           "--llmserve-save-baseline", timeout=1500)
    out = result.stdout.str()
    expect_outcomes(result, passed=7)  # facts and throughput on each combination, the A/B, 2 differentials
    # Two configurations, two boots (the A/B reuses both servers), each with its own facts.
    assert boots_line(out) == "server boots: 2 (cpu[eager=on], cpu[eager=off])", out
    facts = [json.loads(line.split("FACTS ", 1)[1]) for line in out.splitlines() if "FACTS " in line]
    assert {f["id"]: f["compilation_mode"] for f in facts} == {"cpu[eager=on]": "NONE",
                                                               "cpu[eager=off]": "DYNAMO_TRACE_ONCE"}
    assert "A/B output_throughput: A=cpu[eager=on]" in out
    saved = sorted(p.name for p in (pytester.path / "baselines").glob("*.json"))
    assert len(saved) == 2, saved

    # The reference differential: recorded on eager, compared on compiled, the recording kept with the reports.
    run = (pytester.path / "llmserve-results" / "latest").resolve()
    rows = {row["server_id"]: row for row in json.loads((run / "results.json").read_text())["checks"]
            if row["check"] == "test_matches_reference"}
    assert str(rows["cpu[eager=on]"]["detail"]).startswith("recorded: cpu[eager=on] on vllm"), rows
    table = str(rows["cpu[eager=off]"]["detail"])
    assert table.startswith("cpu[eager=off] vs cpu[eager=on] on vllm"), table
    print(table)  # the measured agreement, for the record (-s)
    answers = json.loads((run / "reference-answers" / "cpu.json").read_text())
    assert answers["combination"] == "cpu[eager=on]" and answers["engine"] == "vllm" and len(answers["answers"]) == 9
    # Greedy to at most 32 tokens: a chat answer may end at EOS sooner ("Paris."); each came back with logprobs.
    assert all(answer["status"] == 200 and 0 < len(answer["tokens"]) <= 32 for answer in answers["answers"])

    # A baseline recorded with one memory setting and graph mode, compared with a run where both the
    # memory setting and the graph mode changed while only the graph mode is the variable: refused.
    write_config(default_server_toml("cpu2", mem_fraction=0.5, cuda_graph=False) + TINY_WORKLOAD)
    pytester.makepyfile(test_refuse="""
        import pytest
        @pytest.mark.llmserve_server("cpu2")
        @pytest.mark.llmserve_benchmark(baseline_server="cpu[eager=on]", variable="cuda_graph",
                                        baseline_test="test_matrix.py::test_throughput")
        def test_throughput(llm_bench):
            llm_bench.run()
    """)
    refused = pytester.runpytest_subprocess("test_refuse.py", "-p", "no:cacheprovider", timeout=900)
    expect_outcomes(refused, errors=1)  # refused in set-up, from the configuration alone: no boot
    text = refused.stdout.str()
    assert "server boots:" not in text
    assert "comparison refused" in text
    assert "server_args.mem_fraction" in text       # the confounder is named
    assert "server_args.cuda_graph" in text         # and the variable under test is shown as such


def test_attach_to_running_server_boots_nothing(pytester: pytest.Pytester, shared_servers: SharedServers) -> None:
    server = shared_servers.get("healthy")  # a server this run did not launch
    pytester.makepyfile(test_attach="""
        def test_generate(llm_server, llm_client):
            out = llm_client.chat("What is the capital of France? Answer in one word.", 16)
            assert "Paris" in out.text, out.describe()
            assert llm_server.spec.engine == "external"
    """)
    result = pytester.runpytest_subprocess(f"--llmserve-url={server.url}", "-p", "no:cacheprovider", timeout=600)
    expect_outcomes(result, passed=1)
    assert boots_line(result.stdout.str()) == "server boots: 0"
    assert (f"attached: external at {server.url}, not launched by this run (nor stopped by it)"
            in result.stdout.str())
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # attach mode never stops a server
