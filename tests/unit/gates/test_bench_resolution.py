"""The gate's resolution statement beside an inconclusive verdict, and ``extend_to_resolve``, with the stand-in round
runner and clock of test_warmup (no engine): each stand-in round returns the next figure of a list."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.bench import InconclusiveWarning
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.report.json import read_results_json, write_results_json
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.report.text import format_markdown
from pytest_llmserve.settings import bench_spec
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from pytest_llmserve.verdicts import stats
from tests.unit.gates.standins import CFG, SPEC
from tests.unit.gates.test_warmup import GATE, Rounds, _settings, gate

# Seeded draws at log-sd 0.05 (numpy default_rng(15)): a 5-round baseline and current rounds of the same level. At
# this noise 8 current rounds do not resolve ±10 % (the tolerance the gate catches); the statement names 17, and by 16 the A/A passes.
BASELINE = [93.1, 95.4, 102.0, 97.4, 102.7]
CURRENT = [104.1, 93.0, 105.2, 97.1, 111.0, 103.7, 97.3, 101.0, 101.1, 101.7, 107.2, 102.7, 108.7, 103.2, 99.1, 92.7,
           100.0, 100.0]
NO_WARMUP = replace(GATE, warmup_rounds=0)


def _store(tmp_path: Path, samples: list[float]) -> None:
    wl = CFG.workload("tiny", where="t")
    BaselineStore(tmp_path / "baselines").save(
        BenchKey("tests/test_perf.py::test_throughput", SPEC.id, "tiny"), build_context(SPEC, wl, engine_version=None),
        {"output_throughput": samples}, metric="output_throughput", higher_is_better=True)


def _run(tmp_path: Path, options: Any, figures: list[float] | None = None, seconds: float = 10.0
         ) -> tuple[BenchOutcome, list[str], Rounds]:
    rounds = Rounds(figures or CURRENT, seconds=seconds)
    bench, _, said = gate(tmp_path, rounds, options=options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = bench.run()
    if outcome.status == "inconclusive":
        assert any(isinstance(w.message, InconclusiveWarning) for w in caught)
    return outcome, said, rounds


def test_an_inconclusive_verdict_says_what_the_noise_resolves_and_the_rounds_the_tolerance_needs(
        tmp_path: Path) -> None:
    _store(tmp_path, BASELINE)
    with pytest.warns(InconclusiveWarning) as caught:
        outcome = gate(tmp_path, Rounds(CURRENT), options=NO_WARMUP)[0].run()
    assert (outcome.status, outcome.rounds) == ("inconclusive", 8)
    res = outcome.resolution
    assert res is not None
    # The figures are stats.resolution's at the measured spread of each side.
    expected = stats.resolution(stats.log_sd(BASELINE), stats.log_sd(CURRENT[:8]), n_baseline=5, n_current=8,
                                plan=stats.sequential_plan(stats.gate_looks(5, 2, 8), alpha=0.02), tolerance=0.10)
    assert res.figures.current_rounds == expected.current_rounds and (res.figures.current_rounds or 0) > 8
    assert res.figures.resolvable_tolerance == pytest.approx(expected.resolvable_tolerance) and res.figures.resolvable_tolerance > 0.10
    n = res.figures.current_rounds
    assert f"±10% needs about {n} current rounds against this 5-round baseline; `max_rounds` is 8: raise it to {n}" \
        in res.line
    assert "extend_to_resolve (--llmserve-extend-to-resolve)" in res.line
    assert f"resolution: {res.line}" in str(caught[0].message)
    # The reports: the verdict cell of summary.md names the rounds, the details carry the line; results.json keeps it.
    row = BenchOutcome.from_json(outcome.to_json())
    markdown = format_markdown([row])
    assert f"inconclusive (±10% needs ~{n} rounds)" in markdown and res.line in markdown
    back = read_results_json(write_results_json(tmp_path / "results.json", [row]))[1][0]
    assert back.resolution is not None and back.resolution.figures.current_rounds == n


def test_a_decided_verdict_carries_no_resolution(tmp_path: Path) -> None:
    _store(tmp_path, [100.0, 101.0, 99.5, 100.4, 100.2])
    outcome = gate(tmp_path, Rounds([100.3, 99.8, 100.1, 99.9]), options=NO_WARMUP)[0].run()
    assert outcome.status == "pass" and outcome.resolution is None and outcome.extension is None


def test_extend_to_resolve_adds_rounds_up_to_the_stated_count_and_says_so(tmp_path: Path) -> None:
    _store(tmp_path, BASELINE)
    outcome, said, rounds = _run(tmp_path, replace(NO_WARMUP, extend_to_resolve=True))
    ext = outcome.extension
    assert ext is not None
    assert ext.target is not None and ext.goal is not None
    assert ext.rounds_before == 8 and ext.target > 8 and ext.goal == ext.target
    assert outcome.status == "pass" and outcome.rounds == 8 + ext.rounds_added <= ext.goal
    assert len(rounds.calls) == outcome.rounds
    assert ext.stopped == f"decided (pass) after {outcome.rounds} rounds"
    assert ext.seconds == pytest.approx(10.0 * ext.rounds_added)  # the stand-in clock: 10 s a round
    assert any("extend_to_resolve: adding rounds up to" in line for line in said)
    assert ext.note in BenchOutcome.from_json(outcome.to_json()).notes


def test_the_time_budget_stops_the_extension_before_a_round_that_would_overrun_it(tmp_path: Path) -> None:
    _store(tmp_path, BASELINE)
    outcome, _, _ = _run(tmp_path, replace(NO_WARMUP, extend_to_resolve=True, extend_budget_s=25.0))
    ext = outcome.extension
    assert ext is not None
    # Rounds of 10 s: after two added rounds (20 s) a third would end at 30 s, beyond 25 s.
    assert ext.rounds_added == 2 and outcome.rounds == 10
    assert ext.stopped.startswith("the time budget: 20 s spent and a round takes about 10 s")
    assert outcome.status == "inconclusive" and outcome.resolution is not None
    assert outcome.resolution.figures.max_rounds == ext.goal  # stated against the extended plan
    assert "extend_to_resolve (--llmserve" not in outcome.resolution.line  # it was on: not suggested


def test_no_extension_where_the_baseline_itself_is_the_limit(tmp_path: Path) -> None:
    _store(tmp_path, [88.0, 112.0, 95.0, 120.0, 100.0])  # log-sd 0.13: no count of current rounds resolves ±10 %
    outcome, _, rounds = _run(tmp_path, replace(NO_WARMUP, extend_to_resolve=True))
    assert outcome.status == "inconclusive" and len(rounds.calls) == 8
    assert outcome.extension is not None and outcome.resolution is not None
    assert outcome.extension.rounds_added == 0
    assert outcome.extension.stopped.startswith("not extended: the tolerance cannot be resolved against this "
                                                      "5-round baseline")
    a_side = outcome.resolution.figures.rounds_a_side
    assert outcome.resolution.figures.current_rounds is None
    assert (f"record the baseline with {a_side} rounds (pytest --llmserve-save-baseline --llmserve-rounds {a_side} "
            f"--llmserve-max-rounds {a_side})") in outcome.resolution.line


def test_extension_settings_from_every_source_and_the_marker(tmp_path: Path) -> None:
    default = _settings(tmp_path).bench
    assert (default.extend_to_resolve, default.extend_budget_s) == (False, 600.0)
    assert _settings(tmp_path, cli={"extend_to_resolve": True}).bench.extend_to_resolve is True
    assert _settings(tmp_path, ini={"extend_to_resolve": True}).bench.extend_to_resolve is True
    assert _settings(tmp_path, env={"PYTEST_LLMSERVE_EXTEND_TO_RESOLVE": "1"}).bench.extend_to_resolve is True
    assert _settings(tmp_path, cli={"extend_budget_s": "120"}).bench.extend_budget_s == 120.0
    (tmp_path / "llmserve.toml").write_text('[servers.a]\nmodel = "/a"\n[bench]\nextend_to_resolve = true\n'
                                            'extend_budget_s = 300\n')
    settings = _settings(tmp_path)
    assert (settings.bench.extend_to_resolve, settings.bench.extend_budget_s) == (True, 300.0)
    spec = bench_spec(settings, (), {"extend_to_resolve": False, "extend_budget_s": 60}, where="W")
    assert (spec.extend_to_resolve, spec.extend_budget_s) == (False, 60.0)


@pytest.mark.parametrize(("source", "expected"), [
    ({"env": {"PYTEST_LLMSERVE_EXTEND_TO_RESOLVE": "maybe"}},
     "$PYTEST_LLMSERVE_EXTEND_TO_RESOLVE = 'maybe': must be true or false"),
    ({"cli": {"extend_budget_s": "0"}}, "--llmserve-extend-budget-s = '0': must be > 0"),
    ({"marker": {"extend_budget_s": True}}, "W extend_budget_s = True: must be a number of seconds > 0"),
])
def test_bad_extension_settings_name_the_value_and_its_source(tmp_path: Path, source: dict[str, Any],
                                                              expected: str) -> None:
    def resolve() -> Any:
        settings = _settings(tmp_path, cli=source.get("cli"), env=source.get("env"))
        return bench_spec(settings, (), source.get("marker"), where="W")

    with pytest.raises(ConfigError) as info:
        resolve()
    assert expected in str(info.value)


def test_between_runs_the_statement_says_no_count_of_rounds_resolves_the_tolerance(tmp_path: Path) -> None:
    # The same rounds against a one-run baseline with a spread of 5 % between runs (a prior, between_run_sd): the
    # interval cannot shrink below what the spread between runs leaves, however many rounds. Without it (the test
    # above) the statement names a count of rounds, which here would be a promise more rounds cannot keep.
    _store(tmp_path, BASELINE)
    outcome, _, _ = _run(tmp_path, replace(NO_WARMUP, between_run_sd=0.05))
    res = outcome.resolution
    assert outcome.status == "inconclusive" and res is not None
    assert res.figures.between_sd == 0.05 and res.figures.baseline_runs == 1 and res.figures.between_floor > 0.10
    assert res.figures.current_rounds is None
    assert "cannot be resolved between runs at this spread however many rounds: raise `tolerance` above" in res.line
    assert "between runs 5.0% over 1 recorded run(s)" in res.line
    assert outcome.note is not None and "unknown from one baseline run: the configured between_run_sd" in outcome.note
    assert res.short.startswith("±10% below the spread between runs: needs >")
