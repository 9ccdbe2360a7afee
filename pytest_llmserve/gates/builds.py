"""Builds compared and bisected on a real server: the same configuration under each build, judged like an A/B.

A build (:class:`pytest_llmserve.config.BuildSpec`, installed by :mod:`pytest_llmserve.builds`) becomes a
:class:`ServerSpec` that differs from the base only in ``python`` (the build's interpreter) and the server arguments
the build declares; the comparison context may differ in nothing else (:func:`check_only_build_differs`). Each
build's server gets the correctness probes (NaN evidence and known answers) once; throughput comes from the
existing :class:`~pytest_llmserve.gates.ab.ABRunner` (interleaved rounds, both servers up). Where memory does not
allow two servers, :func:`_alternating` runs blocks of rounds on one server at a time instead.

The bisect search itself is :mod:`pytest_llmserve.verdicts.bisect`; this module measures its steps, and
:mod:`pytest_llmserve.report.builds` writes their results.json, summary.md and the plot of the metric per build.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import psutil

from pytest_llmserve.builds import BuildEnv, Installer
from pytest_llmserve.config import WORKLOAD_PRESETS, BuildSpec, LLMServeConfig, ServerSpec, Workload
from pytest_llmserve.errors import ConfigError, LLMServeError
from pytest_llmserve.gates.ab import ABRunner, ABStop
from pytest_llmserve.gates.context import configuration_comparability
from pytest_llmserve.gates.decode import CheckFailed, DecodeCheck
from pytest_llmserve.gates.rounds import Confounded, RoundLoop, log
from pytest_llmserve.gates.rounds import Measured as MeasuredRound
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.report.builds import Measured, results_document, write_build_reports
from pytest_llmserve.server.handle import RunningServer
from pytest_llmserve.server.pool import ServerPool
from pytest_llmserve.verdicts.bisect import BisectResult, StepResult, bisect, judge_step
from pytest_llmserve.verdicts.comparability import IGNORED_CONTEXT_KEYS

# An idle vLLM CPU server with a 2 GiB KV cache held about 2.7 GB here (DESIGN.md); with the KV cache
# filling and a margin, two servers side by side want about this much available memory each.
SERVER_MEMORY_BYTES = 4 * 2**30
BUILD_KEYS = ("engine_version", "server_args.python")


@dataclass(frozen=True, slots=True)
class RunSettings:
    workload: Workload
    metric: str = "output_throughput"
    tolerance: float = 0.05
    alpha: float = 0.02  # over a step's looks (one per attempt), as the gate's sequential rule
    rounds: int = 5
    warmup_rounds: int = 1
    max_attempts: int = 2  # a step still inconclusive after this many measurements is reported so
    find_change: bool = False
    both_up: bool | None = None  # None: decided from the available memory


def spec_for(base: ServerSpec, env: BuildEnv, index: int) -> ServerSpec:
    """The base configuration under ``env``: its interpreter, plus the server arguments the build declares."""
    return replace(base, python=env.python, args=base.args + env.spec.server_args,
                   variant=(*base.variant, ("build", f"{index}:{env.spec.label}")))


def check_only_build_differs(a: ServerSpec, b: ServerSpec, workload: Workload, *, declared_args: bool) -> None:
    """Refuse (ConfigError) when the two contexts differ in more than the build: interpreter and engine
    version, and the server arguments only where a build declares them."""
    ignore = (*IGNORED_CONTEXT_KEYS, "server_args.variant") + (("server_args.args",) if declared_args else ())
    comp = configuration_comparability(a, b, workload, variable="engine_build", ignore=ignore)
    if comp.status == "refused":
        raise ConfigError(f"{a.id} vs {b.id}: {comp.message}")


def correctness(server: RunningServer) -> tuple[bool, str]:
    """NaN evidence and known answers on one server: (all passed, the first line of each failure)."""
    failures: list[str] = []
    for check in ("no_nan", "known_answers"):
        try:
            getattr(DecodeCheck(server), check)()
        except CheckFailed as failed:
            failures.append(failed.message.splitlines()[0] if failed.message else "failed")
    return not failures, "; ".join(failures)


def both_fit() -> bool:
    return bool(psutil.virtual_memory().available >= 2 * SERVER_MEMORY_BYTES)


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


class BuildRunner:
    """Installs the builds, boots their servers through one pool, measures steps, writes the reports."""

    def __init__(self, builds: list[BuildSpec], base: ServerSpec, settings: RunSettings, out_dir: Path, *,
                 installer: Installer | None = None) -> None:
        self.builds = builds
        self.base = base
        self.settings = settings
        self.out_dir = out_dir
        self.installer = installer or Installer(progress=log.info)
        self.pool: ServerPool | None = None
        self.measured: Measured | None = None
        self.load: dict[str, list[float]] = {}
        self.steps: list[StepResult] = []  # every measurement so far: written even when the run stops early

    # ---- set-up
    def prepare(self) -> Measured:
        envs = [self.installer.ensure(b) for b in self.builds]
        specs = [spec_for(self.base, env, i) for i, env in enumerate(envs)]
        declared = any(b.server_args for b in self.builds)
        for spec in specs[1:]:
            check_only_build_differs(specs[0], spec, self.settings.workload, declared_args=declared)
        self.measured = Measured(envs, specs)
        return self.measured

    def _cfg(self) -> LLMServeConfig:
        assert self.measured is not None
        wl = self.settings.workload
        return LLMServeConfig(servers=(self.base,), workloads={**WORKLOAD_PRESETS, wl.name: wl},
                              default_server=self.base.name, source="llmserve builds",
                              matrices={self.base.name: tuple(self.measured.specs)})

    def _server(self, index: int, keep: tuple[ServerSpec, ...] = ()) -> RunningServer:
        assert self.measured is not None and self.pool is not None
        server = self.pool.get(self.measured.specs[index], keep=keep)
        if index not in self.measured.correctness:
            ok, detail = correctness(server)
            self.measured.correctness[index] = (ok, detail)
            log.info("%s: correctness %s", self.label(index), "passed" if ok else f"FAILED: {detail}")
        return server

    def label(self, index: int) -> str:
        return f"B{index} {self.builds[index].label}"

    # ---- one step: build ``index`` against build ``ref``
    def step(self, ref: int, index: int, attempt: int, acc: dict[int, tuple[list[float], list[float]]], *,
             not_worse: bool = False) -> StepResult:
        assert self.measured is not None and self.pool is not None, "a step runs inside `with BuildRunner(...)`"
        s = self.settings
        spec_ref, spec = self.measured.specs[ref], self.measured.specs[index]
        both = s.both_up if s.both_up is not None else both_fit()
        if both:
            self._server(ref)
            self._server(index, keep=(spec_ref,))
            runner = ABRunner(pool=self.pool, cfg=self._cfg(), test_id=f"{self.label(index)} vs {self.label(ref)}",
                              results_dir=self.out_dir)
            out = runner.run(spec_ref.id, spec.id, workload=s.workload.name, rounds=s.rounds, metric=s.metric,
                             tolerance=s.tolerance, alpha=s.alpha,
                             warmup_rounds=s.warmup_rounds if attempt == 1 else 0, judged_by_caller=True)
            if runner.stop is not None:  # an invalid round, or a busy host: this step is not a number
                return self._invalid(ref, index, attempt, runner.stop)
            ref_new, cand_new = list(out.baseline_series.get(s.metric, [])), list(out.samples.get(s.metric, []))
            self.measured.outcomes.append(out)
        else:
            measured = self._alternating(ref, index, warm=attempt == 1)
            if isinstance(measured, ABStop):
                return self._invalid(ref, index, attempt, measured)
            ref_new, cand_new = measured
        old_ref, old_cand = acc.get(index, ([], []))
        acc[index] = (old_ref + ref_new, old_cand + cand_new)
        self.measured.samples.setdefault(ref, []).extend(ref_new)
        self.measured.samples.setdefault(index, []).extend(cand_new)
        ok, detail = self.measured.correctness.get(index, (True, ""))
        result = judge_step(index, acc[index][0], acc[index][1], higher_is_better=higher_is_better(s.metric),
                            tolerance=s.tolerance, alpha=s.alpha, max_attempts=s.max_attempts,
                            rounds_per_attempt=s.rounds, correctness_ok=ok,
                            correctness_detail=detail, attempt=attempt, metric=s.metric, not_worse=not_worse)
        self.steps.append(result)
        change = f", change {result.change:+.1%}" if result.change is not None else ""
        log.info("step %s vs %s (attempt %d, %d rounds a side%s): %s, correctness %s", self.label(index),
                 self.label(ref), attempt, result.rounds, change, result.verdict, "ok" if ok else "FAILED")
        return result

    def _invalid(self, ref: int, index: int, attempt: int, ended: ABStop) -> StepResult:
        """Rounds that ended before a number. On the good end (side A) it is an error (nothing to compare against).
        On the build under test, wrong output (failed requests, tokens without text, decode collapse: a reason
        that blames the server) makes the step bad, like a correctness failure; a measurement artefact (chunks
        merged on a starved machine, other traffic) or a busy host makes this attempt inconclusive: no look is
        spent, and the next attempt measures again."""
        stop = ended.stop
        if isinstance(stop, Confounded):
            what, faulty = stop.describe().splitlines()[0], False
        else:
            what, faulty = f"{stop.what} is INVALID (not a number): {'; '.join(stop.reasons)}", stop.server_fault
            if ended.side == "A":
                raise LLMServeError(f"the good end {self.label(ref)} produced an invalid round: {stop.describe()}")
        log.info("step %s: %s -> %s", self.label(index), what,
                 "wrong output: the build is bad" if faulty else "not a number: this attempt is inconclusive")
        return StepResult(index, "inconclusive", not faulty, attempt=attempt,
                          correctness_detail=f"invalid round: {what}" if faulty else "",
                          extra={"invalid_round": what})

    def _alternating(self, ref: int, index: int, *, warm: bool) -> tuple[list[float], list[float]] | ABStop:
        """One server at a time (memory allows no more): two blocks per side, A B A B, each block booting its
        server (the pool stops the other), the first round of a fresh boot not counted; the rounds' loop is the
        gate's (:class:`~pytest_llmserve.gates.rounds.RoundLoop`), without a contention bound."""
        assert self.measured is not None
        s = self.settings
        got: dict[int, list[float]] = {ref: [], index: []}
        first_block = (s.rounds + 1) // 2
        loop: RoundLoop | None = None
        for block, n in enumerate((first_block, s.rounds - first_block)):
            for side in (ref, index):
                server = self._server(side)
                loop = loop or RoundLoop(s.workload, metric=s.metric, contention_bound=None)
                for r in range(n + 1):
                    name: Literal["A", "B"] = "A" if side == ref else "B"
                    result = loop.measure(server, f"block {block + 1} round {r} on {name} ({server.spec.id})")
                    if not isinstance(result, MeasuredRound):
                        return ABStop(name, result)
                    if r > 0:  # a fresh boot's first round warms caches
                        got[side].append(result.samples[s.metric])
        return got[ref], got[index]

    def __enter__(self) -> BuildRunner:
        self.out_dir.mkdir(parents=True, exist_ok=False)
        run_dir = Path(tempfile.mkdtemp(prefix="llmserve-builds-"))
        both = self.settings.both_up if self.settings.both_up is not None else both_fit()
        self.pool = ServerPool(run_dir, self.out_dir / "logs", say=log.info, max_alive=2 if both else 1)
        # SIGTERM must run __exit__, or the servers would outlive the command.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        self.load["start"] = load_average()
        return self

    def __exit__(self, *exc: object) -> None:
        self.load["end"] = load_average()
        if self.pool is not None:
            self.pool.stop_all()

    # ---- commands
    def compare(self) -> StepResult:
        self.prepare()
        acc: dict[int, tuple[list[float], list[float]]] = {}
        try:
            result = self.step(0, 1, 1, acc)
            attempt = 1
            while result.verdict == "inconclusive" and attempt < self.settings.max_attempts:
                attempt += 1
                result = self.step(0, 1, attempt, acc)
        except LLMServeError as exc:
            self.write(self.steps, None, error=str(exc))  # what was measured before the stop is kept
            raise
        self.write([result], None)
        return result

    def bisect(self) -> BisectResult:
        self.prepare()
        acc: dict[int, tuple[list[float], list[float]]] = {}
        try:
            # Looking for a regression, a faster build is a good one (find_change asks for either direction).
            not_worse = not self.settings.find_change
            result = bisect(len(self.builds), lambda i, attempt: self.step(0, i, attempt, acc, not_worse=not_worse),
                            max_attempts=self.settings.max_attempts, find_change=self.settings.find_change,
                            names=[self.label(i) for i in range(len(self.builds))])
        except LLMServeError as exc:
            self.write(self.steps, None, error=str(exc), command="bisect")
            raise
        self.write(list(result.steps), result)
        return result

    # ---- reports
    def write(self, steps: list[StepResult], result: BisectResult | None, *, error: str | None = None,
              command: str | None = None) -> None:
        assert self.measured is not None
        s = self.settings
        self.load["end"] = load_average()
        data = results_document(command=command or ("bisect" if result is not None else "compare"), error=error,
                                metric=s.metric, tolerance=s.tolerance, alpha=s.alpha, workload=s.workload,
                                base_server=self.base.id, load=self.load, builds=self.builds, measured=self.measured,
                                steps=steps, labels=[self.label(i) for i in range(len(self.builds))], result=result)
        write_build_reports(self.out_dir, data, measured=self.measured, steps=steps, say=log.info)
