"""The A/B runner: two configured servers benchmarked in one run, rounds interleaved A B A B, judged by the
benchmark gate's sequential rule (:func:`pytest_llmserve.gates.bench.until_verdict`), B against A.

It shares the gate's loop of rounds (:class:`~pytest_llmserve.gates.rounds.RoundLoop`: each round alone on its
server; a contended one, or one invalid only for measurement artefacts of the machine, measured again) and returns a
:class:`~pytest_llmserve.report.outcome.BenchOutcome` like the gate, its ``ending`` saying what a test makes of it;
``llmserve builds`` measures its steps with it and reads :attr:`ABRunner.stop` when the rounds ended early.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates import rounds as gates_rounds  # `rounds` is run()'s count of rounds
from pytest_llmserve.gates.bench import format_values, measured_resolution, resolution_record, until_verdict
from pytest_llmserve.gates.context import configuration_differences
from pytest_llmserve.load.contention import wait_until_quiet
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.report.outcome import BenchOutcome, Ending
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts import stats

log = gates_rounds.log

if TYPE_CHECKING:
    from pytest_llmserve.server.pool import ServerPool


@dataclass(frozen=True, slots=True)
class ABStop:
    """Why an A/B's rounds ended before a verdict, and on which side the round that ended them ran."""

    side: Literal["A", "B"]
    stop: gates_rounds.Invalid | gates_rounds.Confounded


class ABRunner:
    """Two configurations benchmarked in one run, interleaved A B A B, judged like a baseline comparison.

    A is the reference ("baseline"), B the candidate: "regressed" means B is worse than A beyond the
    tolerance with significance. Both servers stay up for the whole comparison, so drift on a shared
    machine hits both sides alike.
    """

    def __init__(self, *, pool: ServerPool, cfg: LLMServeConfig, test_id: str, results_dir: Path,
                 measure: gates_rounds.RoundMeasure = gates_rounds.measure_round) -> None:
        self.pool = pool
        self.cfg = cfg
        self.test_id = test_id
        self.results_dir = results_dir
        self.measure_round = measure  # one round's measurement (a stand-in in unit tests)
        self.stop: ABStop | None = None  # the last run's early end, if its rounds ended before a verdict

    def spec(self, ident: str) -> ServerSpec:
        for spec in self.cfg.all_specs():
            if spec.id == ident:
                return spec
        known = ", ".join(s.id for s in self.cfg.all_specs())
        raise ConfigError(f"{self.test_id}: A/B configuration {ident!r} is not configured (known: {known})")

    def run(self, a: str, b: str, *, workload: str = "smoke", rounds: int = 5, metric: str = "output_throughput",
            tolerance: float = 0.10, alpha: float | None = None, warmup_rounds: int = 1,
            max_rounds: int | None = None, judged_by_caller: bool = False,
            contention_bound: float | None = None) -> BenchOutcome:
        """Interleaved rounds, judged by the sequential rule after ``rounds`` a side and after every further
        pair up to ``max_rounds`` (default ``rounds``: one look, a fixed number of rounds).

        ``judged_by_caller``: these rounds are a part of a comparison the caller decides (a bisect step's
        attempt, pooled with the attempts before it): their own verdict is recorded but neither announced
        as the answer nor failed on. ``contention_bound`` (default the setting's default): a round during which
        other processes took more of the host is measured again (:class:`~pytest_llmserve.gates.rounds.RoundLoop`),
        and so is one invalid only for measurement artefacts of the machine. Rounds that end before a verdict (an
        invalid round, a host that stayed busy) end the outcome "fail", and :attr:`stop` says on which side and why,
        as a value."""
        spec_a, spec_b = self.spec(a), self.spec(b)
        wl = self.cfg.workload(workload, where=self.test_id)
        server_a = self.pool.get(spec_a)
        server_b = self.pool.get(spec_b, keep=(spec_a,))
        diffs = configuration_differences(spec_a, spec_b, wl)
        hib = higher_is_better(metric)
        side: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        servers = {"A": server_a, "B": server_b}
        cap = max(rounds, max_rounds if max_rounds is not None else rounds)
        alpha = stats.DEFAULT_SEQUENTIAL_ALPHA if alpha is None else alpha
        plan = stats.sequential_plan(stats.ab_looks(max(rounds, stats.SEQUENTIAL_FIRST_LOOK), cap), alpha=alpha)
        started = time.monotonic()
        done = 0
        bound = BenchDefaults().contention_bound if contention_bound is None else contention_bound
        loop = gates_rounds.RoundLoop(wl, metric=metric, contention_bound=bound, measure=self.measure_round)
        self.stop = None

        def pair() -> None:
            nonlocal done
            for name in ("A", "B"):
                server = servers[name]
                settle(servers["B" if name == "A" else "A"], server)
                got = loop.measure(server, f"A/B round {done + 1} on {name} ({server.spec.id})")
                if not isinstance(got, gates_rounds.Measured):
                    self.stop = ABStop("A" if name == "A" else "B", got)
                    raise gates_rounds.RoundsEnded(got, side["B"])
                if done >= warmup_rounds:  # the first round of each side warms caches and is not counted
                    side[name].append(got.samples)
                    log.info("A/B round %d/%d..%d: %s %s %.2f", done + 1 - warmup_rounds, rounds, cap, name, metric,
                             side[name][-1].get(metric, float("nan")))
            done += 1

        def settle(other: RunningServer, server: RunningServer) -> None:
            # The side measured just before still polls for work (wait_until_quiet says why): a round beside it
            # would count it as host contention. Half the bound, so the rest of the host keeps its share.
            if other is server:
                return
            quiet = wait_until_quiet(other.server_pid, bound=bound / 2)
            if not quiet.settled:
                log.info("A/B: %s still took %.1f%% of the machine after %.1f s of waiting for it to go quiet; the "
                         "round on %s is measured anyway, its host contention judged", other.spec.id,
                         quiet.share * 100, quiet.seconds, server.spec.id)

        def judge() -> stats.Verdict:
            return stats.decide_sequential([s[metric] for s in side["A"] if metric in s],
                                           [s[metric] for s in side["B"] if metric in s], plan=plan,
                                           higher_is_better=hib, tolerance=tolerance, metric=metric)

        outcome = BenchOutcome(
            test_id=self.test_id, server_id=f"B={spec_b.id} vs A={spec_a.id}", workload=wl.name, metric=metric,
            higher_is_better=hib, tolerance=tolerance, ab=True, differences=[d.describe() for d in diffs],
            contended_rounds=loop.contended, discarded_rounds=loop.discarded,
            baseline_key=BenchKey(test=self.test_id, server=f"{spec_a.id}|{spec_b.id}", workload=wl.name))
        try:
            for _ in range(warmup_rounds + rounds):
                pair()
            verdict = until_verdict(judge, pair, lambda: len(side["B"]), cap)
        except gates_rounds.RoundsEnded as ended:
            assert self.stop is not None
            where = f"workload: {asdict(wl)}\nserver: {servers[self.stop.side].describe()}"
            return self._ended(outcome, ended.stop, side, loop, started, where)
        series_a, series_b = gates_rounds.sample_series(side["A"]), gates_rounds.sample_series(side["B"])
        outcome.verdict, outcome.samples, outcome.baseline_series = verdict, series_b, series_a
        outcome.baseline_samples = list(series_a.get(metric, []))
        outcome.rounds, outcome.note, outcome.seconds = len(side["B"]), verdict.reason, time.monotonic() - started
        if verdict.outcome == "inconclusive":
            resolved = measured_resolution(series_a.get(metric, []), series_b.get(metric, []), plan, tolerance,
                                           both_sides_grow=True)
            if resolved is not None:
                outcome.resolution = resolution_record(resolved)
                outcome.note = f"{verdict.reason}\nresolution: {outcome.resolution.line}"
        outcome.summarize_samples()
        a_s, b_s = stats.summarize(series_a[metric]), stats.summarize(series_b[metric])
        if judged_by_caller:
            log.info("these %d rounds a side: A median %.2f, B median %.2f", len(side["B"]), a_s.median, b_s.median)
            return outcome
        log.info("A/B %s: A=%s median %.2f, B=%s median %.2f, change %+.1f%%: %s", metric, spec_a.id, a_s.median,
                 spec_b.id, b_s.median, verdict.change * 100, verdict.outcome)
        if outcome.resolution is not None:
            log.info("A/B resolution: %s", outcome.resolution.line)
        if verdict.outcome == "regressed":
            outcome.ending = Ending("fail", (
                f"A/B: B={spec_b.id} REGRESSED against A={spec_a.id} on {metric} (workload {wl.name})\n"
                f"  A: median {a_s.median:.3f} {format_values(series_a[metric])}\n"
                f"  B: median {b_s.median:.3f} {format_values(series_b[metric])}\n"
                f"  change {verdict.change:+.1%} (tolerance {tolerance:.0%}); {verdict.reason}\n"
                f"  configurations differ in: {'; '.join(d.describe() for d in diffs) or 'nothing'}"))
        return outcome

    def _ended(self, outcome: BenchOutcome, stop: gates_rounds.Invalid | gates_rounds.Confounded,
               side: dict[str, list[dict[str, float]]], loop: gates_rounds.RoundLoop, started: float,
               where: str) -> BenchOutcome:
        """The outcome of rounds that ended before a verdict: an invalid round (not a number), or a host that stayed
        busy (confounded); the rounds measured before it are kept."""
        outcome.samples, outcome.rounds = gates_rounds.sample_series(side["B"]), len(side["B"])
        outcome.baseline_series = gates_rounds.sample_series(side["A"])
        outcome.baseline_samples = list(outcome.baseline_series.get(outcome.metric, []))
        outcome.seconds = time.monotonic() - started
        if isinstance(stop, gates_rounds.Invalid):
            message = stop.describe(where) + loop.discarded_note()
            outcome.error = f"{stop.what} is INVALID (not a number): " + " | ".join(stop.reasons)
        else:
            message = f"{self.test_id}: {stop.describe()}"
            outcome.confounded = True
        outcome.note = message
        outcome.ending = Ending("fail", message)
        outcome.summarize_samples()
        return outcome
