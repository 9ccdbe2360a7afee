"""The one record of a benchmark's result, :class:`BenchOutcome`, from the gate that fills it to the reports.

The benchmark gate, the A/B runner (:mod:`pytest_llmserve.gates.bench`) and the build runner
(:mod:`pytest_llmserve.gates.builds`) fill a BenchOutcome as they measure; every report
(:mod:`~pytest_llmserve.report.text`, :mod:`~pytest_llmserve.report.json`,
:mod:`~pytest_llmserve.report.benchmark_json`, :mod:`~pytest_llmserve.report.plots`,
:mod:`~pytest_llmserve.report.builds`) takes BenchOutcomes. It becomes JSON only at the edges: in the files
written (:meth:`BenchOutcome.to_dict`, a results.json entry) and across xdist workers, where the plugin carries it
in ``user_properties`` (:meth:`BenchOutcome.to_json` / :meth:`BenchOutcome.from_json`).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, TypeVar

from pytest_llmserve.json_encoding import dumps, float_or_nan
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts.comparability import Comparability
from pytest_llmserve.verdicts.stats import NOISY_CV, Resolution, Summary, Verdict, log_sd, summarize


@dataclass(frozen=True, slots=True)
class DiscardedRound:
    """A round of a benchmark run again because it was invalid only for measurement artefacts of the machine."""

    round: str
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"round": self.round, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DiscardedRound:
        return cls(round=str(data.get("round", "")), reasons=tuple(str(r) for r in data.get("reasons") or ()))


@dataclass(frozen=True, slots=True)
class ContendedRound:
    """A round discarded because the host was busy: the reason names the processes."""

    round: str
    reason: str
    host_contention: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"round": self.round, "reason": self.reason, "host_contention": self.host_contention}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContendedRound:
        return cls(round=str(data.get("round", "a round")), reason=str(data.get("reason", "host busy")),
                   host_contention=dict(data.get("host_contention") or {}))


@dataclass(slots=True)
class WarmUp:
    """The gate's warm-up (:meth:`pytest_llmserve.gates.bench.BenchGate.warm_up`): ``rounds`` discarded, their
    ``values`` of the gated ``metric`` (None: a round without a finite figure), ``settled`` (None:
    ``warmup_rounds = 0``), ``difference`` (the last comparison's relative difference), ``seconds`` spent in
    discarded rounds, the ``agreement`` bound, ``max_rounds`` and ``budget_s`` it ran under, and a ``note`` unless
    it settled."""

    metric: str
    agreement: float
    max_rounds: int
    budget_s: float
    rounds: int = 0
    values: list[float | None] = field(default_factory=list)
    settled: bool | None = None
    difference: float | None = None
    seconds: float = 0.0
    note: str | None = None

    def to_dict(self) -> dict[str, object]:
        out = {name: getattr(self, name) for name in WarmUp.__dataclass_fields__}
        return out if self.note is not None else {k: v for k, v in out.items() if k != "note"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmUp:
        return cls(metric=str(data.get("metric", "")), agreement=float(data.get("agreement") or 0.0),
                   max_rounds=int(data.get("max_rounds") or 0), budget_s=float(data.get("budget_s") or 0.0),
                   rounds=int(data.get("rounds") or 0),
                   values=[None if v is None else float(v) for v in data.get("values") or []],
                   settled=data.get("settled"), difference=data.get("difference"),
                   seconds=float(data.get("seconds") or 0.0), note=data.get("note"))


@dataclass(slots=True)
class Extension:
    """The rounds ``extend_to_resolve`` added after an inconclusive ``max_rounds``: the noise's ``target`` (None:
    not resolvable against this baseline), the ``limit`` and ``budget_s`` it ran under, ``rounds_before`` and
    ``rounds_added``, ``seconds``, the ``goal`` and the re-planned looks (``plan_looks``) where it ran, why it
    ``stopped``, and the ``note`` the report shows."""

    target: int | None
    limit: int
    budget_s: float
    rounds_before: int
    rounds_added: int = 0
    seconds: float = 0.0
    stopped: str = ""
    goal: int | None = None
    plan_looks: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in Extension.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Extension:
        return cls(target=data.get("target"), limit=int(data.get("limit") or 0),
                   budget_s=float(data.get("budget_s") or 0.0), rounds_before=int(data.get("rounds_before") or 0),
                   rounds_added=int(data.get("rounds_added") or 0), seconds=float(data.get("seconds") or 0.0),
                   stopped=str(data.get("stopped") or ""), goal=data.get("goal"), plan_looks=data.get("plan_looks"),
                   note=str(data.get("note") or ""))


@dataclass(frozen=True, slots=True)
class ResolutionRecord:
    """What the rule resolves at the measured noise, beside an inconclusive verdict: the typed ``figures``
    (:class:`~pytest_llmserve.verdicts.stats.Resolution`), the ``line`` said beside the verdict (naming the settings
    as a user writes them) and a ``short`` form for a table cell (:func:`pytest_llmserve.gates.bench.resolution_record`
    makes both)."""

    figures: Resolution
    line: str
    short: str

    def to_dict(self) -> dict[str, object]:
        return {**self.figures.to_dict(), "line": self.line, "short": self.short}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResolutionRecord:
        names = Resolution.__dataclass_fields__
        figures = Resolution(**{k: v for k, v in data.items() if k in names})
        return cls(figures=figures, line=str(data.get("line") or ""), short=str(data.get("short") or ""))


class HostShare(TypedDict):
    """What other processes took of the host over a benchmark's measured rounds (:attr:`BenchOutcome.host_contention`,
    results.json's ``host_contention``): the ``max`` and ``median`` share (None: not sampled), the ``rounds`` sampled
    and the rounds ``discarded`` as contended."""

    max: float | None
    median: float | None
    rounds: int
    discarded: int


@dataclass(frozen=True, slots=True)
class Ending:
    """What the pytest layer makes of an outcome (the gates decide it, :mod:`pytest_llmserve.bench_face` acts on it):
    ``fail`` or ``skip`` the test with ``message``, or ``warn`` it as ``warning`` (a Warning subclass)."""

    action: Literal["fail", "skip", "warn"]
    message: str
    warning: type[Warning] | None = None


@dataclass
class BenchOutcome:
    """One benchmark's result: what was measured, against what, and the verdict.

    ``samples`` holds the current run's samples of every metric (one value per round), ``metrics``
    their summaries (filled from ``samples`` when left empty), ``baseline_samples`` the baseline's
    samples of the gated ``metric``. ``error`` is set when the run was invalid or failed; then no
    verdict is given. ``request_latencies_s`` holds per-request latencies (seconds) for CDF plots.
    ``warmup`` is the gate's warm-up record (:meth:`pytest_llmserve.gates.bench.BenchGate.warm_up`: ``rounds``
    discarded, ``settled``, ``note``...); None where none ran (an A/B, a refusal before any boot, an older file).
    ``discarded_rounds``: rounds run again as measurement artefacts of the machine (``round``, ``reasons``).
    ``resolution`` is what the rule resolves at the measured noise beside an inconclusive verdict
    (:func:`pytest_llmserve.gates.bench.resolution_record`: the figures, its ``line`` and a ``short`` form);
    ``extension`` the record of the rounds ``extend_to_resolve`` added (``rounds_added``, ``stopped``, ``note``...).
    ``contended_rounds``: the rounds discarded because the host was busy (``round``, ``reason`` naming the
    processes, ``host_contention``); each measured round's own contention is ``samples["host_contention"]``.

    The rest is what the gate knows of the run beyond the reports (carried across xdist, not in results.json):
    ``rounds`` measured, ``seconds`` taken, ``cross_check`` (the last round's server-side count), the
    ``correctness_failed`` records that denied a pass, the ``inconclusive_policy``, a saved baseline's spread
    ``warning`` and ``baseline_ci_half_width``, ``baseline_series`` (every metric of the baseline's samples: the
    stored record's, or side A's in an A/B), an A/B's ``differences`` between its configurations (``ab``), and
    ``before_boot`` for a refusal decided from the configuration alone.
    """

    test_id: str
    server_id: str
    workload: str
    metric: str
    higher_is_better: bool = True
    tolerance: float = 0.05
    current: Summary | None = None
    baseline: Summary | None = None
    verdict: Verdict | None = None
    comparability: Comparability | None = None
    metrics: dict[str, Summary] = field(default_factory=dict)
    samples: dict[str, list[float]] = field(default_factory=dict)
    baseline_samples: list[float] = field(default_factory=list)
    error: str | None = None
    context: dict[str, object] = field(default_factory=dict)
    concurrency: int | None = None
    request_latencies_s: dict[str, list[float]] = field(default_factory=dict)
    note: str | None = None
    baseline_path: str | None = None
    run_id: str | None = None  # the session's run, where known (a results.json's; a baseline record takes it)
    saved: bool = False  # this run's samples were recorded as the baseline (nothing compared)
    baseline_key: BenchKey | None = None  # the store key, when it is not (test_id, server_id, workload)
    warmup: WarmUp | None = None
    discarded_rounds: list[DiscardedRound] = field(default_factory=list)
    resolution: ResolutionRecord | None = None
    extension: Extension | None = None
    contended_rounds: list[ContendedRound] = field(default_factory=list)
    confounded: bool = False  # no verdict: the host stayed busy (contended_rounds); skipped, never failed
    rounds: int = 0
    seconds: float | None = None
    cross_check: dict[str, object] | str | None = None
    correctness_failed: list[dict[str, str]] = field(default_factory=list)
    inconclusive_policy: str | None = None
    warning: str | None = None
    baseline_ci_half_width: float | None = None
    baseline_series: dict[str, list[float]] = field(default_factory=dict)
    differences: list[str] = field(default_factory=list)
    ab: bool = False
    before_boot: bool = False
    # Which run of a gate this outcome is, whichever process made it (with the node id, server and workload: its
    # identity); it travels with the record (to_json), not in results.json.
    outcome_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # What the pytest layer does with it (decided by the gate; never stored: the status and note say it).
    ending: Ending | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.summarize_samples()

    def summarize_samples(self) -> None:
        """Fill the summaries the reports read (``metrics``, ``current``, ``baseline``) from the samples; the gate
        calls it again once its rounds are in (it fills the record as it measures)."""
        for name, values in self.samples.items():
            if name not in self.metrics and values and all(math.isfinite(v) for v in values):
                self.metrics[name] = summarize(values)
        if self.current is None:
            self.current = self.metrics.get(self.metric)  # None until the gated metric has a finite round
        if self.baseline is None and self.baseline_samples:
            self.baseline = summarize(self.baseline_samples)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """(node id, server, workload, the gate's run: ``outcome_id``): the same outcome seen in this process and in
        a worker's report, told apart from another run of the same gate in one test."""
        return (self.test_id, self.server_id, self.workload, self.outcome_id)

    @property
    def key(self) -> BenchKey:
        """The baseline store key: ``baseline_key`` if given, else (test id, server id, workload)."""
        return self.baseline_key or BenchKey(test=self.test_id, server=self.server_id, workload=self.workload)

    @property
    def status(self) -> str:
        """``error``, ``refused``, the verdict's outcome, ``saved`` or ``no-baseline``."""
        if self.error:
            return "error"
        if self.confounded:
            return "confounded"
        if self.comparability is not None and self.comparability.status == "refused":
            return "refused"
        if self.verdict is not None:
            return self.verdict.outcome
        return "saved" if self.saved else "no-baseline"

    @property
    def failed(self) -> bool:
        """A regression or an invalid run (refusals and inconclusive results are reported, not failed)."""
        return self.status in ("regressed", "error")

    @property
    def spread(self) -> dict[str, Any]:
        """The between-round spread of the gated metric in this run: ``cv`` (sample stdev / mean of the values)
        and ``log_sd`` (sample stdev of their natural logs, the scale the sequential rule's t test works on;
        close to the CV when both are small), over ``rounds`` rounds; ``noisy`` when the CV is above
        :data:`~pytest_llmserve.verdicts.stats.NOISY_CV` (``noisy_cv``). None for a figure that needs more
        rounds than ran (a CV needs two)."""
        values = [v for v in self.samples.get(self.metric, []) if math.isfinite(v)]
        many = len(values) >= 2
        cv = summarize(values).cv if many else None
        logs = log_sd(values) if many else math.nan
        return {"metric": self.metric, "rounds": len(values), "cv": cv,
                "log_sd": logs if math.isfinite(logs) else None, "noisy": cv is not None and cv > NOISY_CV,
                "noisy_cv": NOISY_CV}

    @property
    def host_contention(self) -> HostShare:
        """What other processes took of the host during the measured rounds (``max`` and ``median`` share of the
        machine over them; None where not sampled) and how many rounds were ``discarded`` as contended."""
        values = [v for v in self.samples.get("host_contention", []) if math.isfinite(v)]
        return {"max": max(values) if values else None,
                "median": summarize(values).median if values else None,
                "rounds": len(values), "discarded": len(self.contended_rounds)}

    @property
    def notes(self) -> list[str]:
        """What a reader of the figures should know about how they were measured: a warm-up that did not
        settle, rounds whose spread is above :data:`~pytest_llmserve.verdicts.stats.NOISY_CV`."""
        out = []
        if self.warmup is not None and self.warmup.settled is False and self.warmup.note:
            out.append(self.warmup.note)
        if self.discarded_rounds:
            out.append(f"{len(self.discarded_rounds)} round(s) discarded as measurement artefacts of the machine and "
                       "run again: " + " | ".join(f"{d.round}: {'; '.join(d.reasons)}" for d in self.discarded_rounds))
        for busy in self.contended_rounds:
            out.append(f"not a sample: {busy.round}: {busy.reason}")
        spread = self.spread
        if spread["noisy"]:
            out.append(f"the rounds are noisy: {self.metric} CV {spread['cv']:.1%} over {spread['rounds']} rounds "
                       f"(sd of the log values {spread['log_sd']:.3f}) is above {NOISY_CV:.0%}: a busy machine or a "
                       "server still warming up; a verdict at this spread needs many rounds")
        if self.extension is not None and self.extension.note:
            out.append(self.extension.note)
        if self.status == "inconclusive" and self.resolution is not None and self.resolution.line:
            out.append(f"resolution: {self.resolution.line}")
        return out

    @property
    def name(self) -> str:
        """Short display name: the test function (with parameters) and, if not already in it, the server."""
        short = self.test_id.rsplit("::", 1)[-1]
        return short if self.server_id in short else f"{short}[{self.server_id}]"

    def to_dict(self) -> dict[str, object]:
        return {
            "test_id": self.test_id,
            "server_id": self.server_id,
            "workload": self.workload,
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "tolerance": self.tolerance,
            "status": self.status,
            "current": self.current.to_dict() if self.current else None,
            "baseline": self.baseline.to_dict() if self.baseline else None,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "comparability": self.comparability.to_dict() if self.comparability else None,
            "metrics": {k: v.to_dict() for k, v in self.metrics.items()},
            "samples": self.samples,
            "baseline_samples": self.baseline_samples,
            "error": self.error,
            "context": self.context,
            "concurrency": self.concurrency,
            "request_latencies_s": self.request_latencies_s,
            "note": self.note,
            "baseline_path": self.baseline_path,
            "run_id": self.run_id,
            "saved": self.saved,
            "key": self.key.as_dict(),
            "spread": self.spread,
            "warmup": self.warmup.to_dict() if self.warmup is not None else None,
            "discarded_rounds": [d.to_dict() for d in self.discarded_rounds],
            "resolution": self.resolution.to_dict() if self.resolution is not None else None,
            "extension": self.extension.to_dict() if self.extension is not None else None,
            "host_contention": self.host_contention,
            "contended_rounds": [c.to_dict() for c in self.contended_rounds],
            "confounded": self.confounded,
        }

    def to_json(self) -> str:
        """The whole record as JSON, for ``user_properties`` (xdist workers): the results.json entry
        (:meth:`to_dict`) and what the gate knows beyond it; :meth:`from_json` reads it back."""
        extra = {name: getattr(self, name) for name in RECORD_ONLY}
        return dumps({**self.to_dict(), **extra})

    @classmethod
    def from_json(cls, text: str) -> BenchOutcome:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchOutcome:
        """A results.json entry (:meth:`to_dict`), or the whole record (:meth:`to_json`'s)."""
        return cls(
            test_id=str(data["test_id"]),
            server_id=str(data["server_id"]),
            workload=str(data["workload"]),
            metric=str(data["metric"]),
            higher_is_better=bool(data.get("higher_is_better", True)),
            tolerance=float(data.get("tolerance", 0.05)),
            current=_if_mapping(data.get("current"), Summary.from_dict),
            baseline=_if_mapping(data.get("baseline"), Summary.from_dict),
            verdict=_if_given(data.get("verdict"), Verdict.from_dict),
            comparability=_if_given(data.get("comparability"), Comparability.from_dict),
            metrics={k: Summary.from_dict(v) for k, v in (data.get("metrics") or {}).items()},
            samples=_series(data.get("samples")),
            baseline_samples=_floats(data.get("baseline_samples")),
            error=data.get("error"),
            context=dict(data.get("context") or {}),
            concurrency=data.get("concurrency"),
            request_latencies_s=_series(data.get("request_latencies_s")),
            note=data.get("note"),
            baseline_path=data.get("baseline_path"),
            run_id=data.get("run_id"),
            saved=bool(data.get("saved", False)),
            baseline_key=_if_given(data.get("key"), BenchKey.from_dict),
            warmup=_if_mapping(data.get("warmup"), WarmUp.from_dict),
            discarded_rounds=_records(data.get("discarded_rounds"), DiscardedRound.from_dict),
            resolution=_if_mapping(data.get("resolution"), ResolutionRecord.from_dict),
            extension=_if_mapping(data.get("extension"), Extension.from_dict),
            contended_rounds=_contended(data),
            confounded=bool(data.get("confounded", False)),
            rounds=int(data.get("rounds") or 0),
            seconds=data.get("seconds"),
            cross_check=data.get("cross_check"),
            correctness_failed=[dict(c) for c in data.get("correctness_failed") or [] if isinstance(c, Mapping)],
            inconclusive_policy=data.get("inconclusive_policy"),
            warning=data.get("warning"),
            baseline_ci_half_width=data.get("baseline_ci_half_width"),
            baseline_series=_series(data.get("baseline_series")),
            differences=[str(d) for d in data.get("differences") or []],
            ab=bool(data.get("ab", False)),
            before_boot=bool(data.get("before_boot", False)),
            # a results.json entry has none (identity matters only while a session's outcomes are gathered)
            outcome_id=str(data.get("outcome_id") or uuid.uuid4().hex[:12]),
        )


# The fields that travel with the record (to_json) but are not a results.json entry's (to_dict: schema 1).
RECORD_ONLY = ("rounds", "seconds", "cross_check", "correctness_failed", "inconclusive_policy", "warning",
               "baseline_ci_half_width", "baseline_series", "differences", "ab", "before_boot", "outcome_id")


def _contended(data: Mapping[str, object]) -> list[ContendedRound]:
    items = data.get("contended_rounds")
    return [ContendedRound.from_dict(c) for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


_T = TypeVar("_T")


def _if_given(value: Mapping[str, object] | None, read: Callable[[Mapping[str, object]], _T]) -> _T | None:
    """``read(value)``, or None when the value is absent, null or empty."""
    return read(value) if value else None


def _if_mapping(value: object, read: Callable[[Mapping[str, object]], _T]) -> _T | None:
    """``read(value)`` when the value is an object, else None."""
    return read(value) if isinstance(value, Mapping) else None


def _records(items: Iterable[object] | None, read: Callable[[Mapping[str, object]], _T]) -> list[_T]:
    """``read`` of each object in a list (absent or null: none; items that are not objects are passed over)."""
    return [read(item) for item in items or [] if isinstance(item, Mapping)]


def _floats(values: Iterable[float | str | None] | None) -> list[float]:
    """Floats written under the NaN policy (null: NaN); absent or null: none."""
    return [float_or_nan(x) for x in values or []]


def _series(value: Mapping[str, Iterable[float | str | None]] | None) -> dict[str, list[float]]:
    """Metric name -> its samples, written under the NaN policy (null: NaN); absent or null: none."""
    return {k: _floats(v) for k, v in (value or {}).items()}
