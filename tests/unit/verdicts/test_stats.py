"""Summaries and the regression decision, on synthetic samples from a seeded RNG."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

from pytest_llmserve.verdicts.stats import (
    Summary,
    Verdict,
    decide,
    needs_more_rounds,
    summarize,
)
from pytest_llmserve.verdicts.two_sample import min_attainable_p

NOISE = 0.03  # relative round-to-round noise of a throughput
TOL = 0.05
SEEDS = 200


def rounds(rng: np.random.Generator, n: int, level: float = 100.0, noise: float = NOISE) -> list[float]:
    return [float(v) for v in level * (1.0 + noise * rng.standard_normal(n))]


def outcomes(
    effect: float,
    n_base: int,
    n_cur: int,
    *,
    tolerance: float = TOL,
    higher: bool = True,
    seeds: int = SEEDS,
    offset: int = 0,
) -> Counter[str]:
    counts: Counter[str] = Counter()
    for seed in range(offset, offset + seeds):
        rng = np.random.default_rng(seed)
        base = rounds(rng, n_base)
        cur = rounds(rng, n_cur, level=100.0 * (1.0 + effect))
        counts[decide(base, cur, higher_is_better=higher, tolerance=tolerance).outcome] += 1
    return counts


# --------------------------------------------------------------------------- summarize


def test_summarize_matches_numpy() -> None:
    values = [float(v) for v in np.random.default_rng(1).normal(50, 5, size=37)]
    s = summarize(values)
    assert s.n == 37
    assert s.mean == pytest.approx(np.mean(values))
    assert s.median == pytest.approx(np.median(values))
    assert s.stdev == pytest.approx(np.std(values, ddof=1))
    assert s.p90 == pytest.approx(np.percentile(values, 90))
    assert s.p99 == pytest.approx(np.percentile(values, 99))
    assert (s.min, s.max) == (min(values), max(values))
    assert s.cv == pytest.approx(s.stdev / s.mean)
    assert Summary.from_dict(s.to_dict()) == s


def test_summarize_single_and_bad_values() -> None:
    s = summarize([3.0])
    assert (s.n, s.median, s.stdev, s.p99, s.cv) == (1, 3.0, 0.0, 3.0, 0.0)
    with pytest.raises(ValueError, match="no samples"):
        summarize([])
    nothing = Summary.undefined()
    assert nothing.n == 0 and all(math.isnan(v) for k, v in nothing.to_dict().items() if k != "n")
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, math.nan])


def test_min_attainable_p_documents_the_3v3_trap() -> None:
    assert min_attainable_p(3, 3) == pytest.approx(0.05)  # never < alpha = 0.05
    assert min_attainable_p(4, 4) == pytest.approx(1 / 70)
    assert min_attainable_p(5, 5) == pytest.approx(1 / 252)


# --------------------------------------------------------------------------- decide: single cases


def test_clear_regression_is_regressed_with_all_numbers() -> None:
    v = decide(
        [100, 101, 99, 100.5, 99.5],
        [90, 90.5, 89.5, 91, 89],
        higher_is_better=True,
        tolerance=TOL,
        metric="output_throughput",
    )
    assert v.outcome == "regressed"
    assert v.failed
    assert v.change == pytest.approx(-0.10)
    assert v.raw_change == pytest.approx(-0.10)
    assert v.p_value == v.p_worse == pytest.approx(1 / 252)
    assert v.ci_high < -TOL
    assert v.cliffs_delta == -1.0
    assert v.hodges_lehmann == pytest.approx(-0.10)
    assert "output_throughput" in v.reason
    assert "significant" in v.reason
    assert Verdict.from_dict(v.to_dict()) == v


def test_lower_is_better_direction() -> None:
    base = [10.0, 10.1, 9.9, 10.05, 9.95]
    slower = [11.0, 11.1, 10.9, 11.05, 10.95]
    v = decide(base, slower, higher_is_better=False, tolerance=TOL)
    assert v.outcome == "regressed"
    assert v.change == pytest.approx(-0.10)
    assert v.raw_change == pytest.approx(0.10)
    faster = [9.0, 9.1, 8.9, 9.05, 8.95]
    assert decide(base, faster, higher_is_better=False, tolerance=TOL).outcome == "improved"


def test_too_few_samples_is_inconclusive_even_when_separated() -> None:
    v = decide([100, 101, 99], [80, 81, 79], higher_is_better=True, tolerance=TOL)
    assert v.outcome == "inconclusive"  # 3 vs 3: the smallest exact one-sided p is 0.05
    assert "too few samples" in v.reason
    assert (
        decide(
            [100, 101], [80, 81, 79, 80, 80.5], higher_is_better=True, tolerance=TOL, min_samples=3
        ).outcome
        == "inconclusive"
    )
    # and even a big alpha does not make 2 vs 2 enough with min_samples=3
    assert decide([1, 2], [1, 2], higher_is_better=True, tolerance=TOL, alpha=0.5).outcome == "inconclusive"


def test_within_tolerance_but_significant_and_wide_ci_asks_for_more_rounds() -> None:
    rng = np.random.default_rng(7)
    base = rounds(rng, 5)
    cur = [v * 0.96 for v in base]  # exactly 4% worse each round: significant, within 5%
    v = decide(base, cur, higher_is_better=True, tolerance=TOL)
    assert v.p_worse < 0.05
    assert v.outcome in ("pass", "inconclusive")
    assert v.outcome == ("pass" if v.ci_low >= -TOL else "inconclusive")


def test_tiny_real_change_with_tight_ci_passes() -> None:
    base = [100 + 0.1 * i for i in range(8)]
    cur = [v * 0.98 for v in base]
    v = decide(base, cur, higher_is_better=True, tolerance=TOL)
    assert v.outcome == "pass"
    assert "lies within" in v.reason


def test_ties_and_constant_samples() -> None:
    v = decide([5.0] * 5, [5.0] * 5, higher_is_better=True, tolerance=TOL)
    assert v.outcome == "pass"
    assert v.p_worse == 1.0
    assert v.change == 0.0
    tied = decide([100, 100, 101, 101, 100], [90, 90, 91, 91, 90], higher_is_better=True, tolerance=TOL)
    assert tied.outcome == "regressed"
    assert "permutation" in tied.test


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="tolerance"):
        decide([1, 2, 3], [1, 2, 3], higher_is_better=True, tolerance=-0.1)
    with pytest.raises(ValueError, match="alpha"):
        decide([1, 2, 3], [1, 2, 3], higher_is_better=True, tolerance=0.05, alpha=1.5)
    with pytest.raises(ValueError, match="median is 0"):
        decide([0, 0, 0], [1, 2, 3], higher_is_better=True, tolerance=0.05)
    with pytest.raises(ValueError, match="current: no samples"):
        decide([1, 2, 3], [], higher_is_better=True, tolerance=0.05)


def test_deterministic() -> None:
    rng = np.random.default_rng(3)
    base, cur = rounds(rng, 6), rounds(rng, 6)
    a = decide(base, cur, higher_is_better=True, tolerance=TOL)
    b = decide(base, cur, higher_is_better=True, tolerance=TOL)
    assert a == b


def test_needs_more_rounds() -> None:
    inc = decide([100, 101, 99], [80, 81, 79], higher_is_better=True, tolerance=TOL)
    assert needs_more_rounds(inc, rounds_done=3, max_rounds=6)
    assert not needs_more_rounds(inc, rounds_done=6, max_rounds=6)
    reg = decide([100, 101, 99, 100, 100.5], [80, 81, 79, 80, 80.5], higher_is_better=True, tolerance=TOL)
    assert not needs_more_rounds(reg, rounds_done=5, max_rounds=10)


# --------------------------------------------------------------------------- operating characteristics


def test_power_10pct_drop_3pct_noise_5_rounds() -> None:
    counts = outcomes(-0.10, 5, 5)
    power = counts["regressed"] / SEEDS
    print(f"power (10% drop, 3% noise, 5 vs 5, tol 5%): {power:.3f} {dict(counts)}")
    assert power >= 0.95
    assert counts["pass"] <= 1  # a real 10% drop almost never passes
    assert counts["improved"] == 0


def test_improvement_is_reported() -> None:
    counts = outcomes(+0.10, 5, 5)
    assert counts["improved"] / SEEDS >= 0.95
    assert counts["regressed"] == 0


def test_identical_distributions_never_regress_at_the_default_tolerance() -> None:
    counts = outcomes(0.0, 5, 5)
    rate = counts["regressed"] / SEEDS
    print(f"false-regression rate (no change, 3% noise, 5 vs 5, tol 5%): {rate:.3f} {dict(counts)}")
    assert rate <= 0.01
    assert counts["pass"] / SEEDS >= 0.75


@pytest.mark.parametrize(("n_base", "n_cur"), [(5, 5), (4, 6), (10, 10)])
def test_false_regression_rate_is_bounded_by_alpha_without_a_tolerance(n_base: int, n_cur: int) -> None:
    # tolerance 0 leaves only the significance test: the rate must be about alpha or less.
    counts = outcomes(0.0, n_base, n_cur, tolerance=0.0, seeds=300, offset=10_000)
    rate = counts["regressed"] / 300
    print(f"false-regression rate, tolerance 0, {n_base} vs {n_cur}: {rate:.3f}")
    # alpha = 0.05 plus ~2 binomial standard deviations at n = 300 (sd = 0.0126)
    assert rate <= 0.05 + 0.025


def _sequential(
    effect: float, seed: int, *, n_base: int = 5, start: int = 3, cap: int = 8
) -> tuple[str, int]:
    rng = np.random.default_rng(seed)
    base = rounds(rng, n_base)
    cur = rounds(rng, start, level=100.0 * (1 + effect))
    while True:
        verdict = decide(base, cur, higher_is_better=True, tolerance=TOL)
        if not needs_more_rounds(verdict, len(cur), cap):
            return verdict.outcome, len(cur)
        cur += rounds(rng, 1, level=100.0 * (1 + effect))


def test_sequential_reruns_keep_false_regressions_rare_and_catch_real_ones() -> None:
    null = Counter(_sequential(0.0, 20_000 + s)[0] for s in range(SEEDS))
    real = [_sequential(-0.10, 30_000 + s) for s in range(SEEDS)]
    real_counts = Counter(outcome for outcome, _ in real)
    mean_rounds = sum(n for _, n in real) / len(real)
    print(
        f"sequential (base 5, current 3..8): false regressions {null['regressed'] / SEEDS:.3f} {dict(null)}"
        f"; power {real_counts['regressed'] / SEEDS:.3f}, mean rounds {mean_rounds:.2f}"
    )
    assert null["regressed"] / SEEDS <= 0.03
    assert real_counts["regressed"] / SEEDS >= 0.95


def test_noise_free_random_module_independent() -> None:
    # the decision does not touch the global RNGs
    random.seed(1)
    np.random.seed(1)
    before = (random.random(), np.random.random())
    random.seed(1)
    np.random.seed(1)
    decide([1, 2, 3, 4, 5], [2, 3, 4, 5, 6], higher_is_better=True, tolerance=TOL)
    assert (random.random(), np.random.random()) == before
