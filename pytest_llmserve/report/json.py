"""The results of a session as JSON (``results.json``), written and read back.

``llmserve baselines accept`` reads this file to record a run as the baseline. It is strict JSON, a figure that is
not finite written null (:mod:`pytest_llmserve.json_encoding`). Layout::

    {"format": "pytest-llmserve-results", "schema": 1, "created_at": ISO-8601, "run_id": "...",
     "plugin_version": "...",
     "benchmarks": [{"test_id", "server_id", "workload", "metric", "higher_is_better", "tolerance",
                     "samples": {metric: [...]}, "metrics": {metric: summary}, "current": summary | null,
                     "baseline": summary | null, "baseline_samples": [...], "verdict": {...} | null,
                     "comparability": {...} | null, "error": str | null, "context": {...},
                     "concurrency": int | null, "request_latencies_s": {name: [...]}, "note": ...,
                     "baseline_path": ..., "run_id": ..., "saved": bool,
                     "key": {"test", "server", "workload"},
                     "spread": {"metric", "rounds", "cv": float | null, "log_sd": float | null, "noisy": bool,
                                "noisy_cv": 0.1},
                     "warmup": {"metric", "rounds", "values", "settled": bool | null, "difference", "seconds",
                                "agreement", "max_rounds", "budget_s", "note"?} | null,
                     "discarded_rounds": [{"round", "reasons"}, ...],
                     "resolution": {"log_sd", "resolvable_tolerance", "current_rounds", "rounds_a_side", ...,
                                    "line", "short"} | null,
                     "extension": {"target", "limit", "budget_s", "rounds_before", "rounds_added", "seconds",
                                   "stopped", "goal", "plan_looks", "note"} | null,
                     "contended_rounds": [{"round", "reason", "host_contention"}, ...]},
                    ...],
     "checks": [{"test_id", "check", "server_id", "verdict": "pass|fail|error|unverifiable|not-applicable|skipped",
                 "kind": "correctness|benchmark", "first_finding", "findings": [...], "message", "detail",
                 "oracles": [...], "duration_s"}, ...],
     "summary": {"headline": "verified 12 of 17 checks · 3 FAILED (2 correctness, 1 benchmark) · 9 passed · ...",
                 "counts": {"failed": {"correctness", "benchmark"}, "strict_failed", "passed", "unverifiable",
                            "not-applicable", "skipped", "benchmarks": {status: n}, "verified", "total"},
                 "strict": bool,
                 "interrupted": {"stopped": "interrupted|stopped-early", "why", "collected", "ran",
                                 "never_ran"} | null}}

``spread`` is the between-round spread of the gated metric in this run: ``cv`` (sample stdev / mean of the
values) and ``log_sd`` (sample stdev of their natural logs, what the sequential rule's t test works on), each
null with fewer than two rounds; ``noisy`` when the CV is above ``noisy_cv``. ``warmup`` is the gate's warm-up
(:meth:`pytest_llmserve.gates.bench.BenchGate.warm_up`), null where none ran. ``discarded_rounds`` are rounds run
again as measurement artefacts of the machine. These are additions to schema 1: a file without them reads as
having no warm-up record and no discarded round. ``resolution`` (beside an inconclusive verdict: what the rule
resolves at the measured noise and the rounds the tolerance needs, ``line`` as the gate said it) and ``extension``
(the rounds ``extend_to_resolve`` added) are later additions, null where there is none.

``checks`` holds every check that is not a measured benchmark (see :mod:`pytest_llmserve.report.checks`);
a file without it (written before checks were reported) reads as having none. A check row's ``untrained_declared``
and ``strict_from`` (a test strict mode failed, and the verdict or benchmark status it had) are later additions.

``summary.counts.verified`` of ``summary.counts.total``: the checks and benchmarks whose verdict was reached from
evidence (:func:`pytest_llmserve.report.checks.is_verified`). ``summary.strict``: the run was in strict mode.
``summary.interrupted``: null for a run that ran to its end; for one stopped by Ctrl-C or SIGTERM
(``interrupted``) or by ``-x`` / ``--maxfail`` (``stopped-early``, ``why`` as pytest said it), how many of the
collected items ran to an outcome (:class:`~pytest_llmserve.report.checks.RunCompleteness`). These are additions
to schema 1 as well.

A bare JSON list of outcomes is read as well (``"format": "gate-outcomes"``): entries as above, or in the shape the
benchmark gate recorded before it filled a :class:`BenchOutcome` (``test``, ``server``, ``verdict``,
``verdict_detail``, ``current`` and ``baseline`` as metric → samples, ...; :func:`_from_gate_record`), which
``llmserve builds`` still writes as its ``ab_outcomes``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pytest_llmserve.errors import BaselineError
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.report.checks import CheckOutcome, RunCompleteness, headline, headline_counts
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.store.baselines import BenchKey, atomic_write_text, utc_timestamp
from pytest_llmserve.verdicts.comparability import Comparability
from pytest_llmserve.verdicts.stats import Verdict
from pytest_llmserve.version import __version__

_T = TypeVar("_T")

RESULTS_FORMAT = "pytest-llmserve-results"
RESULTS_SCHEMA = 1


def results_document(outcomes: Sequence[BenchOutcome], checks: Sequence[CheckOutcome] = (), *,
                     run_id: str | None = None, strict: bool = False,
                     completeness: RunCompleteness | None = None) -> dict[str, Any]:
    stopped = completeness is not None and completeness.stopped is not None
    return {
        "format": RESULTS_FORMAT,
        "schema": RESULTS_SCHEMA,
        "created_at": utc_timestamp(),
        "run_id": run_id or uuid.uuid4().hex[:12],
        "plugin_version": __version__,
        "summary": {"headline": headline(checks, outcomes, strict=strict, completeness=completeness),
                    "counts": headline_counts(checks, outcomes), "strict": strict,
                    "interrupted": completeness.to_dict() if completeness is not None and stopped else None},
        "benchmarks": [o.to_dict() for o in outcomes],
        "checks": [c.to_dict() for c in checks],
    }


def write_results_json(
    path: str | os.PathLike[str], outcomes: Sequence[BenchOutcome], checks: Sequence[CheckOutcome] = (), *,
    run_id: str | None = None, strict: bool = False, completeness: RunCompleteness | None = None
) -> Path:
    """Write the results of a session (atomically); ``llmserve baselines accept`` reads this file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    doc = results_document(outcomes, checks, run_id=run_id, strict=strict, completeness=completeness)
    atomic_write_text(p, dumps(doc, indent=2) + "\n")
    return p


def load_json_file(path: Path, what: str = "file") -> object:
    """A JSON file's data; a missing or unreadable file is a :class:`BaselineError` naming the path and ``what`` it
    was to be ("results file": ``no such results file``, ``not a readable JSON results file (...)``)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BaselineError(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BaselineError(f"{path}: not a readable JSON {what} ({exc})") from None


def read_results_json(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[BenchOutcome]]:
    """The header (everything but ``benchmarks``) and the outcomes of a results file."""
    p = Path(path)
    data = load_json_file(p, "results file")
    if isinstance(data, list):  # a bare list of outcomes
        try:
            return {"format": "gate-outcomes"}, [
                BenchOutcome.from_dict(item) if "test_id" in item else _from_gate_record(item) for item in data]
        except (KeyError, TypeError, ValueError, AttributeError, BaselineError) as exc:
            raise BaselineError(f"{p}: a list, but not of benchmark outcomes ({exc!r})") from None
    if not isinstance(data, dict) or data.get("format") != RESULTS_FORMAT:
        raise BaselineError(
            f'{p}: not a pytest-llmserve results file (expected "format": "{RESULTS_FORMAT}")'
        )
    if data.get("schema") != RESULTS_SCHEMA:
        raise BaselineError(
            f"{p}: results schema {data.get('schema')!r} is not supported (reads {RESULTS_SCHEMA})"
        )
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, list):
        raise BaselineError(f"{p}: 'benchmarks' must be a list")
    outcomes = _read_each(benchmarks, BenchOutcome.from_dict, f"{p}: benchmarks",
                          (KeyError, TypeError, ValueError, BaselineError))
    header = {k: v for k, v in data.items() if k != "benchmarks"}
    return header, outcomes


def read_check_outcomes(path: str | os.PathLike[str]) -> list[CheckOutcome]:
    """The check rows of a results file (none in a file written before checks were reported)."""
    header, _ = read_results_json(path)
    rows = header.get("checks") or []
    if not isinstance(rows, list):
        raise BaselineError(f"{path}: 'checks' must be a list")
    return _read_each(rows, CheckOutcome.from_dict, f"{path}: checks", (KeyError, TypeError, ValueError))


def _read_each(items: Sequence[Any], read: Callable[[Any], _T], where: str,
               malformed: tuple[type[Exception], ...]) -> list[_T]:
    """``read`` of each item of a file's list (``where``: the file and the list's key); an item that raises one of
    ``malformed`` is a BaselineError naming its index."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(read(item))
        except malformed as exc:
            raise BaselineError(f"{where}[{i}] is malformed ({exc!r})") from None
    return out


def _from_gate_record(data: Mapping[str, Any]) -> BenchOutcome:
    """An outcome in the gate's earlier record shape (module docstring): ``test``, ``server``, ``workload``,
    ``metric``, ``higher_is_better``, ``tolerance``, ``verdict`` (an outcome, ``saved``, ``no-baseline``,
    ``refused`` or ``confounded``), ``verdict_detail`` (a :class:`Verdict` dict), ``current`` and ``baseline``
    (metric → samples), ``comparability``, ``context``, ``message``, ``baseline_file``, ``key`` (without it: the
    test id without its parameters, the server and the workload), ``concurrency``, ``request_latencies_s``,
    ``error``, ``run_id``, ``warmup``, ``discarded_rounds``, ``resolution``, ``extension``, ``contended_rounds``."""
    metric, test, server, workload = (str(data[k]) for k in ("metric", "test", "server", "workload"))
    baseline = data.get("baseline") or {}
    detail, comp, key = data.get("verdict_detail"), data.get("comparability"), data.get("key")
    higher = data.get("higher_is_better")
    return BenchOutcome.from_dict({
        **{k: data.get(k) for k in ("workload", "tolerance", "error", "context", "concurrency", "request_latencies_s",
                                    "run_id", "warmup", "discarded_rounds", "resolution", "extension",
                                    "contended_rounds") if data.get(k) is not None},
        "test_id": test, "server_id": server, "metric": metric,
        "higher_is_better": bool(higher) if higher is not None else higher_is_better(metric),
        "verdict": Verdict.from_dict(detail).to_dict() if isinstance(detail, Mapping) else None,
        "comparability": Comparability.from_dict(comp).to_dict() if isinstance(comp, Mapping) else None,
        "samples": data.get("current") or {}, "baseline_samples": baseline.get(metric) or [],
        "note": data.get("message"), "baseline_path": data.get("baseline_file"),
        "saved": data.get("verdict") == "saved", "confounded": data.get("verdict") == "confounded",
        "key": key if isinstance(key, Mapping) else BenchKey(test.split("[", 1)[0], server, workload).as_dict(),
    })
