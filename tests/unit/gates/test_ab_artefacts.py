"""The A/B runner runs a round again when it is invalid only for measurement artefacts of the machine, like the
gate: seen in CI on 2 cores (an A/B of the CPU default, eager against compiled), one round with 7 of 8 requests'
chunks in one read failed the comparison while the gated benchmark of the same run discarded such a round.
Stand-in rounds: a starved client cannot be produced on demand on a real server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.bench_face import ABFace
from pytest_llmserve.config import ServerSpec, config_from_table
from pytest_llmserve.gates import ab
from pytest_llmserve.gates.rounds import ARTEFACT_RETRIES, Invalid
from pytest_llmserve.load.metrics import Blame, InvalidReason
from pytest_llmserve.report.outcome import BenchOutcome
from tests.unit.gates.standins import StandinClient, StandinResult

CFG = config_from_table({"servers": {"a": {"engine": "vllm", "model": "/models/m"},
                                     "b": {"engine": "vllm", "model": "/models/m", "args": ["--enforce-eager"]}},
                         "workloads": {"tiny": {"num_prompts": 8, "input_len": 32, "output_len": 32}}},
                        "llmserve.toml")
# A round-wide artefact (run again) and a fault of the server's output, classified as load/metrics classifies them.
ARTEFACT = InvalidReason("client 90.0 tok/s vs server counter 100.0 tok/s: -10.0% (DISAGREE, bound ±3%)",
                         Blame.MACHINE)
FAULT = InvalidReason("8 of 8 requests generated tokens but no text (every content chunk empty)", Blame.SERVER)


@dataclass
class _Server:
    spec: ServerSpec

    @property
    def server_pid(self) -> int | None:
        return None  # no process to wait for

    def client(self) -> StandinClient:
        return StandinClient()

    def describe(self) -> str:
        return f"stand-in {self.spec.id}"


class _Pool:
    def get(self, spec: ServerSpec, *, keep: tuple[ServerSpec, ...] = ()) -> _Server:
        return _Server(spec)


@dataclass
class Rounds:
    """Round k (in call order, A and B interleaved) is invalid with ``invalid_for[k]``, else measures 100."""

    invalid_for: dict[int, tuple[InvalidReason, ...]]
    calls: list[str] = field(default_factory=list)

    def __call__(self, server: Any, workload: Any, prompts: Any) -> StandinResult:
        self.calls.append(server.spec.id)
        reasons = self.invalid_for.get(len(self.calls) - 1)
        if reasons is not None:
            return StandinResult.invalid({"output_throughput": 100.0}, *reasons)
        return StandinResult({"output_throughput": 100.0})


def compare(tmp_path: Path, rounds: Rounds) -> tuple[list[BenchOutcome], list[str]]:
    recorded: list[BenchOutcome] = []
    said: list[str] = []
    runner = ab.ABRunner(pool=_Pool(), cfg=CFG, test_id="test_ab", results_dir=tmp_path,  # type: ignore[arg-type]
                         measure=rounds)
    ABFace(runner, record=recorded.append, say=said.append).run("a", "b", workload="tiny", rounds=3, warmup_rounds=0)
    return recorded, said


def test_an_artefact_round_of_an_ab_is_run_again_said_and_recorded(tmp_path: Path) -> None:
    rounds = Rounds({2: (ARTEFACT,)})
    recorded, said = compare(tmp_path, rounds)
    assert len(rounds.calls) == 7  # 3 a side and the discarded one
    assert rounds.calls[2] == rounds.calls[3] == "a"
    outcome = recorded[-1]
    assert [(d.round, d.reasons) for d in outcome.discarded_rounds] == [("A/B round 2 on A (a)", (ARTEFACT,))]
    assert len(outcome.baseline_samples) == 3 and outcome.rounds == 3
    assert any("discarded and run again (1 of 2 allowed)" in line for line in said), said
    assert BenchOutcome.from_json(outcome.to_json()).discarded_rounds == outcome.discarded_rounds


def test_an_output_fault_fails_the_ab_at_once(tmp_path: Path) -> None:
    rounds = Rounds({1: (ARTEFACT, FAULT)})
    with pytest.raises(pytest.fail.Exception, match="generated tokens but no text"):
        compare(tmp_path, rounds)
    assert len(rounds.calls) == 2


def test_artefacts_beyond_the_retries_fail_the_ab_and_the_error_is_recorded(tmp_path: Path) -> None:
    rounds = Rounds({k: (ARTEFACT,) for k in range(1, 2 + ARTEFACT_RETRIES)})
    recorded: list[BenchOutcome] = []
    runner = ab.ABRunner(pool=_Pool(), cfg=CFG, test_id="test_ab", results_dir=tmp_path,  # type: ignore[arg-type]
                         measure=rounds)
    with pytest.raises(pytest.fail.Exception, match="DISAGREE"):
        ABFace(runner, record=recorded.append, say=lambda _: None).run("a", "b", workload="tiny", rounds=3,
                                                                       warmup_rounds=0)
    assert len(rounds.calls) == 2 + ARTEFACT_RETRIES  # the first round, the discarded ones, the failing one
    # The runner says which side ended it, as a value (the build runner acts on it), and the report has the error.
    assert runner.stop is not None and runner.stop.side == "B" and isinstance(runner.stop.stop, Invalid)
    assert recorded[-1].status == "error" and "A/B round 1 on B (b) is INVALID" in (recorded[-1].error or "")
