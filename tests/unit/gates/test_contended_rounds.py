"""A busy host never makes a verdict: contended rounds are not samples, and a host that stays busy is
"confounded: host busy" naming the processes, never REGRESSED. Stand-in rounds carry a host-contention record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.bench_face import BenchFace
from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.rounds import (
    HOST_CONTENTION,
    MAX_CONTENDED_ROUNDS,
    Contended,
    Invalid,
    Measured,
    judge_round,
)
from pytest_llmserve.load.contention import BusyProcess, HostContention
from pytest_llmserve.load.metrics import Blame, InvalidReason
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.text import format_markdown
from pytest_llmserve.settings import BenchSpec, Sources, bench_spec, resolve_settings
from tests.unit.gates.standins import (
    CONTAMINATED,
    FAILED_REQUESTS,
    SPEC,
    TIMING_ARTEFACT,
    StandinResult,
    StandinServer,
    stand_in_gate,
)

# The synthetic rounds of one stand-in do not differ between runs: the spread between runs (a prior with a one-run
# baseline) is tests/unit/verdicts/test_between_runs.py's subject, not this file's.
GATE = BenchSpec(workload="tiny", metric="output_throughput", tolerance=0.10, rounds=2, max_rounds=8, alpha=0.02,
                 warmup_rounds=0, contention_bound=0.10, between_run_sd=0.0)
BURNER = 4242


def _host(share: float) -> HostContention:
    top = [BusyProcess(BURNER, "python", share * 20.0, share)] if share > 0.02 else []
    return HostContention(share=share, seconds=10.0, cores=2, samples=11, top=top,
                          by_command=[("python", share, 1)] if top else [])


@dataclass
class Rounds:
    """Round k returns ``figures[k]`` measured under ``contention[k]`` (a share of the machine)."""

    figures: Sequence[float]
    contention: Sequence[float]
    calls: list[int] = field(default_factory=list)

    def __call__(self, server: Any, workload: Any, prompts: Any) -> StandinResult:
        k = len(self.calls)
        self.calls.append(k)
        return StandinResult({"output_throughput": self.figures[k]}, _host(self.contention[k]))


def gate(tmp_path: Path, rounds: Rounds, *, save: bool = False,
         first_look: int | None = None) -> tuple[BenchFace, list[BenchOutcome], list[str]]:
    spec = replace(GATE, rounds=first_look) if first_look is not None else GATE
    return stand_in_gate(tmp_path, rounds, options=spec, save=save)


def test_a_contended_round_is_not_a_sample_and_is_measured_again(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 55.0, 101.0], [0.01, 0.47, 0.02])
    bench, recorded, said = gate(tmp_path, rounds)
    outcome = bench.run()
    assert outcome.status == "no-baseline"
    assert outcome.samples["output_throughput"] == [100.0, 101.0]  # the 55 never reaches the figures
    assert outcome.samples[HOST_CONTENTION] == [0.01, 0.02]  # stored with each sample
    assert len(outcome.contended_rounds) == 1
    assert outcome.contended_rounds[0].reason.startswith(
        "confounded: host busy: other processes took 47.0% of the machine's 2 cores during the round (bound 10%): "
        f"pid {BURNER} python (47.0%); by command: python 47.0% (1 process)")
    assert any("is not a sample: confounded: host busy" in line for line in said)
    assert outcome.contended_rounds[0].round == "benchmark round 2 on cpu"
    assert any(line.startswith("benchmark round 2 on cpu (again: 1 contended so far): host contention")
               for line in said), said
    # The round's terminal line shows its contention; the reports carry the column and the discarded round.
    assert any(line.endswith("host contention 1.0% of the machine (2 cores, 10.0 s): no other process used CPU")
               for line in said)
    markdown = format_markdown([BenchOutcome.from_json(recorded[-1].to_json())])
    assert "host contention" in markdown and "2.0%" in markdown and f"pid {BURNER} python" in markdown


def test_a_busy_host_is_confounded_never_regressed(tmp_path: Path) -> None:
    baseline = Rounds([100.0, 101.0, 99.0, 100.5, 100.2], [0.01] * 5)
    gate(tmp_path, baseline, save=True)[0].run()
    # Every round now runs beside a CPU-bound process, and is slow: from these alone a verdict would say REGRESSED.
    busy = Rounds([55.0] * 10, [0.47] * 10)
    # Under pytest the gate skips (no verdict either way).
    bench, recorded, _ = gate(tmp_path, busy)
    with pytest.raises(pytest.skip.Exception) as skipped:
        bench.run()
    message = str(skipped.value)
    assert f"confounded: host busy: {MAX_CONTENDED_ROUNDS} rounds discarded" in message
    assert f"pid {BURNER} python (47.0%)" in message and "REGRESSED" not in message
    assert len(busy.calls) == MAX_CONTENDED_ROUNDS
    assert recorded[-1].status == "confounded" and recorded[-1].error is None
    assert recorded[-1].samples == {}
    report = BenchOutcome.from_json(recorded[-1].to_json())
    assert (report.status, report.failed) == ("confounded", False)
    assert BenchOutcome.from_dict(report.to_dict()).status == "confounded"
    # The gate itself never calls pytest: it returns the outcome and what it means for a test.
    core = gate(tmp_path, Rounds([55.0] * 10, [0.47] * 10))[0].gate.run()
    assert core.status == "confounded" and core.ending is not None and core.ending.action == "skip"
    assert "confounded: host busy" in core.ending.message


def test_clean_rounds_between_busy_ones_are_judged_alone(tmp_path: Path) -> None:
    gate(tmp_path, Rounds([100.0, 101.0, 99.0, 100.5, 100.2], [0.01] * 5), save=True)[0].run()
    # Clean rounds enough for the rule's last look (across runs, a one-run baseline may need them all).
    mixed = Rounds([55.0, 100.4, 56.0, 99.8, 100.1, 100.0, 99.9, 100.2, 100.3, 99.7], [0.47, 0.01, 0.5] + [0.02] * 7)
    outcome = gate(tmp_path, mixed)[0].run()
    assert outcome.samples["output_throughput"][:2] == [100.4, 99.8]
    assert not {55.0, 56.0} & set(outcome.samples["output_throughput"])
    assert outcome.status != "regressed" and len(outcome.contended_rounds) == 2


def test_a_clear_regression_in_the_clean_rounds_before_a_busy_host_fails_and_the_report_shows_both(
        tmp_path: Path) -> None:
    """Issue 35: evidence is not thrown away. With a first look at round 3, two clean rounds 30 % slow and then a busy
    host: before, "confounded" (skipped) hid the drop; now the clean rounds are judged first."""
    gate(tmp_path, Rounds([100.0, 101.0, 99.0, 100.5, 100.2], [0.01] * 5), save=True)[0].run()
    slow_then_busy = Rounds([70.0, 70.5, 55.0, 55.0, 55.0], [0.01, 0.02, 0.47, 0.47, 0.47])
    bench, recorded, _ = gate(tmp_path, slow_then_busy, first_look=3)
    with pytest.raises(pytest.fail.Exception) as failed:
        bench.run()
    message = str(failed.value)
    assert "regressed in the clean rounds before the host got busy" in message
    assert f"confounded: host busy: {MAX_CONTENDED_ROUNDS} rounds discarded" in message
    assert "the 2 clean round(s) measured before the host got busy, judged alone: regressed" in message
    assert recorded[-1].verdict is not None and recorded[-1].verdict.outcome == "regressed"
    assert recorded[-1].samples["output_throughput"] == [70.0, 70.5]


def test_clean_rounds_that_agree_before_a_busy_host_stay_confounded_with_their_verdict_shown(tmp_path: Path) -> None:
    gate(tmp_path, Rounds([100.0, 101.0, 99.0, 100.5, 100.2], [0.01] * 5), save=True)[0].run()
    fine_then_busy = Rounds([100.3, 99.9, 55.0, 55.0, 55.0], [0.01, 0.02, 0.47, 0.47, 0.47])
    bench, recorded, _ = gate(tmp_path, fine_then_busy, first_look=3)
    with pytest.raises(pytest.skip.Exception) as skipped:
        bench.run()
    assert "judged alone: " in str(skipped.value) and "judged alone: regressed" not in str(skipped.value)
    assert recorded[-1].status == "confounded"


def _settings(tmp_path: Path, cli: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Any:
    return resolve_settings(tmp_path, Sources(cli=cli or {}, ini={}, env=env or {}),
                            lambda: ServerSpec(name="default", engine="vllm", model="/m"))


def test_the_bound_is_a_setting_from_every_source_and_the_marker(tmp_path: Path) -> None:
    assert _settings(tmp_path).bench.contention_bound == 0.10
    assert _settings(tmp_path, cli={"contention_bound": "0.2"}).bench.contention_bound == 0.2
    assert _settings(tmp_path, env={"PYTEST_LLMSERVE_CONTENTION_BOUND": "0.3"}).bench.contention_bound == 0.3
    assert bench_spec(_settings(tmp_path), (), {"contention_bound": 0.25}, where="W").contention_bound == 0.25
    with pytest.raises(ConfigError, match=r"--llmserve-contention-bound = '2': must be a fraction below 1"):
        _settings(tmp_path, cli={"contention_bound": "2"})


# --------------------------------------------------------------------------- invalid rounds on a busy host

class RoundServer(StandinServer):
    """The stand-in server with what the real round (measure_round) reads: no lock, no accounting, no process."""

    spec_for_checks = SPEC  # the engine's metric names (vLLM's)
    base_url = "http://127.0.0.1:9"
    model_name = "m"
    accounting = None
    request_lock = None
    server_pid = None
    gpu_scope = None

    def ensure_alive(self) -> None:
        return None


@pytest.mark.parametrize(("reason", "share", "bound", "kind"), [
    (CONTAMINATED, 0.47, 0.10, Contended),   # only artefacts, on a busy host: measured again as contended
    (CONTAMINATED, 0.01, 0.10, Invalid),     # artefacts on a quiet host: invalid (run again as an artefact)
    (FAILED_REQUESTS, 0.47, 0.10, Invalid),  # the server's output was wrong: never blamed on the host
    (CONTAMINATED, 0.47, None, Invalid),     # a caller that does not judge contention (the build runner)
    (TIMING_ARTEFACT, 0.01, 0.10, Measured),  # chunk timing only: a sample of throughput, its timing withheld
], ids=["artefact-busy", "artefact-quiet", "output-fault-busy", "no-bound", "timing-quiet"])
def test_a_round_is_judged_from_its_typed_reasons_and_the_host(reason: InvalidReason, share: float,
                                                               bound: float | None, kind: type) -> None:
    result = StandinResult.invalid({"output_throughput": 50.0, "mean_tpot_ms": 0.0}, reason, host=_host(share))
    got = judge_round(result, "round 1", metric="output_throughput", contention_bound=bound)
    assert isinstance(got, kind), got
    if isinstance(got, Invalid):
        assert got.reasons == (reason,) and "round 1 is INVALID (not a number)" in got.describe()
        assert got.server_fault is (reason.blame is Blame.SERVER)
    if isinstance(got, Measured):
        assert got.samples["output_throughput"] == 50.0 and "mean_tpot_ms" not in got.samples
        assert got.unmeasured == (reason,)


def test_artefact_rounds_on_a_busy_host_are_confounded_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_llmserve.gates import rounds as rounds_module

    # Seen as a limit on 2 cores: a starved client's merged chunks made a round invalid while a burner ran; the
    # gate ran it again twice as an artefact and then failed the benchmark as an error, blaming the server.
    calls: list[str] = []

    def busy_invalid(*args: Any, **kwargs: Any) -> StandinResult:
        calls.append("round")
        return StandinResult.invalid({"output_throughput": 50.0}, CONTAMINATED, host=_host(0.47))

    monkeypatch.setattr(rounds_module, "run_workload", busy_invalid)
    bench, recorded, _ = stand_in_gate(tmp_path, rounds_module.measure_round, options=GATE, server=RoundServer())
    with pytest.raises(pytest.skip.Exception) as skipped:
        bench.run()
    message = str(skipped.value)
    assert f"confounded: host busy: {MAX_CONTENDED_ROUNDS} rounds discarded" in message
    assert "measurement artefacts, likelier the busy host's than the server's" in message and CONTAMINATED in message
    assert len(calls) == MAX_CONTENDED_ROUNDS and not bench.gate.discarded_rounds
    assert recorded[-1].status == "confounded" and recorded[-1].error is None
