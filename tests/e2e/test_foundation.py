"""The foundation slice on the real vLLM CPU server: the suite runs, a baseline is saved and re-checked,
and a deliberately slower configuration fails the benchmark gate with baseline and current figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import TINY_WORKLOAD, boots_line, default_server_toml, expect_outcomes

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def test_suite_save_recheck_and_slower_configuration_fails(
        pytester: pytest.Pytester, write_config: Callable[[str], Path]) -> None:
    slow = default_server_toml("slow", max_batch_size=1)
    write_config('default_server = "default"\n' + default_server_toml() + slow + TINY_WORKLOAD)
    # Two boots on a shared 2-core machine can differ by 15 % on a 2-second round: the same configuration's
    # re-check (step 2) gets a wide tolerance. How much slower --max-num-seqs 1 is depends on the CPU: about
    # 80 % on the host this test was first written on, 28.6 % on a 2-core AVX2 host without AVX-512
    # (18.81 -> 13.43 tok/s, 2026-12-03; why batching gains so little there was not measured). So step 3 has
    # a tolerance of its own, 10 %, which both drops exceed by more than their rounds' noise (CV 1-4 %).
    pytester.makeini("[pytest]\nllmserve_workload = tiny\nllmserve_tolerance = 0.30\n")
    # The baseline's benchmark ran after the suite's checks ("after traffic", issue 35): test_slow's benchmark runs
    # after traffic of its own (the plugin runs a configuration's benchmarks after its other tests).
    pytester.makepyfile(test_slow="""
        import pytest

        @pytest.mark.llmserve_server("slow")
        def test_traffic_first(llm_client):
            done = llm_client.complete_concurrently(["Write a long story about a lighthouse."] * 8, max_tokens=64,
                                                    ignore_eos=True)
            assert sum(c.completion_tokens or 0 for c in done) > 256

        @pytest.mark.llmserve_server("slow")
        @pytest.mark.llmserve_benchmark(baseline_server="default", variable="max_batch_size", rounds=3,
                                        tolerance=0.10,
                                        baseline_test="test_llmserve_suite.py::test_throughput")
        def test_throughput(llm_bench):
            llm_bench.run()
    """)

    # 1. The built-in suite on the default server: decode checks pass, the baseline is recorded.
    first = pytester.runpytest_subprocess("--llmserve-suite", "--llmserve-server=default",
                                          "--llmserve-save-baseline", "-p", "no:cacheprovider", timeout=900)
    out = first.stdout.str()
    expect_outcomes(first, passed=14, skipped=2)  # 14 suite items + 2 property tests; skipped: captured sizes
    # (graphs off) and matches-reference (no reference combination declared)
    assert boots_line(out) == "server boots: 1 (default)"
    assert "saved 5 rounds as a new baseline record" in out
    baseline_files = sorted((pytester.path / "baselines").glob("test_throughput--default--tiny-*.json"))
    assert len(baseline_files) == 1
    stored = json.loads(baseline_files[0].read_text())
    assert len(stored["records"][0]["samples"]["output_throughput"]) == 5
    assert stored["context"]["engine_version"] == "0.32.0"
    assert stored["context"]["workload"]["name"] == "tiny"
    saved_figure = stored["records"][0]["summary"]["output_throughput"]["median"]
    assert saved_figure > 0
    # The suite's benchmark runs after its correctness checks: the engine's own counters say the server had served
    # traffic (issue 35: the state is part of the context).
    state = stored["context"]["server_state"]
    assert state["state"] == "after traffic" and state["generated_tokens_before"] > 256, state
    assert state["requests_before"] > 0 and state["seconds_since_ready"] > 0, state

    # 2. The same command again, against the saved baseline, passes (same configuration: not regressed). The
    # whole suite, not its throughput test alone: the benchmark then runs after the same requests on a fresh
    # server as the baseline's did. Alone, right after boot, it measured +31.5 % (190.5 -> 250.5 tok/s, a
    # fresh-clone run on 2 cores, 2026-12-03) and was rightly "improved" against the ±30 % tolerance.
    second = pytester.runpytest_subprocess("--llmserve-suite", "--llmserve-server=default",
                                           "-p", "no:cacheprovider", timeout=900)
    expect_outcomes(second, passed=14, skipped=2)
    verdict_line = [ln for ln in second.stdout.lines if ln.startswith("test_throughput[default] ")]
    # The verdict column (the table goes on with the rounds and their CV).
    assert verdict_line and {"pass", "inconclusive"} & set(verdict_line[0].split()), second.stdout.str()

    # 2b. The suite's benchmark alone on a fresh boot ran from another state: refused against the suite's baseline,
    # naming the state and what to do, with its figure (before issue 35 it was compared: +31.5 % "improved" above).
    alone = pytester.runpytest_subprocess("--llmserve-suite", "--llmserve-server=default", "-k", "test_throughput",
                                          "-p", "no:cacheprovider", timeout=900)
    expect_outcomes(alone, failed=1, passed=0)
    text = alone.stdout.str()
    assert 'server_state.state: "after traffic" -> "fresh"' in text
    assert "run the benchmark as the baseline's ran" in text

    # 3. The same workload on --max-num-seqs 1 under concurrency 8 is slower: the gate fails and shows both figures.
    third = pytester.runpytest_subprocess("test_slow.py", "-p", "no:cacheprovider", timeout=900)
    expect_outcomes(third, failed=1, passed=1)
    text = third.stdout.str()
    assert "output_throughput REGRESSED on slow" in text
    assert "baseline: median" in text and "now:      median" in text
    assert "A/B of max_batch_size" in text
    assert boots_line(text) == "server boots: 1 (slow)"
