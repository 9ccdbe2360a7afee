"""Comparisons across runs: the random-effects model of verdicts/between_runs.py and the sequential rule using it.

Seeded synthetic trials with a shift between runs (each run's level drawn around the true one) show the fault the
model exists for (the within-run rule calls an unchanged server "regressed" or "improved" because another boot sits
elsewhere) and that a real drop is still caught across runs.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from pytest_llmserve.verdicts import stats
from pytest_llmserve.verdicts.between_runs import between_run_difference, run_spread

TOLERANCE = 0.10  # the change the gate catches (half of it negligible)
MAX_ROUNDS = 8
RESAMPLES = 200  # the figures beside the verdict only; the decision does not use them


def draw_run(rng: np.random.Generator, rounds: int, level: float, between: float, within: float) -> list[float]:
    run_level = level * math.exp(between * rng.standard_normal())
    return [float(v) for v in run_level * np.exp(within * rng.standard_normal(rounds))]


@functools.cache
def plan_for(n_baseline: int) -> stats.SequentialPlan:
    return stats.sequential_plan(stats.gate_looks(n_baseline, 3, MAX_ROUNDS), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)


def gate(baseline_runs: list[list[float]], current: list[float], *, across_runs: bool,
         prior: float | None = None, tolerance: float = TOLERANCE) -> str:
    """The gate's sequence of looks (current rounds 3..MAX_ROUNDS) until a verdict other than inconclusive."""
    base = [v for run in baseline_runs for v in run]
    plan = plan_for(len(base))
    verdict = "inconclusive"
    for n in range(3, MAX_ROUNDS + 1):
        verdict = stats.decide_sequential(base, current[:n], plan=plan, higher_is_better=True, tolerance=tolerance,
                                          n_resamples=RESAMPLES, baseline_runs=baseline_runs if across_runs else None,
                                          prior_between_sd=prior).outcome
        if verdict != "inconclusive":
            break
    return verdict


def aa_trials(*, runs: int, between: float, within: float = 0.02, trials: int = 60, seed: int = 7,
              effect: float = 0.0, across_runs: bool, prior: float | None = None,
              tolerance: float = TOLERANCE) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    counts = {"pass": 0, "regressed": 0, "improved": 0, "inconclusive": 0}
    for _ in range(trials):
        baseline = [draw_run(rng, 5, 100.0, between, within) for _ in range(runs)]
        current = draw_run(rng, MAX_ROUNDS, 100.0 * (1.0 + effect), between, within)
        counts[gate(baseline, current, across_runs=across_runs, prior=prior, tolerance=tolerance)] += 1
    return counts


def test_an_unchanged_server_on_another_boot_is_called_changed_by_the_within_run_rule_and_not_across_runs() -> None:
    # A between-run sd of 8 % (the assumption) against 2 % inside runs: the within-run rule sees every other
    # boot's level as a significant change.
    within_only = aa_trials(runs=3, between=0.08, across_runs=False)
    changed = within_only["regressed"] + within_only["improved"]
    assert changed >= 0.3 * 60, within_only
    across = aa_trials(runs=3, between=0.08, across_runs=True)
    assert across["regressed"] + across["improved"] <= 0.05 * 60, across


def test_a_real_drop_is_still_caught_across_runs_when_the_runs_agree() -> None:
    # Between-run sd 1 %, a 20 % drop: caught (regressed) nearly always, with a 3-run baseline.
    caught = aa_trials(runs=3, between=0.01, effect=-0.20, across_runs=True)
    assert caught["regressed"] >= 0.9 * 60, caught
    assert caught["pass"] == 0 and caught["improved"] == 0, caught


def test_one_baseline_run_uses_the_prior_and_the_verdict_says_so() -> None:
    rng = np.random.default_rng(3)
    baseline = [draw_run(rng, 5, 100.0, 0.0, 0.02)]
    current = draw_run(rng, 8, 100.0, 0.0, 0.02)
    plan = stats.sequential_plan(stats.gate_looks(5, 3, 8), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
    verdict = stats.decide_sequential(baseline[0], current, plan=plan, higher_is_better=True, tolerance=TOLERANCE,
                                      n_resamples=RESAMPLES, baseline_runs=baseline, prior_between_sd=0.04)
    assert "unknown from one baseline run" in verdict.reason and "between runs 4.0%" in verdict.reason
    assert "the between runs spread dominates" in verdict.reason


def test_a_drop_of_the_tolerance_is_not_passed_and_an_unchanged_server_is() -> None:
    # The tolerance as a user reads it: "0.10" = a 10 % drop is caught. Runs that agree (between 0.5 %), 2 % inside:
    # a true drop of exactly the tolerance is passed in at most beta (5 %) of the trials; most are "regressed".
    drop = aa_trials(runs=3, between=0.005, effect=-TOLERANCE, across_runs=True, trials=80, seed=21)
    assert drop["pass"] <= 0.05 * 80 and drop["regressed"] >= 0.6 * 80, drop
    same = aa_trials(runs=3, between=0.005, across_runs=True, trials=80, seed=22)
    assert same["pass"] >= 0.8 * 80 and same["regressed"] == 0, same
    # The fault this exists for: the rule before issue 35 excluded twice the tolerance (a user's 0.10 then meant what
    # 0.20 means now) and passed the same 10 % drop about half the time.
    old_reading = aa_trials(runs=3, between=0.005, effect=-TOLERANCE, across_runs=True, trials=80, seed=21,
                            tolerance=2 * TOLERANCE)
    assert old_reading["pass"] >= 0.25 * 80, old_reading


def test_across_runs_a_slow_round_is_counted_and_named_inside_one_run_it_is_set_aside() -> None:
    # One stalled round (-40 %) among eight: inside one run (the A/B runner) the slowest round is set aside and the
    # rest pass; across runs (the gate: contended rounds are measured again, so a slow round left is the server's
    # own) it counts, is named, and the stall keeps the verdict from passing.
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    stalled = [100.2, 99.8, 100.1, 60.0, 99.9, 100.3, 100.0, 99.7]
    plan = stats.sequential_plan(stats.gate_looks(5, 2, 8), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
    inside = stats.decide_sequential(base, stalled, plan=plan, higher_is_better=True, tolerance=TOLERANCE,
                                     n_resamples=RESAMPLES)
    assert inside.outcome == "pass" and "current round 4" in inside.set_aside
    across = stats.decide_sequential(base, stalled, plan=plan, higher_is_better=True, tolerance=TOLERANCE,
                                     n_resamples=RESAMPLES, baseline_runs=[base], prior_between_sd=0.0)
    assert across.outcome != "pass" and across.set_aside == ""
    assert "slow and counted: current round 4 (-40" in across.reason


def test_the_spread_estimates() -> None:
    rng = np.random.default_rng(11)
    runs = [draw_run(rng, 6, 100.0, 0.05, 0.01) for _ in range(40)]
    spread = run_spread(runs, runs[0])
    assert spread.estimated and spread.runs == 40 and spread.between_df == 39
    assert 0.035 < spread.between_sd < 0.065 and 0.008 < spread.within_sd < 0.012
    # Runs that agree beyond what their rounds' spread explains: tau is floored at 0, not negative.
    same = [[100.0, 101.0, 99.0], [100.5, 99.5, 100.0], [99.8, 100.2, 100.0]]
    assert run_spread(same, [100.0, 100.0, 101.0]).between_sd == 0.0
    diff = between_run_difference(same, [100.0, 100.0, 101.0], run_spread(same, [100.0, 100.0, 101.0]))
    assert diff.between_var == 0.0 and diff.dominant == "inside runs"


def test_bad_groupings_are_refused() -> None:
    plan = stats.sequential_plan(stats.gate_looks(5, 3, 8), alpha=stats.DEFAULT_SEQUENTIAL_ALPHA)
    with pytest.raises(ValueError, match="baseline_runs hold 4 rounds, the baseline 5"):
        stats.decide_sequential([100.0] * 5, [100.0] * 3, plan=plan, higher_is_better=True, tolerance=TOLERANCE,
                                baseline_runs=[[100.0] * 4])
    with pytest.raises(ValueError, match="at least one round"):
        run_spread([[100.0], []], [100.0])
