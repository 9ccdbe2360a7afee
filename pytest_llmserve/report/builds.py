"""The reports of ``llmserve builds compare`` and ``llmserve bisect``: results.json, summary.md and the plot of the
metric per build, from the typed records of the run (:class:`Measured`: each build's environment, correctness and
rounds, and the A/B steps' :class:`~pytest_llmserve.report.outcome.BenchOutcome`; the bisect's
:class:`~pytest_llmserve.verdicts.bisect.StepResult` and :class:`~pytest_llmserve.verdicts.bisect.BisectResult`).

results.json (strict JSON, :func:`pytest_llmserve.json_encoding.dumps`: a figure that is not finite is null)::

    {"command": "compare" | "bisect", "error": str | null, "metric", "tolerance", "alpha",
     "workload": {...}, "base_server", "load_average": {"start": [...], "end": [...]},
     "builds": [{"index", "build", "label", "python", "resolved", "engine_version", "server_args",
                 "correctness": {"ok", "detail"} | null, "samples": [...]}, ...],
     "steps": [StepResult fields + "label", ...],
     "result": {"status", "first_bad", "last_good", "first_unknown", "message"} | null,
     "ab_outcomes": [{"test", "server", "workload", "metric", "higher_is_better", "tolerance", "verdict",
                      "verdict_detail", "baseline", "current", "rounds", "message", "seconds", "ab", "differences",
                      "contended_rounds", "key", "resolution"?}, ...]}

``ab_outcomes`` keep the shape the A/B runner recorded before it filled a BenchOutcome (:func:`ab_outcome_dict`:
``baseline`` and ``current`` are side A's and side B's samples of every metric).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_llmserve.builds import BuildEnv
from pytest_llmserve.config import BuildSpec, ServerSpec, Workload
from pytest_llmserve.json_encoding import dumps
from pytest_llmserve.report import plots
from pytest_llmserve.report.outcome import BenchOutcome
from pytest_llmserve.verdicts.bisect import BisectResult, StepResult


@dataclass(slots=True)
class Measured:
    """What a run learned about each build (index into the builds given)."""

    envs: list[BuildEnv]
    specs: list[ServerSpec]
    correctness: dict[int, tuple[bool, str]] = field(default_factory=dict)
    samples: dict[int, list[float]] = field(default_factory=dict)  # the build's rounds, all steps
    outcomes: list[BenchOutcome] = field(default_factory=list)  # each A/B step's outcome


def ab_outcome_dict(outcome: BenchOutcome) -> dict[str, object]:
    """An A/B step's outcome as results.json's ``ab_outcomes`` hold it (module docstring)."""
    out = {"test": outcome.test_id, "server": outcome.server_id, "workload": outcome.workload,
           "metric": outcome.metric, "higher_is_better": outcome.higher_is_better, "tolerance": outcome.tolerance,
           "verdict": outcome.status, "verdict_detail": outcome.verdict.to_dict() if outcome.verdict else None,
           "baseline": outcome.baseline_series, "current": outcome.samples, "rounds": outcome.rounds,
           "message": outcome.note, "seconds": outcome.seconds, "ab": outcome.ab,
           "differences": outcome.differences,
           "contended_rounds": [c.to_dict() for c in outcome.contended_rounds],
           "key": outcome.key.as_dict()}
    if outcome.resolution is not None:
        out["resolution"] = outcome.resolution
    return out


def results_document(*, command: str, error: str | None, metric: str, tolerance: float, alpha: float,
                     workload: Workload, base_server: str, load: dict[str, list[float]], builds: list[BuildSpec],
                     measured: Measured, steps: list[StepResult], labels: list[str],
                     result: BisectResult | None) -> dict[str, Any]:
    """results.json of a builds run (module docstring); ``labels``: each build's, by index."""
    m = measured
    rows = [{"index": i, "build": b.text, "label": b.label, "python": m.envs[i].python,
             "resolved": m.envs[i].resolved, "engine_version": m.envs[i].version,
             "server_args": list(b.server_args),
             "correctness": ({"ok": m.correctness[i][0], "detail": m.correctness[i][1]}
                             if i in m.correctness else None),
             "samples": m.samples.get(i, [])} for i, b in enumerate(builds)]
    return {"command": command, "error": error, "metric": metric, "tolerance": tolerance, "alpha": alpha,
            "workload": workload.to_dict(), "base_server": base_server, "load_average": load, "builds": rows,
            "steps": [_step_dict(st, labels[st.index]) for st in steps],
            "result": None if result is None else {"status": result.status, "first_bad": result.first_bad,
                                                   "last_good": result.last_good,
                                                   "first_unknown": result.first_unknown,
                                                   "message": result.message},
            "ab_outcomes": [ab_outcome_dict(o) for o in m.outcomes]}


def write_build_reports(out_dir: Path, data: dict[str, Any], *, measured: Measured, steps: list[StepResult],
                        say: Callable[[str], None]) -> None:
    """results.json, summary.md and (with matplotlib) throughput_per_build.png under ``out_dir``."""
    (out_dir / "results.json").write_text(dumps(data, indent=2) + "\n")
    (out_dir / "summary.md").write_text(summary_markdown(data))
    missing = plots.matplotlib_missing()
    if missing:
        say(missing)
    else:
        count = len(data["builds"])
        verdicts = {st.index: st.verdict for st in steps}
        plots.plot_builds([f"B{i}" for i in range(count)], [measured.samples.get(i, []) for i in range(count)],
                          out_dir / "throughput_per_build.png", metric=data["metric"],
                          verdicts=[verdicts.get(i, "good end" if i == 0 else "") for i in range(count)])
    say(f"wrote {out_dir}/results.json and summary.md")


def _step_dict(st: StepResult, label: str) -> dict[str, object]:
    d = asdict(st)
    d["label"] = label
    return d


def _num(x: object, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def summary_markdown(data: dict[str, Any]) -> str:
    """The step table (build, verdict, medians, change and its CI, p, correctness) and the answer."""
    lines = [f"# llmserve {data['command']}: {data['metric']} per build", ""]
    wl = data["workload"]
    lines.append(f"Workload `{wl['name']}`: {wl['num_prompts']} prompts, {wl['input_len']} in / {wl['output_len']} "
                 f"out, concurrency {wl['max_concurrency']}; tolerance {data['tolerance']:.0%}, alpha {data['alpha']}; "
                 f"load average (1, 5, 15 min) at start {data['load_average'].get('start')}, "
                 f"at end {data['load_average'].get('end')}.")
    lines += ["", "| build | engine | declared args | correctness | median (all rounds) |",
              "|---|---|---|---|---|"]
    for b in data["builds"]:
        corr = "—" if b["correctness"] is None else ("pass" if b["correctness"]["ok"] else
                                                     "FAIL: " + b["correctness"]["detail"][:80])
        med = f"{statistics.median(b['samples']):.2f} ({len(b['samples'])} rounds)" if b["samples"] else "—"
        args = " ".join(b["server_args"]) or "—"
        lines.append(f"| B{b['index']} `{b['build']}` | {b['engine_version']} | {args} | {corr} | {med} |")
    lines += ["", "| step | build vs B0 | attempt | rounds | verdict | B0 median | median | change | 95% CI | p "
                  "| correctness |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, st in enumerate(data["steps"]):
        ci = st["ci"]
        ci_text = "—" if not ci else f"{ci[0]:+.1%}..{ci[1]:+.1%}"
        lines.append(f"| {i + 1} | {st['label']} | {st['attempt']} | {st['rounds']} | {st['verdict']} | "
                     f"{_num(st['reference_median'], '.2f')} | {_num(st['median'], '.2f')} | "
                     f"{_num(st['change'], '+.1%')} | {ci_text} | {_num(st['p_value'], '.3g')} | "
                     f"{'pass' if st['correctness_ok'] else 'FAIL'} |")
    notes = [f"- step {i + 1}: {st['extra'].get('invalid_round') or st['correctness_detail']}"
             for i, st in enumerate(data["steps"])
             if st.get("extra", {}).get("invalid_round") or (not st["correctness_ok"] and st["correctness_detail"])]
    if notes:
        lines += ["", "Invalid rounds and correctness failures:", *notes]
    if data["result"]:
        lines += ["", f"**{data['result']['status']}**: {data['result']['message']}"]
    if data.get("error"):
        lines += ["", f"**stopped early**: {data['error'].splitlines()[0]}"]
    return "\n".join(lines) + "\n"
