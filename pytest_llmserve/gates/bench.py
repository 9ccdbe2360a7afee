"""The benchmark gate: rounds of a fixed workload, the stored baseline, and the statistical verdict.

One round = one run of the workload (every request streamed, tokens counted from the server's usage), a value of
:mod:`pytest_llmserve.gates.rounds`: measured, invalid or contended. An invalid round (failed requests, wrong lengths,
tokens without text, collapse in a sampled output of a trained model: reasons that blame the server) is never a
number: the outcome holds the reasons and ends "fail". A round invalid only for measurement artefacts of the machine
(other traffic on the server, a counter that disagrees: each reason classified where its check is made,
:class:`pytest_llmserve.load.metrics.InvalidReason`) is discarded, said and recorded (``discarded_rounds``), and run
again, at most :data:`~pytest_llmserve.gates.rounds.ARTEFACT_RETRIES` times per benchmark: a busy machine must not
fail the server. A round whose only artefacts are of chunk timing (chunks merged or buffered on a starved client) is a
sample of throughput, its latency figures withheld. A round measured while other processes took more of the host than
``contention_bound`` is a contended round instead, which a host that stays busy ends as "confounded". All of this is
the one loop of rounds (:class:`~pytest_llmserve.gates.rounds.RoundLoop`) that the A/B and build runners share. The
verdict (:func:`pytest_llmserve.verdicts.stats.decide_sequential`, a group-sequential test that looks after every
round) needs significance AND a median change beyond the tolerance; with too little evidence it runs one more
round, up to ``max_rounds``, then "inconclusive" is reported by the policy ``inconclusive = warn | fail`` (a
warning, or a failure). The gate and the A/B runner share that loop (:func:`until_verdict`). The gate fills one
:class:`~pytest_llmserve.report.outcome.BenchOutcome` as it measures and returns it, its ``ending`` saying what a
test makes of it (fail, skip, warn, or nothing); the gate never calls pytest (:mod:`pytest_llmserve.bench_face`
does). Progress goes to the ``pytest_llmserve.gates`` logger.

Warm-up: a GPU server's first rounds are slow (a CUDA graph replayed for a batch size for the first time, the
first prefill shapes, JIT-compiled kernels): on an H200 two rounds of SGLang measured 1,118 and 2,217 tok/s
(CV 46.6 %). So before the measured rounds the gate runs the same workload (same prompts, same concurrency:
every batch shape the measured rounds use is seen) until a round agrees with the round before it within
``warmup_agreement`` (default 5 %) on the gated metric; the rounds before the agreeing one are discarded, and the
agreeing round is the first measured round, not a third one: on the vLLM CPU default, where the first rounds
usually agree, the warm-up then costs one round. Measured there (docs/performance.md, section 7): each round's two
``Workload.warmup`` requests take 3.1-3.3 s of its 11.3-12.3 s, so about 0.6 of a round over the default 2 rounds
(they stay: the workload's recorded context includes them); the new warm-up added one round (13.6 s). At most
``warmup_rounds`` (default 3) rounds are discarded, and none once the warm-up has taken :data:`WARMUP_BUDGET_S`;
then the next round is measured whatever it says and the result records "warm-up did not settle: ..." (reported,
not failed). ``warmup_rounds = 0`` measures from the first round. The agreeing round was picked for being close
to its predecessor, which narrows its spread a little; with a bound wider than the usual round-to-round noise
(3 % on the CPU default) that selection is mild.

Host contention: every round samples what processes other than the server's and the load generator's took of
the host (CPU, and GPU SM where NVML accounts per process: :mod:`pytest_llmserve.load.contention`), stored with
the round's samples as ``host_contention`` (a share of the machine) and printed after it. A round above
``contention_bound`` (default 10 %) is not a sample: it is discarded, named with the top processes, and
measured again; after :data:`~pytest_llmserve.gates.rounds.MAX_CONTENDED_ROUNDS` discarded rounds in one
benchmark the outcome is "confounded: host busy" naming them (the test is skipped), never a verdict: only clean
rounds ever reach the statistics, so a busy host cannot make a benchmark REGRESSED (or IMPROVED). One round, and
its contention judged, is :mod:`pytest_llmserve.gates.rounds`.

A figure always: with no baseline, or a refused comparison, the rounds still run and the outcome carries
their figures, the reason, and the one command that records a baseline for this context. What can be
refused from the configuration alone (an unreadable baseline file; a context that differs in server
arguments, environment, model or workload) is decided before any boot by
:func:`~pytest_llmserve.gates.preflight.preflight_refusal`.
A benchmark of a server whose correctness checks failed in this run (:mod:`pytest_llmserve.gates.failed_checks`)
never passes.

Baselines: a file per (test, server, workload) under ``baselines/`` holding every sample and the full
context. A comparison whose context differs in more than the declared variable is refused with the
differing keys; a baseline recorded on another host (its identity, ``hardware``, differs: CPU, instruction sets,
cores, memory, GPUs; or it was recorded before that identity was stored: an unknown host) or with another
Python/plugin version is reported as "no baseline for this environment", the host fields named, and skipped,
after measuring, so a newcomer's first run on another machine is not a failure but shows its figure and an
invitation to record one. (The host is known before the boot, but a skip must carry a figure, so only a refusal
that also differs elsewhere is decided before it.) ``allow_host_change`` compares across hosts on purpose, the
differing host fields printed beside the verdict. Saving takes at least
:data:`SAVE_MIN_ROUNDS` rounds, more while the CI of the median is wider than the tolerance.
"""

from __future__ import annotations

import functools
import math
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pytest_llmserve.config import LLMServeConfig, ServerSpec, Workload
from pytest_llmserve.errors import BaselineError
from pytest_llmserve.gates.context import build_context, read_server_state
from pytest_llmserve.gates.failed_checks import correctness_failures
from pytest_llmserve.gates.preflight import accept_command, elsewhere, environment_only
from pytest_llmserve.gates.rounds import (
    Invalid,
    Measured,
    RoundFigures,
    RoundLoop,
    RoundMeasure,
    RoundsEnded,
    log,
    measure_round,
    sample_series,
)
from pytest_llmserve.load.prompts import WorkloadPrompt, build_prompts
from pytest_llmserve.metrics import METRICS, higher_is_better
from pytest_llmserve.report.outcome import BenchOutcome, DiscardedRound, Ending, Extension, ResolutionRecord, WarmUp
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.settings import INCONCLUSIVE_POLICIES, BenchSpec, Settings
from pytest_llmserve.store.baselines import BaselineDoc, BaselineStore, BenchKey
from pytest_llmserve.verdicts import stats
from pytest_llmserve.verdicts.between_runs import run_spread
from pytest_llmserve.verdicts.comparability import (
    Comparability,
    append_diffs,
    comparability,
    host_change_text,
    is_host_key,
)

#: A workload's prompts, built once per benchmark: every round sends the same.
Prompts = Sequence[WorkloadPrompt]

#: The baseline's most recent recorded runs a comparison uses: enough to estimate the spread between runs, few
#: enough that a drift of the host months ago does not weigh on today's verdict.
BASELINE_RUNS_USED = 10
SAVE_MIN_ROUNDS = 5  # at 5 vs 3+ samples an exact one-sided Mann-Whitney test can reach p < 0.05
# No round is discarded as warm-up once the warm-up has taken this long: a bound for long workloads (a
# CPU smoke round takes ~20 s, ~80 s on a slow host; a saturated H200 round ~10 s), where the round cap alone
# could add many minutes; generous enough for a first GPU round that pays for JIT compilation.
WARMUP_BUDGET_S = 300.0

# The most current rounds ``extend_to_resolve`` takes a comparison to, whatever the noise asks for: at ~12 s a
# smoke round on the CPU default that is 6 minutes of rounds (and the time budget, extend_budget_s, may stop it
# sooner).
EXTEND_ROUND_LIMIT = 30


class InconclusiveWarning(UserWarning):
    """A benchmark verdict was inconclusive after the most rounds allowed (policy ``warn``)."""


class BaselineSpreadWarning(UserWarning):
    """A baseline was saved although its own spread is wider than the gate's tolerance."""


def unit_of(metric: str) -> str:
    """The metric's unit as reports print it (``tok/s``, ``ms``); empty for an unknown metric."""
    known = METRICS.get(metric)
    return known.unit.replace("tokens/s", "tok/s") if known is not None else ""


def figure_line(metric: str, values: list[float]) -> str:
    """``output_throughput: median 108.5 tok/s over 3 rounds (107.9..109.0, CV 0.5%)``."""
    if not values:
        return f"{metric}: no valid round"
    s = stats.summarize(values)
    unit = unit_of(metric)
    unit = f" {unit}" if unit else ""
    return (f"{metric}: median {s.median:.2f}{unit} over {s.n} round{'s' if s.n != 1 else ''} "
            f"({s.min:.2f}..{s.max:.2f}, CV {s.cv:.1%})")


def median_half_width(values: list[float]) -> float:
    """Half the width of the 95 % bootstrap CI of the median, relative to the median (0.03 = ±3 %)."""
    low, high = stats.median_ci(values)
    median = stats.summarize(values).median
    return (high - low) / 2 / abs(median) if median else float("inf")


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True, slots=True)
class GateRun:
    """What a benchmark gate takes from its run: the configuration, where baselines and results live, and the
    run's choices (``--llmserve-save-baseline``, the allowances, the ``inconclusive`` policy)."""

    cfg: LLMServeConfig
    store_dir: Path
    results_dir: Path
    save: bool = False
    allow_confounded: bool = False
    allow_host_change: bool = False  # compare across hosts on purpose (the host fields are shown)
    inconclusive: str = "warn"

    def __post_init__(self) -> None:
        if self.inconclusive not in INCONCLUSIVE_POLICIES:
            raise ValueError(f"inconclusive = {self.inconclusive!r}: must be one of "
                             f"{', '.join(INCONCLUSIVE_POLICIES)}")

    @classmethod
    def from_settings(cls, settings: Settings) -> GateRun:
        return cls(cfg=settings.cfg, store_dir=settings.baseline_dir, results_dir=settings.results_dir,
                   save=settings.save_baseline, allow_confounded=settings.allow_confounded,
                   allow_host_change=settings.allow_host_change, inconclusive=settings.inconclusive)


class BenchGate:
    """Bound to one server and one test; ``run()`` measures, compares and returns the outcome, its ``ending``
    saying what the test should make of it (:class:`~pytest_llmserve.report.outcome.Ending`)."""

    def __init__(self, *, server: RunningServer, options: BenchSpec, run: GateRun, test_id: str,
                 key_test: str | None = None, record_command: str | None = None,
                 correctness_failed: Callable[[str], list[dict[str, str]]] | None = None,
                 measure: RoundMeasure = measure_round, clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.options = options
        self.run_settings = run
        self.cfg = run.cfg
        self.test_id = test_id
        # The baseline key names the test by file and function, so it is the same whatever the rootdir.
        self.key_test = key_test or test_id.split("[", 1)[0]
        self.record_command = record_command or shlex.join(["pytest", "--llmserve-save-baseline", test_id])
        self.correctness_failed = correctness_failed or (lambda server_id: [])
        # One measured round (a stand-in in unit tests); the warm-up's time budget is read on ``clock``.
        self.measure_round = measure
        self.clock = clock
        self.warmup: WarmUp | None = None  # the warm-up's record, once it ran (it runs once per gate)
        # Judges the clean rounds of a benchmark that ends confounded (set once a comparable baseline is read).
        self._judge_clean_rounds: Callable[[list[float]], stats.Verdict | None] | None = None
        self._loop: RoundLoop | None = None  # the benchmark's rounds: built with the workload's prompts

    @classmethod
    def for_run(cls, settings: Settings, *, server: RunningServer, options: BenchSpec, test_id: str, key_test: str,
                run_dir: Path, record_command: str) -> BenchGate:
        """The gate of one test under the run's resolved ``settings``; the run's correctness failures (any
        xdist worker's, noted in ``run_dir``) are read when the gate concludes."""
        return cls(server=server, options=options, run=GateRun.from_settings(settings), test_id=test_id,
                   key_test=key_test, record_command=record_command,
                   correctness_failed=lambda server_id: correctness_failures(run_dir, server_id))

    @property
    def store_dir(self) -> Path:
        return self.run_settings.store_dir

    @property
    def results_dir(self) -> Path:
        return self.run_settings.results_dir

    @property
    def inconclusive(self) -> str:
        return self.run_settings.inconclusive

    @property
    def discarded_rounds(self) -> list[DiscardedRound]:
        """The rounds run again as measurement artefacts so far."""
        return self._loop.discarded if self._loop is not None else []

    @property
    def spec(self) -> ServerSpec:
        return self.server.spec_for_checks or self.server.spec

    def engine_version(self) -> str | None:
        try:
            facts = self.server.facts()
            if getattr(facts, "version", None):
                return str(facts.version)
        except Exception:  # noqa: BLE001 - the version is context, not a verdict
            pass
        try:
            data = self.server.client().page("/version").json()
            if isinstance(data, dict) and data.get("version") is not None:
                return str(data["version"])
        except Exception:  # noqa: BLE001
            pass
        return None

    def measure(self, workload: Workload, rounds: int, prompts: Prompts | None = None,
                outcome: BenchOutcome | None = None,
                done: list[dict[str, float]] | None = None) -> tuple[list[dict[str, float]], RoundFigures | None]:
        """Run ``rounds`` measured rounds, after the warm-up on the first call (:meth:`warm_up`). A round that
        ends the benchmark (invalid, or the host stayed busy) raises :class:`RoundsEnded` with the rounds so far, for
        :meth:`run` to make the outcome."""
        if prompts is None:
            prompts = self.prompts(workload)
        samples: list[dict[str, float]] = []
        last: RoundFigures | None = None
        earlier = list(done or [])
        if self.warmup is None and rounds > 0:
            first = self.warm_up(workload, prompts, outcome)
            samples.append(first.samples)
            last = first.result
        while len(samples) < rounds:
            number = len(earlier) + len(samples) + 1
            log.info("%s: measured round %d of workload %s", self.spec.id, number, workload.name)
            got = self._round(workload, prompts, f"benchmark round {number} on {self.spec.id}", outcome,
                              earlier + samples)
            samples.append(got.samples)
            last = got.result
        return samples, last

    def prompts(self, workload: Workload) -> Prompts:
        """The workload's prompts, built once (they are seeded: every round, warm-up included, sends the same)."""
        if self._loop is None or self._loop.workload.name != workload.name:
            self._loop = RoundLoop(workload, build_prompts(workload, tokenize=self.server.client().tokenize),
                                   metric=self.options.metric, contention_bound=self.options.contention_bound,
                                   measure=self.measure_round)
        assert self._loop.prompts is not None
        return self._loop.prompts

    def _round(self, workload: Workload, prompts: Prompts, what: str, outcome: BenchOutcome | None,
               measured: list[dict[str, float]]) -> Measured:
        """One round that is a sample (:class:`~pytest_llmserve.gates.rounds.RoundLoop`); a round that ends the
        benchmark raises :class:`RoundsEnded` with the ``measured`` rounds so far."""
        self.prompts(workload)
        assert self._loop is not None
        if outcome is not None:  # the lists the rounds fill, shared by the benchmark's rounds
            outcome.contended_rounds, outcome.discarded_rounds = self._loop.contended, self._loop.discarded
        got = self._loop.measure(self.server, what)
        if isinstance(got, Measured):
            return got
        raise RoundsEnded(got, measured)

    def _stopped(self, outcome: BenchOutcome, stopped: RoundsEnded, workload: Workload, started: float) -> BenchOutcome:
        """The outcome of rounds that ended before a verdict: an invalid round is never a number (the reasons, the
        rounds before it); a host that stayed busy gets no verdict, but the clean rounds measured before it are
        judged alone first, and a clear regression in them fails (the report shows both)."""
        measured, stop = stopped.measured, stopped.stop
        outcome.samples, outcome.rounds = sample_series(measured), len(measured)
        outcome.seconds = time.monotonic() - started
        if isinstance(stop, Invalid):
            message = (stop.describe(f"workload: {asdict(workload)}\nserver: {self.server.describe()}")
                       + self._loop_note())
            failures = self.correctness_failed(self.spec.id)
            if failures:  # the likelier explanation of a round that measured nothing
                outcome.correctness_failed = failures
                message += f"\n{_correctness_text(failures)}"
            outcome.error = f"{stop.what} is INVALID (not a number): " + " | ".join(stop.reasons)
            outcome.note = message
            outcome.ending = Ending("fail", message)
            return self._finish(outcome)
        message = stop.describe()
        metric = self.options.metric
        clean = (self._judge_clean_rounds([m[metric] for m in measured if metric in m])
                 if self._judge_clean_rounds is not None else None)
        if clean is not None:
            message += (f"\nthe {len(measured)} clean round(s) measured before the host got busy, judged alone: "
                        f"{clean.outcome}: {clean.reason}")
        outcome.confounded, outcome.note = True, message
        if clean is not None and clean.outcome == "regressed":
            outcome.verdict = clean
            outcome.ending = Ending("fail", f"{self.test_id}: regressed in the clean rounds before the host got busy: "
                                            f"{message}")
        else:
            # No verdict either way, skipped with the reason like a baseline from another host: a busy machine
            # neither blocks a merge nor passes as a figure.
            outcome.ending = Ending("skip", f"{self.test_id}: {message}")
        return self._finish(outcome)

    def _loop_note(self) -> str:
        return self._loop.discarded_note() if self._loop is not None else ""

    def warm_up(self, workload: Workload, prompts: Prompts, outcome: BenchOutcome | None = None) -> Measured:
        """Rounds of the workload until one agrees with the round before it within ``warmup_agreement`` on the
        gated metric; returns that round, the first measured round (module docstring, "Warm-up").

        Rounds before it are discarded, at most ``warmup_rounds``, and none once :data:`WARMUP_BUDGET_S` is
        spent; then the next round is measured, settled or not. The record is a
        :class:`~pytest_llmserve.report.outcome.WarmUp` (``self.warmup``, and the outcome's ``warmup``)."""
        opts = self.options
        metric, cap, bound = opts.metric, opts.warmup_rounds, opts.warmup_agreement
        record = WarmUp(metric=metric, agreement=bound, max_rounds=cap, budget_s=WARMUP_BUDGET_S)
        self.warmup = record
        if outcome is not None:
            outcome.warmup = record
        name, unit = self.spec.id, unit_of(metric)
        started = self.clock()
        previous: float | None = None
        while True:
            number = len(record.values) + 1
            if cap == 0:
                what = f"benchmark round 1 on {name}"
                log.info("%s: round 1 of workload %s (no warm-up round: warmup_rounds = 0)", name, workload.name)
            elif previous is None:
                what = f"warm-up round 1 on {name}"
                log.info("%s: warm-up round 1 of workload %s (not counted)", name, workload.name)
            else:
                what = f"round {number} on {name} (warm-up unless within {bound:.0%} of round {number - 1})"
                log.info("%s: round %d of workload %s: counted if its %s is within %.0f%% of round %d's", name, number,
                         workload.name, metric, bound * 100, number - 1)
            result = self._round(workload, prompts, what, outcome, [])
            value = result.samples.get(metric, math.nan)
            if cap == 0:
                record.note = "no warm-up round (warmup_rounds = 0): the first round is measured"
                return result
            spent = self.clock() - started
            if previous is not None:
                difference = relative_difference(previous, value)
                record.difference = difference if math.isfinite(difference) else None
                if difference <= bound:
                    record.settled = True
                    log.info("%s: warmed up: round %d's %s is within %.1f%% of round %d's (bound %.0f%%): it counts "
                             "as measured round 1, the %d before it as warm-up", name, number, metric, difference * 100,
                             number - 1, bound * 100, number - 1)
                    return result
            if len(record.values) < cap and (previous is None or spent < WARMUP_BUDGET_S):
                record.values.append(value if math.isfinite(value) else None)  # None: no figure
                record.rounds = len(record.values)
                record.seconds = spent
                previous = value
                continue
            why = (f"the most warm-up rounds allowed (warmup_rounds = {cap})" if len(record.values) >= cap
                   else f"the warm-up time budget ({WARMUP_BUDGET_S:.0f} s) spent")
            figures = ", ".join(_value(v, unit) for v in record.values)
            record.settled = False
            record.note = (
                f"warm-up did not settle: {metric} of the first measured round ({_value(value, unit)}) differs by "
                f"{_percent(record.difference)} from the last of {record.rounds} warm-up round"
                f"{'s' if record.rounds != 1 else ''} ({figures}), beyond warmup_agreement {bound:.0%}, after "
                f"{why}; the measured rounds may still include warm-up effects (a larger warmup_rounds lets the "
                "warm-up run longer)")
            log.info("%s: %s", name, record.note)
            return result

    def run(self, workload: str | None = None) -> BenchOutcome:
        opts = self.options
        wl = self.cfg.workload(workload or opts.workload, where=self.test_id)
        metric = opts.metric
        hib = opts.higher_is_better if opts.higher_is_better is not None else higher_is_better(metric)
        spec = self.spec
        # The server's state is read before the warm-up generates anything (gates/context.server_state).
        context = build_context(spec, wl, engine_version=self.engine_version(),
                                extra={"server_state": read_server_state(self.server)})
        run = self.run_settings
        key = BenchKey(test=opts.baseline_test or self.key_test,
                       server=opts.baseline_server or spec.id, workload=wl.name)
        store = BaselineStore(self.store_dir)
        path = store.path_for(key)
        outcome = BenchOutcome(test_id=self.test_id, server_id=spec.id, workload=wl.name, metric=metric,
                               higher_is_better=hib, tolerance=opts.tolerance, baseline_path=str(path),
                               context=context, baseline_key=key, inconclusive_policy=self.inconclusive)
        started = time.monotonic()
        # The stored file is read before anything is measured: an unreadable one is refused at once, for a
        # comparison and for a save alike (which would refuse to write it only after all its rounds).
        try:
            doc = store.load(key)
        except BaselineError as exc:
            return self._refuse(outcome, f"baseline unreadable: {exc}",
                                f"{exc}\nNothing was measured and the file was not written.", started)
        if run.save:
            if doc is not None and (diffs := append_diffs(doc.context, context)):
                listing = "\n".join(f"  - {d.describe()}" for d in diffs)
                return self._refuse(
                    outcome, "save refused: the stored baseline has another context",
                    f"--llmserve-save-baseline refused: {path} holds samples of another context, and appending "
                    f"would mix incomparable samples:\n{listing}\nNothing was measured. To record this context "
                    f"instead, run without --llmserve-save-baseline, then: "
                    f"{accept_command(self.results_dir, self.store_dir, self.test_id)}", started)
            return self._rounds(lambda: self._save(store, key, context, wl, metric, hib, outcome, started),
                                outcome, wl, started)
        comp = (comparability(doc.context, context, opts.variable, run.allow_confounded,
                              allow_host_change=run.allow_host_change) if doc else None)
        outcome.comparability = comp
        if doc is not None and comp is not None and comp.ok:
            base_runs = doc.runs(metric, last=BASELINE_RUNS_USED)
            # At the level of one look of the gate's own plan: the clean rounds judged as the gate would have.
            self._judge_clean_rounds = functools.partial(
                judge_clean_rounds, base_runs, tolerance=opts.tolerance, higher_is_better=hib, metric=metric,
                prior_between_sd=opts.between_run_sd,
                alpha=self._plan(sum(len(run) for run in base_runs)).nominal_alpha)
        return self._rounds(lambda: self._measured(outcome, wl, doc, comp, started), outcome, wl, started)

    def _rounds(self, conclude: Callable[[], BenchOutcome], outcome: BenchOutcome, wl: Workload,
                started: float) -> BenchOutcome:
        """``conclude()`` (which measures the rounds), or the outcome of rounds that ended before a verdict."""
        try:
            return conclude()
        except RoundsEnded as stopped:
            return self._stopped(outcome, stopped, wl, started)

    def _measured(self, outcome: BenchOutcome, wl: Workload, doc: BaselineDoc | None, comp: Comparability | None,
                  started: float) -> BenchOutcome:
        samples, last = self.measure(wl, self.options.rounds, outcome=outcome)
        outcome.cross_check = _cross(last)
        if doc is None or comp is None:
            return self._without_baseline(outcome, samples, started)
        if not comp.ok:
            return self._refused_after_measuring(outcome, comp, samples, started)
        return self._judged(outcome, wl, doc, comp, samples, last, started)

    def _plan(self, n_baseline: int) -> stats.SequentialPlan:
        """The gate's looks against a baseline of ``n_baseline`` rounds (current rounds from the first look to
        ``max_rounds``)."""
        opts = self.options
        first_look = max(opts.rounds, stats.SEQUENTIAL_FIRST_LOOK)
        return stats.sequential_plan(stats.gate_looks(n_baseline, first_look, opts.max_rounds), alpha=opts.alpha)

    def _refuse(self, outcome: BenchOutcome, error: str, message: str, started: float) -> BenchOutcome:
        """Nothing measured: the stored file cannot be read, or a save would mix contexts."""
        outcome.error, outcome.note, outcome.seconds = error, message, time.monotonic() - started
        outcome.ending = Ending("fail", f"{self.test_id}: {message}")
        return self._finish(outcome)

    def _without_baseline(self, outcome: BenchOutcome, samples: list[dict[str, float]],
                          started: float) -> BenchOutcome:
        """No baseline for this key: the figure, and the command that records one."""
        metric, series = outcome.metric, sample_series(samples)
        figure = figure_line(metric, series.get(metric, []))
        outcome.samples, outcome.rounds, outcome.seconds = series, len(samples), time.monotonic() - started
        outcome.note = f"{figure}; no baseline at {outcome.baseline_path}; record one with: {self.record_command}"
        log.info("%s: %s (no baseline; record one with: %s)", self.spec.id, figure, self.record_command)
        return self._conclude(outcome)

    def _refused_after_measuring(self, outcome: BenchOutcome, comp: Comparability, samples: list[dict[str, float]],
                                 started: float) -> BenchOutcome:
        """The baseline's context differs: a refusal, or (only where it ran differs) no baseline for this
        environment, skipped; the figure either way."""
        metric, path, series = outcome.metric, outcome.baseline_path, sample_series(samples)
        figure = figure_line(metric, series.get(metric, []))
        here = environment_only(comp)
        command = accept_command(self.results_dir, self.store_dir, self.test_id)
        reason = (f"no baseline for this environment in {path} ({elsewhere(comp)})" if here
                  else "comparison refused")
        message = (f"{figure}\n{reason}:\n{comp.message}\nbaseline: {path}\n"
                   f"record a baseline for this context: {command}")
        if here and any(is_host_key(d.key) for d in comp.diffs):
            message += "\n(or compare across hosts on purpose: --llmserve-allow-host-change)"
        if any(d.key == "server_state.state" for d in comp.diffs):
            message += ("\nthe server's state differs: run the benchmark as the baseline's ran (the suite runs its "
                        "benchmark after its correctness checks, 'after traffic'; a benchmark alone on a fresh boot "
                        "is 'fresh'), or record a baseline for this way of running it")
        outcome.samples, outcome.rounds, outcome.note = series, len(samples), message
        outcome.seconds = time.monotonic() - started
        log.info("%s: %s (%s)", self.spec.id, figure, reason)
        self._conclude(outcome)
        if outcome.ending is None:  # a correctness failure comes first
            outcome.ending = Ending("skip", message) if here else Ending("fail", f"{self.test_id}: {message}")
        return outcome

    def _judged(self, outcome: BenchOutcome, wl: Workload, doc: BaselineDoc, comp: Comparability,
                samples: list[dict[str, float]], last: RoundFigures | None, started: float) -> BenchOutcome:
        """The comparison: the sequential rule after every round up to ``max_rounds`` (and, with
        ``extend_to_resolve``, beyond), then the verdict recorded, failed or warned as the policy says."""
        opts, metric, spec = self.options, outcome.metric, self.spec
        # Every recorded run of the baseline (up to the last BASELINE_RUNS_USED), each its own level: the comparison
        # crosses runs and carries the spread between them (verdicts/between_runs.py).
        base_runs = doc.runs(metric, last=BASELINE_RUNS_USED)
        base_samples = [v for run in base_runs for v in run]
        first_look = max(opts.rounds, stats.SEQUENTIAL_FIRST_LOOK)
        plan = self._plan(len(base_samples))
        round_s: float | None = None  # how long the last extra round took (the extension's time budget reads it)

        def judge() -> stats.Verdict:  # reads ``plan`` when called: the extension re-plans its looks
            return stats.decide_sequential(base_samples, [s[metric] for s in samples], plan=plan,
                                           higher_is_better=outcome.higher_is_better, tolerance=opts.tolerance,
                                           metric=metric, baseline_runs=base_runs,
                                           prior_between_sd=opts.between_run_sd)

        def one_more() -> None:
            nonlocal last, round_s
            began = self.clock()
            more, last = self.measure(wl, 1, outcome=outcome, done=samples)
            samples.extend(more)
            round_s = self.clock() - began

        def replan(goal: int) -> int:
            nonlocal plan
            plan = stats.sequential_plan(stats.gate_looks(len(base_samples), first_look, goal), alpha=opts.alpha)
            return len(plan.looks)

        verdict = until_verdict(judge, one_more, lambda: len(samples), opts.max_rounds)
        resolved = (self._resolution(base_runs, [s[metric] for s in samples], plan)
                    if verdict.outcome == "inconclusive" else None)
        if resolved is not None and opts.extend_to_resolve:
            verdict = self._extend(outcome, verdict, resolved.current_rounds, len(base_samples), samples, judge,
                                   one_more, replan, lambda: round_s)
            resolved = (self._resolution(base_runs, [s[metric] for s in samples], plan)
                        if verdict.outcome == "inconclusive" else None)
        series = sample_series(samples)
        across = host_change_text(comp.host_diffs)
        outcome.verdict, outcome.samples, outcome.rounds = verdict, series, len(samples)
        outcome.baseline_series = {**doc.latest.samples, metric: base_samples}  # the gated metric: every run used
        outcome.baseline_samples = [float(x) for x in outcome.baseline_series.get(metric) or []]
        outcome.note = verdict.reason + (f"\nacross hosts (allowed): {across}" if across else "")
        outcome.seconds, outcome.cross_check = time.monotonic() - started, _cross(last)
        if across:
            log.info("%s: %s against a baseline of another host (allowed): %s", spec.id, verdict.outcome, across)
        if resolved is not None:
            outcome.resolution = resolution_record(resolved, extend=opts.extend_to_resolve)
        self._conclude(outcome)
        if verdict.outcome == "inconclusive":
            self._inconclusive(outcome, verdict, base_samples)
        if outcome.ending is None and verdict.outcome == "regressed":
            outcome.ending = Ending("fail", self._regressed_message(outcome, verdict, base_samples, comp, across, wl))
        return outcome

    def _extend(self, outcome: BenchOutcome, verdict: stats.Verdict, target: int | None, base_rounds: int,
                samples: list[dict[str, float]], judge: Callable[[], stats.Verdict], one_more: Callable[[], None],
                replan: Callable[[int], int], round_s: Callable[[], float | None]) -> stats.Verdict:
        """``extend_to_resolve``: rounds added after an inconclusive ``max_rounds`` until the noise's ``target``
        (at most :data:`EXTEND_ROUND_LIMIT`, within ``extend_budget_s``); recorded as the outcome's ``extension``."""
        opts, spec = self.options, self.spec
        extension = Extension(target=target, limit=EXTEND_ROUND_LIMIT, budget_s=opts.extend_budget_s,
                              rounds_before=len(samples))
        outcome.extension = extension
        if target is None:
            extension.stopped = (f"not extended: the tolerance cannot be resolved against this "
                                    f"{base_rounds}-round baseline in {stats.RESOLUTION_ROUND_LIMIT} "
                                    "current rounds")
        elif target <= len(samples):
            extension.stopped = ("not extended: this noise resolves the tolerance within max_rounds "
                                    f"{opts.max_rounds} (the inconclusive verdict is chance)")
        else:
            goal = min(target, EXTEND_ROUND_LIMIT)
            extension.goal = goal
            # The looks are planned anew up to the goal: the bound over more looks is higher, so the added
            # looks are judged more strictly; the looks already taken were judged against the lower bound of
            # the original plan, so the error rates over the whole exceed alpha and beta a little.
            looks = replan(goal)
            log.info("%s: inconclusive at max_rounds %d; extend_to_resolve: adding rounds up to %d (the noise "
                     "resolves ±%.0f%% in about %d) within %g s", spec.id, opts.max_rounds, goal, opts.tolerance * 100,
                     target, opts.extend_budget_s)
            began = self.clock()
            stopped = f"reached {goal} rounds"
            verdict = judge()
            while verdict.outcome == "inconclusive" and len(samples) < goal:
                spent = self.clock() - began
                if spent + (round_s() or 0.0) > opts.extend_budget_s:
                    stopped = (f"the time budget: {spent:.0f} s spent and a round takes about {round_s() or 0:.0f} "
                               f"s, over extend_budget_s {opts.extend_budget_s:g}")
                    break
                one_more()
                verdict = judge()
            if verdict.outcome != "inconclusive":
                stopped = f"decided ({verdict.outcome}) after {len(samples)} rounds"
            extension.rounds_added = len(samples) - extension.rounds_before
            extension.seconds, extension.stopped, extension.plan_looks = self.clock() - began, stopped, looks
        extension.note = (f"extend_to_resolve: {extension.rounds_added} round(s) added after max_rounds "
                          f"{opts.max_rounds}; {extension.stopped}")
        return verdict

    def _regressed_message(self, outcome: BenchOutcome, verdict: stats.Verdict, base_samples: list[float],
                           comp: Comparability, across: str, wl: Workload) -> str:
        opts, metric = self.options, outcome.metric
        base_s = stats.summarize(base_samples)
        cur_s = stats.summarize(outcome.samples[metric])
        return (
            f"{self.test_id}: {metric} REGRESSED on {self.spec.id} (workload {wl.name})\n"
            f"  baseline: median {base_s.median:.3f} over {base_s.n} rounds {format_values(base_samples)}\n"
            f"  now:      median {cur_s.median:.3f} over {cur_s.n} rounds {format_values(outcome.samples[metric])}\n"
            f"  change:   {verdict.change:+.1%} (tolerance {opts.tolerance:.0%}, good direction "
            f"{'up' if outcome.higher_is_better else 'down'})\n  {verdict.reason}\n  comparison: {comp.label}\n"
            + (f"  across hosts: {across}\n" if across else "") +
            f"  baseline file: {outcome.baseline_path}" + self._unsettled())

    def _inconclusive(self, outcome: BenchOutcome, verdict: stats.Verdict, base_samples: list[float]) -> None:
        """Said, and warned or failed as the policy ``inconclusive`` says (unless a correctness failure ended it)."""
        opts, metric = self.options, outcome.metric
        message = (f"{self.test_id}: INCONCLUSIVE after {outcome.rounds} rounds (max_rounds {opts.max_rounds}): "
                   f"{verdict.reason}\n  {figure_line(metric, outcome.samples[metric])}; baseline "
                   f"{figure_line(metric, base_samples)}"
                   + (f"\n  {outcome.extension.note}" if outcome.extension is not None else "")
                   + (f"\n  resolution: {outcome.resolution.line}" if outcome.resolution is not None else "")
                   + f"\n  policy inconclusive = {self.inconclusive}"
                   + (" (--llmserve-inconclusive=fail makes this a failure)" if self.inconclusive == "warn"
                      else ""))
        log.info("%s", message.splitlines()[0])
        if outcome.resolution is not None:
            log.info("%s: resolution: %s", self.spec.id, outcome.resolution.line)
        if outcome.ending is None:
            outcome.ending = (Ending("fail", message) if self.inconclusive == "fail"
                              else Ending("warn", message, InconclusiveWarning))

    def _resolution(self, base_runs: list[list[float]], current: list[float],
                    plan: stats.SequentialPlan) -> stats.Resolution | None:
        """What the rule resolves at this noise, the spread between runs included (stats.resolution); None where
        no side has a spread to measure."""
        base = [v for run in base_runs for v in run]
        if not base or not current:
            return None
        spread = run_spread(base_runs, current, prior_between_sd=self.options.between_run_sd)
        return measured_resolution(base, current, plan, self.options.tolerance, between_sd=spread.between_sd,
                                   baseline_runs=len(base_runs))

    def _save(self, store: BaselineStore, key: BenchKey, context: dict[str, Any], wl: Workload, metric: str, hib: bool,
              outcome: BenchOutcome, started: float) -> BenchOutcome:
        """Measure a new baseline record: at least SAVE_MIN_ROUNDS rounds, more (up to max_rounds) while the
        CI of the gated metric's median is wider than the tolerance; saved with a warning if it stays so."""
        opts = self.options
        rounds = max(opts.rounds, SAVE_MIN_ROUNDS)
        cap = max(opts.max_rounds, rounds)
        samples, last = self.measure(wl, rounds, outcome=outcome)
        width = median_half_width([s[metric] for s in samples])
        while width > opts.tolerance and len(samples) < cap:
            log.info("%s: the baseline's median is known to ±%.1f%%, wider than the tolerance ±%.0f%%: one more "
                     "round", self.spec.id, width * 100, opts.tolerance * 100)
            more, last = self.measure(wl, 1, outcome=outcome, done=samples)
            samples.extend(more)
            width = median_half_width([s[metric] for s in samples])
        series = sample_series(samples)
        figure = figure_line(metric, series[metric])
        outcome.samples, outcome.rounds, outcome.cross_check = series, len(samples), _cross(last)
        outcome.baseline_ci_half_width = width
        failures = self.correctness_failed(self.spec.id)
        if failures:
            outcome.error, outcome.seconds = _correctness_text(failures), time.monotonic() - started
            outcome.note = f"{figure}; not saved: {_correctness_text(failures)}"
            outcome.ending = Ending("fail", f"{self.test_id}: {figure}\nnot saved as a baseline: "
                                            f"{_correctness_text(failures)}")
            return self._finish(outcome)
        spread_warning = None
        if width > opts.tolerance:
            spread_warning = (f"baseline saved with a wide spread: the 95% CI of the {metric} median is ±{width:.1%} "
                              f"after {len(samples)} rounds (max_rounds {cap}), wider than the tolerance "
                              f"±{opts.tolerance:.0%}; comparisons against it will often be inconclusive "
                              "(a loaded machine? record it again when the machine is quiet)")
        store.save(key, context, series, metric=metric, higher_is_better=hib, run_id=uuid.uuid4().hex[:12],
                   info={"test": self.test_id, "cross_check": _cross(last), "ci_half_width": width,
                         "warmup": self.warmup.to_dict() if self.warmup is not None else None,
                         **({"warning": spread_warning} if spread_warning else {})})
        message = f"{figure}; saved {len(samples)} rounds as a new baseline record in {store.path_for(key)}"
        if spread_warning:
            message += f"\nWARNING: {spread_warning}"
        outcome.saved, outcome.note, outcome.seconds = True, message, time.monotonic() - started
        outcome.warning = spread_warning
        log.info("%s", message.replace("\n", " "))
        if spread_warning:
            outcome.ending = Ending("warn", f"{self.test_id}: {spread_warning}", BaselineSpreadWarning)
        return self._finish(outcome)

    def _unsettled(self) -> str:
        """A line for a failure message when the warm-up did not settle (the likelier cause of a slow round)."""
        return f"\n  {self.warmup.note}" if self.warmup is not None and self.warmup.settled is False else ""

    def _conclude(self, outcome: BenchOutcome) -> BenchOutcome:
        """The outcome's summaries; a server whose correctness checks failed in this run gets no pass."""
        failures = self.correctness_failed(self.spec.id)
        if failures:
            outcome.correctness_failed = failures
            outcome.error = _correctness_text(failures)
            figure = figure_line(outcome.metric, outcome.samples.get(outcome.metric, []))
            outcome.ending = Ending("fail", f"{self.test_id}: {figure}\nnot a pass: {_correctness_text(failures)}")
        return self._finish(outcome)

    def _finish(self, outcome: BenchOutcome) -> BenchOutcome:
        outcome.summarize_samples()  # the rounds are in: the reports' summaries
        self.results_dir.mkdir(parents=True, exist_ok=True)
        return outcome


def judge_clean_rounds(baseline_runs: list[list[float]], current: list[float], *, tolerance: float,
                       higher_is_better: bool, metric: str, alpha: float,
                       prior_between_sd: float | None = None) -> stats.Verdict | None:
    """The clean rounds a confounded benchmark measured before the host got busy, against the baseline in one look
    at ``alpha`` (the nominal level of one of the gate's looks: the same test the gate's next look would have
    made); None with fewer than two rounds. Rounds the gate already looked at were judged there (a regression
    there failed at once); these are the ones it had not, and the last verdict shown beside "confounded"."""
    if len(current) < 2:
        return None
    base = [v for run in baseline_runs for v in run]
    plan = stats.sequential_plan(((len(base), len(current)),), alpha=alpha)
    return stats.decide_sequential(base, current, plan=plan, higher_is_better=higher_is_better, tolerance=tolerance,
                                   metric=metric, baseline_runs=baseline_runs, prior_between_sd=prior_between_sd)


def _correctness_text(failures: list[dict[str, str]]) -> str:
    first = failures[0]
    more = f" and {len(failures) - 1} more" if len(failures) > 1 else ""
    return (f"the correctness checks of server {first['server']} failed earlier in this run "
            f"({first['test']}{more}: {first['summary'].splitlines()[0] if first['summary'] else ''})")


class _Judged(Protocol):
    @property
    def outcome(self) -> str: ...


_V = TypeVar("_V", bound=_Judged)


def measured_resolution(base: Sequence[float], current: Sequence[float], plan: stats.SequentialPlan, tolerance: float,
                        *, both_sides_grow: bool = False, between_sd: float = 0.0,
                        baseline_runs: int = 1) -> stats.Resolution | None:
    """:func:`pytest_llmserve.verdicts.stats.resolution` at the spread of these rounds (each side's log-sd);
    None where no side has two rounds with a spread."""
    try:
        return stats.resolution(stats.log_sd(base), stats.log_sd(current), n_baseline=len(base),
                                n_current=len(current), plan=plan, tolerance=tolerance,
                                both_sides_grow=both_sides_grow, between_sd=between_sd, baseline_runs=baseline_runs)
    except ValueError:
        return None


def resolution_record(resolved: stats.Resolution, *, extend: bool | None = None) -> ResolutionRecord:
    """The outcome's ``resolution``: the figures of a :class:`~pytest_llmserve.verdicts.stats.Resolution`, the
    ``line`` said beside an inconclusive verdict (naming the settings as a user writes them: ``max_rounds`` and
    ``tolerance`` in a marker or ``[tool.llmserve.bench]``, ``--llmserve-max-rounds``...) and a ``short`` form for a
    table cell. ``extend``: whether ``extend_to_resolve`` was on (None: not a setting here, the A/B runner)."""
    line = resolved.line(rounds_setting="max_rounds", tolerance_setting="tolerance",
                         record_hint="pytest --llmserve-save-baseline --llmserve-rounds {n} --llmserve-max-rounds {n}")
    if extend is False and not resolved.resolved and resolved.current_rounds is not None:
        line += (f"; or extend_to_resolve (--llmserve-extend-to-resolve) adds the rounds, up to "
                 f"{EXTEND_ROUND_LIMIT}, within extend_budget_s")
    limit = stats.RESOLUTION_ROUND_LIMIT
    tol = f"±{resolved.tolerance * 100:g}%"
    if resolved.resolved:
        short = f"{tol} resolvable in {resolved.max_rounds}"
    elif resolved.between_floor >= resolved.tolerance:
        short = f"{tol} below the spread between runs: needs >{resolved.between_floor:.0%}"
    elif resolved.ab:
        n = resolved.rounds_a_side
        short = f"{tol} needs ~{n} rounds a side" if n is not None else f"{tol} needs >{limit} rounds a side"
    elif resolved.current_rounds is not None:
        short = f"{tol} needs ~{resolved.current_rounds} rounds"
    elif resolved.rounds_a_side is not None:
        short = f"{tol} needs ~{resolved.rounds_a_side} rounds a side"
    else:
        short = f"{tol} needs >{limit} rounds a side"
    return ResolutionRecord(figures=resolved, line=line, short=short)


def until_verdict(judge: Callable[[], _V], one_more: Callable[[], None], rounds_done: Callable[[], int],
                  max_rounds: int) -> _V:
    """The one round loop of the gate and the A/B runner: judge the rounds so far and, while the verdict is
    inconclusive and the cap allows, measure one more round (a side) and judge again. The sequential rule's
    boundaries already account for looking after every round (verdicts/stats.py)."""
    verdict = judge()
    while verdict.outcome == "inconclusive" and rounds_done() < max_rounds:
        one_more()
        verdict = judge()
    return verdict


def _cross(result: RoundFigures | None) -> str | None:
    """The last round's cross-check of the client's count against the server's own counter, as it said it."""
    return result.server_check if result is not None else None


def relative_difference(reference: float, value: float) -> float:
    """|value - reference| / |reference|: how far a round is from the round before it (inf from 0, NaN when
    either has no value)."""
    if not (math.isfinite(reference) and math.isfinite(value)):
        return math.nan
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - reference) / abs(reference)


def _value(value: float | None, unit: str) -> str:
    return f"{value:.2f}{' ' + unit if unit else ''}" if value is not None and math.isfinite(value) else "no value"


def _percent(fraction: float | None) -> str:
    return "an unknown amount" if fraction is None else f"{fraction:.1%}"


def format_values(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"
