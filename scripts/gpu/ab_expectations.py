"""What the GPU scripts' A/B tests expect of an A/B's outcome, judged from the outcome alone (no pytest import).

``llm_ab.run(a=..., b=...)`` returns a :class:`~pytest_llmserve.report.outcome.BenchOutcome` whose verdict is B
(the candidate) against A (the reference): "improved" = B better beyond the tolerance with significance,
"regressed" = B worse, "pass" = a change beyond the margin excluded, "inconclusive" = none of these. A test that
accepted all four could not fail, so each test states one :data:`ABExpectation`:

* a verdict word (``"improved"``, ``"regressed"``, ``"pass"``) where the direction is known from a measurement;
* ``"decided"`` where it is not known in advance: any of pass / improved / regressed, never inconclusive, and
  the direction found is reported.

Either way the verdict must come from valid rounds: no error, not confounded by a busy host, at least the rounds
asked for on each side, each with a finite positive figure of the gated metric, and the verdict counting exactly
those rounds. :func:`check_ab` returns what it found as a typed :class:`ABCheck`; the tests assert on ``met`` and
print ``story``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pytest_llmserve.bench_face import ABFace
from pytest_llmserve.report.outcome import BenchOutcome

ABExpectation = Literal["improved", "regressed", "pass", "decided"]
#: pytest's ``record_property`` fixture: a name and a value for the junit XML.
RecordProperty = Callable[[str, object], None]
#: The verdicts that decide something; "inconclusive" does not.
DECIDED_VERDICTS: tuple[str, ...] = ("pass", "improved", "regressed")


@dataclass(frozen=True)
class ABCheck:
    """One A/B outcome against its expectation. ``problems`` is empty when the expectation is met; each names what
    is wrong (an invalid round, a wrong verdict) in words for the failure message."""

    expected: ABExpectation
    verdict: str | None  # the verdict reached; None where none was (an error, a confounded run)
    direction: str  # what B did against A, in words: the record a "decided" test exists to make
    problems: tuple[str, ...]
    story: str  # the sides, medians, change, interval, rounds and the verdict's reason: printed by every test

    @property
    def met(self) -> bool:
        return not self.problems

    def failure_message(self) -> str:
        return (f"A/B expected {_expected_words(self.expected)}, but: " + "; ".join(self.problems)
                + f"\n{self.story}")


def _expected_words(expected: ABExpectation) -> str:
    if expected == "decided":
        return "a decided verdict (pass, improved or regressed) from valid rounds"
    return f"the verdict {expected!r} from valid rounds"


def round_problems(outcome: BenchOutcome, min_rounds: int) -> list[str]:
    """Why the outcome's verdict does not stand on ``min_rounds`` or more valid rounds a side (empty: it does)."""
    if outcome.error:
        return [f"the A/B was invalid: {outcome.error}"]
    if outcome.confounded:
        return ["no verdict: the host stayed busy (confounded): "
                + "; ".join(r.reason for r in outcome.contended_rounds)]
    problems = []
    side_a = outcome.baseline_samples
    side_b = outcome.samples.get(outcome.metric, [])
    for name, values in (("A", side_a), ("B", side_b)):
        if len(values) != outcome.rounds:
            # The runner's judge drops a round without a figure of the metric: such a round was not valid.
            problems.append(f"side {name} has {len(values)} figure(s) of {outcome.metric} for {outcome.rounds} "
                            "rounds (a round without one was not valid)")
        bad = [v for v in values if not (math.isfinite(v) and v > 0)]
        if bad:
            problems.append(f"side {name} has round figures that are not finite and positive: {bad}")
    if outcome.rounds < min_rounds:
        problems.append(f"{outcome.rounds} round(s) a side, fewer than the {min_rounds} asked for")
    verdict = outcome.verdict
    if verdict is None:
        problems.append("no verdict was reached")
    elif (verdict.n_baseline, verdict.n_current) != (len(side_a), len(side_b)):
        problems.append(f"the verdict counted {verdict.n_baseline} A and {verdict.n_current} B rounds, not the "
                        f"{len(side_a)} and {len(side_b)} measured")
    return problems


def direction(outcome: BenchOutcome) -> str:
    """What B did against A on the gated metric, in the verdict's words and figures."""
    verdict = outcome.verdict
    if verdict is None:
        return "no direction: no verdict"
    words = {"improved": "B better than A beyond the tolerance",
             "regressed": "B worse than A beyond the tolerance",
             "pass": "no change beyond the margin either way",
             "inconclusive": "not decided"}[verdict.outcome]
    return (f"{words} ({outcome.metric} median change {verdict.change:+.1%}, 95% CI "
            f"{verdict.ci_low:+.1%}..{verdict.ci_high:+.1%})")


def story(outcome: BenchOutcome) -> str:
    """One paragraph for the test's printed output: what was compared, each side's median, the rounds, the
    contended rounds measured again and the verdict's own reason."""
    verdict = outcome.verdict
    a = outcome.baseline_samples
    b = outcome.samples.get(outcome.metric, [])
    medians = ""
    if verdict is not None:
        medians = f"A median {verdict.baseline_median:.1f}, B median {verdict.current_median:.1f}; "
    return (f"A/B {outcome.server_id} on {outcome.workload}: {medians}{len(a)} A and {len(b)} B rounds "
            f"({len(outcome.contended_rounds)} contended round(s) measured again); verdict "
            f"{verdict.outcome if verdict else outcome.status}: {verdict.reason if verdict else outcome.error}")


def check_ab(outcome: BenchOutcome, expected: ABExpectation, *, min_rounds: int) -> ABCheck:
    """Whether ``outcome`` meets ``expected`` from at least ``min_rounds`` valid rounds a side."""
    problems = round_problems(outcome, min_rounds)
    verdict = outcome.verdict.outcome if outcome.verdict is not None else None
    if verdict is not None:
        if expected == "decided" and verdict not in DECIDED_VERDICTS:
            problems.append(f"the verdict is {verdict!r}: the rounds did not decide the direction")
        elif expected != "decided" and verdict != expected:
            problems.append(f"the verdict is {verdict!r}, not {expected!r}")
    return ABCheck(expected=expected, verdict=verdict, direction=direction(outcome), problems=tuple(problems),
                   story=story(outcome))


def run_expected_ab(llm_ab: ABFace, record_property: RecordProperty, *, a: str, b: str, workload: str,
                    expected: ABExpectation, rounds: int = 5, max_rounds: int = 8, tolerance: float = 0.10,
                    metric: str = "output_throughput") -> ABCheck:
    """Run the A/B and judge it against ``expected``; the check's verdict and direction go into the junit XML
    (``ab_verdict``, ``ab_direction``) and its story to the test's output.

    Where a verdict word is expected, one look after ``rounds`` a side, and the runner itself fails a "regressed"
    verdict with its figures. Where any decided verdict is the answer, the sequential rule may look again after each
    further pair up to ``max_rounds`` a side, and a "regressed" verdict is a finding, not a failure: the caller
    judges it (``judged_by_caller``). ``tolerance`` 0.10: "improved" needs a significant gain beyond half of it (5 %),
    what 0.05 asked before issue 35 made the tolerance the change a pass excludes."""
    decided = expected == "decided"
    outcome = llm_ab.run(a=a, b=b, workload=workload, rounds=rounds, max_rounds=max_rounds if decided else rounds,
                         metric=metric, tolerance=tolerance, judged_by_caller=decided)
    check = check_ab(outcome, expected, min_rounds=rounds)
    record_property("ab_verdict", check.verdict)
    record_property("ab_direction", check.direction)
    print(f"{check.story}\ndirection: {check.direction}")
    return check
