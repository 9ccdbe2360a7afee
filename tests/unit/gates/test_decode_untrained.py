"""DecodeCheck on an untrained model: oracles that need a trained model are "not applicable" (recorded so,
skipped with a reason starting "not applicable:"), and batch cases compare each concurrent output with the
engine's own batch-1 answer without judging that reference's coherence first."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.gates.decode import DecodeCheck
from pytest_llmserve.verdicts.batch_sizes import BatchCase
from pytest_llmserve.verdicts.oracles import DEFAULT_BATCH_PROMPTS
from tests.unit.gates.test_decode import Failed, FakeHandle
from tests.unit.gates.test_decode_records import Skipped, finish
from tests.unit.gates.test_oracle_runs import FakeServer

UNTRAINED = ServerSpec(name="tiny", source="llmserve.toml", random_weights=True)
TRAINED = ServerSpec(name="smol", source="llmserve.toml")
CASE = BatchCase(size=3, kind="no-graph")


def checker(spec: ServerSpec, server: FakeServer) -> tuple[DecodeCheck, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    return DecodeCheck(FakeHandle(spec, server), records=records), records


@pytest.mark.parametrize(("method", "check"), [("known_answers", "known-answers"), ("coherent", "long-decode")])
def test_trained_model_oracles_are_not_applicable_and_send_nothing(method: str, check: str) -> None:
    server = FakeServer(garbage=True)  # random weights' text: would fail both on a trained model
    decode, records = checker(UNTRAINED, server)
    getattr(decode, method)()
    with pytest.raises(Skipped) as skipped:
        finish(decode)
    assert str(skipped.value).startswith(f"not applicable: {check} on tiny: ")
    assert "random_weights = true declared in llmserve.toml for server 'tiny'" in str(skipped.value)
    assert [(r["check"], r["verdict"], r["declared"]) for r in records] == [(check, "not-applicable", True)]
    assert server.requests == []


def test_a_not_applicable_check_in_a_chain_does_not_hide_the_next_one() -> None:
    # The chain: coherent() is not applicable untrained; the batch coverage after it still runs and
    # still catches a divergence.
    decode, records = checker(UNTRAINED, FakeServer(garbage=True, flip_concurrent=True))
    with pytest.raises(Failed):
        decode.coherent().batch_case(CASE)
    assert [(r["check"], r["verdict"]) for r in records] == [("long-decode", "not-applicable"),
                                                             (f"batch[{CASE.id}]", "fail")]


def test_on_a_trained_model_the_same_output_still_fails() -> None:
    decode, records = checker(TRAINED, FakeServer(garbage=True))
    with pytest.raises(Failed):
        decode.coherent()
    assert records[-1]["verdict"] == "fail"


def test_nan_and_determinism_run_as_on_any_model() -> None:
    decode, records = checker(UNTRAINED, FakeServer(garbage=True))
    decode.deterministic()
    assert [(r["check"], r["verdict"]) for r in records] == [("determinism", "pass")]


def test_batch_cases_compare_with_the_engines_own_bs1_answers_untrained() -> None:
    server = FakeServer(garbage=True)
    decode, records = checker(UNTRAINED, server)
    decode.batch_case(CASE)
    report = decode.reports[-1]
    assert report.ok and not [f for f in report.findings if f.oracle == "coherence"]
    # The bs=1 reference (one request per prompt), then the batch of three: every answer compared.
    assert len(server.requests) == len(DEFAULT_BATCH_PROMPTS) + CASE.size
    assert records[-1]["verdict"] == "pass"
    assert "not judged (not applicable: random_weights = true declared in llmserve.toml" in records[-1]["detail"]


def test_a_divergence_is_still_caught_on_an_untrained_model() -> None:
    decode, records = checker(UNTRAINED, FakeServer(garbage=True, flip_concurrent=True))
    with pytest.raises(Failed):
        decode.batch_case(CASE)
    assert any(f.oracle == "differential" for f in decode.reports[-1].errors)
    assert records[-1]["verdict"] == "fail"


def test_on_a_trained_model_the_references_coherence_is_a_separate_finding_beside_the_comparisons() -> None:
    decode, records = checker(TRAINED, FakeServer(garbage=True, flip_concurrent=True))
    with pytest.raises(Failed):
        decode.batch_case(CASE)
    findings = decode.reports[-1].errors
    assert any(f.oracle == "coherence" and f.message.startswith("bs=1 reference: ") for f in findings)
    assert any(f.oracle == "differential" for f in findings)  # the comparisons ran too


class NanWhileAlone(FakeServer):
    """NaN (HTTP 400) for one prompt while the bs=1 reference is sent, healthy in the batch after it."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        if len(self.requests) >= len(DEFAULT_BATCH_PROMPTS):
            self.nan_prompts = ()
        return super().handle(request)


def test_a_reference_with_nan_makes_the_comparison_impossible_and_says_so() -> None:
    decode, _records = checker(UNTRAINED, NanWhileAlone(nan_prompts=(DEFAULT_BATCH_PROMPTS[0].text,)))
    with pytest.raises(Failed):
        decode.batch_case(CASE)
    messages = [f.message for f in decode.reports[-1].errors]
    assert any(m.startswith("bs=1 reference: ") for m in messages)
    assert any(m.startswith("no comparison with the bs=1 reference") for m in messages)
