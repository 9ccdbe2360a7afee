"""The one record of a benchmark's result, :class:`BenchOutcome`, and its construction from the gate.

Every report (:mod:`~pytest_llmserve.report.text`, :mod:`~pytest_llmserve.report.json`,
:mod:`~pytest_llmserve.report.benchmark_json`, :mod:`~pytest_llmserve.report.plots`) takes BenchOutcomes:
plain data that the plugin (or a script) fills in after a benchmark ran and was judged. The benchmark gate
(:mod:`pytest_llmserve.gates.bench`) records a JSON-plain dict instead, since the plugin carries it across
xdist workers in ``user_properties``; :func:`outcome_from_gate` turns that dict into a BenchOutcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.store.baselines import BenchKey
from pytest_llmserve.verdicts.comparability import Comparability
from pytest_llmserve.verdicts.stats import NOISY_CV, Summary, Verdict, log_sd, summarize


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
    context: dict[str, Any] = field(default_factory=dict)
    concurrency: int | None = None
    request_latencies_s: dict[str, list[float]] = field(default_factory=dict)
    note: str | None = None
    baseline_path: str | None = None
    run_id: str | None = None
    saved: bool = False  # this run's samples were recorded as the baseline (nothing compared)
    baseline_key: BenchKey | None = None  # the store key, when it is not (test_id, server_id, workload)
    warmup: dict[str, Any] | None = None
    discarded_rounds: list[dict[str, Any]] = field(default_factory=list)
    resolution: dict[str, Any] | None = None
    extension: dict[str, Any] | None = None
    contended_rounds: list[dict[str, Any]] = field(default_factory=list)
    confounded: bool = False  # no verdict: the host stayed busy (contended_rounds); skipped, never failed

    def __post_init__(self) -> None:
        for name, values in self.samples.items():
            if name not in self.metrics and values and all(math.isfinite(v) for v in values):
                self.metrics[name] = summarize(values)
        if self.current is None:
            self.current = self.metrics.get(self.metric)
        if self.baseline is None and self.baseline_samples:
            self.baseline = summarize(self.baseline_samples)

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
    def host_contention(self) -> dict[str, Any]:
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
        if self.warmup is not None and self.warmup.get("settled") is False and self.warmup.get("note"):
            out.append(str(self.warmup["note"]))
        if self.discarded_rounds:
            out.append(f"{len(self.discarded_rounds)} round(s) discarded as measurement artefacts of the machine and "
                       "run again: " + " | ".join(f"{d.get('round')}: {'; '.join(d.get('reasons') or [])}"
                                                  for d in self.discarded_rounds))
        for busy in self.contended_rounds:
            out.append(f"not a sample: {busy.get('round', 'a round')}: {busy.get('reason', 'host busy')}")
        spread = self.spread
        if spread["noisy"]:
            out.append(f"the rounds are noisy: {self.metric} CV {spread['cv']:.1%} over {spread['rounds']} rounds "
                       f"(sd of the log values {spread['log_sd']:.3f}) is above {NOISY_CV:.0%}: a busy machine or a "
                       "server still warming up; a verdict at this spread needs many rounds")
        if self.extension is not None and self.extension.get("note"):
            out.append(str(self.extension["note"]))
        if self.status == "inconclusive" and self.resolution is not None and self.resolution.get("line"):
            out.append(f"resolution: {self.resolution['line']}")
        return out

    @property
    def name(self) -> str:
        """Short display name: the test function (with parameters) and, if not already in it, the server."""
        short = self.test_id.rsplit("::", 1)[-1]
        return short if self.server_id in short else f"{short}[{self.server_id}]"

    def to_dict(self) -> dict[str, Any]:
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
            "warmup": self.warmup,
            "discarded_rounds": self.discarded_rounds,
            "resolution": self.resolution,
            "extension": self.extension,
            "host_contention": self.host_contention,
            "contended_rounds": self.contended_rounds,
            "confounded": self.confounded,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchOutcome:
        def summary(value: Any) -> Summary | None:
            return Summary.from_dict(value) if isinstance(value, Mapping) else None

        return cls(
            test_id=str(data["test_id"]),
            server_id=str(data["server_id"]),
            workload=str(data["workload"]),
            metric=str(data["metric"]),
            higher_is_better=bool(data.get("higher_is_better", True)),
            tolerance=float(data.get("tolerance", 0.05)),
            current=summary(data.get("current")),
            baseline=summary(data.get("baseline")),
            verdict=Verdict.from_dict(data["verdict"]) if data.get("verdict") else None,
            comparability=Comparability.from_dict(data["comparability"])
            if data.get("comparability")
            else None,
            metrics={k: Summary.from_dict(v) for k, v in (data.get("metrics") or {}).items()},
            samples={k: [float(x) for x in v] for k, v in (data.get("samples") or {}).items()},
            baseline_samples=[float(x) for x in data.get("baseline_samples") or []],
            error=data.get("error"),
            context=dict(data.get("context") or {}),
            concurrency=data.get("concurrency"),
            request_latencies_s={
                k: [float(x) for x in v] for k, v in (data.get("request_latencies_s") or {}).items()
            },
            note=data.get("note"),
            baseline_path=data.get("baseline_path"),
            run_id=data.get("run_id"),
            saved=bool(data.get("saved", False)),
            baseline_key=BenchKey.from_dict(data["key"]) if data.get("key") else None,
            warmup=dict(data["warmup"]) if isinstance(data.get("warmup"), Mapping) else None,
            discarded_rounds=[dict(d) for d in data.get("discarded_rounds") or [] if isinstance(d, Mapping)],
            resolution=dict(data["resolution"]) if isinstance(data.get("resolution"), Mapping) else None,
            extension=dict(data["extension"]) if isinstance(data.get("extension"), Mapping) else None,
            contended_rounds=_contended(data),
            confounded=bool(data.get("confounded", False)),
        )


def _contended(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = data.get("contended_rounds")
    return [dict(c) for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def outcome_from_gate(data: Mapping[str, Any]) -> BenchOutcome:
    """A :class:`BenchOutcome` from the dict the benchmark gate (``pytest_llmserve.gates.bench``) records.

    Keys read: ``test``, ``server``, ``workload``, ``metric``, ``higher_is_better``, ``tolerance``,
    ``verdict`` (an outcome, ``saved``, ``no-baseline`` or ``refused``), ``verdict_detail`` (a
    :class:`Verdict` dict), ``current`` and ``baseline`` (metric → samples), ``comparability``,
    ``context``, ``message``, ``baseline_file``, ``key`` (the store key; without it the key is the test
    id without its parameters, the server and the workload, as the gate computes it), ``concurrency``,
    ``request_latencies_s``, ``error``, ``run_id``, ``warmup``, ``discarded_rounds``, ``resolution``,
    ``extension``, ``contended_rounds``.
    """
    metric = str(data["metric"])
    test = str(data["test"])
    server = str(data["server"])
    workload = str(data["workload"])
    current = {k: [float(x) for x in v] for k, v in (data.get("current") or {}).items()}
    baseline = data.get("baseline") or {}
    detail = data.get("verdict_detail")
    comp = data.get("comparability")
    key_data = data.get("key")
    key = (
        BenchKey.from_dict(key_data)
        if isinstance(key_data, Mapping)
        else BenchKey(test=test.split("[", 1)[0], server=server, workload=workload)
    )
    higher = data.get("higher_is_better")
    return BenchOutcome(
        test_id=test,
        server_id=server,
        workload=workload,
        metric=metric,
        higher_is_better=bool(higher) if higher is not None else higher_is_better(metric),
        tolerance=float(data.get("tolerance", 0.05)),
        verdict=Verdict.from_dict(detail) if isinstance(detail, Mapping) else None,
        comparability=Comparability.from_dict(comp) if isinstance(comp, Mapping) else None,
        samples=current,
        baseline_samples=[float(x) for x in baseline.get(metric) or []],
        error=data.get("error"),
        context=dict(data.get("context") or {}),
        concurrency=data.get("concurrency"),
        request_latencies_s={
            k: [float(x) for x in v] for k, v in (data.get("request_latencies_s") or {}).items()
        },
        note=data.get("message"),
        baseline_path=data.get("baseline_file"),
        run_id=data.get("run_id"),
        saved=data.get("verdict") == "saved",
        baseline_key=key,
        warmup=dict(data["warmup"]) if isinstance(data.get("warmup"), Mapping) else None,
        discarded_rounds=[dict(d) for d in data.get("discarded_rounds") or [] if isinstance(d, Mapping)],
        resolution=dict(data["resolution"]) if isinstance(data.get("resolution"), Mapping) else None,
        extension=dict(data["extension"]) if isinstance(data.get("extension"), Mapping) else None,
        contended_rounds=_contended(data),
        confounded=data.get("verdict") == "confounded",
    )


def as_outcomes(items: Iterable[BenchOutcome | Mapping[str, Any]]) -> list[BenchOutcome]:
    """BenchOutcomes as they are; gate dicts converted by :func:`outcome_from_gate`."""
    return [item if isinstance(item, BenchOutcome) else outcome_from_gate(item) for item in items]
