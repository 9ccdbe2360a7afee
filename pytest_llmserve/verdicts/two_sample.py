"""Two-sample statistics, with no verdict in them: the figures the rules of :mod:`pytest_llmserve.verdicts.stats`
decide on, and the ratio of two sets of rounds.

One *sample* is one round of a benchmark. Here: the checks every set of samples passes (:func:`check_samples`),
the linear-interpolation :func:`percentile`, the one-sided Mann-Whitney p-values (exact, permutation or normal,
by the samples' size and ties) and the smallest p they can reach, seeded bootstrap intervals of a median and of
the relative change of the median, effect sizes (Cliff's delta, Hodges-Lehmann), the sequential rule's pooled
log-ratio t and its test for a slow outlier round, and :func:`ratio_ci` (one tool or build against another,
benchmarks/peers.py's figures). Which outcome these figures make is :mod:`~pytest_llmserve.verdicts.stats`'s job.

numpy and scipy are imported inside the functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from scipy.stats import PermutationMethod

# Largest C(n + m, n) for which ties are handled by enumerating every permutation.
_EXACT_PERMUTATION_LIMIT = 20000
# Up to this many samples per side the exact Mann-Whitney distribution is used (no ties).
_EXACT_LIMIT = 50


def check_samples(samples: Sequence[float], what: str) -> list[float]:
    """``samples`` as floats; ``ValueError`` naming ``what`` for none, or for a non-finite one."""
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


def min_attainable_p(n_baseline: int, n_current: int) -> float:
    """Smallest one-sided p an exact Mann-Whitney test can give: 1 / C(n + m, n) (complete separation)."""
    return 1.0 / math.comb(n_baseline + n_current, n_baseline)


def mann_whitney(
    baseline: list[float], current: list[float], *, higher_is_better: bool, seed: int
) -> tuple[float, float, str]:
    """One-sided p-values (worse, better) of current vs baseline and the name of the method used."""
    if len(set(baseline) | set(current)) == 1:
        return 1.0, 1.0, "all samples equal"
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np
    from scipy.stats import PermutationMethod, mannwhitneyu

    n_b, n_c = len(baseline), len(current)
    has_ties = len(set(baseline + current)) < n_b + n_c
    method: str | PermutationMethod
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


def bootstrap_change_ci(
    baseline: list[float],
    current: list[float],
    *,
    sign: float,
    n_resamples: int,
    confidence: float,
    seed: int,
) -> tuple[float, float]:
    """Seeded percentile-bootstrap interval of the relative change of the median, signed by ``sign`` (+1: higher
    is better), each side resampled on its own."""
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    rng = np.random.default_rng(seed)
    med_b = _resampled_medians(rng, baseline, n_resamples)
    med_c = _resampled_medians(rng, current, n_resamples)
    return _percentile_interval(sign * (med_c - med_b) / np.abs(med_b), confidence)


def bootstrap_median_ci(values: list[float], *, n_resamples: int, confidence: float, seed: int) -> tuple[float, float]:
    """Seeded percentile-bootstrap interval of the median of one set of samples."""
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    return _percentile_interval(_resampled_medians(np.random.default_rng(seed), values, n_resamples), confidence)


def _resampled_medians(rng: np.random.Generator, values: list[float], n_resamples: int) -> npt.NDArray[np.float64]:
    """The medians of ``n_resamples`` resamples (with replacement) of ``values``, drawn from ``rng``."""
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    data = np.asarray(values, dtype=float)
    medians: npt.NDArray[np.float64] = np.median(data[rng.integers(0, data.size, size=(n_resamples, data.size))],
                                                 axis=1)
    return medians


def _percentile_interval(draws: npt.NDArray[np.float64], confidence: float) -> tuple[float, float]:
    # lazy: numpy takes ~75 ms to import (-X importtime)
    import numpy as np

    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(draws, [tail, 100.0 - tail])
    return float(low), float(high)


def effect_sizes(
    baseline: list[float], current: list[float], sign: float, base_median: float
) -> tuple[float, float]:
    diffs = sorted(c - b for c in current for b in baseline)
    greater = sum(1 for d in diffs if d > 0)
    less = sum(1 for d in diffs if d < 0)
    cliffs = sign * (greater - less) / len(diffs)
    hodges_lehmann = sign * percentile(diffs, 50) / abs(base_median)
    return cliffs, hodges_lehmann


def slow_round(side: list[float], other: list[float], level: float) -> int | None:
    """Index of the side's slowest round when it is an outlier on the slow side, else None.

    Contention on a shared machine only ever makes a round slower, so the slowest round of a side is set
    aside when it lies below the mean of the side's other rounds by more than a t prediction bound at
    ``level``, the scale taken from every other round of both sides (so one slow round cannot inflate it)."""
    if len(side) < 2:
        return None
    low = min(range(len(side)), key=side.__getitem__)
    rest = [v for i, v in enumerate(side) if i != low]
    df = len(rest) - 1 + len(other) - 1
    if df < 2:
        return None
    # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
    from scipy.stats import t as student_t

    mean_rest, mean_other = math.fsum(rest) / len(rest), math.fsum(other) / len(other)
    ss = math.fsum((v - mean_rest) ** 2 for v in rest) + math.fsum((v - mean_other) ** 2 for v in other)
    bound = float(student_t.isf(level, df)) * math.sqrt(ss / df * (1.0 + 1.0 / len(rest)))
    return low if mean_rest - side[low] > bound else None


def log_t(lb: list[float], lc: list[float]) -> tuple[float, float, int]:
    """Mean log-ratio (current over baseline), its pooled standard error and degrees of freedom."""
    df = len(lb) + len(lc) - 2
    mb, mc = math.fsum(lb) / len(lb), math.fsum(lc) / len(lc)
    ss = math.fsum((v - mb) ** 2 for v in lb) + math.fsum((v - mc) ** 2 for v in lc)
    se = math.sqrt(ss / df * (1.0 / len(lb) + 1.0 / len(lc))) if df > 0 else math.inf
    return mc - mb, se, df


def ratio_ci(baseline: Sequence[float], current: Sequence[float], *,
             confidence: float = 0.95) -> tuple[float, float, float]:
    """The ratio current / baseline of two sets of rounds (one tool against another, one build against another)
    with its ``confidence`` interval: the geometric-mean ratio ``exp(mean log c - mean log b)`` and the
    two-sided Student t interval of that log difference with the pooled standard error of :func:`log_t` (the
    sequential rule's). Rounds need not be paired. NaN bounds with fewer than three rounds in all (no degrees of
    freedom); ``ValueError`` naming the bad value for an empty side or a sample <= 0 (no log)."""
    lb = [math.log(v) for v in _positive(baseline, "ratio_ci baseline")]
    lc = [math.log(v) for v in _positive(current, "ratio_ci current")]
    diff, se, df = log_t(lb, lc)
    if df <= 0 or not math.isfinite(se):
        return math.exp(diff), math.nan, math.nan
    # lazy: scipy.stats takes ~0.85 s to import (-X importtime)
    from scipy.stats import t as student_t

    half = float(student_t.isf((1.0 - confidence) / 2.0, df)) * se
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half)


def _positive(samples: Sequence[float], what: str) -> list[float]:
    values = check_samples(samples, what)
    bad = [v for v in values if v <= 0]
    if bad:
        raise ValueError(f"{what}: {bad[0]!r} is not > 0 (a ratio's interval works on logs)")
    return values
