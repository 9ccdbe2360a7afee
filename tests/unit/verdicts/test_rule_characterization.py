"""Characterization of the regression rules (verdicts/stats.py), pinned before decide and decide_sequential were split
into named steps (issue 36): for each branch of each rule, the outcome and the whole reason (with the look, whether it
is the last and the rounds set aside, for the sequential rule), and each argument error's message."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest

from pytest_llmserve.verdicts.stats import (
    SequentialPlan,
    ab_looks,
    decide,
    decide_sequential,
    gate_looks,
    sequential_plan,
)

base5 = [100.0, 101.0, 99.0, 100.5, 99.5]
# name: (baseline, current, tolerance)
FIXED: dict[str, tuple[list[float], list[float], float]] = {
    "too-few": (base5[:3], [100.0, 101.0, 99.0], 0.05),
    "regressed": (base5, [90.0, 91.0, 89.0, 90.5, 89.5], 0.05),
    "improved": (base5, [110.0, 111.0, 109.0, 110.5, 109.5], 0.05),
    "ci-within": (base5, [100.2, 100.9, 99.3, 100.4, 99.8], 0.05),
    "within-not-significant": (base5, [100.0, 103.0, 97.0, 101.0, 99.8], 0.02),
    "within-but-significant": (base5, [102.0, 103.0, 101.0, 102.5, 101.5], 0.03),
    "beyond-not-significant": (base5, [90.0, 110.0, 80.0, 115.0, 94.0], 0.05),
}

# name: (plan, baseline, current, keyword arguments)
SEQUENTIAL: dict[str, tuple[str, list[float], list[float], dict[str, object]]] = {
    "few-baseline": ("gate", base5[:2], [100.0, 101.0], {}),
    "not-a-look": ("gate", base5, [100.0] * 7, {}),
    "slow-left-too-few": ("ab", [100.0, 100.5, 99.5], [100.0, 100.2, 60.0], {}),
    "regressed": ("gate", base5, [90.0, 90.5, 89.5], {}),
    "improved": ("gate", base5, [112.0, 112.5, 111.5], {}),
    "lower-is-better": ("gate", base5, [90.0, 90.5, 89.5], {"higher_is_better": False}),
    "pass": ("gate", base5, [100.1, 100.3, 99.8, 100.2], {}),
    "not-worse-pass": ("gate", base5, [100.0, 112.0, 106.0, 104.0, 109.0], {"not_worse": True}),
    "inconclusive-final": ("gate", base5, [90.0, 110.0, 95.0, 108.0, 92.0, 104.0], {}),
    "set-aside-both": ("ab", [100.0, 100.5, 99.5, 100.2, 10.0], [100.0, 100.2, 99.9, 100.1, 90.0], {}),
    "across-runs-slow-counted": ("gate", base5, [100.0, 100.2, 99.9, 60.0], {"baseline_runs": [base5[:2], base5[2:]]}),
    "across-runs-prior": ("gate", base5, [100.0, 100.2, 99.9], {"baseline_runs": [base5], "prior_between_sd": 0.02}),
}

# name: (outcome, reason), as e369d3a decided them
FIXED_EXPECTED = {
    "too-few": ("inconclusive",
        "too few samples to decide (3 baseline vs 3 current samples): need >= 3 a side and enough that an exact "
        "one-sided Mann-Whitney p can fall below alpha=0.05 (smallest possible here 0.05); median change +0.0%"),
    "regressed": ("regressed",
        "output_throughput is worse by 10.0% (95% CI -11.4%..-8.6%), beyond the ±5% tolerance, and the drop is "
        "significant (one-sided Mann-Whitney p=0.00397 < 0.05; 5 baseline vs 5 current samples)"),
    "improved": ("improved",
        "output_throughput is better by 10.0% (95% CI +8.5%..+11.6%), beyond the ±5% tolerance, significant "
        "(p=0.00397 < 0.05; 5 baseline vs 5 current samples); the baseline is stale: accept the new samples"),
    "ci-within": ("pass",
        "output_throughput median change +0.2%: its 95% CI -1.2%..+1.4% lies within ±5% (5 baseline vs 5 "
        "current samples)"),
    "within-not-significant": ("pass",
        "output_throughput median change +0.0% is within ±2% and not significant (p=0.405; 95% CI -3.0%..+3.0%; "
        "5 baseline vs 5 current samples)"),
    "within-but-significant": ("inconclusive",
        "output_throughput median change +2.0% is within ±3% but significant (p=0.00794) and its 95% CI "
        "+0.5%..+3.5% reaches beyond ±3% (5 baseline vs 5 current samples): run more rounds"),
    "beyond-not-significant": ("inconclusive",
        "output_throughput median change -6.0% is beyond the ±5% tolerance but not significant (one-sided "
        "Mann-Whitney p=0.345 >= 0.05; 95% CI -20.0%..+15.0%; 5 baseline vs 5 current samples): run more rounds"),
}
# name: (outcome, look, final look, set aside, reason), as e369d3a decided them
SEQUENTIAL_EXPECTED = {
    "few-baseline": ("inconclusive", 0, False, "",
        "output_throughput: too few baseline samples to decide (2 < 3); median change +0.0%"),
    "not-a-look": ("inconclusive", 0, True, "",
        "output_throughput: 5 baseline vs 7 current samples is not a look of the plan [(5, 2), (5, 3), (5, 4), "
        "(5, 5), (5, 6)]; median change +0.0%"),
    "slow-left-too-few": ("inconclusive", 1, False, "current round 3 (-40.1%)",
        "output_throughput median change +0.0%: too few current rounds left beside a slow one (3 baseline vs 3 "
        "current samples, look 1 of 6; set aside as slow: current round 3 (-40.1%)): run more rounds"),
    "regressed": ("regressed", 2, False, "",
        "output_throughput is worse by 10.0%, beyond ±5% (half the 10% tolerance), and the drop is significant "
        "at this look: log-ratio t=-20.01 (df 6); significant beyond |t| >= 3.32 (nominal 0.00802 a look, alpha "
        "0.02 over 5 looks) (5 baseline vs 3 current samples, look 2 of 5)"),
    "improved": ("improved", 2, False, "",
        "output_throughput is better by 12.0%, beyond ±5% (half the 10% tolerance), significant at this look: "
        "log-ratio t=+22.33 (df 6); significant beyond |t| >= 3.32 (nominal 0.00802 a look, alpha 0.02 over 5 "
        "looks) (5 baseline vs 3 current samples, look 2 of 5); the baseline is stale: accept the new samples"),
    "lower-is-better": ("improved", 2, False, "",
        "output_throughput is better by 10.0%, beyond ±5% (half the 10% tolerance), significant at this look: "
        "log-ratio t=+20.01 (df 6); significant beyond |t| >= 3.32 (nominal 0.00802 a look, alpha 0.02 over 5 "
        "looks) (5 baseline vs 3 current samples, look 2 of 5); the baseline is stale: accept the new samples"),
    "pass": ("pass", 3, False, "",
        "output_throughput median change +0.2% is within ±5% (half the 10% tolerance), and a change of ±10% "
        "(the tolerance) is excluded at this look (|d| + 2.44·se = 1.1% < 10%; nominal 0.0224 a look, beta 0.05 "
        "over the looks; 5 baseline vs 4 current samples, look 3 of 5)"),
    "not-worse-pass": ("pass", 4, False, "",
        "output_throughput median change +6.0% is not worse than ±5% (half the 10% tolerance), and a drop of "
        "10% (the tolerance) is excluded at this look (d - 2.38·se = +1.3% > -10%; nominal 0.0224 a look, beta "
        "0.05 over the looks; 5 baseline vs 5 current samples, look 4 of 5); a gain is not what is sought here"),
    "inconclusive-final": ("inconclusive", 5, True, "",
        "output_throughput median change -0.5%: no boundary crossed (log-ratio t=-0.12 (df 9); significant "
        "beyond |t| >= 2.96 (nominal 0.00802 a look, alpha 0.02 over 5 looks); a change of ±10% excluded only "
        "down to 10.0%; 5 baseline vs 6 current samples, look 5 of 5)"),
    "set-aside-both": ("pass", 3, False, "baseline round 5 (-90.0%); current round 5 (-10.0%)",
        "output_throughput median change +0.0% is within ±5% (half the 10% tolerance), and a change of ±10% "
        "(the tolerance) is excluded at this look (|d| + 2.67·se = 0.6% < 10%; nominal 0.0184 a look, beta 0.05 "
        "over the looks; 5 baseline vs 5 current samples, look 3 of 6; set aside as slow: baseline round 5 "
        "(-90.0%); current round 5 (-10.0%))"),
    "across-runs-slow-counted": ("inconclusive", 3, False, "",
        "output_throughput median change -0.0%: no boundary crossed (log-ratio t=-1.05 (df 6); significant "
        "beyond |t| >= 3.32 (nominal 0.00802 a look, alpha 0.02 over 5 looks); a change of ±10% excluded only "
        "down to 54.9%; 5 baseline vs 4 current samples, look 3 of 5; slow and counted: current round 4 "
        "(-40.0%); spread inside runs 18.1%, between runs 0.0% (estimated from 2 baseline runs); the inside "
        "runs spread dominates the standard error): run more rounds"),
    "across-runs-prior": ("pass", 2, False, "",
        "output_throughput median change +0.0% is within ±5% (half the 10% tolerance), and a change of ±10% "
        "(the tolerance) is excluded at this look (|d| + 2.53·se = 7.6% < 10%; nominal 0.0224 a look, beta 0.05 "
        "over the looks; 5 baseline vs 3 current samples, look 2 of 5; spread inside runs 0.7%, between runs "
        "2.0% (unknown from one baseline run: the configured between_run_sd); the between runs spread dominates "
        "the standard error)"),
}


@pytest.fixture(scope="module")
def plans() -> dict[str, SequentialPlan]:
    return {"gate": sequential_plan(gate_looks(5, 2, 6), alpha=0.02), "ab": sequential_plan(ab_looks(3, 8), alpha=0.02)}


@pytest.mark.parametrize("name", list(FIXED))
def test_each_branch_of_the_fixed_sample_rule(name: str) -> None:
    baseline, current, tolerance = FIXED[name]
    v = decide(baseline, current, higher_is_better=True, tolerance=tolerance, metric="output_throughput",
               n_resamples=500)
    assert (v.outcome, v.reason) == FIXED_EXPECTED[name]


@pytest.mark.parametrize("name", list(SEQUENTIAL))
def test_each_branch_of_the_sequential_rule(name: str, plans: dict[str, SequentialPlan]) -> None:
    plan, baseline, current, kwargs = SEQUENTIAL[name]
    v = decide_sequential(baseline, current, plan=plans[plan], tolerance=0.1, metric="output_throughput",
                          n_resamples=500, **{"higher_is_better": True, **kwargs})  # type: ignore[arg-type]
    assert (v.outcome, v.look, v.final_look, v.set_aside, v.reason) == SEQUENTIAL_EXPECTED[name]
    assert v.rule == "sequential" and v.tolerance == 0.1 and v.margin == 0.1


def test_argument_errors(plans: dict[str, SequentialPlan]) -> None:
    gate = plans["gate"]
    errors: list[tuple[Callable[[], object], str]] = [
        (lambda: decide(base5, base5, higher_is_better=True, tolerance=-0.1),
         "tolerance = -0.1: must be a finite fraction >= 0 (0.05 = 5%)"),
        (lambda: decide(base5, base5, higher_is_better=True, tolerance=math.nan),
         "tolerance = nan: must be a finite fraction >= 0 (0.05 = 5%)"),
        (lambda: decide(base5, base5, higher_is_better=True, tolerance=0.05, alpha=1.0),
         "alpha = 1.0: must be in (0, 1)"),
        (lambda: decide(base5, base5, higher_is_better=True, tolerance=0.05, min_samples=0),
         "min_samples = 0: must be >= 1"),
        (lambda: decide([0.0, 0.0, 0.0], base5, higher_is_better=True, tolerance=0.05),
         "baseline median is 0: a relative change is undefined"),
        (lambda: decide_sequential(base5, base5[:3], plan=gate, higher_is_better=True, tolerance=0.0),
         "tolerance = 0.0: must be a fraction in (0, 1) (0.10 = a 10% change caught)"),
        (lambda: decide_sequential(base5, base5[:3], plan=gate, higher_is_better=True, tolerance=1.0),
         "tolerance = 1.0: must be a fraction in (0, 1) (0.10 = a 10% change caught)"),
        (lambda: decide_sequential(base5, base5[:3], plan=gate, higher_is_better=True, tolerance=0.1,
                                   baseline_runs=[base5[:2]]),
         "baseline_runs hold 2 rounds, the baseline 5: they must be the same rounds, grouped by run"),
        (lambda: decide_sequential(base5, [1.0, -1.0], plan=gate, higher_is_better=True, tolerance=0.1),
         "samples must be > 0 for a test on the log scale"),
    ]
    for call, message in errors:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            call()
