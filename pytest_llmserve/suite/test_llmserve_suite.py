"""Built-in checks, run by ``pytest --llmserve-suite`` once per configured server (and matrix combination).

Each test names what it proves; failures carry what was sent, what came back and the server id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_llmserve.suite import suite_requests

if TYPE_CHECKING:
    from pytest_llmserve.bench_face import BenchFace
    from pytest_llmserve.evidence.client import LLMClient
    from pytest_llmserve.gates.decode import DecodeCheck
    from pytest_llmserve.server.handle import RunningServer
    from pytest_llmserve.verdicts.batch_sizes import BatchCase

pytestmark = pytest.mark.llmserve_server("*")


@suite_requests("probes")
def test_boots_and_generates(llm_server: RunningServer, llm_client: LLMClient) -> None:
    """The server is up and answers a real generation of exactly the requested length."""
    out = llm_client.complete("Hello, my name is", 8, ignore_eos=True)
    # The failure's first line is what went wrong (the reports show it as the first finding).
    assert out.ok, (f"a plain completion failed: HTTP {out.status}: {out.error}\n{out.describe().splitlines()[0]}\n"
                    f"{llm_server.describe()}")
    assert out.completion_tokens == 8, f"{llm_server.describe()}: asked for 8 tokens\n{out.describe()}"


@pytest.mark.llmserve_correctness
@pytest.mark.llmserve_after_traffic  # after the batch-size cases, so every batch size's graph use is in the log
def test_config_is_execution(decode_check: DecodeCheck) -> None:
    """What was configured is what ran, from the server's own log and metrics."""
    decode_check.config_is_execution()


@suite_requests("probes", independent=True)
@pytest.mark.llmserve_correctness
def test_no_nan(decode_check: DecodeCheck) -> None:
    """No NaN from any channel: logprobs, sentinels, HTTP errors, the engine's log."""
    decode_check.no_nan()


@suite_requests("probes", independent=True)
@pytest.mark.llmserve_correctness
def test_known_answers(decode_check: DecodeCheck) -> None:
    """Known-answer probes (capital of France → Paris, ...)."""
    decode_check.known_answers()


@suite_requests("probes", independent=True)
@pytest.mark.llmserve_correctness
def test_long_decode_is_coherent(decode_check: DecodeCheck) -> None:
    """A long greedy decode does not collapse (repetition, '!!!!', replacement characters, NaN)."""
    decode_check.coherent()


@pytest.mark.llmserve_correctness
def test_greedy_is_deterministic(decode_check: DecodeCheck) -> None:
    """Two greedy runs of the same prompt agree (exactly in deterministic mode, else by the differential rule: a
    flip only as a near-tie on both sides, |Δlogprob| and top-k distance bounded before it)."""
    decode_check.deterministic()


@pytest.mark.llmserve_correctness
def test_batch_size(decode_check: DecodeCheck, llmserve_batch_case: BatchCase) -> None:
    """N concurrent greedy requests: every output NaN-free, coherent, and close to its batch-1 reference."""
    decode_check.batch_case(llmserve_batch_case)


@pytest.mark.llmserve_correctness
def test_captured_batch_sizes_covered(decode_check: DecodeCheck) -> None:
    """Every batch size the server reports having captured is exercised, padded sizes included."""
    decode_check.cuda_graph_sizes_covered()


@pytest.mark.llmserve_correctness
def test_matches_reference(decode_check: DecodeCheck) -> None:
    """Agrees with the matrix's declared reference combination on the same weights (recorded there, replayed
    here), by the differential rule: per request |Δlogprob| and top-k distance at every compared position, the
    first divergence a near-tie on both sides, no truncated answer; over the set, few early divergences."""
    decode_check.matches_reference()


@pytest.mark.llmserve_benchmark
def test_throughput(llm_bench: BenchFace) -> None:
    """Throughput gate against the stored baseline (several rounds, statistical verdict)."""
    llm_bench.run()
