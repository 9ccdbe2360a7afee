"""Before the boot, and the words of a refusal: what a benchmark's comparison can refuse from the configuration
alone (:func:`preflight_refusal`, decided before any server starts), whether a refused comparison differs only in
where it ran (:func:`environment_only`, :func:`elsewhere`: no baseline for this environment, an invitation rather
than a refusal), and the commands a refusal names (:func:`accept_command`, :func:`save_command`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pytest_llmserve.config import LLMServeConfig, ServerSpec
from pytest_llmserve.errors import BaselineError, LLMServeError
from pytest_llmserve.gates.context import build_context
from pytest_llmserve.metrics import higher_is_better
from pytest_llmserve.options import OPTIONS
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.settings import BenchSpec, Settings
from pytest_llmserve.store.baselines import BaselineStore, BenchKey
from pytest_llmserve.verdicts.comparability import (
    Comparability,
    append_diffs,
    comparability,
    host_change_text,
    unknown_host,
)

ENVIRONMENT_KEYS = ("hardware", "python", "plugin_version")


def environment_only(comp: Comparability) -> bool:
    """The comparison differs only in where it ran (hardware, Python, plugin version): no baseline exists for
    this environment, which is an invitation to record one rather than a refusal of a change."""
    return bool(comp.confounders) and all(
        any(d.key == k or d.key.startswith(k + ".") for k in ENVIRONMENT_KEYS) for d in comp.confounders)


def elsewhere(comp: Comparability) -> str:
    """Where an environment-only refusal's baseline was recorded, as the refusal says it: on another host
    (its differing fields named), before the host's identity was stored (an unknown host), or elsewhere."""
    if unknown_host(comp.diffs):
        return ("recorded before baselines stored their host's identity: from an unknown host, "
                "re-record it on this one")
    host = host_change_text(comp.diffs)
    return f"recorded on another host: {host}" if host else "recorded elsewhere"


def accept_command(results_dir: Path, store_dir: Path, test_id: str) -> str:
    """The command that turns this run's figures into the baseline of its context (replacing the record of
    the other context: explicit, and the old file stays in version control)."""
    latest = results_dir / "latest" / "results.json"
    return (f"llmserve baselines accept --replace {shlex.quote(str(latest))} --dir {shlex.quote(str(store_dir))} "
            f"-k {shlex.quote(test_id)}")


def save_command(invocation: Sequence[str], *, nodeid: str, test_name: str, server_name: str,
                 suite: bool) -> str:
    """``pytest <this run's --llmserve-* options> --llmserve-save-baseline <this benchmark>``: the one
    command that records a baseline for this benchmark in this context."""
    kept: list[str] = []
    args = list(invocation)
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0]
        if arg.startswith("--llmserve-") and name not in ("--llmserve-save-baseline", "--llmserve-server"):
            kept.append(arg)
            option = next((o for o in OPTIONS if o.flag == name), None)
            if "=" not in arg and option is not None and option.kind != "flag" and i + 1 < len(args):
                kept.append(args[i + 1])
                i += 1
        elif name == "--llmserve-server" and "=" not in arg:
            i += 1  # its value: the command names this benchmark's server itself
        i += 1
    if suite:
        selection = ["--llmserve-server=" + server_name, "-k", test_name]
    else:
        selection = [nodeid]
    return shlex.join(["pytest", *kept, "--llmserve-save-baseline", *selection])


def preflight_refusal(*, spec: ServerSpec, cfg: LLMServeConfig, options: BenchSpec, store_dir: Path,
                      key_test: str, test_id: str, save: bool, allow_confounded: bool,
                      results_dir: Path, allow_host_change: bool = False) -> BenchOutcome | None:
    """What can be refused from the configuration alone, before any server boots; None when nothing.

    * a baseline file that cannot be read (truncated, corrupt, another schema): never measured against,
      never written (``--llmserve-save-baseline`` refuses too, leaving the file byte-identical);
    * a comparison whose context differs in more than the variable under test in a key known before the
      boot (server arguments and environment, model, workload); only where it ran (hardware, Python,
      plugin) is not refused: that run measures and reports "no baseline for this environment";
    * a save whose context differs from the stored one (appending would mix incomparable samples).

    The engine version is known only after the boot: it is taken as the baseline's here, and compared then.
    Returns the benchmark's outcome (refused, or an ``error``; ``note`` says why).
    """
    wl = cfg.workload(options.workload, where=test_id)
    key = BenchKey(test=options.baseline_test or key_test, server=options.baseline_server or spec.id,
                   workload=wl.name)
    store = BaselineStore(store_dir)
    hib = options.higher_is_better if options.higher_is_better is not None else higher_is_better(options.metric)
    outcome = BenchOutcome(test_id=test_id, server_id=spec.id, workload=wl.name, metric=options.metric,
                           higher_is_better=hib, tolerance=options.tolerance, baseline_path=str(store.path_for(key)),
                           baseline_key=key, seconds=0.0, before_boot=True)
    try:
        doc = store.load(key)
    except BaselineError as exc:
        outcome.error = f"baseline unreadable: {exc}"
        outcome.note = f"{test_id}: refused before any boot: {exc}\nNothing was measured and the file was not written."
        return outcome
    if doc is None:
        return None
    context = build_context(spec, wl, engine_version=doc.context.get("engine_version"))
    outcome.context = context
    if save:
        diffs = append_diffs(doc.context, context)
        if not diffs:
            return None
        listing = "\n".join(f"  - {d.describe()}" for d in diffs)
        outcome.error = "save refused: the stored baseline has another context"
        outcome.note = (
            f"{test_id}: --llmserve-save-baseline refused before any boot: {store.path_for(key)} holds "
            f"samples of another context, and appending would mix incomparable samples:\n{listing}\n"
            f"Nothing was measured and the file was not written. To record this context instead, run without "
            f"--llmserve-save-baseline, then: {accept_command(results_dir, store_dir, test_id)}")
        return outcome
    comp = comparability(doc.context, context, options.variable, allow_confounded,
                         allow_host_change=allow_host_change)
    if comp.ok or environment_only(comp):
        return None
    outcome.comparability = comp
    outcome.note = (f"{test_id}: {comp.message}\nbaseline: {store.path_for(key)}\nDecided from the configuration "
                    "before any boot: no server was started for this benchmark.")
    return outcome


def refusal_before_boot(spec: ServerSpec, settings: Settings, options: BenchSpec, *, key_test: str,
                        test_id: str) -> tuple[BenchOutcome | None, str]:
    """:func:`preflight_refusal` under the run's settings, for a test's set-up: the refusal (None when
    there is none) and the test's failure message ('' when it may run). A configuration error, e.g. a
    workload the configuration does not declare, is a message without a record."""
    try:
        refusal = preflight_refusal(spec=spec, cfg=settings.cfg, options=options, store_dir=settings.baseline_dir,
                                    key_test=key_test, test_id=test_id, save=settings.save_baseline,
                                    allow_confounded=settings.allow_confounded,
                                    allow_host_change=settings.allow_host_change, results_dir=settings.results_dir)
    except LLMServeError as exc:
        return None, f"{test_id}: {exc}"
    return refusal, (refusal.note or "") if refusal is not None else ""
