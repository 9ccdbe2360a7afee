"""Built-in property tests over the API, run by ``pytest --llmserve-suite`` once per configured server.

Hypothesis draws requests (prompt text, ``max_tokens`` 1..32, stop sequences, temperature / top_p /
seed) and :mod:`pytest_llmserve.testing.properties` checks each one's invariants: no error, no NaN,
``max_tokens`` and stop sequences respected, usage consistent with the stream, streamed equal to
non-streamed when reproducible, seeded sampling repeatable. Examples are derandomized (the same ones in
every run, so CI is stable) and bounded (about 30 s on the CPU default); a failure is not shrunk, since
every extra example costs server time, and its message already holds the full request. A failure that
Hypothesis's replay does not reproduce (a sampled answer, a shared batch) is reported by its first
occurrence's evidence, never as a bare "Flaky" (:func:`pytest_llmserve.suite.first_failure_reported`).

Property examples judge each response on its own, so the plugin sends every example's requests ahead,
together with the server's other independent probes (``--llmserve-probe-concurrency``), by running these
tests once against a recording client: the same derandomized examples, drawn twice.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.suite import first_failure_reported, suite_requests
from pytest_llmserve.testing.properties import (
    ApiExample,
    api_examples,
    check_api_example,
    check_seeded_repeatable,
    seeded_examples,
)
from pytest_llmserve.verdicts.findings import OracleReport

pytestmark = [pytest.mark.llmserve_server("*"), pytest.mark.llmserve_correctness]

API_EXAMPLES = 15
SEEDED_EXAMPLES = 8

_SETTINGS = dict(deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate),
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _fail_unless_ok(report: OracleReport, server: RunningServer) -> None:
    if not report.ok:
        spec = server.spec_for_checks or server.spec
        # AssertionError, not pytest.fail: Hypothesis reports it with the falsifying example.
        raise AssertionError(report.message(spec.id) + f"\n{server.describe()}")


@suite_requests("properties", independent=True)
@first_failure_reported
@settings(max_examples=API_EXAMPLES, **_SETTINGS)  # type: ignore[arg-type]
@given(example=api_examples())
def test_api_invariants(llm_server: RunningServer, llm_client: LLMClient, example: ApiExample) -> None:
    """Each request, streamed and not: no error, no NaN, max_tokens and stop respected, usage consistent,
    and (greedy or seeded) the stream equals the non-streamed answer."""
    _fail_unless_ok(check_api_example(llm_client, example), llm_server)


@suite_requests("properties", independent=True)
@first_failure_reported
@settings(max_examples=SEEDED_EXAMPLES, **_SETTINGS)  # type: ignore[arg-type]
@given(example=seeded_examples())
def test_seeded_sampling_is_repeatable(llm_server: RunningServer, llm_client: LLMClient, example: ApiExample) -> None:
    """The same sampled request with the same seed, twice: the same tokens."""
    _fail_unless_ok(check_seeded_repeatable(llm_client, example), llm_server)
