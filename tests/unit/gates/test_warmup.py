"""The benchmark gate's warm-up and the between-round spread it reports, with a stand-in round runner: no engine.

Each stand-in round returns the next figure of a list (what a real round's ``output_throughput`` would be), so the
tests decide which rounds agree; the warm-up's time budget is read on a stand-in clock that each round advances.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.bench_face import BenchFace
from pytest_llmserve.config import ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.bench import WARMUP_BUDGET_S, relative_difference
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.load.metrics import InvalidReason
from pytest_llmserve.report.json import read_results_json, write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.session import format_text_summary
from pytest_llmserve.report.text import format_markdown
from pytest_llmserve.settings import BenchSpec, Sources, bench_spec, resolve_settings
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from pytest_llmserve.verdicts.stats import NOISY_CV
from tests.unit.gates.standins import (
    CFG,
    CONTAMINATED,
    DISAGREES,
    FAILED_REQUESTS,
    FAULT,
    SPEC,
    TEST_ID,
    TIMING_ARTEFACT,
    StandinResult,
    stand_in_gate,
)

# The synthetic rounds of one stand-in do not differ between runs: the spread between runs (a prior with a one-run
# baseline) is tests/unit/verdicts/test_between_runs.py's subject, not this file's.
GATE = BenchSpec(workload="tiny", metric="output_throughput", tolerance=0.10, rounds=2, max_rounds=8, alpha=0.02,
                 warmup_rounds=3, warmup_agreement=0.05, between_run_sd=0.0)


@dataclass
class Rounds:
    """The stand-in round: round k returns ``figures[k]`` and advances the clock by ``seconds``."""

    figures: Sequence[float]
    seconds: float = 10.0
    now: float = 0.0
    calls: list[tuple[Any, Any]] = field(default_factory=list)
    invalid_at: int | None = None  # the round (1-based) that comes back invalid: failed requests
    # Rounds (1-based call numbers) that come back invalid for these reasons instead (artefacts or faults).
    invalid_for: dict[int, tuple[InvalidReason, ...]] = field(default_factory=dict)

    def __call__(self, server: Any, workload: Any, prompts: Any) -> StandinResult:
        self.calls.append((workload, prompts))
        self.now += self.seconds
        value = self.figures[len(self.calls) - 1]
        figures = {"output_throughput": value, "mean_ttft_ms": 1000.0 / value}
        if self.invalid_at == len(self.calls):
            return StandinResult.invalid(figures, FAILED_REQUESTS)
        if len(self.calls) in self.invalid_for:
            return StandinResult.invalid(figures, *self.invalid_for[len(self.calls)])
        return StandinResult(figures)

    def clock(self) -> float:
        return self.now


def gate(tmp_path: Path, rounds: Rounds, *, options: BenchSpec = GATE, save: bool = False
         ) -> tuple[BenchFace, list[BenchOutcome], list[str]]:
    return stand_in_gate(tmp_path, rounds, options=options, save=save, clock=rounds.clock)


# --------------------------------------------------------------------------- the warm-up


def test_the_warm_up_stops_at_the_first_round_that_agrees_with_the_one_before_it(tmp_path: Path) -> None:
    # The H200 case: a cold first round at half speed, then warm rounds within 1 % of each other.
    rounds = Rounds([1118.0, 2217.0, 2230.0, 2221.0, 2226.0])
    bench, recorded, _ = gate(tmp_path, rounds)
    outcome = bench.run()
    warm = outcome.warmup
    assert warm is not None
    assert (warm.rounds, warm.settled, warm.values) == (2, True, [1118.0, 2217.0])
    assert warm.difference == pytest.approx(relative_difference(2217.0, 2230.0))
    # The agreeing round is the first measured one: 2 warm-up rounds, then the 2 measured rounds of the gate.
    assert outcome.samples["output_throughput"] == [2230.0, 2221.0]
    assert len(rounds.calls) == 4
    # Every round, warm-up included, sends the same workload and the very same prompts.
    assert len({id(prompts) for _, prompts in rounds.calls}) == 1
    assert {workload.name for workload, _ in rounds.calls} == {"tiny"}
    assert recorded[-1].warmup is warm and warm.note is None and "note" not in warm.to_dict()


def test_where_the_first_two_rounds_agree_the_warm_up_costs_one_round(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 102.0, 101.0])
    outcome = gate(tmp_path, rounds)[0].run()
    assert len(rounds.calls) == GATE.rounds + 1
    assert outcome.warmup is not None and (outcome.warmup.rounds, outcome.warmup.settled) == (1, True)
    assert outcome.samples["output_throughput"] == [102.0, 101.0]


def test_the_warm_up_continues_while_consecutive_rounds_disagree(tmp_path: Path) -> None:
    rounds = Rounds([50.0, 80.0, 95.0, 100.0, 101.0, 100.5])
    options = replace(GATE, warmup_rounds=6)
    outcome = gate(tmp_path, rounds, options=options)[0].run()
    # 80 is 60 % above 50, 95 19 % above 80, 100 5.3 % above 95: all beyond 5 %; 101 is within 1 % of 100.
    assert outcome.warmup is not None and outcome.warmup.values == [50.0, 80.0, 95.0, 100.0]
    assert outcome.warmup.settled is True
    assert outcome.samples["output_throughput"] == [101.0, 100.5]


def test_at_the_round_cap_the_warm_up_stops_and_the_result_says_it_did_not_settle(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 150.0] * 4)  # never two alike
    outcome = gate(tmp_path, rounds)[0].run()  # no baseline: a figure, not a failure
    warm = outcome.warmup
    assert warm is not None
    assert (warm.rounds, warm.settled) == (GATE.warmup_rounds, False)
    assert len(rounds.calls) == GATE.warmup_rounds + GATE.rounds
    assert warm.note is not None
    assert warm.note.startswith("warm-up did not settle: output_throughput of the first measured round")
    assert "warmup_rounds = 3" in warm.note and "50.0%" in warm.note
    assert outcome.status == "no-baseline"


def test_the_time_budget_stops_the_warm_up_before_the_round_cap(tmp_path: Path) -> None:
    # Rounds so long that two of them spend the budget: the second is measured though it disagrees.
    rounds = Rounds([100.0, 150.0, 151.0, 150.0], seconds=WARMUP_BUDGET_S * 0.6)
    outcome = gate(tmp_path, rounds, options=replace(GATE, warmup_rounds=10))[0].run()
    warm = outcome.warmup
    assert warm is not None
    assert (warm.rounds, warm.settled) == (1, False)
    assert "time budget" in (warm.note or "")
    assert outcome.samples["output_throughput"] == [150.0, 151.0]


def test_warmup_rounds_0_measures_from_the_first_round(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 150.0])
    outcome = gate(tmp_path, rounds, options=replace(GATE, warmup_rounds=0))[0].run()
    assert outcome.samples["output_throughput"] == [100.0, 150.0]
    assert outcome.warmup is not None
    assert outcome.warmup.settled is None and outcome.warmup.rounds == 0


def test_the_warm_up_runs_once_per_gate_not_again_for_the_extra_rounds(tmp_path: Path) -> None:
    bench, _, _ = gate(tmp_path, Rounds([100.0, 101.0, 102.0, 100.0, 99.0]))
    first, _ = bench.gate.measure(CFG.workload("tiny", where="t"), 2)
    more, _ = bench.gate.measure(CFG.workload("tiny", where="t"), 2, done=first)
    assert [s["output_throughput"] for s in first + more] == [101.0, 102.0, 100.0, 99.0]


def test_an_invalid_warm_up_round_fails_the_benchmark_and_is_named_as_warm_up(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 100.0, 100.0], invalid_at=1)
    bench, recorded, _ = gate(tmp_path, rounds)
    with pytest.raises(pytest.fail.Exception, match="warm-up round 1 on cpu is INVALID"):
        bench.run()
    assert recorded[-1].status == "error" and recorded[-1].rounds == 0


def test_a_round_invalid_only_for_artefacts_of_the_machine_is_run_again_and_said(tmp_path: Path) -> None:
    # Seen in CI on 2 cores: one round of a healthy server invalid for an artefact failed the benchmark.
    rounds = Rounds([100.0, 101.0, 100.0, 102.0], invalid_for={2: (CONTAMINATED,)})
    bench, recorded, said = gate(tmp_path, rounds)
    outcome = bench.run()
    assert outcome.status == "no-baseline"
    assert len(rounds.calls) == 4  # warm-up 1, the artefact, its re-run (agrees: measured 1), measured 2
    assert outcome.samples["output_throughput"] == [100.0, 102.0]
    assert [(d.round, d.reasons) for d in outcome.discarded_rounds] == [
        ("round 2 on cpu (warm-up unless within 5% of round 1)", (CONTAMINATED,))]
    assert any("a measurement artefact of the machine, not the server's output; discarded and run again (1 of 2"
               in line for line in said), said
    report = BenchOutcome.from_json(recorded[-1].to_json())
    assert report.discarded_rounds == outcome.discarded_rounds
    assert any("1 round(s) discarded as measurement artefacts" in note for note in report.notes)


def test_a_round_whose_chunk_timing_is_an_artefact_counts_for_throughput_but_not_for_latency(tmp_path: Path) -> None:
    # Seen in CI (2026-12-07, tests/e2e/test_foundation.py): on --max-num-seqs 1, rounds where most requests' chunks
    # came in one read failed a throughput benchmark after two retries, though the tokens were counted from the
    # server's usage over the round's duration. Such a round is a sample of throughput, its timing figures withheld.
    rounds = Rounds([100.0, 101.0, 100.5, 99.0], invalid_for={2: (TIMING_ARTEFACT,), 3: (TIMING_ARTEFACT,),
                                                               4: (TIMING_ARTEFACT,)})
    bench, _, said = gate(tmp_path, rounds)
    outcome = bench.run()
    assert outcome.status == "no-baseline" and len(rounds.calls) == 3
    assert outcome.samples["output_throughput"] == [101.0, 100.5] and "mean_ttft_ms" not in outcome.samples
    assert outcome.discarded_rounds == []
    assert any("per-token timing not measured" in line and "TPOT = 0" in line for line in said), said
    # Gated on a latency, the same rounds are no numbers: run again, then the third fails naming the others.
    latency = Rounds([100.0] * 6, invalid_for={k: (TIMING_ARTEFACT,) for k in (2, 3, 4)})
    bench, recorded, _ = gate(tmp_path, latency, options=replace(GATE, metric="mean_ttft_ms"))
    with pytest.raises(pytest.fail.Exception, match="TPOT = 0"):
        bench.run()
    assert len(latency.calls) == 4 and len(recorded[-1].discarded_rounds) == 2
    # Timing beside a fault of the server's output is no sample of anything.
    faulty = Rounds([100.0] * 3, invalid_for={2: (TIMING_ARTEFACT, FAULT)})
    with pytest.raises(pytest.fail.Exception, match="generated tokens but no text"):
        gate(tmp_path, faulty)[0].run()


def test_an_output_fault_is_never_run_again_even_beside_an_artefact(tmp_path: Path) -> None:
    rounds = Rounds([100.0, 100.0, 100.0], invalid_for={2: (CONTAMINATED, FAULT)})
    bench, recorded, _ = gate(tmp_path, rounds)
    with pytest.raises(pytest.fail.Exception, match="generated tokens but no text"):
        bench.run()
    assert len(rounds.calls) == 2 and recorded[-1].status == "error"
    assert recorded[-1].discarded_rounds == []


def test_artefacts_beyond_the_retries_fail_naming_every_discarded_round(tmp_path: Path) -> None:
    rounds = Rounds([100.0] * 6, invalid_for={1: (DISAGREES,), 2: (CONTAMINATED,), 3: (DISAGREES,)})
    bench, recorded, _ = gate(tmp_path, rounds)
    with pytest.raises(pytest.fail.Exception) as failed:
        bench.run()
    message = str(failed.value)
    assert len(rounds.calls) == 3  # two run again, the third fails
    assert "2 earlier round(s) of this benchmark were discarded as measurement artefacts (is the machine busy?)" \
        in message and CONTAMINATED in message
    assert [d.reasons for d in recorded[-1].discarded_rounds] == [(DISAGREES,), (CONTAMINATED,)]


def test_relative_difference_of_rounds() -> None:
    assert relative_difference(100.0, 105.0) == pytest.approx(0.05)
    assert relative_difference(100.0, 95.0) == pytest.approx(0.05)
    assert relative_difference(0.0, 1.0) == math.inf
    assert math.isnan(relative_difference(math.nan, 1.0))


# --------------------------------------------------------------------------- the spread in the reports


def _store_baseline(tmp_path: Path) -> None:
    wl = CFG.workload("tiny", where="t")
    store = BaselineStore(tmp_path / "baselines")
    store.save(BenchKey("tests/test_perf.py::test_throughput", SPEC.id, "tiny"),
               build_context(SPEC, wl, engine_version=None),
               {"output_throughput": [100.0, 101.0, 99.5, 100.4, 100.2]}, metric="output_throughput",
               higher_is_better=True)


@pytest.mark.parametrize("case", ["no-baseline", "comparison", "saved"])
def test_every_benchmark_reports_its_rounds_cv_log_sd_and_warm_up(tmp_path: Path, case: str) -> None:
    if case == "comparison":
        _store_baseline(tmp_path)
    figures = [60.0, 100.0, 100.3, 99.8, 100.1, 99.9, 100.2, 100.0, 99.7, 100.1, 100.0]
    outcome = gate(tmp_path, Rounds(figures), save=case == "saved")[0].run()
    expected_verdict = {"no-baseline": "no-baseline", "saved": "saved"}.get(case, "pass")
    assert outcome.status == expected_verdict
    values = outcome.samples["output_throughput"]
    row = BenchOutcome.from_json(outcome.to_json())
    spread = row.spread
    assert spread["rounds"] == len(values) >= 2
    assert spread["cv"] == pytest.approx(statistics.stdev(values) / statistics.mean(values))
    assert spread["log_sd"] == pytest.approx(statistics.stdev([math.log(v) for v in values]))
    assert not spread["noisy"] and row.notes == []
    # results.json carries the spread and the warm-up, and reads the warm-up back.
    path = write_results_json(tmp_path / "results.json", [row])
    stored = json.loads(path.read_text())["benchmarks"][0]
    assert stored["spread"]["cv"] == pytest.approx(spread["cv"])
    assert stored["spread"]["log_sd"] == pytest.approx(spread["log_sd"])
    assert (stored["warmup"]["rounds"], stored["warmup"]["settled"]) == (2, True)  # 60 and 100 set aside
    assert read_results_json(path)[1][0].warmup == row.warmup
    # The terminal table and summary.md: measured rounds (+ warm-up), and the CV with the log sd beside it.
    cells = f"{spread['cv']:.1%} ({spread['log_sd']:.3f})"
    text, markdown = format_text_summary([row]), format_markdown([row])
    for report in (text, markdown):
        assert "rounds (+warm-up)" in report and "CV (sd ln)" in report
        assert f"{len(values)} (+2 warm-up)" in report and cells in report


def test_noisy_rounds_and_an_unsettled_warm_up_get_notes_in_every_report(tmp_path: Path) -> None:
    rounds = Rounds([1118.0, 2217.0, 1118.0, 2217.0, 1118.0, 2217.0])  # the H200's two rounds, over and over
    outcome = gate(tmp_path, rounds)[0].run()
    row = BenchOutcome.from_json(outcome.to_json())
    assert row.spread["noisy"] and row.spread["cv"] > NOISY_CV
    assert row.spread["cv"] == pytest.approx(0.466, abs=0.001)
    assert row.spread["log_sd"] == pytest.approx(0.484, abs=0.001)
    assert len(row.notes) == 2
    assert row.notes[0].startswith("warm-up did not settle")
    assert row.notes[1].startswith("the rounds are noisy: output_throughput CV 46.6% over 2 rounds")
    text, markdown = format_text_summary([row]), format_markdown([row])
    for report in (text, markdown):
        assert "NOT settled" in report and "46.6% (0.484) noisy" in report
        assert "warm-up did not settle" in report and "the rounds are noisy" in report
    stored = json.loads(write_results_json(tmp_path / "results.json", [row]).read_text())["benchmarks"][0]
    assert stored["spread"]["noisy"] is True and stored["spread"]["noisy_cv"] == NOISY_CV
    assert stored["warmup"]["settled"] is False


def test_a_benchmark_without_a_warm_up_record_reports_its_rounds_alone() -> None:
    row = BenchOutcome(test_id=TEST_ID, server_id="cpu", workload="tiny", metric="output_throughput",
                       samples={"output_throughput": [100.0]})
    assert row.warmup is None and row.spread["cv"] is None and row.notes == []
    table_rows = [line for line in format_text_summary([row]).splitlines() if line.startswith("test_throughput")]
    assert len(table_rows) == 1
    assert re.split(r"\s{2,}", table_rows[0].strip())[-4:] == ["no baseline", "1", "-", "-"]  # verdict, rounds, CV, host


# --------------------------------------------------------------------------- the settings


def _settings(tmp_path: Path, cli: dict[str, Any] | None = None, ini: dict[str, Any] | None = None,
              env: dict[str, str] | None = None) -> Any:
    return resolve_settings(tmp_path, Sources(cli=cli or {}, ini=ini or {}, env=env or {}),
                            lambda: ServerSpec(name="default", engine="vllm", model="/m"))


def test_warm_up_settings_from_every_source_and_the_marker(tmp_path: Path) -> None:
    assert (_settings(tmp_path).bench.warmup_rounds, _settings(tmp_path).bench.warmup_agreement) == (3, 0.05)
    assert _settings(tmp_path, ini={"warmup_rounds": 5}).bench.warmup_rounds == 5
    assert _settings(tmp_path, env={"PYTEST_LLMSERVE_WARMUP_ROUNDS": "0"}).bench.warmup_rounds == 0
    assert _settings(tmp_path, cli={"warmup_agreement": "0.02"}).bench.warmup_agreement == 0.02
    (tmp_path / "llmserve.toml").write_text('[servers.a]\nmodel = "/a"\n[bench]\nwarmup_rounds = 6\n')
    settings = _settings(tmp_path, ini={"warmup_rounds": 5})
    assert settings.bench.warmup_rounds == 6  # the bench table outranks the ini
    spec = bench_spec(settings, (), {"warmup_rounds": 1, "warmup_agreement": 0.1}, where="W")
    assert (spec.warmup_rounds, spec.warmup_agreement) == (1, 0.1)


@pytest.mark.parametrize(("source", "expected"), [
    ({"cli": {"warmup_rounds": "-1"}}, "--llmserve-warmup-rounds = '-1': must be a whole number >= 0"),
    ({"env": {"PYTEST_LLMSERVE_WARMUP_ROUNDS": "two"}},
     "$PYTEST_LLMSERVE_WARMUP_ROUNDS = 'two': must be a whole number >= 0"),
    ({"ini": {"warmup_agreement": 1.5}}, "ini llmserve_warmup_agreement = 1.5: must be a fraction below 1"),
    ({"env": {"PYTEST_LLMSERVE_WARMUP_AGREEMENT": "0"}}, "$PYTEST_LLMSERVE_WARMUP_AGREEMENT = '0': must be > 0"),
    ({"table": "warmup_rounds = 1.5"}, "[tool.llmserve.bench] warmup_rounds = 1.5: must be a whole number >= 0"),
    ({"table": "warmup_rounds = true"}, "[tool.llmserve.bench] warmup_rounds = True: must be a whole number >= 0"),
    ({"marker": {"warmup_agreement": 2}}, "W warmup_agreement = 2: must be a fraction below 1"),
])
def test_bad_warm_up_settings_name_the_value_and_its_source(tmp_path: Path, source: dict[str, Any],
                                                             expected: str) -> None:
    if "table" in source:
        (tmp_path / "pyproject.toml").write_text(
            f'[tool.llmserve.servers.a]\nmodel = "/a"\n[tool.llmserve.bench]\n{source["table"]}\n')

    def resolve() -> BenchSpec:
        settings = _settings(tmp_path, cli=source.get("cli"), ini=source.get("ini"), env=source.get("env"))
        return bench_spec(settings, (), source.get("marker"), where="W")

    with pytest.raises(ConfigError) as info:
        resolve()
    assert expected in str(info.value)
