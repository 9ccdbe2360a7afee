"""Summaries of benchmark samples and the regression decision.

One *sample* is one round of a fixed workload (e.g. the output token throughput of 64 requests), so a
benchmark compares a handful of baseline rounds with a handful of current rounds.

The decision rule (:func:`decide`)
----------------------------------
``change`` is the relative change of the median, signed in the metric's *good* direction
(``+0.07`` = 7 % better, ``-0.10`` = 10 % worse, whether the metric is a throughput or a latency).
``p_worse`` / ``p_better`` are one-sided Mann-Whitney U p-values (exact distribution for small samples
without ties, an exact or seeded permutation distribution with ties, the normal approximation for large
samples). A seeded bootstrap (2000 resamples) gives the 95 % CI of ``change``. Then, in order:

1. **inconclusive** - too few samples: fewer than ``min_samples`` on a side, *or* so few that even
   complete separation could not reach ``p < alpha``. The smallest one-sided p an exact Mann-Whitney
   test can give is ``1 / C(n + m, n)``: 0.05 for 3 vs 3 (never below alpha = 0.05), 0.029 for 3 vs 4,
   0.014 for 4 vs 4, 0.004 for 5 vs 5, 0.0002 for 10 vs 10.
2. **regressed** - ``change < -tolerance`` AND ``p_worse < alpha``: significance AND size, both.
3. **improved** - ``change > +tolerance`` AND ``p_better < alpha`` (the baseline is stale: refresh it).
4. **pass** - the 95 % CI of ``change`` lies within ``±tolerance``; or ``|change| <= tolerance`` and
   the change is not significant (``p >= alpha``) although the samples were enough for it to be.
5. **inconclusive** - otherwise: the median moved beyond the tolerance but the test is not significant,
   or the change is within the tolerance but significant with a CI reaching beyond it (a real change
   close to the tolerance). The caller runs more rounds, up to a bound (:func:`needs_more_rounds`),
   and then reports "inconclusive" as such (not as a pass, not as a failure).

Sizing of this fixed-sample rule (``alpha = 0.05``, ``min_samples = 3``; the gate now uses the sequential rule
below, this one gives the figures beside its verdict and ``llmserve baselines compare``). For a throughput
with ~3 % round-to-round noise, 5 rounds per side calls a real 10 % drop "regressed" almost always (measured
in ``tests/unit/verdicts/test_stats.py``: 195 of 200 seeds "regressed", the other 5 "inconclusive", none
"pass"; with re-runs from 3 current rounds up to 8, 199 of 200), because at 5 vs 5 an exact one-sided test
reaches p < 0.05 with up to 4 of the 25 pairs out of order (P(U <= 4) = 0.048). With 3 vs 3 no verdict other
than "inconclusive" is possible at alpha = 0.05, so a gate should record baselines with at least 5 rounds and
start the current side at >= 3 rounds (3 vs 5 reaches p = 0.018) with a cap of about 10. The rule of thumb for
the smallest detectable change at 80 % power is about ``2.5 * CV * sqrt(2 / n)``: 4.7 % for CV 3 % and n = 5,
7.9 % for CV 5 %. Under no change the false "regressed" rate is below both ``alpha`` and the chance that noise
alone moves the median beyond the tolerance; with 3 % noise and a 5 % tolerance it measured 0 of 200 seeds
(and 3.7-6.0 % with the tolerance set to 0, i.e. alpha alone). Re-running an inconclusive comparison is
sequential testing and inflates ``alpha`` a little; the size requirement and the round cap keep that small
(measured: 1 false "regressed" in 200 seeds, baseline 5 rounds, current 3 to 8).

The sequential rule (:func:`decide_sequential`): what the gate and the A/B runner use
---------------------------------------------------------------------------------------
Re-running the fixed-sample rule after each extra round is sequential testing without accounting for it, and
it cannot decide before 3 current rounds. The gate instead plans its looks (after current round 2, 3, ...,
``max_rounds``; :func:`gate_looks`, :func:`ab_looks`) and tests, on the log scale (throughput noise is
multiplicative), d = mean log(current) - mean log(baseline) with a pooled t statistic:

The ``tolerance`` is the change the gate is built to catch, as a user reads it: a drop of ``tolerance`` is
passed with a chance of at most ``beta`` (0.05) over all looks, and a change within half of it
(:func:`negligible_change`) is never called "regressed" or "improved", however significant. (Before issue 35 the
pass excluded twice the tolerance: ``tolerance = 0.05`` caught a 10 % drop. The default tolerance went from 0.05 to
0.10 with the change, so a default gate decides as before; a tolerance a user wrote now means the drop caught.)

1. **regressed** - t <= -t(nominal alpha, df) AND the median change < -tolerance / 2 (significance AND size, as
   above). The nominal level is the same at every look (Pocock), set so that the chance of crossing at *any*
   look under no change is ``alpha`` (default :data:`DEFAULT_SEQUENTIAL_ALPHA` = 0.02 over all looks).
2. **improved** - the mirror image.
3. **pass** - the median change lies within half the tolerance AND a change of ``tolerance`` is excluded both ways
   at the look's beta level: |d| + t(nominal beta, df) * se < log(1 + tolerance); ``beta`` bounds P(pass | a drop
   of ``tolerance``) over all looks. This is more than "not significant": a pass is evidence against a real drop.
4. **inconclusive** - no boundary crossed: one more round; at the last look, the final word (the gate says how
   many rounds the tolerance needs, :func:`resolution`; ``inconclusive = "fail"`` makes it a failure).

With ``not_worse=True`` (a bisect looking for a regression, where a faster build is as good as an unchanged
one) step 3 also passes when only the bad direction is excluded: the median change is not worse than half the
tolerance AND d - t(nominal beta, df) * se > -log(1 + tolerance), a one-sided non-inferiority test at the same
beta: P(pass | a drop of ``tolerance``) stays bounded by ``beta``.

Across runs (``baseline_runs``): a gate's baseline was recorded in other runs, on other boots of the server, and
the test is on the random-effects difference of :mod:`pytest_llmserve.verdicts.between_runs`, whose standard error
carries the spread between runs (estimated from a baseline of two or more runs, else a prior); the boundaries are
the same.

Inside one run (the A/B runner, a bisect) the slowest round of a side is set aside when it lies below the side's
other rounds beyond a t prediction bound at :data:`SLOW_ROUND_LEVEL`, at most one a side, and the verdict names it
(one round slowed by the machine inflates the t test's variance until the cap). Across runs (the gate against a
stored baseline) no round is set aside: other processes' share of the machine is measured during each round and a
contended round is measured again (gates/rounds.RoundLoop), so a slow round left is the server's own and counts;
the verdict names it ("slow and counted"). The figures beside the verdict (median change, Mann-Whitney p,
bootstrap CI) are the fixed-sample rule's. Operating characteristics (false "regressed" rate, power, rounds to a
verdict) of both rules, measured on seeded synthetic trials with the real server's noise and on the real server:
docs/performance.md, "Time to verdict"; :mod:`pytest_llmserve.verdicts.operating` runs such trials.

What the rule can resolve (:func:`resolution`): beside an inconclusive verdict the gate says, from each side's
log-sd and the plan, the smallest tolerance the pass boundary can reach within the planned rounds, and about how
many rounds the configured tolerance needs (against this baseline, or with a baseline of as many rounds), from
the same interval (|d| + t(nominal beta) * se against log(1 + tolerance)), each count judged with its own plan.
At CV 5 % and a 5-round baseline it says 8 current rounds resolve about ±11 % and ±10 % needs about 15 (the
figures of ±5.5 % and ±5 % before issue 35, when the pass excluded twice the tolerance); seeded A/A trials
(``tests/unit/verdicts/test_resolution.py``) pass more often at the stated count than at 8. Across runs the spread
between runs adds to se whatever the rounds, and the statement says when it alone keeps the tolerance out of reach.

The two-sample figures these rules decide on (Mann-Whitney p-values, bootstrap intervals, effect sizes, the pooled
log-ratio t, the slow-round test) and :func:`~pytest_llmserve.verdicts.two_sample.ratio_ci` are computed in
:mod:`pytest_llmserve.verdicts.two_sample`; this module decides and says why. numpy and scipy are imported inside
the functions that need them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypedDict

from pytest_llmserve.json_encoding import float_or_nan
from pytest_llmserve.verdicts.between_runs import between_run_difference, run_spread
from pytest_llmserve.verdicts.two_sample import (
    bootstrap_change_ci,
    bootstrap_median_ci,
    check_samples,
    effect_sizes,
    log_t,
    mann_whitney,
    min_attainable_p,
    percentile,
    slow_round,
)

Outcome = Literal["pass", "regressed", "improved", "inconclusive"]
OUTCOMES: tuple[str, ...] = ("pass", "regressed", "improved", "inconclusive")

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SAMPLES = 3
DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Summary:
    """Descriptive statistics of one metric's samples: the rounds of a benchmark, or a run's latencies (ms).

    ``stdev`` is the *sample* standard deviation (n - 1 in the denominator, 0 for one sample) and ``cv`` =
    stdev / |mean|. The samples are a few draws from a noisy process whose spread is what a reader wants
    to know, and n - 1 is the unbiased variance estimate for that; it is also what numpy (ddof=1),
    ``statistics.stdev`` and pytest-benchmark report, so our figures match theirs.
    """

    n: int
    mean: float
    median: float
    stdev: float
    min: float
    max: float
    p90: float
    p99: float
    cv: float

    @classmethod
    def undefined(cls) -> Summary:
        """The summary of no samples: n = 0 and every figure NaN (null in JSON)."""
        nan = math.nan
        return cls(n=0, mean=nan, median=nan, stdev=nan, min=nan, max=nan, p90=nan, p99=nan, cv=nan)

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """A summary as :meth:`to_dict` wrote it; a figure written null (JSON has no NaN) is NaN again."""
        return cls(
            n=int(data["n"]),
            mean=float_or_nan(data["mean"]),
            median=float_or_nan(data["median"]),
            stdev=float_or_nan(data["stdev"]),
            min=float_or_nan(data["min"]),
            max=float_or_nan(data["max"]),
            p90=float_or_nan(data["p90"]),
            p99=float_or_nan(data["p99"]),
            cv=float_or_nan(data["cv"]),
        )


def summarize(samples: Sequence[float]) -> Summary:
    """Summary of samples; raises ValueError for no samples or non-finite ones."""
    values = check_samples(samples, "summarize")
    n = len(values)
    ordered = sorted(values)
    mean = math.fsum(values) / n
    stdev = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return Summary(
        n=n,
        mean=mean,
        median=percentile(ordered, 50),
        stdev=stdev,
        min=ordered[0],
        max=ordered[-1],
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        cv=stdev / abs(mean) if mean else 0.0,
    )


# Rounds whose gated metric spreads wider than this (CV, sample stdev / mean) are called noisy in the reports.
# The sequential rule's operating characteristics were measured at CV 3 % (the embedded default's rounds on a quiet
# 2-core host: per-set CV 1.1-5.0 %) and 5 % (21.9 % of A/A comparisons then end inconclusive at the cap): at
# twice that, a 5 % tolerance cannot be judged in a handful of rounds, and the likelier cause is a machine that is
# busy or a server that was still warming up (docs/performance.md, "Time to verdict").
NOISY_CV = 0.10


def log_sd(samples: Sequence[float]) -> float:
    """The sample standard deviation (n - 1) of the natural logs of ``samples``: the spread the sequential rule
    (:func:`decide_sequential`, a t test on log values) works with. Close to the CV for a small spread (0.03 for
    CV 3 %), larger for a wide one (two rounds at 1,118 and 2,217 tok/s: CV 46.6 %, log sd 0.48); NaN for fewer
    than two samples or a sample <= 0 (no log)."""
    values = check_samples(samples, "log_sd")
    if len(values) < 2 or any(v <= 0 for v in values):
        return math.nan
    logs = [math.log(v) for v in values]
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in logs) / (len(logs) - 1))


def median_ci(samples: Sequence[float], *, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> tuple[float, float]:
    """Seeded percentile-bootstrap CI of the median of one set of samples (how well a baseline knows it)."""
    values = check_samples(samples, "median_ci")
    if len(values) == 1:
        return values[0], values[0]
    return bootstrap_median_ci(values, n_resamples=n_resamples, confidence=confidence, seed=seed)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of :func:`decide`, with every number behind it and a one-sentence ``reason``."""

    outcome: Outcome
    reason: str
    change: float  # relative median change, + = better in the metric's direction
    raw_change: float  # (current - baseline) / baseline of the medians, unsigned by direction
    p_value: float  # one-sided p in the direction of the observed change
    p_worse: float
    p_better: float
    ci_low: float  # bootstrap CI of ``change``
    ci_high: float
    confidence: float
    cliffs_delta: float  # in [-1, 1], + = current tends to be better
    hodges_lehmann: float  # median of pairwise differences / baseline median, + = better
    baseline_median: float
    current_median: float
    n_baseline: int
    n_current: int
    higher_is_better: bool
    tolerance: float
    alpha: float
    min_samples: int
    test: str  # which Mann-Whitney distribution produced the p-values
    metric: str | None = None
    # Which rule decided, and (sequential rule) the evidence at the look where it stopped.
    rule: str = "fixed"
    look: int = 0  # 1-based look of the plan; 0 for the fixed-sample rule
    looks: int = 0
    final_look: bool = False
    # None where the rule has no such figure (JSON null; NaN would not compare equal after a round trip)
    t_stat: float | None = None  # log-ratio t, + = better
    t_alpha: float | None = None  # |t| at or beyond which a change beyond the tolerance is significant here
    t_beta: float | None = None  # the quantile that excludes a change of ``margin`` for a pass here
    margin: float | None = None
    beta: float | None = None
    set_aside: str = ""  # rounds set aside as slow outliers, e.g. "current round 2 (-31.0%)" (inside one run only)

    @property
    def failed(self) -> bool:
        return self.outcome == "regressed"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        names = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in names}
        if kwargs.get("outcome") not in OUTCOMES:
            raise ValueError(f"verdict outcome {kwargs.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
        return cls(**kwargs)


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _check_fixed_arguments(tolerance: float, alpha: float, min_samples: int) -> None:
    if not tolerance >= 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance = {tolerance!r}: must be a finite fraction >= 0 (0.05 = 5%)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha = {alpha!r}: must be in (0, 1)")
    if min_samples < 1:
        raise ValueError(f"min_samples = {min_samples!r}: must be >= 1")


@dataclass(frozen=True, slots=True)
class _FixedEvidence:
    """What the fixed-sample rule decides on: the median change (+ = better), both one-sided Mann-Whitney p-values,
    the bootstrap CI of the change, and the sample counts."""

    change: float
    p_worse: float
    p_better: float
    ci_low: float
    ci_high: float
    n_baseline: int
    n_current: int

    @property
    def p_value(self) -> float:
        """The one-sided p in the direction of the observed change."""
        return self.p_worse if self.change < 0 else self.p_better


def _fixed_outcome(e: _FixedEvidence, *, tolerance: float, alpha: float, min_samples: int, confidence: float,
                   name: str) -> tuple[Outcome, str]:
    """The fixed-sample rule's steps, in order (module docstring, "The decision rule"), and the reason for the one
    that decides."""
    floor_p = min_attainable_p(e.n_baseline, e.n_current)
    tol = f"±{tolerance * 100:g}%"
    ci = f"{confidence * 100:g}% CI {_pct(e.ci_low)}..{_pct(e.ci_high)}"
    counts = f"{e.n_baseline} baseline vs {e.n_current} current samples"
    change = e.change
    if e.n_baseline < min_samples or e.n_current < min_samples or floor_p >= alpha:
        return "inconclusive", (
            f"too few samples to decide ({counts}): need >= {min_samples} a side and enough that an exact "
            f"one-sided Mann-Whitney p can fall below alpha={alpha:g} (smallest possible here "
            f"{floor_p:.3g}); median change {_pct(change)}"
        )
    if change < -tolerance and e.p_worse < alpha:
        return "regressed", (
            f"{name} is worse by {_pct(change)[1:]} ({ci}), beyond the {tol} tolerance, and the drop is "
            f"significant (one-sided Mann-Whitney p={e.p_worse:.3g} < {alpha:g}; {counts})"
        )
    if change > tolerance and e.p_better < alpha:
        return "improved", (
            f"{name} is better by {_pct(change)[1:]} ({ci}), beyond the {tol} tolerance, significant "
            f"(p={e.p_better:.3g} < {alpha:g}; {counts}); the baseline is stale: accept the new samples"
        )
    if -tolerance <= e.ci_low and e.ci_high <= tolerance:
        return "pass", f"{name} median change {_pct(change)}: its {ci} lies within {tol} ({counts})"
    if abs(change) <= tolerance and e.p_value >= alpha:
        return "pass", (
            f"{name} median change {_pct(change)} is within {tol} and not significant "
            f"(p={e.p_value:.3g}; {ci}; {counts})"
        )
    if abs(change) <= tolerance:
        return "inconclusive", (
            f"{name} median change {_pct(change)} is within {tol} but significant (p={e.p_value:.3g}) and "
            f"its {ci} reaches beyond {tol} ({counts}): run more rounds"
        )
    return "inconclusive", (
        f"{name} median change {_pct(change)} is beyond the {tol} tolerance but not significant "
        f"(one-sided Mann-Whitney p={e.p_value:.3g} >= {alpha:g}; {ci}; {counts}): run more rounds"
    )


def decide(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    higher_is_better: bool,
    tolerance: float,
    alpha: float = DEFAULT_ALPHA,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    metric: str | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> Verdict:
    """Compare current samples with baseline samples by the rule in the module docstring."""
    base = check_samples(baseline, "baseline")
    cur = check_samples(current, "current")
    _check_fixed_arguments(tolerance, alpha, min_samples)
    base_summary, cur_summary = summarize(base), summarize(cur)
    base_median, cur_median = base_summary.median, cur_summary.median
    if base_median == 0:
        raise ValueError("baseline median is 0: a relative change is undefined")
    sign = 1.0 if higher_is_better else -1.0
    raw_change = (cur_median - base_median) / abs(base_median)
    change = sign * raw_change
    p_worse, p_better, test = mann_whitney(base, cur, higher_is_better=higher_is_better, seed=seed)
    ci_low, ci_high = bootstrap_change_ci(
        base, cur, sign=sign, n_resamples=n_resamples, confidence=confidence, seed=seed
    )
    cliffs, hl = effect_sizes(base, cur, sign, base_median)
    evidence = _FixedEvidence(change, p_worse, p_better, ci_low, ci_high, len(base), len(cur))
    outcome, reason = _fixed_outcome(evidence, tolerance=tolerance, alpha=alpha, min_samples=min_samples,
                                     confidence=confidence, name=metric or "the metric")
    return Verdict(outcome=outcome, reason=reason, change=change, raw_change=raw_change, p_value=evidence.p_value,
                   p_worse=p_worse, p_better=p_better, ci_low=ci_low, ci_high=ci_high, confidence=confidence,
                   cliffs_delta=cliffs, hodges_lehmann=hl, baseline_median=base_median, current_median=cur_median,
                   n_baseline=len(base), n_current=len(cur), higher_is_better=higher_is_better, tolerance=tolerance,
                   alpha=alpha, min_samples=min_samples, test=test, metric=metric)


def needs_more_rounds(verdict: Verdict, rounds_done: int, max_rounds: int) -> bool:
    """True while the verdict is inconclusive and the current side may still run more rounds."""
    return verdict.outcome == "inconclusive" and rounds_done < max_rounds


# --------------------------------------------------------------------------- the sequential rule
# A group-sequential test on log throughput: looks after every round of the current side, from the first
# look to the round cap, with boundaries that spend the error rates over the planned looks, so that looking
# after every round does not inflate them (re-running today's fixed-sample test until it decides does).

SEQUENTIAL_FIRST_LOOK = 2  # one current round alone is never enough: one slow round would look like a drop
DEFAULT_BETA = 0.05  # P(pass | a drop of the tolerance): the gate's design power is 1 - beta
# A change within this share of the tolerance is negligible: never "regressed" or "improved", however significant.
NEGLIGIBLE_SHARE = 0.5
# The sequential rule's alpha over all looks: at 0.05 its false "regressed" rate under no change measured
# 1.1 % (docs/performance.md, "Time to verdict"), above the 1 % the gate promises; 0.02 measured 0.6 %.
DEFAULT_SEQUENTIAL_ALPHA = 0.02
# A slowest round is set aside when it is this improbable under the other rounds' spread (one per side).
SLOW_ROUND_LEVEL = 0.001
_BOUNDARY_DRAWS = 100_000
_BOUNDARY_SEED = 12345


@dataclass(frozen=True, slots=True)
class SequentialPlan:
    """The looks of one comparison and their boundaries (nominal one-sided levels per look).

    ``looks`` are (baseline samples, current samples) at each look. The test statistic at look k is
    z_k = d_k / (sigma * sqrt(1/nb_k + 1/nc_k)) with d_k the difference of the mean log values; its
    information is I_k = 1 / (1/nb_k + 1/nc_k), and for looks that add rounds to a side,
    corr(z_j, z_k) = sqrt(I_j / I_k) (j < k): the canonical joint distribution of group-sequential designs.
    A constant (Pocock) boundary on the z-scale is found so that the chance of crossing it at any look
    under the null is ``alpha`` (regressed / improved) or ``beta`` (pass, against a drop of ``margin``);
    each look's nominal level is converted to a t quantile with that look's degrees of freedom.
    """

    looks: tuple[tuple[int, int], ...]
    alpha: float
    beta: float
    z_alpha: float
    z_beta: float

    @property
    def nominal_alpha(self) -> float:
        # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
        from scipy.stats import norm

        return float(norm.sf(self.z_alpha))

    @property
    def nominal_beta(self) -> float:
        # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
        from scipy.stats import norm

        return float(norm.sf(self.z_beta))

    def look_of(self, n_baseline: int, n_current: int) -> int:
        """1-based index of the look with these sample counts; 0 when it is not a planned look."""
        for i, look in enumerate(self.looks, 1):
            if look == (n_baseline, n_current):
                return i
        return 0


def negligible_change(tolerance: float) -> float:
    """The change too small to call "regressed" or "improved" under ``tolerance`` (the change the gate catches)."""
    return tolerance * NEGLIGIBLE_SHARE


def _pocock_z(looks: Sequence[tuple[int, int]], level: float, draws: int = _BOUNDARY_DRAWS) -> float:
    """The constant z boundary crossed at some look with probability ``level`` under the canonical joint
    distribution of the looks' z statistics (seeded Monte Carlo: the same plan always gets the same bound;
    :func:`resolution` takes fewer ``draws`` for its many candidate plans)."""
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    info = np.array([1.0 / (1.0 / b + 1.0 / c) for b, c in looks])
    corr = np.sqrt(np.minimum.outer(info, info) / np.maximum.outer(info, info))
    rng = np.random.default_rng(_BOUNDARY_SEED)
    z = rng.standard_normal((draws, info.size)) @ np.linalg.cholesky(corr).T
    return float(np.quantile(z.max(axis=1), 1.0 - level))


def sequential_plan(looks: Sequence[tuple[int, int]], *, alpha: float = DEFAULT_ALPHA,
                    beta: float = DEFAULT_BETA) -> SequentialPlan:
    """Boundaries for the planned ``looks`` ((baseline, current) sample counts at each look, increasing)."""
    planned = tuple((int(b), int(c)) for b, c in looks)
    if not planned or any(b < 1 or c < 1 for b, c in planned):
        raise ValueError(f"looks = {planned!r}: each look needs samples on both sides")
    if any(b2 < b1 or c2 < c1 or (b2, c2) == (b1, c1) for (b1, c1), (b2, c2) in itertools.pairwise(planned)):
        raise ValueError(f"looks = {planned!r}: each look must add samples")
    if not 0 < alpha < 1 or not 0 < beta < 1:
        raise ValueError(f"alpha = {alpha!r}, beta = {beta!r}: must be in (0, 1)")
    return SequentialPlan(looks=planned, alpha=alpha, beta=beta, z_alpha=_pocock_z(planned, alpha),
                          z_beta=_pocock_z(planned, beta))


def gate_looks(n_baseline: int, first: int, max_rounds: int) -> tuple[tuple[int, int], ...]:
    """Looks of a gate against a fixed baseline: after each current round from ``first`` to ``max_rounds``."""
    return tuple((n_baseline, n) for n in range(max(first, 1), max(max_rounds, first) + 1))


def ab_looks(first: int, max_rounds: int) -> tuple[tuple[int, int], ...]:
    """Looks of an A/B comparison, both sides growing a round at a time."""
    return tuple((n, n) for n in range(max(first, 2), max(max_rounds, first) + 1))


class _SequentialFields(TypedDict):
    """The fields every verdict of the sequential rule sets on the fixed-sample rule's."""

    rule: str
    looks: int
    margin: float | None
    beta: float | None
    alpha: float
    tolerance: float


def _check_sequential_samples(base: list[float], cur: list[float], tolerance: float) -> None:
    if any(v <= 0 for v in base + cur):
        raise ValueError("samples must be > 0 for a test on the log scale")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance = {tolerance!r}: must be a fraction in (0, 1) (0.10 = a 10% change caught)")


def _not_a_look(n_baseline: int, n_current: int, plan: SequentialPlan, min_samples: int) -> str | None:
    """Why these sample counts cannot be decided at all (too few baseline samples, or not a look of the plan)."""
    if n_baseline < min_samples:
        return f"too few baseline samples to decide ({n_baseline} < {min_samples})"
    if plan.look_of(n_baseline, n_current) == 0:
        return f"{n_baseline} baseline vs {n_current} current samples is not a look of the plan {list(plan.looks)}"
    return None


@dataclass(frozen=True, slots=True)
class _LogRounds:
    """Both sides' rounds as signed log values (+ = better) once slow rounds are set aside, and what the verdict
    names of them: the rounds ``set_aside`` (inside one run), the slowest current round ``counted_slow`` (across
    runs)."""

    baseline: list[float]
    current: list[float]
    set_aside: str = ""
    counted_slow: str = ""


def _slow_round_named(side: str, values: list[float], index: int) -> str:
    return f"{side} round {index + 1} ({_pct(math.expm1(values[index] - _mean(values, index)))})"


def _log_rounds(base: list[float], cur: list[float], sign: float, *, across_runs: bool,
                min_samples: int) -> _LogRounds:
    """The rounds on the log scale, with slow rounds handled by where they were measured.

    Across runs (a gate against a stored baseline) every round counts: a round slowed by other processes is found by
    measuring them and measured again (gates/rounds.RoundLoop), so a slow round left is the server's own (a stall is
    a regression too); the slowest is named if it is an outlier. Inside one run (the A/B runner, a bisect) the
    slowest round of a side is set aside as before, and named."""
    lb = [sign * math.log(v) for v in base]
    lc = [sign * math.log(v) for v in cur]
    if across_runs:
        slow_c = slow_round(lc, lb, SLOW_ROUND_LEVEL)
        return _LogRounds(lb, lc, counted_slow="" if slow_c is None else _slow_round_named("current", lc, slow_c))
    aside = []
    drop_b = slow_round(lb, lc, SLOW_ROUND_LEVEL) if len(lb) > min_samples else None
    if drop_b is not None:
        aside.append(_slow_round_named("baseline", lb, drop_b))
        lb = lb[:drop_b] + lb[drop_b + 1:]
    drop_c = slow_round(lc, lb, SLOW_ROUND_LEVEL)
    if drop_c is not None:
        aside.append(_slow_round_named("current", lc, drop_c))
        lc = lc[:drop_c] + lc[drop_c + 1:]
    return _LogRounds(lb, lc, set_aside="; ".join(aside))


@dataclass(frozen=True, slots=True)
class _LookEvidence:
    """The sequential rule's figures at one look: d (the difference of the mean log values, + = better), its standard
    error and degrees of freedom, the t statistic, and the quantiles of the alpha and beta boundaries."""

    d: float
    se: float
    df: float
    t_stat: float
    t_alpha: float
    t_beta: float

    @property
    def excluded(self) -> float:
        """A change this large or larger is excluded at this look's level (log scale)."""
        return abs(self.d) + self.t_beta * self.se


def _look_evidence(rounds: _LogRounds, cur: list[float], sign: float, plan: SequentialPlan,
                   baseline_runs: Sequence[Sequence[float]] | None,
                   prior_between_sd: float | None) -> tuple[_LookEvidence, str]:
    """The test at this look: the pooled within-run t on the log values (inside one run), or the random-effects
    difference across runs; and, across runs, the words that say which spread dominates."""
    # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
    from scipy.stats import t as student_t

    df: float
    spread_words = ""
    if baseline_runs is None:
        d, se, df = log_t(rounds.baseline, rounds.current)  # d > 0 = better, on the log scale
    else:
        spread = run_spread(baseline_runs, cur, prior_between_sd=prior_between_sd)
        diff = between_run_difference(baseline_runs, cur, spread)
        d, se, df = sign * diff.d, diff.se, diff.df
        spread_words = f"; {spread.describe()}; the {diff.dominant} spread dominates the standard error"
    t_stat = d / se if se > 0 else (0.0 if d == 0 else math.copysign(math.inf, d))
    return _LookEvidence(d, se, df, t_stat, float(student_t.isf(plan.nominal_alpha, df)),
                         float(student_t.isf(plan.nominal_beta, df))), spread_words


def _sequential_outcome(e: _LookEvidence, change: float, *, plan: SequentialPlan, tolerance: float, not_worse: bool,
                        final: bool, name: str, counts: str) -> tuple[Outcome, str]:
    """The sequential rule's boundaries, in order (module docstring, "The sequential rule"), and the reason for the one
    crossed (or for none)."""
    margin = tolerance  # the change a pass excludes: the one the gate is built to catch
    negligible = negligible_change(tolerance)
    tol = f"±{negligible * 100:g}% (half the {tolerance * 100:g}% tolerance)"
    evidence = (f"log-ratio t={e.t_stat:+.2f} (df {e.df:.3g}); significant beyond |t| >= {e.t_alpha:.2f} (nominal "
                f"{plan.nominal_alpha:.3g} a look, alpha {plan.alpha:g} over {len(plan.looks)} looks)")
    if e.t_stat <= -e.t_alpha and change < -negligible:
        return "regressed", (f"{name} is worse by {_pct(change)[1:]}, beyond {tol}, and the drop is "
                             f"significant at this look: {evidence} ({counts})")
    if e.t_stat >= e.t_alpha and change > negligible:
        return "improved", (f"{name} is better by {_pct(change)[1:]}, beyond {tol}, significant at this "
                            f"look: {evidence} ({counts}); the baseline is stale: accept the new samples")
    if e.excluded < math.log1p(margin) and abs(change) <= negligible:
        return "pass", (f"{name} median change {_pct(change)} is within {tol}, and a change of ±{margin * 100:g}% "
                        f"(the tolerance) is excluded at this look (|d| + {e.t_beta:.2f}·se = "
                        f"{math.expm1(e.excluded) * 100:.1f}% < {margin * 100:g}%; nominal {plan.nominal_beta:.3g} a "
                        f"look, beta {plan.beta:g} over the looks; {counts})")
    lower = e.d - e.t_beta * e.se
    if not_worse and lower > -math.log1p(margin) and change >= -negligible:
        return "pass", (f"{name} median change {_pct(change)} is not worse than {tol}, and a drop of "
                        f"{margin * 100:g}% (the tolerance) is excluded at this look (d - {e.t_beta:.2f}·se = "
                        f"{math.expm1(lower) * 100:+.1f}% > -{margin * 100:g}%; nominal {plan.nominal_beta:.3g} "
                        f"a look, beta {plan.beta:g} over the looks; {counts}); a gain is not what is sought here")
    return "inconclusive", (f"{name} median change {_pct(change)}: no boundary crossed ({evidence}; a change of "
                            f"±{margin * 100:g}% excluded only down to {math.expm1(e.excluded) * 100:.1f}%; {counts})"
                            + ("" if final else ": run more rounds"))


def decide_sequential(
    baseline: Sequence[float],
    current: Sequence[float],
    *,
    plan: SequentialPlan,
    higher_is_better: bool,
    tolerance: float,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    metric: str | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
    not_worse: bool = False,
    baseline_runs: Sequence[Sequence[float]] | None = None,
    prior_between_sd: float | None = None,
) -> Verdict:
    """The group-sequential rule at one look of ``plan`` (the module docstring, "The sequential rule"):
    ``tolerance`` is the change it is built to catch; half of it is negligible.

    ``baseline_runs``: the baseline's rounds grouped by the run that measured them (``baseline`` is their
    concatenation): the comparison crosses runs, and the test is on the between-run difference of
    :mod:`pytest_llmserve.verdicts.between_runs` (its standard error carries the spread between runs, estimated
    from two or more runs, else ``prior_between_sd``) instead of the pooled within-run t."""
    base = check_samples(baseline, "baseline")
    cur = check_samples(current, "current")
    _check_sequential_samples(base, cur, tolerance)
    # The figures beside the verdict (median change, Mann-Whitney p, bootstrap CI, effect sizes) are the
    # fixed-sample rule's, so a reader sees the same numbers whichever rule decided.
    fixed = decide(base, cur, higher_is_better=higher_is_better, tolerance=negligible_change(tolerance),
                   alpha=plan.alpha, min_samples=min_samples, metric=metric, n_resamples=n_resamples,
                   confidence=confidence, seed=seed)
    look = plan.look_of(len(base), len(cur))
    name = metric or "the metric"
    common = _SequentialFields(rule="sequential", looks=len(plan.looks), margin=tolerance, beta=plan.beta,
                               alpha=plan.alpha, tolerance=tolerance)
    why = _not_a_look(len(base), len(cur), plan, min_samples)
    if why is not None:
        return replace(fixed, outcome="inconclusive", reason=f"{name}: {why}; median change {_pct(fixed.change)}",
                       look=look, final_look=look == len(plan.looks) or len(cur) >= plan.looks[-1][1],
                       **common)
    final = look == len(plan.looks)
    sign = 1.0 if higher_is_better else -1.0
    if baseline_runs is not None and sum(len(run) for run in baseline_runs) != len(base):
        raise ValueError(f"baseline_runs hold {sum(len(run) for run in baseline_runs)} rounds, the baseline "
                         f"{len(base)}: they must be the same rounds, grouped by run")
    rounds = _log_rounds(base, cur, sign, across_runs=baseline_runs is not None, min_samples=min_samples)
    counts = (f"{len(base)} baseline vs {len(cur)} current samples, look {look} of {len(plan.looks)}"
              + (f"; set aside as slow: {rounds.set_aside}" if rounds.set_aside else "")
              + (f"; slow and counted: {rounds.counted_slow}" if rounds.counted_slow else ""))
    if len(rounds.current) < plan.looks[0][1]:
        return replace(fixed, outcome="inconclusive", look=look, final_look=final, set_aside=rounds.set_aside,
                       reason=(f"{name} median change {_pct(fixed.change)}: too few current rounds left beside a "
                               f"slow one ({counts})" + ("" if final else ": run more rounds")), **common)
    evidence, spread_words = _look_evidence(rounds, cur, sign, plan, baseline_runs, prior_between_sd)
    outcome, reason = _sequential_outcome(evidence, fixed.change, plan=plan, tolerance=tolerance,
                                          not_worse=not_worse, final=final, name=name, counts=counts + spread_words)
    return replace(fixed, outcome=outcome, reason=reason, look=look, final_look=final, t_stat=evidence.t_stat,
                   t_alpha=evidence.t_alpha, t_beta=evidence.t_beta, set_aside=rounds.set_aside,
                   test=f"group-sequential t on log values (Pocock boundaries, {len(plan.looks)} looks)",
                   min_samples=min_samples, **common)


def _mean(values: list[float], without: int) -> float:
    rest = [v for i, v in enumerate(values) if i != without]
    return math.fsum(rest) / len(rest)


# --------------------------------------------------------------------------- what the rule can resolve
# An inconclusive verdict at the round cap is often not bad luck but arithmetic: at the measured noise the
# interval the sequential rule needs for a pass (|d| + t(nominal beta) * se < log(1 + margin)) cannot shrink
# below the margin within the planned rounds. :func:`resolution` says by how much, from the same formula.

# The chance, at the rounds :func:`resolution` states, that an unchanged metric's interval excludes the margin
# at the last look (a pass can also come earlier), and that a drop of :attr:`Resolution.detectable_drop`
# crosses the regression boundary there.
RESOLUTION_POWER = 0.8
# The most rounds a side :func:`resolution` looks at; beyond it "more than this" is said, not a number.
RESOLUTION_ROUND_LIMIT = 50
# Seeded draws for the Pocock bound of each candidate round count: the statement is "about N rounds", and
# one plan per candidate at the full :data:`_BOUNDARY_DRAWS` would take seconds (the bound moves by < 0.02).
_RESOLUTION_DRAWS = 20_000


@dataclass(frozen=True, slots=True)
class Resolution:
    """What the sequential rule can resolve at the measured noise (:func:`resolution`).

    ``log_sd`` is the pooled sd of the log values, as the t test pools it (from each side's ``*_log_sd``).
    ``resolvable_margin``: the smallest change an unchanged metric's interval excludes (with
    :data:`RESOLUTION_POWER`) at the plan's last look; a pass needs it below ``margin`` (the tolerance), so
    ``resolvable_tolerance`` (the same figure) is the smallest tolerance this noise passes within the planned
    rounds. ``between_sd``: the spread between runs a comparison across runs carries (0 inside one run) over
    ``baseline_runs`` recorded runs; no count of rounds brings the interval below what it alone leaves
    (``between_floor``: the interval's width with the rounds' spread gone, at the last look's quantiles).
    ``detectable_drop``: the smallest drop crossing the regression boundary there with the same power.
    ``current_rounds``: current rounds against this baseline that resolve ``tolerance`` (the margin excluded),
    None when no count up to :data:`RESOLUTION_ROUND_LIMIT` does (the baseline's own rounds, or the spread between
    runs, are then the limit); ``rounds_a_side``: the rounds of each side (a baseline recorded with as many) that
    do; None beyond the limit. ``ab``: both sides grow together (the A/B runner's plan)."""

    baseline_log_sd: float
    current_log_sd: float
    log_sd: float
    n_baseline: int
    n_current: int
    max_rounds: int
    tolerance: float
    margin: float
    power: float
    resolvable_margin: float
    resolvable_tolerance: float
    detectable_drop: float
    current_rounds: int | None
    rounds_a_side: int | None
    ab: bool = False
    between_sd: float = 0.0
    baseline_runs: int = 1
    between_floor: float = 0.0

    @property
    def resolved(self) -> bool:
        """The tolerance is resolvable within the planned rounds (an inconclusive verdict was then chance, or a
        change close to the tolerance)."""
        return self.resolvable_tolerance <= self.tolerance

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def line(self, *, rounds_setting: str = "max_rounds", tolerance_setting: str = "tolerance",
             record_hint: str = "") -> str:
        """One sentence for beside an inconclusive verdict: the noise, what it resolves within the cap, the rounds
        the tolerance needs, and what to change. ``rounds_setting`` / ``tolerance_setting`` name the settings as
        the caller's user writes them; ``record_hint`` (with ``{n}`` for the rounds) how a baseline with more
        rounds is recorded."""
        tol = f"±{self.tolerance * 100:g}%"
        limit = RESOLUTION_ROUND_LIMIT
        head = (f"at log-sd {self.log_sd:.3f} (baseline {self.baseline_log_sd:.3f}, current "
                f"{self.current_log_sd:.3f}), the rule resolves about ±{self.resolvable_tolerance:.1%} within "
                f"{self.max_rounds} rounds (a pass excludes ±{self.resolvable_margin:.1%}; a drop is proven from "
                f"about {self.detectable_drop:.1%})")
        if self.between_sd > 0:
            head += (f"; between runs {self.between_sd:.1%} over {self.baseline_runs} recorded run(s), which alone "
                     f"keeps a pass above ±{self.between_floor:.1%}")
        raise_tolerance = f"or raise `{tolerance_setting}`"
        if not self.resolved and self.between_floor >= self.tolerance:
            return (f"{head}: {tol} cannot be resolved between runs at this spread however many rounds: raise "
                    f"`{tolerance_setting}` above {self.between_floor:.0%}, or record the baseline on a host whose "
                    "boots differ less (docs/performance.md, 'Between runs')")
        if self.resolved:
            return (f"{head}: {tol} is resolvable within {rounds_setting} {self.max_rounds}, so this inconclusive "
                    "verdict is chance or a change close to the tolerance; more rounds decide it")
        if self.ab or self.current_rounds is not None:
            n = self.rounds_a_side if self.ab else self.current_rounds
            what = "rounds a side" if self.ab else f"current rounds against this {self.n_baseline}-round baseline"
            return (f"{head}; {tol} needs about {n} {what}; `{rounds_setting}` is {self.max_rounds}: raise it to "
                    f"{n} {raise_tolerance}")
        if self.rounds_a_side is None:
            return (f"{head}; {tol} needs more than {limit} rounds a side at this noise: raise `{tolerance_setting}`, "
                    "or measure on a quieter machine")
        n = self.rounds_a_side
        hint = f" ({record_hint.format(n=n)})" if record_hint else ""
        return (f"{head}; {tol} cannot be resolved against this {self.n_baseline}-round baseline in up to {limit} "
                f"current rounds (with the pooled spread, its {self.n_baseline} rounds are the limit); it needs about "
                f"{n} rounds a side: record the baseline with {n} rounds{hint} and raise `{rounds_setting}` to {n}, "
                f"{raise_tolerance}")


def _pass_width(z_beta: float, n_baseline: int, n_current: int, sd: float, power: float,
                between_var: float = 0.0) -> float:
    """(t(nominal beta) + t((1 + power) / 2)) * se at a look with these counts, ``z_beta`` the plan's Pocock bound:
    the interval half-width, on the log scale, that an unchanged metric's pass needs below log(1 + margin)
    there (decide_sequential's pass). ``between_var``: the between-run part of se² (verdicts/between_runs)."""
    # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
    from scipy.stats import norm
    from scipy.stats import t as student_t

    df = n_baseline + n_current - 2
    t_beta = float(student_t.isf(float(norm.sf(z_beta)), df))
    t_power = float(student_t.isf((1.0 - power) / 2.0, df))
    return (t_beta + t_power) * math.sqrt(sd * sd * (1.0 / n_baseline + 1.0 / n_current) + between_var)


def pooled_log_sd(baseline_log_sd: float, n_baseline: int, current_log_sd: float, n_current: int) -> float:
    """The pooled sd of two sides' log values (decide_sequential's t test pools them): a side with fewer than two
    rounds (no sd of its own) takes the other's."""
    parts = [(sd, n) for sd, n in ((baseline_log_sd, n_baseline), (current_log_sd, n_current))
             if n >= 2 and math.isfinite(sd)]
    if not parts:
        raise ValueError(f"log-sd {baseline_log_sd!r} over {n_baseline} baseline rounds and {current_log_sd!r} over "
                         f"{n_current} current rounds: no side has two rounds with a spread")
    return math.sqrt(math.fsum((n - 1) * sd * sd for sd, n in parts) / sum(n - 1 for _, n in parts))


def resolution(baseline_log_sd: float, current_log_sd: float, *, n_baseline: int, n_current: int,
               plan: SequentialPlan, tolerance: float, power: float = RESOLUTION_POWER,
               both_sides_grow: bool = False, between_sd: float = 0.0, baseline_runs: int = 1) -> Resolution:
    """What :func:`decide_sequential` can resolve at this noise (each side's log-sd, :func:`log_sd`) with
    ``plan``, and the rounds the ``tolerance`` needs.

    The pass boundary is decide_sequential's: |d| + t(nominal beta, df) * se < log(1 + margin), se = pooled sd *
    sqrt(1/nb + 1/nc). For an unchanged metric |d| / se is |t(df)|, so the pass is reached at the last look
    with probability ``power`` when (t(nominal beta) + t((1 + power) / 2)) * se <= log(1 + margin); the
    regression boundary likewise proves a drop δ when (t(nominal alpha) + t(power)) * se <= -log(1 - δ).
    More rounds mean more looks, and a Pocock bound over more looks is higher: each candidate round count is
    judged with its own plan (gate_looks, or ab_looks with ``both_sides_grow``: the A/B runner's), the one
    the gate would use with ``max_rounds`` set to it. The median change must also lie within the tolerance;
    at this width it almost always does, and it is not modelled."""
    # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
    from scipy.stats import norm
    from scipy.stats import t as student_t

    margin = tolerance  # what a pass excludes (decide_sequential)
    if not 0 < tolerance < 1 or not 0 < power < 1:
        raise ValueError(f"tolerance {tolerance!r}, power {power!r}: need both in (0, 1)")
    sd = pooled_log_sd(baseline_log_sd, n_baseline, current_log_sd, n_current)
    # Across runs the spread between them adds tau^2 (1 + 1/K) to se^2 whatever the rounds (verdicts/between_runs).
    between_var = between_sd * between_sd * (1.0 + 1.0 / max(baseline_runs, 1))
    nb, cap = plan.looks[-1]
    first = plan.looks[0][1]
    # Now: the plan as it stands, at its last look.
    width = _pass_width(plan.z_beta, nb, cap, sd, power, between_var)
    resolvable = math.expm1(width)
    floor = math.expm1(_pass_width(plan.z_beta, nb, cap, 0.0, power, between_var))
    df = nb + cap - 2
    t_alpha = float(student_t.isf(plan.nominal_alpha, df))
    t_power = float(student_t.isf(1.0 - power, df))
    detectable = -math.expm1(-(t_alpha + t_power) * math.sqrt(sd * sd * (1.0 / nb + 1.0 / cap) + between_var))
    bound = math.log1p(margin)
    z_one_look = float(norm.isf(plan.beta))  # a bound over one look: the lowest any plan has

    def needed(looks_for: Callable[[int], tuple[tuple[int, int], ...]], baseline_for: Callable[[int], int]
               ) -> int | None:
        # The first count whose pass width fits, scanning up: against a fixed baseline the width stops shrinking
        # (se tends to sd / sqrt(nb)) while the bound over more looks keeps growing, so it is not monotone. A count
        # whose width is too wide even with the lowest bound a plan of that many looks can have (one look's, or
        # this plan's for more looks than it has: more looks raise the bound) is passed over without a plan.
        for n in range(first, RESOLUTION_ROUND_LIMIT + 1):
            z_low = plan.z_beta if n >= cap else z_one_look
            if _pass_width(z_low, baseline_for(n), n, sd, power, between_var) > bound:
                continue
            z = _pocock_z(looks_for(n), plan.beta, _RESOLUTION_DRAWS)
            if _pass_width(z, baseline_for(n), n, sd, power, between_var) <= bound:
                return n
        return None

    if both_sides_grow:
        current_rounds = needed(lambda n: ab_looks(first, n), lambda n: n)
        a_side = current_rounds
    else:
        current_rounds = needed(lambda n: gate_looks(nb, first, n), lambda n: nb)
        a_side = needed(lambda n: gate_looks(n, first, n), lambda n: n)
    return Resolution(baseline_log_sd=baseline_log_sd, current_log_sd=current_log_sd, log_sd=sd, n_baseline=nb,
                      n_current=n_current, max_rounds=cap, tolerance=tolerance, margin=margin, power=power,
                      resolvable_margin=resolvable, resolvable_tolerance=resolvable,
                      detectable_drop=detectable, current_rounds=current_rounds, rounds_a_side=a_side,
                      ab=both_sides_grow, between_sd=between_sd, baseline_runs=baseline_runs, between_floor=floor)
