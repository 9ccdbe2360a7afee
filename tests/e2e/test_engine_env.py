"""A variable the server inherits from the shell is part of the baseline context, on the real vLLM CPU server.

The case of issue 12: ``VLLM_CPU_KVCACHE_SPACE=2`` then ``=1`` set in the shell (the server's KV cache halves:
93,184 to 46,592 tokens in bfloat16, 46,592 to 23,296 in float32, the default on a CPU without native bfloat16)
used to compare as "same context" and pass. The server here has no ``env`` of
its own, so the shell's value is the one vLLM reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.conftest import TINY_WORKLOAD, default_server_toml, expect_outcomes

pytestmark = [pytest.mark.slow, pytest.mark.bench]

KV_TEST = """
import os

import pytest

# The saved record is about its context, not its figures: no warm-up rounds, and the least rounds a save takes
# (SAVE_MIN_ROUNDS, 5), never extended.
@pytest.mark.llmserve_benchmark(rounds=1, max_rounds=5, warmup_rounds=0)
def test_throughput(llm_server, llm_bench):
    print("KV", llm_server.facts().kv_cache_tokens)
    if os.environ.get("KV_ONLY"):  # the forced run proves the boot and the KV cache, not a comparison
        return
    llm_bench.run()
"""


def _kv(output: str) -> int:
    return int(next(line.split("KV ", 1)[1].split()[0] for line in output.splitlines() if line.startswith("KV ")))


def test_shell_kv_cache_space_enters_the_baseline_context(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                          write_config: Callable[[str], Path]) -> None:
    write_config(default_server_toml("cpu", env=None) + TINY_WORKLOAD)
    pytester.makeini("[pytest]\nllmserve_workload = tiny\n")
    pytester.makepyfile(test_kv=KV_TEST)

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    saved = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--llmserve-save-baseline", timeout=900)
    expect_outcomes(saved, passed=1)
    [baseline] = (pytester.path / "baselines").glob("*.json")
    assert json.loads(baseline.read_text())["context"]["engine_env"] == {"VLLM_CPU_KVCACHE_SPACE": "2"}

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    rerun = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", timeout=900)
    out = rerun.stdout.str()
    # Decidable from the configuration alone: refused in set-up, before any boot, naming the variable.
    expect_outcomes(rerun, errors=1)
    assert 'engine_env.VLLM_CPU_KVCACHE_SPACE: "2" -> "1"' in out, out
    assert "booting" not in out and "server boots:" not in out, out
    # Forced, the run boots: the variable reached the server, which got half the KV cache.
    # Its rounds would compare figures of two KV-cache sizes, which is what the refusal above is for: the test
    # stops after the fact (KV_ONLY), which saves the rounds' time (a warm-up and up to max_rounds).
    monkeypatch.setenv("KV_ONLY", "1")
    forced = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--llmserve-allow-confounded", timeout=900)
    expect_outcomes(forced, passed=1)
    assert _kv(forced.stdout.str()) * 2 == _kv(saved.stdout.str()), forced.stdout.str()
