"""Bisecting an ordered range of builds with the statistical verdict at every step (pure logic).

Builds ``B0 .. Bn`` are ordered; ``B0`` is known good. Each step measures one build against the good end
(the runner decides how: interleaved rounds of ``B0`` and the build) and hands back a :class:`StepResult`:
the throughput verdict (the gate's sequential rule, one look per attempt) and whether its correctness
checks passed. A step is

* **bad**: a correctness failure, or "regressed" (with ``find_change``: "regressed" or "improved",
  the first significant change in either direction);
* **good**: "pass" (and, without ``find_change``, "improved": faster is not the regression sought);
* **inconclusive**: the verdict could not decide. The step is measured again with more rounds, at most
  ``max_attempts`` times; still inconclusive, the search stops and reports the range that is left,
  rather than guessing a side.

The bad end is measured first: a range whose last build is not bad has no first bad build to find, and
that is the answer (not a guess at the last build). Nothing here runs a server: :func:`bisect` takes a
``measure(index, attempt)`` callable, so the search is tested on synthetic samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pytest_llmserve.verdicts import stats

Classification = Literal["good", "bad", "inconclusive"]
Status = Literal["found", "no-bad-build", "inconclusive"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One measurement of build ``index`` against the good end."""

    index: int
    verdict: str  # stats outcome: pass | regressed | improved | inconclusive ("-" when not measured)
    correctness_ok: bool
    median: float | None = None  # the build's median of the metric
    reference_median: float | None = None  # the good end's median in the same step
    change: float | None = None  # relative, + = better
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    attempt: int = 1
    rounds: int = 0
    correctness_detail: str = ""
    extra: dict[str, str] = field(default_factory=dict)  # what a report says beside the step (reason, invalid_round)


def classify(step: StepResult, *, find_change: bool = False) -> Classification:
    if not step.correctness_ok:
        return "bad"
    if step.verdict == "regressed" or (find_change and step.verdict == "improved"):
        return "bad"
    if step.verdict in ("pass", "improved"):
        return "good"
    return "inconclusive"


@dataclass(frozen=True, slots=True)
class BisectResult:
    status: Status
    first_bad: int | None  # index of the first bad build when found
    last_good: int
    first_unknown: int | None  # with status "inconclusive": the build that could not be decided
    steps: tuple[StepResult, ...]
    message: str

    def classifications(self, *, find_change: bool = False) -> list[Classification]:
        return [classify(s, find_change=find_change) for s in self.steps]


def bisect(n_builds: int, measure: Callable[[int, int], StepResult], *, max_attempts: int = 3,
           find_change: bool = False, names: list[str] | None = None) -> BisectResult:
    """Binary search for the first bad build in ``0 .. n_builds - 1`` (index 0 is the good end).

    ``measure(index, attempt)`` measures that build (attempt 1, 2, ... adds rounds for an inconclusive
    step); it is called at most ``max_attempts`` times per build.
    """
    if n_builds < 2:
        raise ValueError(f"bisect needs at least two builds (a good and a bad end), got {n_builds}")
    if max_attempts < 1:
        raise ValueError(f"max_attempts = {max_attempts}: must be >= 1")
    label = (lambda i: names[i]) if names else (lambda i: f"build {i}")
    steps: list[StepResult] = []

    def judge(index: int) -> Classification:
        kind: Classification = "inconclusive"
        for attempt in range(1, max_attempts + 1):
            step = measure(index, attempt)
            steps.append(step)
            kind = classify(step, find_change=find_change)
            if kind != "inconclusive":
                break
        return kind

    sought = "significant change" if find_change else "bad build"
    lo, hi = 0, n_builds - 1
    end = judge(hi)
    if end == "good":
        return BisectResult("no-bad-build", None, hi, None, tuple(steps),
                            f"the last build ({label(hi)}) is not bad against {label(0)}: no {sought} in the range")
    if end == "inconclusive":
        return BisectResult("inconclusive", None, 0, hi, tuple(steps),
                            f"the last build ({label(hi)}) stayed inconclusive after {max_attempts} attempts: "
                            f"the range has no decided bad end")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        kind = judge(mid)
        if kind == "bad":
            hi = mid
        elif kind == "good":
            lo = mid
        else:
            return BisectResult(
                "inconclusive", None, lo, mid, tuple(steps),
                f"{label(mid)} stayed inconclusive after {max_attempts} attempts: the first {sought} lies in "
                f"{label(lo + 1)} .. {label(hi)} and is not guessed")
    return BisectResult("found", hi, lo, None, tuple(steps),
                        f"first {sought}: {label(hi)} (last good: {label(lo)})")


def attempt_looks(rounds: int, max_attempts: int) -> tuple[tuple[int, int], ...]:
    """The looks of a step: after each attempt, both sides having ``rounds`` more rounds."""
    return tuple((k * rounds, k * rounds) for k in range(1, max_attempts + 1))


def judge_step(index: int, reference: list[float], candidate: list[float], *, higher_is_better: bool,
               tolerance: float, alpha: float | None = None, max_attempts: int = 1,
               rounds_per_attempt: int | None = None, correctness_ok: bool = True,
               correctness_detail: str = "", attempt: int = 1, metric: str | None = None,
               not_worse: bool = False) -> StepResult:
    """A step's result from the good end's and the build's samples so far, by the gate's rule: the
    sequential test (:func:`pytest_llmserve.verdicts.stats.decide_sequential`) whose looks are the step's
    attempts, so that looking again after an inconclusive attempt does not spend more than ``alpha`` in all.
    Each attempt adds ``rounds_per_attempt`` rounds a side (default: as many as measured per attempt so far);
    an attempt that gave no number (an invalid round) spends no look. ``not_worse``: a bisect for a
    regression, where a build shown not slower beyond the tolerance is good even when it is faster."""
    if not reference or not candidate:
        return StepResult(index, "inconclusive", correctness_ok, attempt=attempt, rounds=len(candidate),
                          correctness_detail=correctness_detail or "no valid round")
    per_attempt = rounds_per_attempt or max(1, len(candidate) // attempt)
    looks = list(attempt_looks(per_attempt, max(max_attempts, attempt)))
    looks[attempt - 1] = (len(reference), len(candidate))  # as measured (a side may have a round fewer)
    if any(b2 <= b1 or c2 <= c1 for (b1, c1), (b2, c2) in zip(looks, looks[1:], strict=False)):
        looks = [(len(reference), len(candidate))]  # uneven attempts: this look alone
    plan = stats.sequential_plan(looks, alpha=stats.DEFAULT_SEQUENTIAL_ALPHA if alpha is None else alpha)
    v = stats.decide_sequential(reference, candidate, plan=plan, higher_is_better=higher_is_better,
                                tolerance=tolerance, metric=metric, not_worse=not_worse)
    return StepResult(index, v.outcome, correctness_ok, median=v.current_median, reference_median=v.baseline_median,
                      change=v.change, ci=(v.ci_low, v.ci_high), p_value=v.p_value, attempt=attempt,
                      rounds=len(candidate), correctness_detail=correctness_detail, extra={"reason": v.reason})
