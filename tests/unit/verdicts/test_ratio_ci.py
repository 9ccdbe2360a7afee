"""ratio_ci: the ratio of two sets of rounds with its interval (benchmarks/peers.py's peer / plugin figures)."""

from __future__ import annotations

import math

import pytest

from pytest_llmserve.verdicts.two_sample import ratio_ci


def test_equal_sets_give_ratio_one_inside_a_symmetric_interval() -> None:
    ratio, low, high = ratio_ci([100.0, 102.0, 98.0], [100.0, 102.0, 98.0])
    assert ratio == pytest.approx(1.0)
    assert low < 1.0 < high
    assert low * high == pytest.approx(1.0)  # symmetric on the log scale


def test_ratio_is_the_geometric_mean_ratio_and_the_interval_the_pooled_log_t() -> None:
    base, cur = [100.0, 110.0, 90.0], [200.0, 220.0, 180.0]
    ratio, low, high = ratio_ci(base, cur)
    assert ratio == pytest.approx(2.0)
    # By hand: log sd of both sets is s, pooled se = s * sqrt(2/3), df = 4, t(0.975, 4) = 2.7764.
    logs = [math.log(v) for v in base]
    mean = sum(logs) / 3
    s = math.sqrt(sum((v - mean) ** 2 for v in logs) / 2)
    half = 2.7764451 * s * math.sqrt(2 / 3)
    assert low == pytest.approx(2.0 * math.exp(-half), rel=1e-6)
    assert high == pytest.approx(2.0 * math.exp(half), rel=1e-6)


def test_wider_confidence_gives_a_wider_interval() -> None:
    base, cur = [100.0, 104.0, 97.0, 101.0], [95.0, 99.0, 93.0]
    _, low95, high95 = ratio_ci(base, cur)
    _, low99, high99 = ratio_ci(base, cur, confidence=0.99)
    assert low99 < low95 < high95 < high99


def test_one_round_each_has_a_ratio_but_no_interval() -> None:
    ratio, low, high = ratio_ci([100.0], [150.0])
    assert ratio == pytest.approx(1.5)
    assert math.isnan(low) and math.isnan(high)


@pytest.mark.parametrize(("base", "cur", "words"), [
    ([], [1.0], "ratio_ci baseline: no samples"),
    ([1.0, 2.0], [0.0], "ratio_ci current: 0.0 is not > 0"),
    ([1.0, math.nan], [1.0], "non-finite"),
])
def test_bad_samples_are_named(base: list[float], cur: list[float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ratio_ci(base, cur)
