"""The rounds of a benchmark, shared by the gate (:mod:`pytest_llmserve.gates.bench`), the A/B runner
(:mod:`pytest_llmserve.gates.ab`) and the build runner (:mod:`pytest_llmserve.gates.builds`).

A round is a value, never a message (:data:`RoundResult`): :class:`Measured` (its samples), :class:`Invalid` (the
typed reasons of :mod:`pytest_llmserve.load.metrics`, each classified where its check is made: the server's output
was wrong, or the measurement is an artefact of the machine) or :class:`Contended` (other processes took more of the
host than ``contention_bound`` during it). :func:`measure_round` runs one round alone on its server;
:func:`judge_round` makes the value. A round invalid only for artefacts of chunk timing (chunks merged or buffered
on a starved client) is :class:`Measured` for a metric those artefacts do not touch (the throughputs, counted from
the server's usage over the round's duration); its per-token timing figures are withheld and the reasons kept
(``unmeasured``).

:class:`RoundLoop` is the one loop of a benchmark's rounds: each round measured again while it is
:class:`Contended` (after :data:`MAX_CONTENDED_ROUNDS` of them the benchmark is :class:`Confounded`), or
:class:`Invalid` only for measurement artefacts (at most :data:`ARTEFACT_RETRIES` per benchmark); what it returns is
:class:`Measured`, :class:`Invalid` (a server fault, or one artefact too many) or :class:`Confounded`. The caller
turns the last two into its outcome; only the pytest layer turns an outcome into a failure or a skip. Progress is
logged on the ``pytest_llmserve.gates`` logger (:data:`log`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from pytest_llmserve.config import Workload, untrained_reason
from pytest_llmserve.load.contention import HostContention, contention_reason
from pytest_llmserve.load.metrics import Blame, InvalidReason, RunResult, only_artefacts, server_fault, timing_only
from pytest_llmserve.load.prompts import WorkloadPrompt, build_prompts
from pytest_llmserve.load.runner import run_workload
from pytest_llmserve.metrics import LATENCY_METRICS
from pytest_llmserve.report.outcome import ContendedRound, DiscardedRound
from pytest_llmserve.server.handle import RunningServer, engine_of

#: Where the benchmark path says what it does (shown by pytest's live log and, under the plugin, on the terminal).
log = logging.getLogger("pytest_llmserve.gates")

# Contended rounds discarded before a benchmark gives up with "confounded: host busy": one or two let a
# passing burst (a cron job, a package index refresh) go by at the cost of a round each; a host that stays
# busy is told within three rounds' time instead of spending max_rounds on figures that cannot be samples.
MAX_CONTENDED_ROUNDS = 3
# Rounds discarded as measurement artefacts before one more fails the benchmark: seen in CI on 2 cores, a round of
# a healthy server invalid for chunk timing once or twice in a run (7 of 8 requests' chunks in one read, in an A/B
# and in a gated benchmark of one run); a host where it happens three times in one benchmark is too busy to
# measure, and says so.
ARTEFACT_RETRIES = 2
#: The key of a round's host contention (a share of the machine) among its samples.
HOST_CONTENTION = "host_contention"


# --------------------------------------------------------------------------- what a round is


class RoundFigures(Protocol):
    """What a round's judgement reads of its measurement: a :class:`~pytest_llmserve.load.metrics.RunResult` (a
    stand-in's in unit tests)."""

    @property
    def valid(self) -> bool: ...

    @property
    def invalid_reasons(self) -> Sequence[InvalidReason]: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def diagnostics(self) -> Mapping[str, float]: ...

    @property
    def host_contention(self) -> HostContention | None: ...

    @property
    def server_check(self) -> str | None: ...



@dataclass(frozen=True, slots=True)
class Measured:
    """A round that is a sample: ``samples`` of every metric it measured (and :data:`HOST_CONTENTION`).
    ``unmeasured``: artefacts of chunk timing that withheld its per-token timing figures (none: all measured)."""

    what: str
    result: RoundFigures
    samples: dict[str, float]
    unmeasured: tuple[InvalidReason, ...] = ()


@dataclass(frozen=True, slots=True)
class Invalid:
    """A round that is not a number, for ``reasons``; ``host``: the contention measured during it, if sampled."""

    what: str
    reasons: tuple[InvalidReason, ...]
    host: HostContention | None = None

    @property
    def server_fault(self) -> bool:
        """Whether a reason says the server's output was wrong (never run again)."""
        return server_fault(self.reasons)

    def describe(self, context: str = "") -> str:
        """The round, its reasons one a line, then ``context`` (the workload, the server) and the host's share."""
        busy = f"\nhost: {self.host.describe()}" if self.host is not None else ""
        return (f"{self.what} is INVALID (not a number):\n  - " + "\n  - ".join(self.reasons)
                + (f"\n{context}" if context else "") + busy)


@dataclass(frozen=True, slots=True)
class Contended:
    """A round during which other processes took more of the host than the bound: not a sample. ``artefacts``:
    measurement artefacts it also had (likelier the busy host's than the server's)."""

    what: str
    reason: str
    host: HostContention
    artefacts: tuple[InvalidReason, ...] = ()


RoundResult = Measured | Invalid | Contended


@dataclass(frozen=True, slots=True)
class Confounded:
    """The benchmark's end when the host stayed busy: :data:`MAX_CONTENDED_ROUNDS` rounds discarded; no verdict,
    the server is not blamed for the machine."""

    rounds: tuple[ContendedRound, ...]
    bound: float

    def describe(self) -> str:
        lines = "\n".join(f"  - {c.round}: {c.reason}" for c in self.rounds)
        return (f"confounded: host busy: {len(self.rounds)} rounds discarded because other processes took more than "
                f"{self.bound:.0%} of the host (contention_bound) during them; no verdict, the server is not blamed "
                f"for the machine:\n{lines}\nRun again on a quiet host (or raise contention_bound, knowing the "
                "figures then include the others' share).")


# --------------------------------------------------------------------------- one round


def round_samples(result: RoundFigures) -> dict[str, float]:
    """The per-round sample of every metric (throughputs; latency mean/median/p90/p99 in ms), and the host
    contention measured during the round (:data:`HOST_CONTENTION`, a share of the machine) when sampled."""
    out = {name: float(value) for name, value in result.metrics.items()
           if isinstance(value, int | float) and math.isfinite(value)}
    busy = result.host_contention
    if busy is not None and math.isfinite(busy.share):
        out[HOST_CONTENTION] = float(busy.share)
    return out


def judge_round(result: RoundFigures, what: str, *, metric: str, contention_bound: float | None) -> RoundResult:
    """What a measured round is: :class:`Contended` when other processes took more of the host than
    ``contention_bound`` (None: not judged) and nothing blames the server; :class:`Invalid` when it is not a
    number for ``metric``; else :class:`Measured`. A round invalid only for artefacts of chunk timing is measured
    for a ``metric`` that is no per-token timing figure: its throughputs and counts, from the diagnostics."""
    reasons = tuple(result.invalid_reasons) if not result.valid else ()
    host: HostContention | None = result.host_contention
    if contention_bound is not None and not server_fault(reasons):
        busy = contention_reason(host, contention_bound)
        if busy is not None and host is not None:
            return Contended(what, busy, host, reasons)
    if not reasons:
        return Measured(what, result, round_samples(result))
    if timing_only(reasons) and metric not in LATENCY_METRICS:
        samples = {name: float(value) for name, value in result.diagnostics.items()
                   if name not in LATENCY_METRICS and isinstance(value, int | float) and math.isfinite(value)}
        if metric in samples:
            if host is not None and math.isfinite(host.share):
                samples[HOST_CONTENTION] = float(host.share)
            return Measured(what, result, samples, unmeasured=reasons)
    return Invalid(what, reasons, host)


def measure_round(server: RunningServer, workload: Workload, prompts: Sequence[WorkloadPrompt] | None) -> RunResult:
    """One round of ``workload`` on a live ``server``: its requests counted as request time, bounded by the
    server's ``request_timeout_s``.

    The round has the server to itself: it holds the server's request lock exclusively (no other request
    of this run, from any xdist worker, reaches the server meanwhile), and the engine's own
    running-requests gauge, sampled during the round, must never exceed the round's concurrency. What other
    processes took of the host during it is sampled into ``result.host_contention`` (judged by
    :func:`judge_round`). On an untrained model (:func:`pytest_llmserve.config.untrained_reason`) the sampled
    answers' collapse is not judged; failed requests, wrong lengths and NaN still make the round invalid."""
    server.ensure_alive()
    engine = engine_of(server)
    with _alone(server), _requests(server):
        return run_workload(server.base_url, server.model_name, workload, prompts=prompts,
                            api_key=server.spec.api_key, progress=False, timeout_s=server.spec.request_timeout_s,
                            server_counter=engine.generation_counter, running_gauge=engine.running_requests_gauge,
                            untrained=untrained_reason(server.spec_for_checks or server.spec),
                            host_contention=True, server_pid=server.server_pid, gpu_scope=server.gpu_scope)


def _alone(server: RunningServer) -> AbstractContextManager[object]:
    """The server's request lock held exclusively (none when the server was not given one: a script's)."""
    lock = server.request_lock
    return lock.exclusive() if lock is not None else contextlib.nullcontext()


def _requests(server: RunningServer) -> AbstractContextManager[object]:
    acc = server.accounting
    return acc.requests("benchmark") if acc is not None else contextlib.nullcontext()


#: One round's measurement: (server, workload, prompts) -> its RunResult (:func:`measure_round`; a stand-in in
#: unit tests).
RoundMeasure = Callable[[RunningServer, Workload, Sequence[WorkloadPrompt] | None], RoundFigures]


# --------------------------------------------------------------------------- the loop


class RoundLoop:
    """The rounds of one benchmark: :meth:`measure` gives a round that is a sample, measuring again a contended
    round and one invalid only for measurement artefacts, within the benchmark's allowances; ``discarded`` and
    ``contended`` hold every round set aside, in order (shared by all the benchmark's rounds, on every server).
    ``prompts``: the workload's (None: built from the first server's tokenizer)."""

    def __init__(self, workload: Workload, prompts: Sequence[WorkloadPrompt] | None = None, *, metric: str,
                 contention_bound: float | None,
                 measure: RoundMeasure = measure_round) -> None:
        self.workload = workload
        self.prompts = prompts
        self.metric = metric
        self.contention_bound = contention_bound
        self._measure = measure
        self.discarded: list[DiscardedRound] = []
        self.contended: list[ContendedRound] = []

    def measure(self, server: RunningServer, what: str) -> Measured | Invalid | Confounded:
        """One round on ``server`` that is a sample, or why the benchmark ends. The prompts, unless given, are built
        with the first server's tokenizer, and every round sends the same."""
        if self.prompts is None:
            self.prompts = build_prompts(self.workload, tokenize=server.client().tokenize)
        first = what
        while True:
            got = judge_round(self._measure(server, self.workload, self.prompts), what, metric=self.metric,
                              contention_bound=self.contention_bound)
            if isinstance(got, Contended):
                reason = got.reason
                if got.artefacts:
                    reason += ("; its measurement artefacts, likelier the busy host's than the server's: "
                               + "; ".join(got.artefacts))
                self.contended.append(ContendedRound(what, reason, got.host.to_dict()))
                log.info("%s is not a sample: %s", what, reason)
                if len(self.contended) >= MAX_CONTENDED_ROUNDS:
                    return Confounded(tuple(self.contended), self.contention_bound or 0.0)
                what = f"{first} (again: {len(self.contended)} contended so far)"
                continue
            if isinstance(got, Invalid) and only_artefacts(got.reasons) and len(self.discarded) < ARTEFACT_RETRIES:
                self.discarded.append(DiscardedRound(what, tuple(str(r) for r in got.reasons)))
                log.info("%s is not a number (%s): a measurement artefact of the machine, not the server's output; "
                         "discarded and run again (%d of %d allowed)", what, "; ".join(got.reasons),
                         len(self.discarded), ARTEFACT_RETRIES)
                continue
            if isinstance(got, Measured):
                if got.unmeasured:
                    log.info("%s: per-token timing not measured (%s); %s counted from the server's usage",
                             what, "; ".join(got.unmeasured), self.metric)
                if got.result.host_contention is not None:
                    log.info("%s: %s", what, got.result.host_contention.describe())
            return got

    def discarded_note(self) -> str:
        """A line for an invalid round's message: the rounds discarded before it as artefacts."""
        if not self.discarded:
            return ""
        return (f"\n{len(self.discarded)} earlier round(s) of this benchmark were discarded as measurement artefacts "
                "(is the machine busy?): "
                + " | ".join(f"{d.round}: {'; '.join(d.reasons)}" for d in self.discarded))


class RoundsEnded(Exception):
    """The rounds ended before a verdict: an invalid round, or a host that stayed busy. Carries the typed value of
    the round that ended them, and the samples measured before it, up the caller's own loop (the sequential looks)
    to where the caller makes its outcome."""

    def __init__(self, stop: Invalid | Confounded, measured: list[dict[str, float]]) -> None:
        super().__init__(stop)
        self.stop = stop
        self.measured = measured


def sample_series(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    names = sorted(set().union(*[set(s) for s in samples])) if samples else []
    return {n: [s[n] for s in samples if n in s] for n in names}


__all__ = ["ARTEFACT_RETRIES", "HOST_CONTENTION", "MAX_CONTENDED_ROUNDS", "Blame", "Confounded", "Contended",
           "ContendedRound", "DiscardedRound", "Invalid", "InvalidReason", "Measured", "RoundLoop", "RoundMeasure",
           "RoundResult", "RoundsEnded", "judge_round", "log", "measure_round", "round_samples", "sample_series"]
