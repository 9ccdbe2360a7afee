"""Operating characteristics of a throughput rule: seeded synthetic trials, how often and how fast it decides.

A trial draws a baseline of ``n_baseline`` rounds and up to ``max_rounds`` current rounds from the noise
model, then shows the rule the current rounds one at a time from its first look, as the gate does, until
it gives a verdict other than "inconclusive" or reaches the cap. Both rules of a comparison see the same
draws (same seed), so their figures differ only by the rule.

Noise model (per round, multiplicative): ``level * exp(cv * N(0, 1))``, and with probability ``p_slow`` a
slow round, multiplied by ``1 - U(slow_low, slow_high)`` (a round that shared the machine with other
work). The figures that justify the defaults are in docs/performance.md ("Time to verdict").
numpy and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

from pytest_llmserve.verdicts import stats, two_sample


@dataclass(frozen=True, slots=True)
class Noise:
    cv: float = 0.03
    p_slow: float = 0.0
    slow_low: float = 0.10
    slow_high: float = 0.50

    def describe(self) -> str:
        tail = (f", {self.p_slow:.0%} slow rounds (-{self.slow_low:.0%}..-{self.slow_high:.0%})"
                if self.p_slow else "")
        return f"CV {self.cv:.1%}{tail}"

    def draw(self, rng: np.random.Generator, n: int, level: float) -> list[float]:
        # lazy: numpy takes ~75 ms to import (-X importtime)
        import numpy as np

        values = level * np.exp(self.cv * rng.standard_normal(n))
        slow = rng.random(n) < self.p_slow
        factor = 1.0 - rng.uniform(self.slow_low, self.slow_high, n)
        return [float(v) for v in np.where(slow, values * factor, values)]


# A rule sees (baseline, current) at a look and answers a verdict; ``first`` is its first look.
Judge = Callable[[list[float], list[float]], stats.Verdict]


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    first: int
    max_rounds: int
    judge: Judge


def fixed_rule(*, tolerance: float = 0.05, alpha: float = stats.DEFAULT_ALPHA, first: int = 3,
               max_rounds: int = 8, n_resamples: int = stats.DEFAULT_RESAMPLES) -> Rule:
    """Today's rule: :func:`stats.decide` re-run after each extra round while inconclusive."""
    def judge(base: list[float], cur: list[float]) -> stats.Verdict:
        return stats.decide(base, cur, higher_is_better=True, tolerance=tolerance, alpha=alpha,
                            n_resamples=n_resamples)

    return Rule(f"fixed-sample Mann-Whitney, re-run ({first}..{max_rounds})", first, max_rounds, judge)


def sequential_rule(*, n_baseline: int, tolerance: float = 0.10, alpha: float = stats.DEFAULT_SEQUENTIAL_ALPHA,
                    beta: float = stats.DEFAULT_BETA, first: int = stats.SEQUENTIAL_FIRST_LOOK,
                    max_rounds: int = 8, n_resamples: int = 200) -> Rule:
    """The group-sequential rule (:func:`stats.decide_sequential`) against a fixed baseline.

    ``n_resamples`` only sizes the bootstrap CI shown beside the verdict; the verdict does not use it."""
    plan = stats.sequential_plan(stats.gate_looks(n_baseline, first, max_rounds), alpha=alpha, beta=beta)

    def judge(base: list[float], cur: list[float]) -> stats.Verdict:
        return stats.decide_sequential(base, cur, plan=plan, higher_is_better=True, tolerance=tolerance,
                                       n_resamples=n_resamples)

    return Rule(f"group-sequential t, Pocock, alpha {alpha:g} ({first}..{max_rounds})", first, max_rounds, judge)


@dataclass(frozen=True, slots=True)
class Trial:
    outcome: str
    rounds: int  # current rounds measured when the rule stopped


def run_trial(rule: Rule, base: list[float], cur: list[float]) -> Trial:
    """Show the rule the current rounds one at a time, from its first look to its cap."""
    n = rule.first
    while True:
        verdict = rule.judge(base, cur[:n])
        if verdict.outcome != "inconclusive" or n >= rule.max_rounds:
            return Trial(verdict.outcome, n)
        n += 1


def trials(rule: Rule, *, effect: float, noise: Noise, n_trials: int, seed: int, n_baseline: int = 5,
           max_rounds: int = 8) -> list[Trial]:
    """``n_trials`` seeded trials; trial i uses seed (seed, i), whatever the rule, so rules are paired."""
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    out = []
    for i in range(n_trials):
        rng = np.random.default_rng([seed, i])
        base = noise.draw(rng, n_baseline, 100.0)
        cur = noise.draw(rng, max_rounds, 100.0 * (1.0 + effect))
        out.append(run_trial(rule, base, cur))
    return out


@dataclass(frozen=True, slots=True)
class Characteristics:
    n_trials: int
    outcomes: dict[str, int]
    mean_rounds: float
    median_rounds: float
    p90_rounds: float
    rounds: dict[int, int] = field(default_factory=dict)  # rounds spent -> trials

    def rate(self, outcome: str) -> float:
        return self.outcomes.get(outcome, 0) / self.n_trials

    def to_dict(self) -> dict[str, object]:
        return {"n_trials": self.n_trials, "outcomes": self.outcomes, "mean_rounds": self.mean_rounds,
                "median_rounds": self.median_rounds, "p90_rounds": self.p90_rounds,
                "rounds": {str(k): v for k, v in sorted(self.rounds.items())}}


def characterise(results: Sequence[Trial]) -> Characteristics:
    """Outcome counts and the rounds spent (every trial, inconclusive ones at the cap)."""
    spent = sorted(float(t.rounds) for t in results)
    return Characteristics(
        n_trials=len(results),
        outcomes=dict(Counter(t.outcome for t in results)),
        mean_rounds=sum(spent) / len(spent),
        median_rounds=two_sample.percentile(spent, 50),
        p90_rounds=two_sample.percentile(spent, 90),
        rounds=dict(Counter(t.rounds for t in results)),
    )
