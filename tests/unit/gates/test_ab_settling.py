"""Before each A/B round the other side's server is let go quiet: its workers keep polling for work after their
last request, and a round beside them would count them as host contention (seen on a 2-core host: three rounds of
an A/B of the CPU default discarded as confounded by the other side's ``VLLM::Worker``). Stand-in servers and
rounds: what is asserted is which process is waited for, before which round, and what is said when it stays busy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.bench_face import ABFace
from pytest_llmserve.config import ServerSpec
from pytest_llmserve.gates import ab
from pytest_llmserve.load.contention import Settling
from tests.unit.gates.test_ab_artefacts import CFG, Rounds
from tests.unit.gates.test_ab_artefacts import _Server as _ServerWithoutPid

PIDS = {"a": 1001, "b": 1002}


class _Server(_ServerWithoutPid):
    @property
    def server_pid(self) -> int:
        return PIDS[self.spec.name]


class _Pool:
    def get(self, spec: ServerSpec, *, keep: tuple[ServerSpec, ...] = ()) -> _Server:
        return _Server(spec)


def run_ab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settled: bool) -> tuple[list[str], list[str]]:
    """The A/B's events in order (``round ...`` and ``wait <pid> <bound>``) and what it said."""
    events: list[str] = []
    rounds = Rounds({})

    def measure(server: Any, workload: Any, prompts: Any) -> Any:
        events.append(f"round on {server.spec.id}")
        return rounds(server, workload, prompts)

    def wait(pid: int | None, *, bound: float) -> Settling:
        events.append(f"wait {pid} {bound:.2f}")
        return Settling(5.0, settled, 0.0 if settled else 0.21)

    monkeypatch.setattr(ab, "wait_until_quiet", wait)
    said: list[str] = []
    runner = ab.ABRunner(pool=_Pool(), cfg=CFG, test_id="test_ab", results_dir=tmp_path,  # type: ignore[arg-type]
                         measure=measure)
    ABFace(runner, record=lambda _outcome: None, say=said.append).run("a", "b", workload="tiny", rounds=3,
                                                                      warmup_rounds=0, contention_bound=0.10)
    return events, said


def test_each_round_waits_for_the_other_side_at_half_the_contention_bound(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    events, said = run_ab(tmp_path, monkeypatch, settled=True)
    assert events[:4] == ["wait 1002 0.05", "round on a", "wait 1001 0.05", "round on b"]
    assert len(events) == 12  # 3 rounds a side, each after its wait
    assert not [line for line in said if "go quiet" in line], said


def test_a_side_that_stays_busy_is_said_and_the_round_still_measured(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    events, said = run_ab(tmp_path, monkeypatch, settled=False)
    assert sum(event.startswith("round") for event in events) == 6
    assert ("A/B: b still took 21.0% of the machine after 5.0 s of waiting for it to go quiet; the round on a is "
            "measured anyway, its host contention judged") in said
