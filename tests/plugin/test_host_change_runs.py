"""A baseline recorded on another host (issue 25), through whole pytest runs on a stand-in server
(tools/zero_cost_server.py with a realistic gap between tokens, its model declared untrained so its " tok" answers
are not judged as a trained model's: the comparison's logic does not need a real engine; the real-engine run of
the same refusal is tests/e2e/test_gate_real.py, part 2): skipped with the differing host field named and a
figure, and compared on purpose with ``--llmserve-allow-host-change``."""

from __future__ import annotations

import json
import sys

import pytest

from tests.standins.helpers import MARK_ENV, ZERO_COST, server_toml

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.usefixtures("private_registry")]

INNER = """
import pytest

@pytest.mark.llmserve_benchmark(workload="tiny", rounds=2, max_rounds=6, tolerance=0.5)
def test_throughput(llm_bench):
    llm_bench.run()
"""


def test_a_baseline_with_other_cpu_flags_is_skipped_naming_them_and_compared_when_allowed(
        pytester: pytest.Pytester, token: str) -> None:
    # This test is about the host's identity, not about what else runs on it: under `-n 2` the other worker's
    # tests took more than the default contention bound of this 2-core machine and skipped the save as
    # "confounded: host busy" (tests/unit/gates/test_contended_rounds.py and e2e/test_contention_real.py test that).
    pytester.makeini("[pytest]\nllmserve_contention_bound = 0.99\n")
    argv = [sys.executable, str(ZERO_COST), "--port", "{port}", "--token-delay-ms", "2"]
    pytester.makefile(".toml", llmserve=server_toml("s", engine="command", argv=argv, served_model_name="zero-cost",
                                                    random_weights=True, env={MARK_ENV: token}, startup_timeout_s=30)
                      + "[workloads.tiny]\nnum_prompts = 4\ninput_len = 8\noutput_len = 8\nwarmup = 0\n")
    pytester.makepyfile(test_gate=INNER)
    saved = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-save-baseline", timeout=240)
    saved.assert_outcomes(passed=1)
    (path,) = (pytester.path / "baselines").glob("*.json")
    doc = json.loads(path.read_text())
    here = doc["context"]["hardware"]["cpu_flags"]
    other = sorted(set(here) ^ {"avx2"})  # the host of issue 25: the same CPU name, AVX2 not exposed
    doc["context"]["hardware"]["cpu_flags"] = other
    path.write_text(json.dumps(doc))
    flags = f"hardware.cpu_flags: {json.dumps(other)} -> {json.dumps(here)}"

    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", timeout=240)
    out = refused.stdout.str()
    refused.assert_outcomes(skipped=1)  # environment-only: a skip, never a failure
    assert f"no baseline for this environment in {path} (recorded on another host: {flags})" in out, out[-4000:]
    assert "output_throughput: median " in out and "llmserve baselines accept --replace" in out, out[-4000:]
    assert "--llmserve-allow-host-change" in out, out[-4000:]

    allowed = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--llmserve-allow-host-change", timeout=240)
    out = allowed.stdout.str()
    allowed.assert_outcomes(passed=1)
    # The summary table's verdict says so, and the lines below it name the host fields.
    assert "pass (across hosts)" in out and f"across hosts (allowed): {flags}" in out, out[-4000:]
    assert f"  ~ {flags}" in out, out[-4000:]
    row = json.loads((pytester.path / "llmserve-results" / "latest" / "results.json").read_text())["benchmarks"][0]
    assert row["status"] == "pass" and row["comparability"]["host_diffs"][0]["key"] == "hardware.cpu_flags", row
    assert row["comparability"]["label"] == "same context, across hosts (allowed)", row
