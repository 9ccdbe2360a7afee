"""Which tests' independent probes go together: made once per server, planned once by a dry run of each
test in scope, sent in one batch, each test's answers handed to it (stand-in servers, no pytest items)."""

from __future__ import annotations

from typing import Any

from pytest_llmserve.config import ServerSpec
from pytest_llmserve.evidence.client import LLMClient
from pytest_llmserve.gates.prefetch import ProbeTest, dry_run, prefetched, server_probes
from pytest_llmserve.gates.probes import ServerProbes
from tests.unit.gates.test_oracle_runs import FakeServer
from tests.unit.gates.test_probes import LoggedHandle

SPEC = ServerSpec(name="s")


class Facts:
    max_batch_size = 6


class ReportingHandle(LoggedHandle):
    facts_read = 0

    def facts(self) -> Facts:
        self.facts_read += 1
        return Facts()


def test_probes_are_made_once_per_server_within_its_reported_batch_capacity() -> None:
    made: dict[str, ServerProbes] = {}
    server: Any = ReportingHandle(SPEC, FakeServer())  # a stand-in for the RunningServer it is passed as
    probes = server_probes(made, server, SPEC, 16)
    assert probes.concurrency == 6 and server_probes(made, server, SPEC, 16) is probes
    again: Any = ReportingHandle(SPEC, FakeServer())  # the configuration booted again: a new server
    assert server_probes(made, again, SPEC, 16) is not probes
    one_at_a_time: Any = ReportingHandle(SPEC, FakeServer())
    assert server_probes({}, one_at_a_time, SPEC, 1).concurrency == 1
    assert one_at_a_time.facts_read == 0  # the server's capacity is not asked for when it cannot matter


def _asks(question: str) -> Any:
    def test(llm_client: LLMClient) -> None:
        llm_client.complete(question, 4, temperature=0.0, logprobs=None, seed=None)

    return test


def test_the_first_test_plans_and_sends_its_scope_together_the_others_find_their_answers() -> None:
    server: Any = LoggedHandle(SPEC, FakeServer())  # a stand-in for the RunningServer it is passed as
    probes = ServerProbes(server, 4)
    scope = [ProbeTest("t1", _asks("one"), "probes"), ProbeTest("t2", _asks("two"), "probes")]
    asked: list[int] = []

    def in_scope() -> list[ProbeTest]:
        asked.append(1)
        return scope

    first = prefetched(probes, "t1", server, in_scope)
    assert first is not None and len(first) == 1
    assert [batch.size for batch in probes.batches] == [2]  # both tests' requests in one batch
    second = prefetched(probes, "t2", server, in_scope)
    assert second is not None and len(second) == 1
    assert len(asked) == 1 and len(probes.batches) == 1  # planned and sent once


def test_one_at_a_time_nothing_is_planned() -> None:
    server: Any = LoggedHandle(SPEC, FakeServer())  # a stand-in for the RunningServer it is passed as
    assert prefetched(ServerProbes(server, 1), "t1", server, lambda: [ProbeTest("t1", _asks("one"), "probes")]) is None


def test_a_dry_run_calls_only_a_test_whose_fixtures_it_can_stand_in_for() -> None:
    server: Any = LoggedHandle(SPEC, FakeServer())  # a stand-in for the RunningServer it is passed as
    called: list[str] = []

    def uses_planning_fixtures(llm_server: Any, llm_client: Any, decode_check: Any) -> None:
        called.append("planned")

    def needs_another(llm_client: Any, tmp_path: Any) -> None:
        called.append("unexpected")

    recorder = LLMClient("http://planning.invalid", "m")
    dry_run(uses_planning_fixtures, server, recorder)
    dry_run(needs_another, server, recorder)
    dry_run(None, server, recorder)
    recorder.close()
    assert called == ["planned"]
