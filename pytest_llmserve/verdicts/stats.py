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

Sizing (defaults ``alpha = 0.05``, ``min_samples = 3``). For a throughput with ~3 % round-to-round
noise, 5 rounds per side calls a real 10 % drop "regressed" almost always (measured in
``tests/unit/verdicts/test_stats.py``: 195 of 200 seeds "regressed", the other 5 "inconclusive", none "pass";
with re-runs from 3 current rounds up to 8, 199 of 200), because at 5 vs 5 an exact one-sided test
reaches p < 0.05 with up to 4 of the 25 pairs out of order (P(U <= 4) = 0.048). With 3 vs 3 no
verdict other than "inconclusive" is possible at alpha = 0.05, so a gate should record baselines with
at least 5 rounds and start the current side at >= 3 rounds (3 vs 5 reaches p = 0.018) with a cap of
about 10. The rule of thumb for the smallest detectable change at 80 % power is about
``2.5 * CV * sqrt(2 / n)``: 4.7 % for CV 3 % and n = 5, 7.9 % for CV 5 %. Under no change the false
"regressed" rate is below both ``alpha`` and the chance that noise alone moves the median beyond the
tolerance; with 3 % noise and a 5 % tolerance it measured 0 of 200 seeds (and 3.7-6.0 % with the
tolerance set to 0, i.e. alpha alone). Re-running an inconclusive comparison is sequential testing and
inflates ``alpha`` a little; the size requirement and the round cap keep that small (measured: 1 false
"regressed" in 200 seeds, baseline 5 rounds, current 3 to 8).

numpy and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["pass", "regressed", "improved", "inconclusive"]
OUTCOMES: tuple[str, ...] = ("pass", "regressed", "improved", "inconclusive")

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_SAMPLES = 3
DEFAULT_RESAMPLES = 2000
# Largest C(n + m, n) for which ties are handled by enumerating every permutation.
_EXACT_PERMUTATION_LIMIT = 20000
# Up to this many samples per side the exact Mann-Whitney distribution is used (no ties).
_EXACT_LIMIT = 50


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
        return cls(
            n=int(data["n"]),
            mean=float(data["mean"]),
            median=float(data["median"]),
            stdev=float(data["stdev"]),
            min=float(data["min"]),
            max=float(data["max"]),
            p90=float(data["p90"]),
            p99=float(data["p99"]),
            cv=float(data["cv"]),
        )


def _check_samples(samples: Sequence[float], what: str) -> list[float]:
    values = [float(v) for v in samples]
    if not values:
        raise ValueError(f"{what}: no samples")
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what}: non-finite sample(s) {bad[:3]} (an invalid round must not be summarised)")
    return values


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of sorted values, ``q`` in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(samples: Sequence[float]) -> Summary:
    """Summary of samples; raises ValueError for no samples or non-finite ones."""
    values = _check_samples(samples, "summarize")
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


def median_ci(samples: Sequence[float], *, confidence: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> tuple[float, float]:
    """Seeded percentile-bootstrap CI of the median of one set of samples (how well a baseline knows it)."""
    values = _check_samples(samples, "median_ci")
    if len(values) == 1:
        return values[0], values[0]
    import numpy as np

    rng = np.random.default_rng(seed)
    data = np.asarray(values, dtype=float)
    medians = np.median(data[rng.integers(0, data.size, size=(n_resamples, data.size))], axis=1)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(medians, [tail, 100.0 - tail])
    return float(low), float(high)


def min_attainable_p(n_baseline: int, n_current: int) -> float:
    """Smallest one-sided p an exact Mann-Whitney test can give: 1 / C(n + m, n) (complete separation)."""
    return 1.0 / math.comb(n_baseline + n_current, n_baseline)


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

    @property
    def failed(self) -> bool:
        return self.outcome == "regressed"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        names = set(cls.__dataclass_fields__)
        kwargs = {k: v for k, v in data.items() if k in names}
        if kwargs.get("outcome") not in OUTCOMES:
            raise ValueError(f"verdict outcome {kwargs.get('outcome')!r} is not one of {', '.join(OUTCOMES)}")
        return cls(**kwargs)


def _mann_whitney(
    baseline: list[float], current: list[float], *, higher_is_better: bool, seed: int
) -> tuple[float, float, str]:
    """One-sided p-values (worse, better) of current vs baseline and the name of the method used."""
    if len(set(baseline) | set(current)) == 1:
        return 1.0, 1.0, "all samples equal"
    import numpy as np
    from scipy.stats import PermutationMethod, mannwhitneyu

    n_b, n_c = len(baseline), len(current)
    has_ties = len(set(baseline + current)) < n_b + n_c
    method: Any
    if not has_ties and max(n_b, n_c) <= _EXACT_LIMIT:
        method, name = "exact", "Mann-Whitney U (exact)"
    elif has_ties and math.comb(n_b + n_c, n_b) <= _EXACT_PERMUTATION_LIMIT:
        method = PermutationMethod(n_resamples=_EXACT_PERMUTATION_LIMIT, rng=np.random.default_rng(seed))
        name = "Mann-Whitney U (exact permutation, ties)"
    elif has_ties and max(n_b, n_c) <= _EXACT_LIMIT:
        method = PermutationMethod(n_resamples=9999, rng=np.random.default_rng(seed))
        name = "Mann-Whitney U (permutation, 9999 resamples, ties)"
    else:
        method, name = "asymptotic", "Mann-Whitney U (normal approximation)"
    lower = float(mannwhitneyu(current, baseline, alternative="less", method=method).pvalue)
    higher = float(mannwhitneyu(current, baseline, alternative="greater", method=method).pvalue)
    return (lower, higher, name) if higher_is_better else (higher, lower, name)


def _bootstrap_ci(
    baseline: list[float],
    current: list[float],
    *,
    sign: float,
    n_resamples: int,
    confidence: float,
    seed: int,
) -> tuple[float, float]:
    import numpy as np

    rng = np.random.default_rng(seed)
    b = np.asarray(baseline, dtype=float)
    c = np.asarray(current, dtype=float)
    med_b = np.median(b[rng.integers(0, b.size, size=(n_resamples, b.size))], axis=1)
    med_c = np.median(c[rng.integers(0, c.size, size=(n_resamples, c.size))], axis=1)
    rel = sign * (med_c - med_b) / np.abs(med_b)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(rel, [tail, 100.0 - tail])
    return float(low), float(high)


def _effect_sizes(
    baseline: list[float], current: list[float], sign: float, base_median: float
) -> tuple[float, float]:
    diffs = sorted(c - b for c in current for b in baseline)
    greater = sum(1 for d in diffs if d > 0)
    less = sum(1 for d in diffs if d < 0)
    cliffs = sign * (greater - less) / len(diffs)
    hodges_lehmann = sign * percentile(diffs, 50) / abs(base_median)
    return cliffs, hodges_lehmann


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


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
    base = _check_samples(baseline, "baseline")
    cur = _check_samples(current, "current")
    if not tolerance >= 0 or not math.isfinite(tolerance):
        raise ValueError(f"tolerance = {tolerance!r}: must be a finite fraction >= 0 (0.05 = 5%)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha = {alpha!r}: must be in (0, 1)")
    if min_samples < 1:
        raise ValueError(f"min_samples = {min_samples!r}: must be >= 1")
    base_summary, cur_summary = summarize(base), summarize(cur)
    base_median, cur_median = base_summary.median, cur_summary.median
    if base_median == 0:
        raise ValueError("baseline median is 0: a relative change is undefined")
    sign = 1.0 if higher_is_better else -1.0
    raw_change = (cur_median - base_median) / abs(base_median)
    change = sign * raw_change
    p_worse, p_better, test = _mann_whitney(base, cur, higher_is_better=higher_is_better, seed=seed)
    p_value = p_worse if change < 0 else p_better
    ci_low, ci_high = _bootstrap_ci(
        base, cur, sign=sign, n_resamples=n_resamples, confidence=confidence, seed=seed
    )
    cliffs, hl = _effect_sizes(base, cur, sign, base_median)
    n_b, n_c = len(base), len(cur)
    floor_p = min_attainable_p(n_b, n_c)
    name = metric or "the metric"
    tol = f"±{tolerance * 100:g}%"
    ci = f"{confidence * 100:g}% CI {_pct(ci_low)}..{_pct(ci_high)}"
    counts = f"{n_b} baseline vs {n_c} current samples"

    outcome: Outcome
    if n_b < min_samples or n_c < min_samples or floor_p >= alpha:
        outcome = "inconclusive"
        reason = (
            f"too few samples to decide ({counts}): need >= {min_samples} a side and enough that an exact "
            f"one-sided Mann-Whitney p can fall below alpha={alpha:g} (smallest possible here "
            f"{floor_p:.3g}); median change {_pct(change)}"
        )
    elif change < -tolerance and p_worse < alpha:
        outcome = "regressed"
        reason = (
            f"{name} is worse by {_pct(change)[1:]} ({ci}), beyond the {tol} tolerance, and the drop is "
            f"significant (one-sided Mann-Whitney p={p_worse:.3g} < {alpha:g}; {counts})"
        )
    elif change > tolerance and p_better < alpha:
        outcome = "improved"
        reason = (
            f"{name} is better by {_pct(change)[1:]} ({ci}), beyond the {tol} tolerance, significant "
            f"(p={p_better:.3g} < {alpha:g}; {counts}); the baseline is stale: accept the new samples"
        )
    elif -tolerance <= ci_low and ci_high <= tolerance:
        outcome = "pass"
        reason = f"{name} median change {_pct(change)}: its {ci} lies within {tol} ({counts})"
    elif abs(change) <= tolerance and p_value >= alpha:
        outcome = "pass"
        reason = (
            f"{name} median change {_pct(change)} is within {tol} and not significant "
            f"(p={p_value:.3g}; {ci}; {counts})"
        )
    elif abs(change) <= tolerance:
        outcome = "inconclusive"
        reason = (
            f"{name} median change {_pct(change)} is within {tol} but significant (p={p_value:.3g}) and "
            f"its {ci} reaches beyond {tol} ({counts}): run more rounds"
        )
    else:
        outcome = "inconclusive"
        reason = (
            f"{name} median change {_pct(change)} is beyond the {tol} tolerance but not significant "
            f"(one-sided Mann-Whitney p={p_value:.3g} >= {alpha:g}; {ci}; {counts}): run more rounds"
        )
    return Verdict(
        outcome=outcome,
        reason=reason,
        change=change,
        raw_change=raw_change,
        p_value=p_value,
        p_worse=p_worse,
        p_better=p_better,
        ci_low=ci_low,
        ci_high=ci_high,
        confidence=confidence,
        cliffs_delta=cliffs,
        hodges_lehmann=hl,
        baseline_median=base_median,
        current_median=cur_median,
        n_baseline=n_b,
        n_current=n_c,
        higher_is_better=higher_is_better,
        tolerance=tolerance,
        alpha=alpha,
        min_samples=min_samples,
        test=test,
        metric=metric,
    )


def needs_more_rounds(verdict: Verdict, rounds_done: int, max_rounds: int) -> bool:
    """True while the verdict is inconclusive and the current side may still run more rounds."""
    return verdict.outcome == "inconclusive" and rounds_done < max_rounds
