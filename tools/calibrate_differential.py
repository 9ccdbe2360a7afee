"""The differential's calibration: every measured pair's figures against the tolerances, as docs/power.md shows them.

    .venv/bin/python tools/calibrate_differential.py [--cpu tests/data/power/cpu_answers.json.gz] [--plot PNG]

Prints two Markdown tables: per measure, the healthy envelope (the largest figure of any healthy pair, and which),
the smallest figure among the faults (and which) and the tolerance between them; then one row per pair. The H200
pairs come from docs/gpu-runs/dsa-2026-12-02 (the divergences its reports kept and its reference tables'
|Δlogprob|); the CPU pairs from the catalogue run's recording (tests/power/test_checkpoint_faults.py with
LLMSERVE_POWER_RECORD=1). ``--plot`` draws each pair's worst figure per measure on a log axis, healthy and faulty
apart, with the tolerance as a line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_llmserve.verdicts.differential import DEFAULT_TOLERANCE  # noqa: E402
from tests.power.calibration import (  # noqa: E402 - the repository root is put on the path first
    CPU_ANSWERS,
    PairSet,
    caught_by,
    cpu_pair_sets,
    envelopes,
    h200_pair_sets,
)


def _cell(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3g}" if value < 0.01 else f"{value:.3f}"


def _md(text: str) -> str:
    """``text`` safe in a Markdown table cell."""
    return text.replace("|", "\\|")


def markdown(sets: list[PairSet]) -> str:
    lines = ["| measure | tolerance | healthy pairs' worst | which | faults beyond it | nearest fault's figure |",
             "|---|---|---|---|---|---|"]
    for env in envelopes(sets):
        lines.append(f"| {_md(env.measure)} | {env.render_tolerance()} | {_cell(env.healthy_worst)} | "
                     f"{env.healthy_where} | {', '.join(env.caught) or '-'} | {_cell(env.fault_nearest)} |")
    breaks = caught_by(sets)
    lines += ["", "| pair | healthy | answers compared | max \\|Δlogprob\\| | max top-k distance | widest near-tie gap "
                  "| early near-ties | shortest stop | breaks | vLLM's rule fails |", "|---" * 10 + "|"]
    for s in sets:
        gaps = [d.widest for d in s.divergences]
        if s.healthy:
            verdict = "-"
        elif breaks.get(s.name):
            verdict = _md("; ".join(breaks[s.name]))
        else:
            verdict = (f"nothing: {s.not_compared} answer(s) not comparable (a failed request: the NaN checks' "
                       "business)" if s.not_compared else "NOTHING")
        lines.append(f"| {s.name} | {'yes' if s.healthy else 'fault'} | {s.answers}"
                     + (f" ({s.not_compared} not)" if s.not_compared else "") + " | "
                     f"{_cell(max(s.max_deltas) if s.max_deltas else None)} | "
                     f"{_cell(max(s.max_distances) if s.max_distances else None)} | "
                     f"{_cell(max(gaps) if gaps else None)} | {s.early} | "
                     f"{_cell(min(s.truncation_fractions) if s.truncation_fractions else None)} | {verdict} | "
                     + (f"{s.vllm_rule_failures} of {s.answers}" if s.name.startswith(("CPU", "constructed")) else "-")
                     + " |")
    return "\n".join(lines)


def plot(sets: list[PairSet], path: Path) -> None:
    # lazy: matplotlib takes ~0.5 s to import; only --plot needs it
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def gaps(s: PairSet) -> list[float]:
        return [d.widest for d in s.divergences]

    def deltas(s: PairSet) -> list[float]:
        return s.max_deltas

    def distances(s: PairSet) -> list[float]:
        return s.max_distances

    measures: tuple[tuple[str, Callable[[PairSet], list[float]], float], ...] = (
        ("max |Δlogprob|", deltas, DEFAULT_TOLERANCE.max_logprob_delta),
        ("max top-k distance", distances, DEFAULT_TOLERANCE.max_topk_distance),
        ("widest near-tie gap", gaps, DEFAULT_TOLERANCE.near_tie_gap))
    fig, axes = plt.subplots(1, len(measures), figsize=(15, 5))
    for ax, (title, values, tolerance) in zip(axes, measures, strict=True):
        for x, healthy in ((0, True), (1, False)):
            ys = [max(v) for s in sets if s.healthy == healthy and (v := [y for y in values(s) if math.isfinite(y)])]
            ys = [max(y, 1e-4) for y in ys]  # identical answers: 0 on a log axis, drawn at the bottom
            # A fault under this tolerance is caught by another measure (grey): each fault breaks some, not all.
            colors = ["tab:green" if healthy else "tab:red" if y > tolerance else "tab:gray" for y in ys]
            ax.scatter([x + (i % 7 - 3) * 0.03 for i in range(len(ys))], ys, color=colors, s=18, alpha=0.8)
        ax.axhline(tolerance, color="black", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_xticks([0, 1], ["healthy pairs", "faults"])
        ax.set_title(f"{title} (tolerance {tolerance:g})")
    fig.suptitle("The differential's tolerances: healthy pairs (green), faults beyond this tolerance (red), faults "
                 "caught by another measure (grey); identical answers at the bottom (docs/power.md)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", type=Path, default=CPU_ANSWERS, help="the catalogue run's recorded answers")
    ap.add_argument("--plot", type=Path, help="write the calibration plot (PNG) here")
    args = ap.parse_args()
    sets = h200_pair_sets()
    if args.cpu.exists():
        sets += cpu_pair_sets(args.cpu)
    else:
        print(f"no CPU recording at {args.cpu}: the H200 pairs only", file=sys.stderr)
    print(markdown(sets))
    if args.plot:
        plot(sets, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
