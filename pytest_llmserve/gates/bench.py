"""The benchmark gate: rounds of a fixed workload, the stored baseline, and the statistical verdict.

One round = one run of the workload (every request streamed, tokens counted from the server's usage).
A round that is invalid (failed requests, wrong lengths, negative TPOT, empty ITL) is never a number:
the gate fails with the reasons. The verdict (:func:`pytest_llmserve.verdicts.stats.decide`) needs significance
AND a median change beyond the tolerance; with too little evidence it runs more rounds, up to a bound.

Baselines: a file per (test, server, workload) under ``baselines/`` holding every sample and the full
context. A comparison whose context differs in more than the declared variable is refused with the
differing keys; a baseline recorded on other hardware (or another Python/plugin version) is reported as
"no baseline for this environment" and skipped, so a newcomer's first run on another machine is not a
failure but an invitation to record one.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmserve.config import LLMServeConfig, ServerSpec, Workload
from pytest_llmserve.metrics import higher_is_better

if TYPE_CHECKING:
    from pytest_llmserve.server.handle import RunningServer
    from pytest_llmserve.server.pool import ServerPool
    from pytest_llmserve.settings import BenchSpec, Settings

ENVIRONMENT_KEYS = ("hardware", "python", "plugin_version")
SAVE_MIN_ROUNDS = 5  # at 5 vs 3+ samples an exact one-sided Mann-Whitney test can reach p < 0.05




def round_samples(result: Any) -> dict[str, float]:
    """The per-round sample of every metric (throughputs; latency mean/median/p90/p99 in ms)."""
    import math

    return {name: float(value) for name, value in result.metrics.items()
            if isinstance(value, int | float) and math.isfinite(value)}


class BenchGate:
    """Bound to one server and one test; ``run()`` measures, compares and records."""

    def __init__(self, *, server: RunningServer, cfg: LLMServeConfig, options: BenchSpec, store_dir: Path,
                 results_dir: Path, save: bool, allow_confounded: bool, test_id: str, key_test: str | None = None,
                 record: Callable[[dict[str, Any]], None], fail: Callable[[str], None],
                 pool: ServerPool | None = None,
                 skip: Callable[[str], None] | None = None, say: Callable[[str], None] | None = None) -> None:
        self.server = server
        self.cfg = cfg
        self.options = options
        self.store_dir = store_dir
        self.results_dir = results_dir
        self.save = save
        self.allow_confounded = allow_confounded
        self.test_id = test_id
        # The baseline key names the test by file and function, so it is the same whatever the rootdir.
        self.key_test = key_test or test_id.split("[", 1)[0]
        self.record = record
        self.fail = fail
        self.skip = skip
        self.pool = pool
        self.say = say or (lambda msg: None)

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
            resp = self.server.client().get("/version")
            if resp.status_code == 200:
                return str(resp.json().get("version"))
        except Exception:  # noqa: BLE001
            pass
        return None

    def measure(self, workload: Workload, rounds: int, prompts: Any = None) -> tuple[list[dict[str, float]], Any]:
        """Run ``rounds`` rounds; raise via ``fail`` on an invalid round."""
        from pytest_llmserve.load.prompts import build_prompts

        client = self.server.client()
        if prompts is None:
            prompts = build_prompts(workload, tokenize=client.tokenize)
        samples: list[dict[str, float]] = []
        last = None
        for i in range(rounds):
            self.say(f"{self.spec.id}: round {i + 1}/{rounds} of workload {workload.name}")
            last = run_round(self.server, workload, prompts, f"benchmark round {i + 1} on {self.spec.id}", self.fail)
            samples.append(round_samples(last))
        return samples, last

    def run(self, workload: str | None = None) -> dict[str, Any]:
        from pytest_llmserve.evidence.environment import build_context
        from pytest_llmserve.store.baselines import BaselineStore, BenchKey
        from pytest_llmserve.verdicts import stats
        from pytest_llmserve.verdicts.comparability import comparability

        opts = self.options
        wl = self.cfg.workload(workload or opts.workload, where=self.test_id)
        metric = opts.metric
        hib = opts.higher_is_better if opts.higher_is_better is not None else higher_is_better(metric)
        spec = self.spec
        context = build_context(spec, wl, engine_version=self.engine_version())
        key = BenchKey(test=opts.baseline_test or self.key_test,
                       server=opts.baseline_server or spec.id, workload=wl.name)
        store = BaselineStore(self.store_dir)
        outcome: dict[str, Any] = {"test": self.test_id, "server": spec.id, "workload": wl.name, "metric": metric,
                                   "higher_is_better": hib, "tolerance": opts.tolerance,
                                   "baseline_file": str(store.path_for(key)), "context": context,
                                   "key": key.as_dict()}
        started = time.monotonic()
        if self.save:
            rounds = max(opts.rounds, SAVE_MIN_ROUNDS)
            samples, last = self.measure(wl, rounds)
            series = _series(samples)
            store.save(key, context, series, metric=metric, higher_is_better=hib, run_id=uuid.uuid4().hex[:12],
                       info={"test": self.test_id, "cross_check": _cross(last)})
            outcome.update(verdict="saved", current=series, baseline=None, rounds=rounds,
                           message=f"saved {rounds} rounds as a new baseline record in {store.path_for(key)}",
                           seconds=time.monotonic() - started, cross_check=_cross(last))
            self._finish(outcome)
            return outcome
        doc = store.load(key)
        if doc is None:
            samples, last = self.measure(wl, opts.rounds)
            series = _series(samples)
            outcome.update(verdict="no-baseline", current=series, baseline=None, rounds=len(samples),
                           message=f"no baseline at {store.path_for(key)}; record one with --llmserve-save-baseline",
                           seconds=time.monotonic() - started, cross_check=_cross(last))
            self._finish(outcome)
            return outcome
        comp = comparability(doc.context, context, opts.variable, self.allow_confounded)
        outcome["comparability"] = comp.to_dict()
        if not comp.ok:
            env_only = all(any(d.key == k or d.key.startswith(k + ".") for k in ENVIRONMENT_KEYS)
                           for d in comp.confounders)
            outcome.update(verdict="refused", current=None, baseline=None, rounds=0, message=comp.message,
                           seconds=time.monotonic() - started)
            self._finish(outcome)
            if env_only and self.skip is not None:
                self.skip(f"no baseline for this environment in {store.path_for(key)} (recorded elsewhere):\n"
                          f"{comp.message}")
            self.fail(f"{self.test_id}: {comp.message}\nbaseline: {store.path_for(key)}")
            return outcome
        base_samples = doc.samples(metric)
        samples, last = self.measure(wl, opts.rounds)
        verdict = stats.decide(base_samples, [s[metric] for s in samples], higher_is_better=hib,
                               tolerance=opts.tolerance, alpha=opts.alpha, metric=metric)
        while stats.needs_more_rounds(verdict, len(samples), opts.max_rounds):
            more, last = self.measure(wl, 1)
            samples.extend(more)
            verdict = stats.decide(base_samples, [s[metric] for s in samples], higher_is_better=hib,
                                   tolerance=opts.tolerance, alpha=opts.alpha, metric=metric)
        series = _series(samples)
        outcome.update(verdict=verdict.outcome, verdict_detail=verdict.to_dict(), current=series,
                       baseline={m: v for m, v in doc.latest.samples.items()}, rounds=len(samples),
                       message=verdict.reason, seconds=time.monotonic() - started, cross_check=_cross(last))
        self._finish(outcome)
        if verdict.outcome == "regressed":
            base_s = stats.summarize(base_samples)
            cur_s = stats.summarize(series[metric])
            self.fail(
                f"{self.test_id}: {metric} REGRESSED on {spec.id} (workload {wl.name})\n"
                f"  baseline: median {base_s.median:.3f} over {base_s.n} rounds {_fmt(base_samples)}\n"
                f"  now:      median {cur_s.median:.3f} over {cur_s.n} rounds {_fmt(series[metric])}\n"
                f"  change:   {verdict.change:+.1%} (tolerance {opts.tolerance:.0%}, good direction "
                f"{'up' if hib else 'down'})\n  {verdict.reason}\n  comparison: {comp.label}\n"
                f"  baseline file: {store.path_for(key)}")
        return outcome

    def _finish(self, outcome: dict[str, Any]) -> None:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        self.record(outcome)


def run_round(server: RunningServer, workload: Workload, prompts: Any, what: str, fail: Callable[[str], Any]) -> Any:
    """One measured round on a live ``server`` (its requests counted as request time, bounded by the server's
    ``request_timeout_s``); an invalid round is never a number: ``fail`` gets what made it invalid.

    The round has the server to itself: it holds the server's request lock exclusively (no other request
    of this run, from any xdist worker, reaches the server meanwhile), and the engine's own
    running-requests gauge, sampled during the round, must never exceed the round's concurrency."""
    from pytest_llmserve.load.runner import run_workload

    server.ensure_alive()
    engine = _engine_of(server)
    with _alone(server), _requests(server):
        result = run_workload(server.base_url, server.model_name, workload, prompts=prompts,
                              api_key=server.spec.api_key, progress=False,
                              timeout_s=server.spec.request_timeout_s,
                              server_counter=engine.generation_counter,
                              running_gauge=engine.running_requests_gauge)
    if not result.valid:
        fail(f"{what} is INVALID (not a number):\n  - " + "\n  - ".join(result.invalid_reasons)
             + f"\nworkload: {asdict(workload)}\nserver: {server.describe()}")
    return result


def _engine_of(server: RunningServer) -> Any:
    """The engine's adapter, for its metric names: a worker attached to another worker's server reaches it
    as ``external``, but the engine is the one configured (``spec_for_checks``)."""
    from pytest_llmserve.engines import adapter_for

    return adapter_for(server.spec_for_checks) if server.spec_for_checks is not None else server.adapter


def _alone(server: RunningServer) -> Any:
    """The server's request lock held exclusively (none when the server was not given one: a script's)."""
    import contextlib

    lock = getattr(server, "request_lock", None)
    return lock.exclusive() if lock is not None else contextlib.nullcontext()


def _requests(server: RunningServer) -> Any:
    import contextlib

    acc = server.accounting
    return acc.requests() if acc is not None else contextlib.nullcontext()


def _series(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    names = sorted(set().union(*[set(s) for s in samples])) if samples else []
    return {n: [s[n] for s in samples if n in s] for n in names}


def _cross(result: Any) -> Any:
    if result is None:
        return None
    data = getattr(result, "server_check", None)
    return data if isinstance(data, dict | str | type(None)) else str(data)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


def render_outcomes(outcomes: list[dict[str, Any]], settings: Settings, wall_s: float, boot_s: float) -> str:
    """Terminal table plus the paths of the written reports."""
    from pytest_llmserve.report.outcome import as_outcomes
    from pytest_llmserve.report.plots import matplotlib_missing
    from pytest_llmserve.report.session import write_all
    from pytest_llmserve.report.text import format_table

    items = as_outcomes(outcomes)
    lines = [format_table(items)]
    no_plots = matplotlib_missing()
    paths = write_all(items, settings.results_dir, bench_json=settings.bench_json, plots=no_plots is None)
    lines += [f"report: {p}" for p in paths]
    if no_plots:
        lines.append(f"report: {no_plots}")
    lines.append(f"suite wall time {wall_s:.1f} s, of which server boots {boot_s:.1f} s")
    return "\n".join(lines)


class ABRunner:
    """Two configurations benchmarked in one run, interleaved A B A B, judged like a baseline comparison.

    A is the reference ("baseline"), B the candidate: "regressed" means B is worse than A beyond the
    tolerance with significance. Both servers stay up for the whole comparison, so drift on a shared
    machine hits both sides alike.
    """

    def __init__(self, *, pool: ServerPool, cfg: LLMServeConfig, test_id: str, results_dir: Path,
                 record: Callable[[dict[str, Any]], None], fail: Callable[[str], None],
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
        from pytest_llmserve.errors import ConfigError

        raise ConfigError(f"{self.test_id}: A/B configuration {ident!r} is not configured (known: {known})")

    def run(self, a: str, b: str, *, workload: str = "smoke", rounds: int = 5, metric: str = "output_throughput",
            tolerance: float = 0.05, alpha: float = 0.05, warmup_rounds: int = 1) -> dict[str, Any]:
        from pytest_llmserve.evidence.environment import build_context
        from pytest_llmserve.load.prompts import build_prompts
        from pytest_llmserve.verdicts import stats
        from pytest_llmserve.verdicts.comparability import diff_context

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
        started = time.monotonic()
        for i in range(warmup_rounds + rounds):
            for name in ("A", "B"):
                server = servers[name]
                result = run_round(server, wl, prompts, f"A/B round {i + 1} on {name} ({server.spec.id})", self.fail)
                if i >= warmup_rounds:  # the first round of each side warms caches and is not counted
                    side[name].append(round_samples(result))
                    self.say(f"A/B round {i + 1 - warmup_rounds}/{rounds}: {name} {metric} "
                             f"{side[name][-1].get(metric, float('nan')):.2f}")
        series_a, series_b = _series(side["A"]), _series(side["B"])
        verdict = stats.decide(series_a[metric], series_b[metric], higher_is_better=hib, tolerance=tolerance,
                               alpha=alpha, metric=metric)
        outcome: dict[str, Any] = {
            "test": self.test_id, "server": f"B={spec_b.id} vs A={spec_a.id}", "workload": wl.name,
            "metric": metric, "higher_is_better": hib, "tolerance": tolerance, "verdict": verdict.outcome,
            "verdict_detail": verdict.to_dict(), "baseline": series_a, "current": series_b, "rounds": rounds,
            "message": verdict.reason, "seconds": time.monotonic() - started, "ab": True,
            "differences": [d.describe() for d in diffs],
            "key": {"test": self.test_id, "server": f"{spec_a.id}|{spec_b.id}", "workload": wl.name},
        }
        self.record(outcome)
        a_s, b_s = stats.summarize(series_a[metric]), stats.summarize(series_b[metric])
        self.say(f"A/B {metric}: A={spec_a.id} median {a_s.median:.2f}, B={spec_b.id} median {b_s.median:.2f}, "
                 f"change {verdict.change:+.1%}: {verdict.outcome}")
        if verdict.outcome == "regressed":
            self.fail(f"A/B: B={spec_b.id} REGRESSED against A={spec_a.id} on {metric} (workload {wl.name})\n"
                      f"  A: median {a_s.median:.3f} {_fmt(series_a[metric])}\n"
                      f"  B: median {b_s.median:.3f} {_fmt(series_b[metric])}\n"
                      f"  change {verdict.change:+.1%} (tolerance {tolerance:.0%}); {verdict.reason}\n"
                      f"  configurations differ in: {'; '.join(d.describe() for d in diffs) or 'nothing'}")
        return outcome
