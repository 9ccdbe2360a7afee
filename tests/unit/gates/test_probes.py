"""Independent probes sent together: the concurrency bound, planning by a dry run, answers given once, and
the same findings as the checks sending their requests one at a time (stand-in servers, no engine)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import RequestError
from pytest_llmserve.evidence.client import LLMClient, ProbeRequest, StreamedCompletion
from pytest_llmserve.evidence.completion import Completion
from pytest_llmserve.gates.decode import CheckFailed, DecodeCheck
from pytest_llmserve.gates.probes import (
    DEFAULT_PROBE_CONCURRENCY,
    AnswerBook,
    RecordingClient,
    ServerProbes,
    concurrency_bound,
    plan,
)
from pytest_llmserve.suite import test_llmserve_properties as suite_properties
from pytest_llmserve.testing.properties import ApiExample, check_api_example, check_seeded_repeatable
from pytest_llmserve.verdicts.batch_sizes import BatchCase
from pytest_llmserve.verdicts.findings import OracleReport
from tests.unit.gates.test_decode import Failed, FakeHandle
from tests.unit.gates.test_oracle_runs import FakeServer


class LoggedHandle(FakeHandle):
    """A stand-in server with a log and /metrics, counting what reached it."""

    model_name = "m"

    def log_text(self) -> str:
        return ""

    def metrics_text(self) -> str | None:
        return None


# ------------------------------------------------------------------------------------------ the bound

def test_bound_is_the_servers_batch_capacity_capped_by_the_setting() -> None:
    assert concurrency_bound(None) == DEFAULT_PROBE_CONCURRENCY == 8  # capacity unknown
    assert concurrency_bound(None, configured=4, reported=256) == 4  # configured wins over reported
    assert concurrency_bound(None, reported=256) == 256
    assert concurrency_bound(16, reported=6) == 6  # never above the server's batch capacity
    assert concurrency_bound(3, reported=256) == 3
    assert concurrency_bound(1, configured=64) == 1  # one at a time, as before


class SlowClient(LLMClient):
    """Answers after a short wait and records the most requests it had in flight at once."""

    def __init__(self, lock: Any = None) -> None:
        super().__init__("http://stand-in", "m", request_lock=lock)
        self.in_flight = 0
        self.most_in_flight = 0
        self.sent: list[str] = []
        self._count = threading.Lock()

    def post_json(self, path: str, body: dict[str, Any], timeout_s: float | None = None, *,
                  kind: str | None = None) -> Completion:
        with self._count:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(0.02)
        with self._count:
            self.in_flight -= 1
            self.sent.append(body["prompt"])
        if body["prompt"] == "refused":
            raise RequestError("connection refused")
        return Completion(request=body, status=200, text=f"answer to {body['prompt']}")

    def metrics_text(self) -> str | None:
        return None


class CountingLock:
    def __init__(self) -> None:
        self.taken = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        self.taken += 1
        yield

    def acquire_shared(self) -> None:
        self.taken += 1

    def release_shared(self) -> None:
        pass


def _requests(n: int) -> list[ProbeRequest]:
    return [ProbeRequest("post", "/v1/completions", {"prompt": f"p{i}", "max_tokens": 4}) for i in range(n)]


@pytest.mark.parametrize("concurrency", [1, 3])
def test_send_keeps_at_most_the_bound_in_flight_under_one_shared_lock(concurrency: int) -> None:
    lock = CountingLock()
    client = SlowClient(lock)
    probes = ServerProbes(LoggedHandle(ServerSpec(name="s"), FakeServer()), concurrency)
    answers, batch = probes.send(_requests(12), client)
    assert client.most_in_flight == concurrency  # reaches the bound, never passes it
    assert [a.text for a in answers if isinstance(a, Completion)] == [f"answer to p{i}" for i in range(12)]
    assert (batch.size, batch.concurrency) == (12, concurrency)
    assert lock.taken == 1  # the whole batch under one shared hold: no benchmark round inside it


def test_a_transport_failure_is_kept_and_raised_again_when_its_answer_is_read() -> None:
    client = SlowClient()
    probes = ServerProbes(LoggedHandle(ServerSpec(name="s"), FakeServer()), 4)
    [refused] = plan(lambda c: c.complete("refused", 4, temperature=0.0, logprobs=None, seed=None), "m")
    answers, _ = probes.send([refused, *_requests(2)], client)
    assert isinstance(answers[0], RequestError)
    assert len(client.sent) == 3  # the others were still sent
    book = AnswerBook()
    book.put(refused.key, answers[0])
    replay = SlowClient()
    replay.answers = book
    with pytest.raises(RequestError, match="connection refused"):
        replay.complete("refused", 4, temperature=0.0, logprobs=None, seed=None)
    assert replay.sent == []


# ------------------------------------------------------------------------------------------ plan and answers

def test_plan_records_what_a_check_sends_and_the_placeholder_breaks_no_invariant() -> None:
    example = ApiExample("The weather today is", 5, stop=(".",), temperature=0.7, seed=3)
    planned: list[OracleReport] = []
    requests = plan(lambda client: planned.append(check_api_example(client, example)), "m", "properties")
    assert [(r.mode, r.kind) for r in requests] == [("post", "properties"), ("stream", "properties")]
    assert requests[0].body["prompt"] == "The weather today is" and requests[0].body["stop"] == ["."]
    assert planned[0].ok, planned[0].message()  # a check that stops at its first failure plans every request
    seeded = plan(lambda client: check_seeded_repeatable(client, example), "m")
    assert len(seeded) == 2 and seeded[0].key == seeded[1].key  # the same request twice: two answers needed


def test_the_same_request_twice_gets_its_own_two_answers_in_order() -> None:
    book = AnswerBook()
    key = ProbeRequest("post", "/v1/completions", {"prompt": "x"}).key
    first, second = (Completion(request={}, status=200, text=t) for t in ("one", "two"))
    book.put(key, first)
    book.put(key, second)
    assert len(book) == 2
    assert book.take(key) is first and book.take(key) is second and book.take(key) is None


def test_the_suite_property_tests_plan_the_same_examples_each_time() -> None:
    # The prefetch runs each property test once against a recorder and the real run draws again: both
    # must draw the same (derandomized) examples, or the answers sent ahead would go unused.
    def dry_run() -> list[ProbeRequest]:
        return plan(lambda client: suite_properties.test_api_invariants(llm_server=None, llm_client=client),
                    "m", "properties")

    first, second = dry_run(), dry_run()
    assert len(first) == 2 * suite_properties.API_EXAMPLES  # every example: non-streamed and streamed
    assert [r.key for r in first] == [r.key for r in second]
    seeded = plan(lambda client: suite_properties.test_seeded_sampling_is_repeatable(llm_server=None,
                                                                                     llm_client=client), "m")
    assert len(seeded) == 2 * suite_properties.SEEDED_EXAMPLES


def test_recording_client_sends_nothing() -> None:
    recorder = RecordingClient("m", "probes")
    out = recorder.stream({"model": "m", "prompt": "hi", "max_tokens": 3})
    assert isinstance(out, StreamedCompletion) and out.done
    assert recorder.metrics_text() is None and recorder.tokenize("hi") is None
    assert [r.mode for r in recorder.planned] == ["stream"]


# ------------------------------------------------------------------------------------------ same findings

def _reports(fake: FakeServer, probes: ServerProbes | None) -> list[str]:
    handle = LoggedHandle(ServerSpec(name="s"), fake)
    if probes is not None:
        probes.server = handle
    check = DecodeCheck(handle, probes=probes)
    for method in ("no_nan", "known_answers", "coherent"):  # every check, whether the one before it failed or not
        with contextlib.suppress(CheckFailed):
            getattr(check, method)()
    return [r.message(full=True) for r in check.reports]


@pytest.mark.parametrize("make", [FakeServer, lambda: FakeServer(garbage=True),
                                  lambda: FakeServer(nan_prompts=("What is the capital of France? Answer in one "
                                                                  "word.", "The capital of France is"))],
                         ids=["healthy", "scrambled", "nan"])
def test_together_the_checks_find_what_they_find_one_at_a_time(make: Any) -> None:
    alone_server, together_server = make(), make()
    alone = _reports(alone_server, None)
    together = _reports(together_server, ServerProbes(None, 8))
    assert together == alone
    assert len(together_server.requests) == len(alone_server.requests)  # each request sent once
    assert sorted(map(str, together_server.requests)) == sorted(map(str, alone_server.requests))


def test_a_test_takes_its_prefetched_share_and_sends_nothing_more() -> None:
    fake = FakeServer(nan_prompts=("The capital of France is",))
    handle = LoggedHandle(ServerSpec(name="s"), fake)
    probes = ServerProbes(handle, 8)

    def dry_run(method: str) -> list[ProbeRequest]:
        return plan(lambda recorder: getattr(DecodeCheck(handle, planning=recorder), method)(),
                    "m", "probes")

    plans = {"test_no_nan": dry_run("no_nan"), "test_known_answers": dry_run("known_answers")}
    batch = probes.prefetch(plans)
    assert batch is not None and batch.size == sum(len(p) for p in plans.values())
    assert probes.prefetch(plans) is None  # planned once
    sent_ahead = len(fake.requests)
    known = DecodeCheck(handle, probes=probes, prefetched=probes.answers_for("test_known_answers"))
    with contextlib.suppress(CheckFailed):  # what is asserted is which requests went out, not the verdict
        known.known_answers()
    assert len(fake.requests) == sent_ahead  # all its answers were waiting
    nan = DecodeCheck(handle, probes=probes, prefetched=probes.answers_for("test_no_nan"))
    with pytest.raises(CheckFailed):
        nan.no_nan()
    assert len(fake.requests) == sent_ahead + 1  # only the follow-up that depends on an answer (HTTP 400)
    assert nan.reports[-1].errors and "HTTP 400" in nan.reports[-1].message()
    assert known.reports[-1].completions and all(c.ok for c in known.reports[-1].completions)
    assert len(probes.answers_for("test_no_nan")) == 0  # given once


def test_planning_concludes_nothing_and_skips_composition_controlled_checks() -> None:
    fake = FakeServer(garbage=True)
    handle = LoggedHandle(ServerSpec(name="s"), fake)
    recorder = RecordingClient("m", "probes")
    check = DecodeCheck(handle, planning=recorder)
    check.no_nan().known_answers().coherent().deterministic().batch_case(BatchCase(2, "no-graph"))
    assert fake.requests == [] and check.reports == []
    assert {r.body.get("max_tokens") for r in recorder.planned} >= {1, 256}  # NaN one-token probe, long decode
    with pytest.raises(Failed):  # outside planning a failure still fails
        DecodeCheck(handle, probes=ServerProbes(handle, 4)).coherent()
