"""The bisect search on synthetic samples: each build's throughput drawn from a seeded normal distribution."""

from __future__ import annotations

import random
from typing import Protocol, cast

import pytest

from pytest_llmserve.verdicts.bisect import StepResult, bisect, classify, judge_step

NOISE = 0.02  # 2 % relative noise per round, about what the CPU default shows when the machine is quiet


class Measure(Protocol):
    calls: list[tuple[int, int]]

    def __call__(self, index: int, attempt: int) -> StepResult: ...


def sampler(means: list[float], *, rounds: int = 6, correct: list[bool] | None = None, seed: int = 1,
            noise: list[float] | None = None) -> Measure:
    """measure(index, attempt): the good end and build ``index`` sampled side by side, more rounds per attempt."""
    rng = random.Random(seed)
    calls: list[tuple[int, int]] = []

    def draw(i: int, n: int) -> list[float]:
        sd = (noise[i] if noise else NOISE) * means[i]
        return [rng.gauss(means[i], sd) for _ in range(n)]

    kept: dict[int, tuple[list[float], list[float]]] = {}

    def measure(index: int, attempt: int) -> StepResult:
        calls.append((index, attempt))
        ref, cand = kept.get(index, ([], []))
        ref, cand = ref + draw(0, rounds), cand + draw(index, rounds)  # a retry adds rounds to what it had
        kept[index] = (ref, cand)
        ok = correct[index] if correct else True
        return judge_step(index, ref, cand, higher_is_better=True, tolerance=0.10, correctness_ok=ok,
                          attempt=attempt)

    setattr(measure, "calls", calls)  # noqa: B010 (a function with an attribute)
    return cast(Measure, measure)


@pytest.mark.parametrize("first_bad", [1, 2, 3, 5, 7])
def test_known_first_bad_is_found(first_bad: int) -> None:
    means = [100.0 if i < first_bad else 70.0 for i in range(8)]
    measure = sampler(means)
    result = bisect(8, measure)
    assert result.status == "found" and result.first_bad == first_bad and result.last_good == first_bad - 1
    # the bad end first, then about log2(7) steps: never every build
    assert len({i for i, _ in measure.calls}) <= 4


def test_all_the_same_has_no_bad_build() -> None:
    result = bisect(5, sampler([100.0] * 5))
    assert result.status == "no-bad-build" and result.first_bad is None
    assert [s.index for s in result.steps] == [4] and result.steps[0].verdict == "pass"


def test_a_noisy_step_gets_more_rounds_then_is_reported_not_guessed() -> None:
    # build 2 spreads widely on both sides of the good end (60, 124, 62, 122, ...): its median moves beyond the
    # tolerance but never significantly, however many rounds; builds 3 and 4 are clearly slower
    base = sampler([100.0, 100.0, 100.0, 70.0, 70.0], rounds=3)
    spread = [60.0 + k if i % 2 == 0 else 124.0 - k for k in range(0, 20, 2) for i in range(2)]

    def measure(index: int, attempt: int) -> StepResult:
        if index != 2:
            return base(index, attempt)
        ref = [100.0, 101.0, 99.0] * attempt
        return judge_step(2, ref, spread[:3 * attempt], higher_is_better=True, tolerance=0.10, attempt=attempt)

    result = bisect(5, measure, max_attempts=3)
    assert result.status == "inconclusive" and result.first_bad is None and result.first_unknown == 2
    attempts = [s for s in result.steps if s.index == 2]
    assert [s.attempt for s in attempts] == [1, 2, 3] and [s.rounds for s in attempts] == [3, 6, 9]
    assert all(s.verdict == "inconclusive" for s in attempts)
    assert result.message.endswith("the first bad build lies in build 1 .. build 4 and is not guessed")


def test_a_correctness_failure_alone_is_bad() -> None:
    # same throughput everywhere; build 3 onward answers wrongly
    correct = [True, True, True, False, False, False]
    result = bisect(6, sampler([100.0] * 6, correct=correct))
    assert result.status == "found" and result.first_bad == 3
    bad = [s for s in result.steps if s.index == 3][0]
    assert bad.verdict == "pass" and not bad.correctness_ok


def test_find_change_counts_an_improvement() -> None:
    means = [100.0, 100.0, 130.0, 130.0]
    assert bisect(4, sampler(means)).status == "no-bad-build"  # faster is not a regression
    found = bisect(4, sampler(means), find_change=True)
    assert found.status == "found" and found.first_bad == 2


def test_classify_and_argument_checks() -> None:
    assert classify(StepResult(1, "improved", True)) == "good"
    assert classify(StepResult(1, "improved", True), find_change=True) == "bad"
    assert classify(StepResult(1, "inconclusive", True)) == "inconclusive"
    with pytest.raises(ValueError, match="at least two builds"):
        bisect(1, sampler([100.0]))


def test_a_step_is_judged_by_the_sequential_rule_with_a_look_per_attempt() -> None:
    # 3 % noise, no change: attempt 1 cannot exclude a 10 % change with 3 rounds a side; attempt 2 pools 6.
    ref = [100.0, 104.0, 97.0, 101.0, 96.0, 103.0]
    cand = [98.0, 103.0, 95.0, 102.0, 99.0, 100.0]
    first = judge_step(1, ref[:3], cand[:3], higher_is_better=True, tolerance=0.10, max_attempts=2, attempt=1)
    second = judge_step(1, ref, cand, higher_is_better=True, tolerance=0.10, max_attempts=2, attempt=2)
    assert "look 1 of 2" in first.extra["reason"]
    assert "look 2 of 2" in second.extra["reason"] and second.rounds == 6
    assert second.verdict == "pass"


def test_a_faster_build_is_good_in_a_bisect_but_a_change_with_find_change() -> None:
    ref = [109.78, 105.41, 131.89, 116.72, 136.41]
    faster = [131.58, 121.80, 137.95, 127.63, 137.41]  # +12.7 %, noisy (quiet bisect, 2026-12-02)
    step = judge_step(2, ref, faster, higher_is_better=True, tolerance=0.10, max_attempts=2, not_worse=True)
    assert step.verdict == "pass" and classify(step) == "good"
    either = judge_step(2, ref, faster, higher_is_better=True, tolerance=0.10, max_attempts=2)
    assert either.verdict == "inconclusive"  # find_change asks both ways: more rounds are needed

