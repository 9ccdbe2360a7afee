"""The A/B runner runs a round again when it is invalid only for measurement artefacts of the machine, like the
gate: seen in CI on 2 cores (an A/B of the CPU default, eager against compiled), one round with 7 of 8 requests'
chunks in one read failed the comparison while the gated benchmark of the same run discarded such a round.
Stand-in rounds: a starved client cannot be produced on demand on a real server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.config import ServerSpec, config_from_table
from pytest_llmserve.gates import ab
from pytest_llmserve.gates.rounds import ARTEFACT_RETRIES
from pytest_llmserve.report.outcome import BenchOutcome
from tests.unit.gates.standins import StandinClient

CFG = config_from_table({"servers": {"a": {"engine": "vllm", "model": "/models/m"},
                                     "b": {"engine": "vllm", "model": "/models/m", "args": ["--enforce-eager"]}},
                         "workloads": {"tiny": {"num_prompts": 8, "input_len": 32, "output_len": 32}}},
                        "llmserve.toml")
ARTEFACT = "7 of 8 requests have TPOT = 0 (all chunks in one read): the stream was buffered"
FAULT = "8 of 8 requests generated tokens but no text (every content chunk empty)"


@dataclass
class _Server:
    spec: ServerSpec

    def client(self) -> StandinClient:
        return StandinClient()


class _Pool:
    def get(self, spec: ServerSpec, *, keep: tuple[ServerSpec, ...] = ()) -> _Server:
        return _Server(spec)


@dataclass
class _Result:
    metrics: dict[str, float]
    host_contention: None = None  # not sampled: clean_round takes the round as it is


@dataclass
class Rounds:
    """Round k (in call order, A and B interleaved) is invalid with ``invalid_for[k]``, else measures 100."""

    invalid_for: dict[int, str]
    calls: list[str] = field(default_factory=list)

    def __call__(self, server: Any, workload: Any, prompts: Any, what: str, fail: Callable[[str], Any],
                 **_: Any) -> _Result:
        self.calls.append(what)
        reason = self.invalid_for.get(len(self.calls) - 1)
        if reason is not None:
            fail(f"{what} is INVALID (not a number):\n  - {reason}")
        return _Result({"output_throughput": 100.0})


def compare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: Rounds) -> tuple[list[BenchOutcome], list[str]]:
    monkeypatch.setattr(ab, "run_round", rounds)
    recorded: list[BenchOutcome] = []
    said: list[str] = []

    def fail(message: str) -> None:
        pytest.fail(message, pytrace=False)

    runner = ab.ABRunner(pool=_Pool(), cfg=CFG, test_id="test_ab", results_dir=tmp_path,  # type: ignore[arg-type]
                         record=recorded.append, fail=fail, say=said.append)
    runner.run("a", "b", workload="tiny", rounds=3, warmup_rounds=0)
    return recorded, said


def test_an_artefact_round_of_an_ab_is_run_again_said_and_recorded(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = Rounds({2: ARTEFACT})
    recorded, said = compare(tmp_path, monkeypatch, rounds)
    assert len(rounds.calls) == 7  # 3 a side and the discarded one
    assert rounds.calls[2] == rounds.calls[3] == "A/B round 2 on A (a)"
    outcome = recorded[-1]
    assert outcome.discarded_rounds == [{"round": "A/B round 2 on A (a)", "reasons": [ARTEFACT]}]
    assert len(outcome.baseline_samples) == 3 and outcome.rounds == 3
    assert any("discarded and run again (1 of 2 allowed)" in line for line in said), said
    assert BenchOutcome.from_json(outcome.to_json()).discarded_rounds == outcome.discarded_rounds


def test_an_output_fault_fails_the_ab_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = Rounds({1: f"{ARTEFACT}\n  - {FAULT}"})
    with pytest.raises(pytest.fail.Exception, match="generated tokens but no text"):
        compare(tmp_path, monkeypatch, rounds)
    assert len(rounds.calls) == 2


def test_artefacts_beyond_the_retries_fail_the_ab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds = Rounds({k: ARTEFACT for k in range(1, 2 + ARTEFACT_RETRIES)})
    with pytest.raises(pytest.fail.Exception, match="all chunks in one read"):
        compare(tmp_path, monkeypatch, rounds)
    assert len(rounds.calls) == 2 + ARTEFACT_RETRIES  # the first round, the discarded ones, the failing one
