"""The A/B runner: two configured servers benchmarked in one run, rounds interleaved A B A B, judged by the
benchmark gate's sequential rule (:func:`pytest_llmserve.gates.bench.until_verdict`), B against A.

It shares the gate's round (:func:`~pytest_llmserve.gates.rounds.run_round`, each round alone on its server, a
contended one measured again: :func:`~pytest_llmserve.gates.rounds.clean_round`, one invalid only for measurement
artefacts of the machine too: :func:`~pytest_llmserve.gates.rounds.again_on_artefacts`) and records a
:class:`~pytest_llmserve.report.outcome.BenchOutcome` like the gate; ``llmserve builds`` measures its steps with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import ConfigError
from pytest_llmserve.gates.bench import format_values, measured_resolution, resolution_record, until_verdict
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.gates.rounds import again_on_artefacts, clean_round, round_samples, run_round, sample_series
from pytest_llmserve.load.contention import wait_until_quiet
from pytest_llmserve.load.prompts import build_prompts
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.options import BenchDefaults
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts import stats
from pytest_llmserve.verdicts.comparability import diff_context

if TYPE_CHECKING:
    from pytest_llmserve.server.pool import ServerPool


class ABRunner:
    """Two configurations benchmarked in one run, interleaved A B A B, judged like a baseline comparison.

    A is the reference ("baseline"), B the candidate: "regressed" means B is worse than A beyond the
    tolerance with significance. Both servers stay up for the whole comparison, so drift on a shared
    machine hits both sides alike.
    """

    def __init__(self, *, pool: ServerPool, cfg: LLMServeConfig, test_id: str, results_dir: Path,
                 record: Callable[[BenchOutcome], None], fail: Callable[[str], None],
                 say: Callable[[str], None] | None = None) -> None:
        self.pool = pool
        self.cfg = cfg
        self.test_id = test_id
        self.results_dir = results_dir
        self.record = record
        self.fail = fail
        self.say = say or (lambda msg: None)

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
        other processes took more of the host is measured again (:func:`clean_round`), and so is one invalid only
        for measurement artefacts of the machine (:func:`again_on_artefacts`)."""
        spec_a, spec_b = self.spec(a), self.spec(b)
        wl = self.cfg.workload(workload, where=self.test_id)
        server_a = self.pool.get(spec_a)
        server_b = self.pool.get(spec_b, keep=(spec_a,))
        diffs = diff_context(build_context(spec_a, wl, engine_version=None),
                             build_context(spec_b, wl, engine_version=None))
        prompts = build_prompts(wl, tokenize=server_a.client().tokenize)
        hib = higher_is_better(metric)
        side: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
        servers = {"A": server_a, "B": server_b}
        cap = max(rounds, max_rounds if max_rounds is not None else rounds)
        alpha = stats.DEFAULT_SEQUENTIAL_ALPHA if alpha is None else alpha
        plan = stats.sequential_plan(stats.ab_looks(max(rounds, stats.SEQUENTIAL_FIRST_LOOK), cap), alpha=alpha)
        started = time.monotonic()
        done = 0
        bound = BenchDefaults().contention_bound if contention_bound is None else contention_bound
        contended: list[dict[str, Any]] = []
        discarded: list[dict[str, Any]] = []  # rounds run again as measurement artefacts (again_on_artefacts)

        def pair() -> None:
            nonlocal done
            for name in ("A", "B"):
                server = servers[name]
                settle(servers["B" if name == "A" else "A"], server)

                def measure(what: str, server: RunningServer = server) -> Any:
                    return again_on_artefacts(
                        lambda invalid: run_round(server, wl, prompts, what, invalid, contention_bound=bound),
                        what, self.fail, discarded=discarded, say=self.say)

                result = clean_round(measure, f"A/B round {done + 1} on {name} ({server.spec.id})", bound=bound,
                                     contended=contended, say=self.say,
                                     confounded=lambda message: self.fail(f"{self.test_id}: {message}"))
                if done >= warmup_rounds:  # the first round of each side warms caches and is not counted
                    side[name].append(round_samples(result))
                    self.say(f"A/B round {done + 1 - warmup_rounds}/{rounds}..{cap}: {name} {metric} "
                             f"{side[name][-1].get(metric, float('nan')):.2f}")
            done += 1

        def settle(other: RunningServer, server: RunningServer) -> None:
            # The side measured just before still polls for work (wait_until_quiet says why): a round beside it
            # would count it as host contention. Half the bound, so the rest of the host keeps its share.
            if other is server:
                return
            quiet = wait_until_quiet(getattr(other, "server_pid", None), bound=bound / 2)
            if not quiet.settled:
                self.say(f"A/B: {other.spec.id} still took {quiet.share:.1%} of the machine after "
                         f"{quiet.seconds:.1f} s of waiting for it to go quiet; the round on {server.spec.id} is "
                         "measured anyway, its host contention judged")

        def judge() -> stats.Verdict:
            # A round a script let through as invalid (its ``fail`` did not end the run) is not a number.
            return stats.decide_sequential([s[metric] for s in side["A"] if metric in s],
                                           [s[metric] for s in side["B"] if metric in s], plan=plan,
                                           higher_is_better=hib, tolerance=tolerance, metric=metric)

        for _ in range(warmup_rounds + rounds):
            pair()
        verdict = until_verdict(judge, pair, lambda: len(side["B"]), cap)
        series_a, series_b = sample_series(side["A"]), sample_series(side["B"])
        outcome = BenchOutcome(
            test_id=self.test_id, server_id=f"B={spec_b.id} vs A={spec_a.id}", workload=wl.name, metric=metric,
            higher_is_better=hib, tolerance=tolerance, verdict=verdict, samples=series_b,
            baseline_samples=list(series_a.get(metric, [])), baseline_series=series_a, rounds=len(side["B"]),
            note=verdict.reason, seconds=time.monotonic() - started, ab=True,
            differences=[d.describe() for d in diffs], contended_rounds=contended, discarded_rounds=discarded,
            baseline_key=BenchKey(test=self.test_id, server=f"{spec_a.id}|{spec_b.id}", workload=wl.name))
        if verdict.outcome == "inconclusive":
            resolved = measured_resolution(series_a.get(metric, []), series_b.get(metric, []), plan, tolerance,
                                           both_sides_grow=True)
            if resolved is not None:
                outcome.resolution = resolution_record(resolved)
                outcome.note = f"{verdict.reason}\nresolution: {outcome.resolution['line']}"
        self.record(outcome)
        a_s, b_s = stats.summarize(series_a[metric]), stats.summarize(series_b[metric])
        if judged_by_caller:
            self.say(f"these {len(side['B'])} rounds a side: A median {a_s.median:.2f}, B median {b_s.median:.2f}")
            return outcome
        self.say(f"A/B {metric}: A={spec_a.id} median {a_s.median:.2f}, B={spec_b.id} median {b_s.median:.2f}, "
                 f"change {verdict.change:+.1%}: {verdict.outcome}")
        if outcome.resolution is not None:
            self.say(f"A/B resolution: {outcome.resolution['line']}")
        if verdict.outcome == "regressed":
            self.fail(f"A/B: B={spec_b.id} REGRESSED against A={spec_a.id} on {metric} (workload {wl.name})\n"
                      f"  A: median {a_s.median:.3f} {format_values(series_a[metric])}\n"
                      f"  B: median {b_s.median:.3f} {format_values(series_b[metric])}\n"
                      f"  change {verdict.change:+.1%} (tolerance {tolerance:.0%}); {verdict.reason}\n"
                      f"  configurations differ in: {'; '.join(d.describe() for d in diffs) or 'nothing'}")
        return outcome
