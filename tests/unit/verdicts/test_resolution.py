"""What the sequential rule can resolve at the measured noise (stats.resolution), checked against the rule itself."""

from __future__ import annotations

import math

import pytest

from pytest_llmserve.verdicts import operating as op
from pytest_llmserve.verdicts import stats


def _gate(sd_baseline: float, sd_current: float, *, max_rounds: int = 8, n_baseline: int = 5) -> stats.Resolution:
    plan = stats.sequential_plan(stats.gate_looks(n_baseline, 2, max_rounds), alpha=0.02)
    return stats.resolution(sd_baseline, sd_current, n_baseline=n_baseline, n_current=max_rounds, plan=plan,
                            tolerance=0.10)


def _rounds(value: int | None) -> float:
    return math.inf if value is None else value


def test_more_noise_resolves_less_and_needs_more_rounds() -> None:
    found = [_gate(sd, sd) for sd in (0.02, 0.03, 0.045, 0.06, 0.08, 0.12)]
    margins = [r.resolvable_margin for r in found]
    assert margins == sorted(margins) and len(set(margins)) == len(margins)
    assert [r.detectable_drop for r in found] == sorted(r.detectable_drop for r in found)
    for key in ("current_rounds", "rounds_a_side"):
        needed = [_rounds(getattr(r, key)) for r in found]
        assert needed == sorted(needed)
    assert found[0].resolved and not found[-1].resolved
    # At 3 % the tolerance is resolvable in a few rounds; at 12 % a side, only with more than the limit.
    assert found[1].current_rounds is not None and found[1].current_rounds <= 4
    assert found[-1].current_rounds is None


def test_more_rounds_resolve_more() -> None:
    found = [_gate(0.05, 0.05, max_rounds=cap) for cap in (4, 6, 8, 12, 16)]
    margins = [r.resolvable_margin for r in found]
    assert margins == sorted(margins, reverse=True)
    # The rounds the tolerance needs do not depend on the cap it was measured against (one noise, one answer).
    assert len({r.current_rounds for r in found}) == 1 and len({r.rounds_a_side for r in found}) == 1


def test_each_side_counts_with_its_rounds_as_the_t_test_pools_them() -> None:
    assert stats.pooled_log_sd(0.03, 5, 0.06, 8) == pytest.approx(math.sqrt((4 * 0.03**2 + 7 * 0.06**2) / 11))
    assert stats.pooled_log_sd(math.nan, 1, 0.04, 3) == pytest.approx(0.04)
    with pytest.raises(ValueError, match="no side has two rounds"):
        stats.pooled_log_sd(math.nan, 1, math.nan, 1)


def test_a_noisy_baseline_is_named_as_the_limit_and_an_ab_plan_counts_both_sides() -> None:
    gate = _gate(0.12, 0.05)
    assert gate.current_rounds is None and gate.rounds_a_side is not None
    line = gate.line(record_hint="--llmserve-rounds {n}")
    assert "cannot be resolved against this 5-round baseline" in line
    assert f"record the baseline with {gate.rounds_a_side} rounds (--llmserve-rounds {gate.rounds_a_side})" in line
    plan = stats.sequential_plan(stats.ab_looks(2, 8), alpha=0.02)
    ab = stats.resolution(0.07, 0.07, n_baseline=8, n_current=8, plan=plan, tolerance=0.10, both_sides_grow=True)
    assert ab.ab and ab.rounds_a_side == ab.current_rounds and ab.rounds_a_side is not None
    assert f"±10% needs about {ab.rounds_a_side} rounds a side; `max_rounds` is 8" in ab.line()


def test_the_stated_rounds_pass_an_unchanged_metric_in_most_seeded_trials() -> None:
    # CV 5 %, a 5-round baseline: the statement says 8 current rounds do not resolve ±5 % and names N > 8.
    sd = 0.05
    said = _gate(sd, sd)
    assert not said.resolved and said.current_rounds is not None and said.current_rounds > 8
    n_trials = 120

    def pass_rate(max_rounds: int) -> float:
        rule = op.sequential_rule(n_baseline=5, max_rounds=max_rounds, n_resamples=20)
        found = op.trials(rule, effect=0.0, noise=op.Noise(cv=sd), n_trials=n_trials, seed=25, n_baseline=5,
                          max_rounds=max_rounds)
        return sum(t.outcome == "pass" for t in found) / n_trials

    at_cap, at_stated = pass_rate(8), pass_rate(said.current_rounds)
    # The statement's power is 0.8 at the last look; a pass can also come at an earlier one.
    assert at_stated >= stats.RESOLUTION_POWER - 0.05
    assert at_stated > at_cap


def test_the_spread_between_runs_is_a_floor_that_no_count_of_rounds_passes() -> None:
    # Rounds quiet enough to resolve ±10 % in a few rounds inside one run; across runs with 5 % between boots the
    # interval cannot shrink below what that spread leaves, and the statement says so instead of naming rounds.
    plan = stats.sequential_plan(stats.gate_looks(5, 2, 8), alpha=0.02)
    inside = stats.resolution(0.02, 0.02, n_baseline=5, n_current=8, plan=plan, tolerance=0.10)
    assert inside.resolved and inside.between_floor == 0.0
    one_run = stats.resolution(0.02, 0.02, n_baseline=5, n_current=8, plan=plan, tolerance=0.10, between_sd=0.05)
    assert not one_run.resolved and one_run.current_rounds is None and one_run.rounds_a_side is None
    assert one_run.between_floor > 0.10 and one_run.resolvable_tolerance > one_run.between_floor
    assert "cannot be resolved between runs at this spread however many rounds" in one_run.line()
    # More recorded runs lower the floor (tau^2 (1 + 1/K)), never below what tau alone leaves.
    ten_runs = stats.resolution(0.02, 0.02, n_baseline=50, n_current=8,
                                plan=stats.sequential_plan(stats.gate_looks(50, 2, 8), alpha=0.02), tolerance=0.10,
                                between_sd=0.05, baseline_runs=10)
    assert ten_runs.between_floor < one_run.between_floor
